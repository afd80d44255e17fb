//! Cluster-scoped limits (issue 13): one budget per source across every
//! node, decided locally at XDP from allowances the daemon derives from
//! counts shared through Redis. See docs/cluster.md.
//!
//! - [`share`]: the claim arithmetic, cold and fallback caps and the
//!   error bound (pure, host-tested);
//! - [`store`]: the Redis store (per-bucket counters updated and read by one
//!   Lua script, node heartbeats), for a single instance or a Redis Cluster.
//!
//! The daemon's sync loop and the kernel's enforcement build on these.

pub mod share;
pub mod store;
pub mod tick;

pub use share::{cold_cap, error_bound, fallback_cap, node_claim, Fallback};
pub use store::{
    HotList, Mode, Report, Store, StoreConfig, StoreError, SyncOutcome, Totals, WindowSpec,
};
