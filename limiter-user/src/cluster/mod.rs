//! Cluster-scoped limits: one budget per source across every node, decided
//! locally at XDP from allowances the daemon derives from counts shared
//! through Redis. See docs/cluster.md.
//!
//! - [`share`]: the claim arithmetic, cold and fallback caps and the
//!   error bound (pure, host-tested);
//! - [`tick`]: the pure parts of the daemon's sync tick (deltas, health,
//!   share expiry, the kernel's state);
//! - [`key`]: how a source is named, typed and on the wire;
//! - [`store`]: the Redis store (per-bucket counters updated and read by one
//!   Lua script, node heartbeats, the hot listing), for a single instance,
//!   a primary behind Sentinel or a Redis Cluster.
//!
//! The daemon's sync task (`daemon::sync`) and the kernel's enforcement
//! build on these.

pub mod key;
pub mod share;
pub mod store;
pub mod tick;

pub use key::ReportKey;
pub use share::{cold_cap, error_bound, fallback_cap, node_claim, Fallback};
pub use store::{HotList, Report, Store, StoreConfig, StoreError, SyncOutcome, Totals, WindowSpec};
