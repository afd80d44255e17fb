//! `xdp-limiter check`: load the program through the kernel verifier and
//! attach nothing, to know before deploying that this kernel takes it.

use anyhow::Context as _;

use crate::kernel::{self, LoadOptions};

pub fn run(max_sources: u32) -> anyhow::Result<()> {
    let program = kernel::load(&LoadOptions {
        max_sources,
        ..LoadOptions::default()
    })
    .context("loading the XDP program (are you root, with BPF enabled?)")?;
    println!(
        "ok: program `{}` (id {}) passed the verifier; {} maps loaded",
        limiter_common::names::PROGRAM,
        program.id(),
        program.map_count()
    );
    Ok(())
}
