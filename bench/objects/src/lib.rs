//! The benchmarks' eBPF objects, embedded (build.rs builds them from
//! `limiter-bench-ebpf`). Nothing here is part of xdp-limiter: the
//! benchmark drivers load them next to the product's program, and the
//! daemon tests use the baseline as "someone else's" program and map.
//!
//! A crate of its own, apart from `limiter-bench` (the drivers), because
//! both the drivers and the product's integration tests (`limiter-tests`)
//! need the objects, and `limiter-bench` depends on `limiter-tests` for
//! its harness: the objects below both keep the graph acyclic.

/// A reference program for `cargo xtask bench xdp`
/// (`bench/ebpf/src/bin/baseline.rs`): the limiter's parsing plus one
/// per-CPU LRU counter. Never attached by the daemon.
pub static BASELINE_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter-baseline.o"));

/// [`BASELINE_OBJECT`] loaded, its program verified but not attached.
pub fn load_baseline() -> aya::Ebpf {
    let mut ebpf = aya::EbpfLoader::new()
        .load(BASELINE_OBJECT)
        .expect("load the baseline object");
    baseline_program(&mut ebpf)
        .load()
        .expect("verify the baseline program");
    ebpf
}

/// The baseline's XDP program in `ebpf`.
pub fn baseline_program(ebpf: &mut aya::Ebpf) -> &mut aya::programs::Xdp {
    ebpf.program_mut("xdp_baseline")
        .expect("the baseline program")
        .try_into()
        .expect("an XDP program")
}

/// The end-to-end benchmark's programs
/// (`bench/ebpf/src/bin/bench_traffic.rs`): a live-frames traffic
/// generator, the drop-everything and count-and-drop XDP floors and a
/// counting socket filter. Never attached by the daemon.
pub static BENCH_TRAFFIC_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter-bench-traffic.o"));

/// The program every verifier refuses as too large (bench/ebpf's
/// `oversized.rs`), for the test of the refusal message.
pub static OVERSIZED_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter-oversized.o"));
