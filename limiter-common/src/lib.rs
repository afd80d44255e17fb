//! Types and pure logic shared by the xdp-limiter kernel program
//! (`limiter-ebpf`) and its userspace (`limiter-user`, tests).
//!
//! Everything that crosses the kernel/user boundary through a BPF map lives
//! here, `#[repr(C)]` with explicit padding fields so no key or value carries
//! uninitialised bytes. Fields that encode an enum or a flag in a byte are
//! private behind typed accessors and constructors, so no caller compares
//! raw encodings. With the `user` feature each module's `user` submodule
//! adds what only userspace needs (`aya::Pod` impls so the types can be map
//! keys and values, conversions, `Display`). The window arithmetic
//! (`window`) is pure and runs unchanged in the kernel and in host tests;
//! `maps` is the table of every map of the program.
#![no_std]

// Userspace-only impls (and the derives of `clap` and `serde`) may use std;
// the kernel never enables `user`.
#[cfg(any(test, feature = "user"))]
extern crate std;

pub mod cluster;
pub mod event;
pub mod keys;
pub mod lists;
pub mod maps;
pub mod rules;
pub mod sketch;
pub mod state;
pub mod stats;
pub mod tickets;
pub mod window;

pub use cluster::{ClusterShare, ClusterState};
pub use event::{EventKind, LimitEvent};
pub use keys::{prefix_mask, AddressFamily, SourceKey};
pub use maps::{names, DEFAULT_MAX_HOT_SOURCES, DEFAULT_MAX_SOURCES, MAP_LAYOUT_VERSION};
pub use rules::{Action, Config, Level, LevelKey, LevelKind, Rule, RuleRefs, Scope, TrafficClass};
pub use state::{Hold, SourceTraffic, WindowState};
pub use stats::{Counter, Outcome};
