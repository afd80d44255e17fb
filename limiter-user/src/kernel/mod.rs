//! Everything that talks to the kernel: the embedded XDP object loaded once
//! (`object`), its maps opened once into typed handles (`maps`), pins and
//! bpffs (`pins`), attaching to an interface and adopting what an earlier
//! daemon pinned (`attach`), joining libxdp's multi-program dispatcher
//! instead (`dispatcher`), pushing rules (`push`), reading the
//! counters back (`read`, `batch`), writing what the cluster sync
//! decides (`cluster`), writing lists and bans (`lists`, `bans`), and the verifier's cost by function (`verifier`).
//!
//! The daemon, the CLI's `check` and `detach`, and the tests build on this
//! module; nothing here knows about the daemon's loop or the control
//! protocol.
//!
//! Its doors: the loading and attaching machinery (`object`, `maps`,
//! `attach`, `sys`) is private behind the types and functions re-exported
//! here; the operations on a loaded program's maps are modules of their
//! own (`read::sources`, `push::push`, `cluster::share`, ...), each
//! showing only what the daemon, the CLI and the tests call.

mod attach;
pub mod bans;
pub mod batch;
pub mod cluster;
pub mod dispatcher;
pub mod lists;
mod maps;
mod object;
pub mod penalty;
pub mod pins;
pub mod push;
pub mod read;
mod sys;
pub mod verifier;
pub mod windows;

pub use attach::{AttachError, Attachment, Instance, LinkCheck};
pub use maps::Maps;
pub use object::{
    kernel_release, load, load_xdp, LoadError, LoadOptions, Program, Refusal, Verified,
    EBPF_OBJECT, OLDEST_TESTED_KERNEL,
};

/// Why a map of the program could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    #[error("map `{0}` is missing from the loaded object")]
    Missing(&'static str),
    #[error("map `{map}`: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("counting the possible CPUs: {0}")]
    Cpus(#[source] std::io::Error),
    #[error("batched access to map `{map}`: {source}")]
    Batch {
        map: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl MapsError {
    /// A closure turning aya's error on `map` into this one.
    pub(crate) fn on(map: &'static str) -> impl Fn(aya::maps::MapError) -> MapsError {
        move |source| MapsError::Map { map, source }
    }
}

/// The number of possible CPUs: the length of every per-CPU value.
pub fn possible_cpus() -> Result<usize, MapsError> {
    aya::util::nr_cpus().map_err(|(_, e)| MapsError::Cpus(e))
}

/// The kernel's clock for the limiter (`bpf_ktime_get_coarse_ns`).
pub fn now() -> std::time::Duration {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .expect("CLOCK_MONOTONIC_COARSE is always available");
    std::time::Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32)
}
