//! xdp-limiter's benchmarks, demo and soak, apart from the product and
//! from its tests:
//!
//! - [`e2e`]: the end-to-end benchmark's lab, live-frames generator,
//!   scenarios, measurement and report (`cargo xtask bench e2e`, the soak,
//!   and their smoke test `tests/e2e_smoke.rs`).
//! - [`cluster`]: what the cluster benchmark and the cluster demo share on
//!   top of the multi-node lab (`cargo xtask bench cluster`, `cargo xtask
//!   demo --cluster`).
//! - [`current`]: the figures docs/benchmarks.md leads with, saved by
//!   each bench in docs/data and rendered from there (`cargo xtask bench
//!   table`).
//! - `src/bin/`: the drivers `cargo xtask` runs: `bench-xdp`,
//!   `bench-aggregate`, `bench-e2e`, `bench-cluster`, `bench-table`,
//!   `demo`, `demo-cluster` and `soak`.
//!
//! The eBPF programs they load are embedded by `limiter-bench-objects`;
//! the harness they share with the integration tests (namespaces, labs,
//! the daemon driver, test runs, packets) is `limiter-tests`.
//!
//! Everything here needs root and a BPF-capable kernel, and panics with
//! context when it lacks them.

pub mod cluster;
pub mod current;
pub mod e2e;

use std::sync::{atomic::AtomicBool, Arc};

/// A flag set by SIGINT, SIGTERM or SIGHUP: the drivers check it between
/// runs and stop cleanly (namespaces, daemons and servers go as they
/// unwind).
pub fn interrupt_flag() -> Arc<AtomicBool> {
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted))
            .expect("install a signal handler");
    }
    interrupted
}
