//! xdp-limiter userspace: the embedded XDP object, loading it into the
//! kernel, compiling and pushing rules, and reading its maps back.
//!
//! The `xdp-limiter` binary (src/main.rs) and the integration tests both
//! build on this library.

pub mod counters;
pub mod object;
pub mod push;
pub mod rules;

pub use object::{load, LoadError, LoadOptions, EBPF_OBJECT};
