//! xdp-limiter userspace: the embedded XDP object, loading it into the
//! kernel, and reading its maps back.
//!
//! The `xdp-limiter` binary (src/main.rs) and the integration tests both
//! build on this library.

pub mod counters;
pub mod object;

pub use object::{load, LoadError, LoadOptions, EBPF_OBJECT};
