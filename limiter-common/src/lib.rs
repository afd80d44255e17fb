//! Types and pure logic shared by the xdp-limiter kernel program
//! (`limiter-ebpf`) and its userspace (`limiter-user`, tests).
//!
//! Everything that crosses the kernel/user boundary through a BPF map lives
//! here, `#[repr(C)]` with explicit padding fields so no key or value carries
//! uninitialised bytes. With the `user` feature the types implement
//! `aya::Pod` so userspace can use them as map keys and values. The window
//! arithmetic (`window`) is pure and runs unchanged in the kernel and in
//! host tests; `maps` is the table of every map of the program.
#![no_std]

pub mod event;
pub mod keys;
pub mod maps;
pub mod rules;
pub mod state;
pub mod stats;
pub mod traffic;
pub mod window;

pub use event::LimitEvent;
pub use keys::{prefix_mask, AddressFamily, SourceKey};
pub use maps::{names, DEFAULT_MAX_SOURCES, MAP_LAYOUT_VERSION};
pub use rules::{Action, Config, Rule, RuleRefs, TrafficClass};
pub use state::{SourceTraffic, WindowState};
pub use stats::{Counter, Outcome};

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
    unsafe impl aya::Pod for super::traffic::GenConfig {}
    unsafe impl aya::Pod for super::traffic::GenState {}
}
