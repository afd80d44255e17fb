//! How this workspace builds its eBPF crates, defined once: the toolchain,
//! the target, the flags, which crates may use unstable features, and the
//! nested `rustup run <toolchain> cargo ...` call with a clean environment.
//!
//! Used by the build scripts that embed eBPF objects (`limiter-user` for
//! the product program, `limiter-bench-objects` for the benchmark's) as a
//! build-dependency, and by xtask (`setup` links the toolchain, `test`
//! runs clippy on the eBPF crates for their target). It has no
//! dependencies, so a build script that uses it compiles nothing else.
//!
//! Why a nested cargo: the eBPF crates build for `bpfel-unknown-none` with
//! Debian's rustc (it ships a prebuilt BPF `core`; see
//! /work/shared/notes/toolchain.md), while the host crates build with the
//! default rustup toolchain.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// The rustup toolchain of the eBPF build (`cargo xtask setup` links it to
/// Debian's rustc in /usr).
pub const TOOLCHAIN: &str = "debian";

/// Environment variable that names another toolchain for the eBPF build.
pub const TOOLCHAIN_VAR: &str = "LIMITER_EBPF_TOOLCHAIN";

/// The eBPF target (little-endian BPF).
pub const TARGET: &str = "bpfel-unknown-none";

/// The nested builds' target directory, under the workspace root: apart
/// from the host build's, whose lock the outer cargo holds while build
/// scripts run.
const TARGET_DIR: &str = "target/ebpf";

/// Crates of the eBPF build allowed to use unstable features: aya-ebpf
/// uses `#![feature(asm_experimental_arch)]`, and limiter-ebpf the atomic
/// intrinsics (BPF compare-and-swap). The benchmark's crates need none.
const FEATURE_CRATES: &str = "aya_ebpf,limiter_ebpf";

/// Flags of the eBPF build: BTF lets the kernel and bpftool show our
/// types, and BPF ISA v3 has the atomic instructions.
const RUSTFLAGS: &[&str] = &["-Cdebuginfo=2", "-Clink-arg=--btf", "-Ctarget-cpu=v3"];

/// Environment that a parent cargo (or rustup) sets for build scripts and
/// `cargo run`, and that would leak into, and break, the nested build for
/// another target and toolchain.
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

/// The workspace root (this crate sits one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("limiter-ebpf-build sits in the workspace")
        .to_path_buf()
}

/// The toolchain to use: `$LIMITER_EBPF_TOOLCHAIN`, else [`TOOLCHAIN`].
pub fn toolchain() -> String {
    env::var(TOOLCHAIN_VAR).unwrap_or_else(|_| TOOLCHAIN.into())
}

/// `rustup run <toolchain> cargo <subcommand> --release` for `packages` on
/// [`TARGET`], run from `root` with the eBPF flags and a clean
/// environment. Callers append their own arguments (`--quiet`,
/// `-- -D warnings`).
pub fn cargo(root: &Path, subcommand: &str, packages: &[&str]) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", &toolchain(), "cargo", subcommand, "--release"])
        .args(["--target", TARGET])
        .arg("--target-dir")
        .arg(root.join(TARGET_DIR))
        .current_dir(root);
    for package in packages {
        cmd.args(["--package", package]);
    }
    for var in LEAKY_VARS {
        cmd.env_remove(var);
    }
    cmd.env("RUSTC_BOOTSTRAP", FEATURE_CRATES)
        .env("CARGO_ENCODED_RUSTFLAGS", RUSTFLAGS.join("\x1f"));
    cmd
}

/// Host `cargo` (`$CARGO` when cargo started the caller) run from the
/// workspace root, without the variables cargo set for the calling
/// process (a test, a build script, `cargo run`): a dependency's build
/// script that watches one (ring watches `CARGO_MANIFEST_DIR`) would
/// otherwise rebuild, and relink the binary, there and again at the next
/// plain `cargo build`.
pub fn host_cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    for (name, _) in env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&name.as_ref())
        {
            cmd.env_remove(name.as_ref());
        }
    }
    cmd
}

/// Where a release build of the eBPF crates puts its objects.
pub fn objects_dir(root: &Path) -> PathBuf {
    root.join(TARGET_DIR).join(TARGET).join("release")
}

/// For a build script: builds the eBPF `package` and copies each of its
/// `bins` into `$OUT_DIR` as `<bin>.o`, for `include_bytes_aligned!`.
///
/// `watched` are the paths, relative to the workspace root, that the
/// objects are built from; a change to any of them reruns the script, as
/// does a change to `Cargo.lock`, the workspace `Cargo.toml` (it holds the
/// eBPF crates' release profile) or `$LIMITER_EBPF_TOOLCHAIN`.
///
/// Panics with one line naming the remedy: build scripts have no other
/// way to fail.
pub fn embed(package: &str, bins: &[&str], watched: &[&str]) {
    let root = workspace_root();
    for path in watched.iter().chain(&["Cargo.lock", "Cargo.toml"]) {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    println!("cargo:rerun-if-env-changed={TOOLCHAIN_VAR}");

    let toolchain = toolchain();
    let status = cargo(&root, "build", &[package])
        .arg("--quiet")
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run rustup to build the eBPF program {package} ({e}); run `cargo xtask setup`")
        });
    if !status.success() {
        panic!(
            "building {package} with the `{toolchain}` toolchain failed ({status}); \
             if the toolchain or bpf-linker is missing, run `cargo xtask setup`"
        );
    }

    let objects = objects_dir(&root);
    let out_dir =
        PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts"));
    for bin in bins {
        let object = objects.join(bin);
        let embedded = out_dir.join(format!("{bin}.o"));
        std::fs::copy(&object, &embedded)
            .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", object.display(), embedded.display()));
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    fn args(cmd: &Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn nested_cargo_builds_every_package_for_the_bpf_target_in_its_own_dir() {
        let root = Path::new("/ws");
        let cmd = cargo(root, "clippy", &["limiter-ebpf", "limiter-bench-ebpf"]);
        assert_eq!(cmd.get_program(), "rustup");
        let args = args(&cmd);
        assert_eq!(args[0], "run");
        assert_eq!(args[2..5], ["cargo", "clippy", "--release"]);
        let after = |flag: &str| -> Vec<&str> {
            args.windows(2)
                .filter(|w| w[0] == flag)
                .map(|w| w[1].as_str())
                .collect()
        };
        assert_eq!(after("--target"), [TARGET]);
        assert_eq!(after("--target-dir"), ["/ws/target/ebpf"]);
        assert_eq!(after("--package"), ["limiter-ebpf", "limiter-bench-ebpf"]);
        assert_eq!(cmd.get_current_dir(), Some(root));
    }

    #[test]
    fn nested_cargo_sets_the_ebpf_flags_and_drops_the_parent_build_environment() {
        let cmd = cargo(Path::new("/ws"), "build", &["limiter-ebpf"]);
        let envs: Vec<(&OsStr, Option<&OsStr>)> = cmd.get_envs().collect();
        let value = |name: &str| {
            envs.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
        };
        assert_eq!(
            value("RUSTC_BOOTSTRAP"),
            Some(Some("aya_ebpf,limiter_ebpf".into()))
        );
        assert_eq!(
            value("CARGO_ENCODED_RUSTFLAGS"),
            Some(Some(
                "-Cdebuginfo=2\x1f-Clink-arg=--btf\x1f-Ctarget-cpu=v3".into()
            ))
        );
        for var in ["RUSTC", "RUSTUP_TOOLCHAIN", "RUSTFLAGS", "CARGO_TARGET_DIR"] {
            assert_eq!(value(var), Some(None), "{var} is removed");
        }
    }

    #[test]
    fn objects_land_in_the_release_dir_of_the_bpf_target() {
        assert_eq!(
            objects_dir(Path::new("/ws")),
            Path::new("/ws/target/ebpf/bpfel-unknown-none/release")
        );
    }
}
