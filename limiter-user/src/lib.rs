//! xdp-limiter userspace: the embedded XDP object, loading it into the
//! kernel, compiling and pushing rules, reading its maps back, and the
//! daemon that ties them together.
//!
//! The `xdp-limiter` binary (src/main.rs) and the integration tests both
//! build on this library.

pub mod batch;
pub mod cli;
pub mod counters;
pub mod daemon;
pub mod object;
pub mod proto;
pub mod push;
pub mod rules;

pub use object::{load, LoadError, LoadOptions, EBPF_OBJECT};
