//! `xdp-limiter check`: load the program through the kernel verifier and
//! attach nothing, to know before deploying that this kernel takes it, and
//! what verifying it costs here: the instructions the verifier processed
//! (against its limit of a million) and the time the load took.
//!
//! `--functions` splits the processed instructions by function
//! (`kernel::verifier`, a second load with the verifier's full log).
//!
//! A refusal is one message (the kernel, the program and function, the
//! verifier's reason, the oldest kernel known to work); `--verbose` adds
//! the verifier's log.
//!
//! `--config FILE` checks a configuration instead, as `run` would start
//! from it (the file read and validated, its rules compiled, interfaces
//! named, frame sizes against their MTU), loading nothing: what the
//! unit's `ExecStartPre` runs, so that a bad file fails the start before
//! the running daemon is stopped for it.

use serde::Serialize;

use super::Output;
use crate::kernel::{
    self, kernel_release,
    verifier::{self, FunctionCost},
    LoadError, LoadOptions,
};

/// What `check --config FILE --output json` prints.
#[derive(Serialize)]
struct ConfigReport<'a> {
    config: &'a std::path::Path,
    valid: bool,
    rules: Vec<&'a str>,
    interfaces: &'a [String],
}

/// `check --config FILE`: the configuration checked as `run` starts from
/// it; an error names the file and the field.
pub fn config(path: &std::path::Path, output: Output) -> anyhow::Result<()> {
    let options = crate::daemon::RunOptions {
        config: Some(path.to_path_buf()),
        ..crate::daemon::RunOptions::default()
    };
    let config = crate::daemon::effective_config(&options)
        .map_err(|e| e.context(format!("configuration {}", path.display())))?;
    // The lists' files too, as the daemon reads them at start-up.
    crate::lists::read_all(&config.file.lists, path.parent())
        .and_then(|lists| crate::lists::merge(&lists, config.daemon.max_list_prefixes))
        .map_err(|e| anyhow::anyhow!("configuration {}: {e}", path.display()))?;
    let report = ConfigReport {
        config: path,
        valid: true,
        rules: config.rules.specs().map(|s| s.name.as_str()).collect(),
        interfaces: &config.daemon.interfaces,
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Text => println!(
            "configuration {}: valid; rules {}; interfaces {}",
            path.display(),
            report.rules.join(", "),
            report.interfaces.join(", ")
        ),
    }
    Ok(())
}

/// The verifier's limit on processed instructions.
const VERIFIER_LIMIT: u32 = 1_000_000;

/// What `check --output json` prints.
#[derive(Serialize)]
struct Report<'a> {
    kernel: String,
    program: &'a str,
    verified_instructions: u32,
    verifier_limit: u32,
    load_ms: f64,
    maps: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    functions: Option<Vec<Function>>,
}

/// One function's processed instructions, in `--output json`.
#[derive(Serialize)]
struct Function {
    name: String,
    start: usize,
    instructions: u64,
}

pub fn run(max_sources: u32, verbose: bool, functions: bool, output: Output) -> anyhow::Result<()> {
    let program = match kernel::load(&LoadOptions {
        max_sources,
        ..LoadOptions::default()
    }) {
        Ok(program) => program,
        Err(LoadError::Refused(refusal)) => {
            if verbose {
                eprintln!("{}", refusal.log.trim_end());
            }
            return Err(anyhow::Error::msg(refusal.to_string()));
        }
        Err(e) => {
            return Err(anyhow::Error::new(e)
                .context("loading the XDP program (are you root, with BPF enabled?)"))
        }
    };
    let split: Option<Vec<FunctionCost>> = if functions {
        Some(verifier::per_function(limiter_common::names::PROGRAM)?)
    } else {
        None
    };
    let report = Report {
        kernel: kernel_release(),
        program: limiter_common::names::PROGRAM,
        verified_instructions: program.verified.instructions,
        verifier_limit: VERIFIER_LIMIT,
        load_ms: program.verified.load_time.as_secs_f64() * 1e3,
        maps: program.map_count(),
        functions: split.as_ref().map(|split| {
            split
                .iter()
                .map(|f| Function {
                    name: f.name.clone(),
                    start: f.start,
                    instructions: f.instructions,
                })
                .collect()
        }),
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string(&report)?),
        Output::Text => println!(
            "ok: this kernel ({}) accepts program `{}` (id {}), {} maps\n\
             verifier: {} instructions processed ({:.0}% of its limit of {}), load {:.0} ms",
            report.kernel,
            report.program,
            program.id(),
            report.maps,
            report.verified_instructions,
            f64::from(report.verified_instructions) * 100.0 / f64::from(VERIFIER_LIMIT),
            VERIFIER_LIMIT,
            report.load_ms,
        ),
    }
    if let (Output::Text, Some(split)) = (output, &split) {
        for f in split {
            println!(
                "  {:<20} from instruction {:>5}: {:>9} processed",
                f.name, f.start, f.instructions
            );
        }
    }
    Ok(())
}
