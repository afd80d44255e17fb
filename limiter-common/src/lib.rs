//! Types and pure logic shared by the xdp-limiter kernel program
//! (`limiter-ebpf`) and its userspace (`limiter-user`, tests).
//!
//! Everything that crosses the kernel/user boundary through a BPF map lives
//! here, `#[repr(C)]` with explicit padding fields so no key or value carries
//! uninitialised bytes. With the `user` feature the types implement
//! `aya::Pod` so userspace can use them as map keys and values. The window
//! arithmetic (`window`) is pure and runs unchanged in the kernel and in
//! host tests.
#![no_std]

pub mod event;
pub mod keys;
pub mod rules;
pub mod state;
pub mod stats;
pub mod window;

pub use event::LimitEvent;
pub use keys::{prefix_mask, AddressFamily, SourceKey};
pub use rules::{Action, Config, Rule, RuleRefs, TrafficClass};
pub use state::{SourceTraffic, WindowState};
pub use stats::{Counter, Outcome};

/// Names of the maps and the program in the eBPF object, shared so that
/// userspace looks up exactly what the kernel side defines.
pub mod names {
    /// The XDP entry point.
    pub const PROGRAM: &str = "xdp_limiter";
    /// Offered traffic per source, per CPU (LRU per-CPU hash,
    /// `SourceKey` -> `SourceTraffic`).
    pub const SOURCES: &str = "SOURCES";
    /// Admission windows per source, shared (LRU hash,
    /// `SourceKey` -> `WindowState`).
    pub const WINDOWS: &str = "WINDOWS";
    /// Global per-CPU counters by `Outcome` (per-CPU array of `Counter`).
    pub const STATS: &str = "STATS";
    /// The global `Config` (array of one).
    pub const CONFIG: &str = "CONFIG";
    /// Compiled rules (array of `Rule`, two generations' halves).
    pub const RULES: &str = "RULES";
    /// IPv4 prefixes of both generations -> `RuleRefs` (LPM trie keyed
    /// by `rules::PrefixKeyV4`).
    pub const PREFIXES_V4: &str = "PREFIXES_V4";
    /// IPv6 prefixes of both generations -> `RuleRefs` (LPM trie keyed
    /// by `rules::PrefixKeyV6`).
    pub const PREFIXES_V6: &str = "PREFIXES_V6";
    /// Frames dropped (or would-be dropped) per `RULES` index, per CPU.
    pub const RULE_DROPS: &str = "RULE_DROPS";
    /// Ring buffer of `LimitEvent`s.
    pub const EVENTS: &str = "EVENTS";
}

/// Version of the map layouts (keys, values and their field order). Bump it
/// on any change: a daemon never adopts pinned maps of another version,
/// since sizes alone do not reveal a reordered field.
pub const MAP_LAYOUT_VERSION: u32 = 3;

/// Default capacity of the per-source state maps; userspace sets the real
/// size before loading.
pub const DEFAULT_MAX_SOURCES: u32 = 65_536;

#[cfg(feature = "user")]
mod pod {
    // SAFETY (all impls below): #[repr(C)] structs of integers and byte
    // arrays with explicit padding fields: every bit pattern is valid and
    // there are no uninitialised bytes.
    unsafe impl aya::Pod for super::SourceKey {}
    unsafe impl aya::Pod for super::Counter {}
    unsafe impl aya::Pod for super::SourceTraffic {}
    unsafe impl aya::Pod for super::WindowState {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::Rule {}
    unsafe impl aya::Pod for super::RuleRefs {}
    unsafe impl aya::Pod for super::LimitEvent {}
}
