//! Builds the eBPF object (`limiter-ebpf`, target `bpfel-unknown-none`) with
//! the `debian` toolchain and hands its path to the crate, which embeds it,
//! so the `xdp-limiter` binary is the only file an operator installs.
//!
//! `cargo xtask setup` installs that toolchain and bpf-linker; without them
//! this script fails with one line saying so. How the eBPF crates are built
//! is defined once, in `limiter-ebpf-build`.

fn main() {
    limiter_ebpf_build::embed(
        "limiter-ebpf",
        &["limiter-ebpf"],
        &[
            "limiter-ebpf/src",
            "limiter-ebpf/Cargo.toml",
            "limiter-common/src",
            "limiter-common/Cargo.toml",
        ],
    );
}
