//! `cargo xtask bench table`: renders docs/benchmarks.md's "Current
//! figures" again from the saved runs in docs/data (`current::rewrite`).
//! With `--save NAME --machine TEXT` it first saves the JSON lines on its
//! standard input as NAME's latest run: how `bench verifier` (in xtask,
//! which does not link this crate) records its figures.

use std::io::BufRead as _;

use anyhow::Context as _;
use clap::Parser;
use limiter_bench::current;

#[derive(Parser)]
#[command(about = "Render docs/benchmarks.md's current figures from docs/data")]
struct Args {
    /// Save stdin's JSON lines as this run's figures first (`verifier`).
    #[arg(long, requires = "machine")]
    save: Option<String>,
    /// What the saved run was measured on.
    #[arg(long)]
    machine: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let root = current::root();
    if let Some(name) = &args.save {
        let lines = std::io::stdin()
            .lock()
            .lines()
            .map(|line| Ok(serde_json::from_str(&line?)?))
            .collect::<anyhow::Result<Vec<serde_json::Value>>>()
            .context("reading JSON lines from stdin")?;
        anyhow::ensure!(!lines.is_empty(), "--save {name}: no JSON line on stdin");
        current::save(&root, name, args.machine.as_deref().unwrap_or("?"), &lines)?;
    }
    current::rewrite(&root)?;
    eprintln!("rendered the current figures of docs/benchmarks.md from docs/data");
    Ok(())
}
