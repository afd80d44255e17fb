//! `cargo xtask bench ...`: each benchmark is a release binary of the
//! `limiter-bench` crate, run pinned and printing a table plus one JSON
//! line per case.

use std::process::Command;

use clap::Subcommand;

use crate::run;

#[derive(Subcommand, Clone)]
pub enum Which {
    /// ns per packet through BPF_PROG_TEST_RUN: limiter cases against a
    /// baseline program (same parsing, one per-CPU LRU counter).
    Xdp,
    /// One daemon aggregation pass over 1,000,000 sources (time, CPU,
    /// memory) against reading the map key by key.
    Aggregate,
    /// End to end over veth: receiver CPU per packet and admitted traffic
    /// of xdp-limiter against no filter, nftables (input and ingress),
    /// iptables hashlimit and an XDP drop-all floor; rewrites the results
    /// in docs/benchmarks.md. About 10 minutes. `-- --modes service`: a
    /// web server (nginx) and 200 clients under a spoofed SYN flood, with
    /// each filter in front, about 12 minutes. `-- --modes random16`: the
    /// random flood from one /16, against a /16 aggregate
    /// (`xdp-limiter-agg16`) beside the other scenarios; printed only.
    E2e {
        /// Arguments for the benchmark (see `-- --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Cluster-wide limits through Redis, in a multi-node lab (real
    /// daemons, one redis-server): error against the sync interval (50,
    /// 100, 250 ms) and the node count (2, 3, 5) with node scope as the
    /// baseline, and Redis and daemon load at 1,000, (5,000,) 10,000 and
    /// 100,000 hot sources against one redis-server and against a Redis
    /// Cluster of 3 primaries; rewrites its section of docs/benchmarks.md.
    /// About 5 minutes.
    Cluster {
        /// Arguments for the benchmark (see `-- --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The verifier's budget: instructions processed and load time on
    /// this machine's kernel and on each kernel lane's (qemu), against the
    /// target of at most 450,000 instructions. About 2 minutes.
    Verifier,
    /// What libxdp's dispatcher adds to a frame (`attach = "dispatcher"`):
    /// the limiter run directly and through a dispatcher, in the 6.1
    /// lane's guest (this machine's kernel cannot run a dispatcher),
    /// under emulation: the ratio, not the ns. About 3 minutes.
    Dispatcher,
    /// Renders docs/benchmarks.md's "Current figures" from the runs the
    /// benches saved in docs/data (each bench does it after a complete
    /// run; this measures nothing).
    Table,
}

pub fn run(which: Which) -> anyhow::Result<()> {
    let root = run::workspace_root();
    let (bin, args) = match which {
        Which::Verifier => return crate::kernel::bench_verifier(),
        Which::Dispatcher => return crate::kernel::bench_dispatcher(),
        Which::Xdp => ("bench-xdp", Vec::new()),
        Which::Aggregate => ("bench-aggregate", Vec::new()),
        Which::E2e { args } => ("bench-e2e", args),
        Which::Cluster { args } => ("bench-cluster", args),
        Which::Table => ("bench-table", Vec::new()),
    };
    // The e2e and cluster benchmarks run the real daemon: build it
    // (release) too.
    run::status(
        run::cargo()
            .args(["build", "--quiet", "--release"])
            .args(["-p", "limiter-user", "-p", "limiter-bench"])
            .args(["--bin", "xdp-limiter", "--bin", bin]),
    )?;
    run::status(
        Command::new(root.join("target/release").join(bin))
            .current_dir(&root)
            .args(args)
            .env("XDP_LIMITER_BIN", root.join("target/release/xdp-limiter")),
    )
}
