//! Builds the eBPF object (`limiter-ebpf`, target `bpfel-unknown-none`) with
//! the `debian` toolchain and hands its path to the crate, which embeds it,
//! so the `xdp-limiter` binary is the only file an operator installs.
//!
//! `cargo xtask setup` installs that toolchain and bpf-linker; without them
//! this script fails with one line saying so.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// Environment that a parent cargo sets for build scripts and that would
/// leak into, and break, the nested build for another target/toolchain.
const LEAKY_VARS: &[&str] = &[
    "RUSTC",
    "RUSTDOC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTUP_TOOLCHAIN",
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_RUSTC",
    "CARGO_MAKEFLAGS",
    "CARGO_PRIMARY_PACKAGE",
];

/// Crates of the eBPF build allowed to use unstable features.
const EBPF_FEATURE_CRATES: &str = "aya_ebpf,limiter_ebpf";
/// Flags of the eBPF build.
const EBPF_RUSTFLAGS: &[&str] = &["-Cdebuginfo=2", "-Clink-arg=--btf", "-Ctarget-cpu=v3"];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest_dir
        .parent()
        .expect("limiter-user sits in the workspace");
    for watched in [
        "limiter-ebpf/src",
        "limiter-ebpf/Cargo.toml",
        "limiter-common/src",
        "limiter-common/Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=LIMITER_EBPF_TOOLCHAIN");

    let objects = build_ebpf(root);
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    for name in ["limiter-ebpf", "limiter-baseline", "limiter-bench-traffic"] {
        let object = objects.join(name);
        let embedded = out_dir.join(format!("{name}.o"));
        std::fs::copy(&object, &embedded)
            .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", object.display(), embedded.display()));
    }
}

/// Runs the nested `cargo build` and returns the directory of the objects.
fn build_ebpf(root: &Path) -> PathBuf {
    let toolchain = env::var("LIMITER_EBPF_TOOLCHAIN").unwrap_or_else(|_| "debian".into());
    let target_dir = root.join("target").join("ebpf");
    let mut cmd = Command::new("rustup");
    cmd.args(["run", &toolchain, "cargo", "build", "--quiet", "--release"])
        .args([
            "--package",
            "limiter-ebpf",
            "--target",
            "bpfel-unknown-none",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(root);
    for var in LEAKY_VARS {
        cmd.env_remove(var);
    }
    // aya-ebpf uses #![feature(asm_experimental_arch)] and limiter-ebpf the
    // atomic intrinsics (BPF compare-and-swap); allow features for those two
    // crates only. BPF ISA v3 has the atomic instructions; BTF lets the
    // kernel and bpftool show our types.
    cmd.env("RUSTC_BOOTSTRAP", EBPF_FEATURE_CRATES)
        .env("CARGO_ENCODED_RUSTFLAGS", EBPF_RUSTFLAGS.join("\x1f"));
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run rustup to build the eBPF program ({e}); run `cargo xtask setup`")
    });
    if !status.success() {
        panic!(
            "building limiter-ebpf with the `{toolchain}` toolchain failed ({status}); \
             if the toolchain or bpf-linker is missing, run `cargo xtask setup`"
        );
    }
    target_dir.join("bpfel-unknown-none/release")
}
