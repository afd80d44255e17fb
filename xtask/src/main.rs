//! `cargo xtask`: the project's workflows in one place.
//!
//! Every command but `setup` runs set-up first (it returns in about a second
//! when everything is installed), so a fresh machine needs no other step.

mod bench;
mod build;
mod demo;
mod fuzz;
mod kernel;
mod package;
mod package_lane;
mod run;
mod setup;
mod soak;
mod test;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "xdp-limiter build, test and set-up workflows")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what is missing: Debian's Rust with its BPF core, the
    /// `debian` rustup toolchain link, bpf-linker, and test tools.
    Setup,
    /// Build the eBPF object and the `xdp-limiter` binary that embeds it.
    Build {
        /// Build the userspace binary in debug mode instead of release.
        #[arg(long)]
        debug: bool,
    },
    /// The Debian package (`target/package/PROFILE/`): the binary, the
    /// unit, the configuration as a conffile, man pages, completions, the
    /// docs, the dashboard and the alert rules.
    Package {
        /// Pack the debug binary instead of a release build.
        #[arg(long)]
        debug: bool,
        /// The Debian revision: `VERSION-REVISION`.
        #[arg(long, default_value_t = 1)]
        revision: u32,
    },
    /// The main job: a throwaway netns lab, the daemon in enforce mode, a
    /// mix of light and heavy senders, live per-source results and metrics.
    Demo {
        /// The cluster-wide variant: three nodes and one Redis, a source
        /// spread over them held at its limit cluster-wide, then Redis
        /// killed and the fallback shown.
        #[arg(long)]
        cluster: bool,
    },
    /// Benchmarks that print comparable figures against a baseline measured
    /// in the same run.
    Bench {
        #[command(subcommand)]
        which: bench::Which,
    },
    /// Parser fuzzing through the real kernel: random and mutated frames
    /// checked against the reference model of the documented semantics.
    Fuzz {
        /// Frames to run.
        #[arg(long, default_value_t = 1_000_000)]
        frames: usize,
        /// Seed (default: from the clock; a failure prints the one to rerun).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Soak (not in the suite): the daemon under a mixed flood with a rule
    /// change every 3 s and a reload every minute; asserts bounded RSS and
    /// file descriptors, monotonic counters, and that the daemon's
    /// verdicts add up to the frames sent.
    Soak {
        /// Minutes of traffic (fractions allowed, e.g. 0.5 for a smoke run).
        #[arg(long, default_value_t = 30.0)]
        minutes: f64,
    },
    /// The whole suite: fmt, clippy (kernel and user), unit, kernel and
    /// netns tests on this machine's kernel, then the kernel lane on
    /// Debian 12's 6.1 in qemu. Needs root; never skips a test.
    Test {
        /// Run only the kernel lane, on this kernel (6.1, 6.12, or all):
        /// the kernel tests and a daemon smoke test in qemu.
        #[arg(long, value_name = "KERNEL", conflicts_with = "package_lane")]
        kernel: Option<String>,
        /// Run only the package lane: the .deb installed, reloaded,
        /// upgraded, removed and purged on Debian 12 with systemd in qemu.
        #[arg(long)]
        package_lane: bool,
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        cargo_test_args: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::run(),
        Command::Build { debug } => {
            setup::run()?;
            build::run(!debug)
        }
        Command::Package { debug, revision } => {
            setup::run()?;
            package::build(!debug, revision).map(drop)
        }
        Command::Demo { cluster } => {
            setup::run()?;
            demo::run(cluster)
        }
        Command::Bench { which } => {
            setup::run()?;
            bench::run(which)
        }
        Command::Fuzz { frames, seed } => {
            setup::run()?;
            fuzz::run(frames, seed)
        }
        Command::Soak { minutes } => {
            setup::run()?;
            soak::run(minutes)
        }
        Command::Test {
            kernel,
            package_lane,
            cargo_test_args,
        } => {
            setup::run()?;
            if package_lane {
                return package_lane::run();
            }
            test::run(&cargo_test_args, kernel.as_deref())
        }
    }
}
