//! `xdp-limiter status`.

use std::path::Path;

use super::{client, Output};
use crate::proto::{Reply, Request, Status};

pub fn run(socket: &Path, output: Output) -> anyhow::Result<()> {
    let Reply::Status(status) = client::request(socket, Request::Status)? else {
        anyhow::bail!("the daemon answered `status` with something else");
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&status)?),
        Output::Text => print!("{}", render(&status)),
    }
    Ok(())
}

/// The human form.
pub fn render(status: &Status) -> String {
    let mut text = format!(
        "xdp-limiter {}: {}, {} rules (generation {})\n",
        status.version,
        if status.dry_run { "dry-run" } else { "enforce" },
        status.rules,
        status.generation
    );
    text.push_str(&format!(
        "{:<12} {:<8} {:>8} {:>18} {:>8} {:>12} {:>12}\n",
        "interface", "mode", "program", "sources", "limited", "passed/s", "dropped/s"
    ));
    for i in &status.interfaces {
        text.push_str(&format!(
            "{:<12} {:<8} {:>8} {:>18} {:>8} {:>12.0} {:>12.0}\n",
            i.name,
            i.mode,
            i.program_id,
            format!("{}/{}", i.tracked_sources, i.capacity),
            i.limited_sources,
            i.passed_pps,
            i.dropped_pps
        ));
    }
    text
}
