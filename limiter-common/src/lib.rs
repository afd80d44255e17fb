//! Types and pure logic shared by the xdp-limiter kernel program
//! (`limiter-ebpf`) and its userspace (`limiter-user`, tests).
//!
//! Everything that crosses the kernel/user boundary through a BPF map lives
//! here, `#[repr(C)]` with explicit padding fields so no key or value carries
//! uninitialised bytes. With the `user` feature the types implement
//! `aya::Pod` so userspace can use them as map keys and values.
#![no_std]

pub mod keys;
pub mod stats;

pub use keys::{AddressFamily, SourceKey};
pub use stats::{Counter, Outcome};

/// Names of the maps and the program in the eBPF object, shared so that
/// userspace looks up exactly what the kernel side defines.
pub mod names {
    /// The XDP entry point.
    pub const PROGRAM: &str = "xdp_limiter";
    /// Per-source per-CPU counters (LRU per-CPU hash, `SourceKey` -> `Counter`).
    pub const SOURCES: &str = "SOURCES";
    /// Global per-CPU counters by `Outcome` (per-CPU array of `Counter`).
    pub const STATS: &str = "STATS";
}

/// Default capacity of the per-source state map; userspace may override it
/// before loading.
pub const DEFAULT_MAX_SOURCES: u32 = 65_536;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)], only integer/byte-array fields, explicit padding:
    // every bit pattern is valid and there are no uninitialised bytes.
    unsafe impl aya::Pod for super::SourceKey {}
    // SAFETY: #[repr(C)] pair of u64, no padding.
    unsafe impl aya::Pod for super::Counter {}
}
