//! Builds the benchmarks' eBPF programs (`limiter-bench-ebpf`, target
//! `bpfel-unknown-none`) the way the product's program is built
//! (`limiter-ebpf-build`), and hands them to the crate, which embeds them.
//!
//! The objects are built from the benchmark's eBPF crate and its common
//! crate (`bench/ebpf`, `bench/common`), the product's parser (the
//! library of limiter-ebpf: `lib.rs` and `parse.rs`, not the product
//! program) and limiter-common; a change anywhere else leaves them alone.

fn main() {
    limiter_ebpf_build::embed(
        "limiter-bench-ebpf",
        &[
            "limiter-baseline",
            "limiter-bench-traffic",
            "limiter-oversized",
        ],
        &[
            "bench/ebpf/src",
            "bench/ebpf/Cargo.toml",
            "bench/common/src",
            "bench/common/Cargo.toml",
            "limiter-ebpf/src/lib.rs",
            "limiter-ebpf/src/parse.rs",
            "limiter-ebpf/Cargo.toml",
            "limiter-common/src",
            "limiter-common/Cargo.toml",
        ],
    );
}
