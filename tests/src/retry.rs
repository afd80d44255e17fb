//! Measurements that a stalled machine can void (a burst that crossed an
//! epoch or a bucket boundary, a generator starved of CPU) are taken
//! again, never silently: every discarded run is printed and appended to
//! the suite's retry log (`LIMITER_RETRY_LOG`, set by `cargo xtask test`),
//! and the suite fails when a run of it retried more than once
//! (`xtask/src/test.rs`). A retry is a symptom to read, not a tolerance.

use std::io::Write;

/// The environment variable naming the retry log (`xtask/src/test.rs`
/// reads the log under the same name).
pub const LOG_VAR: &str = "LIMITER_RETRY_LOG";

/// Prints a discarded run of `what` and why, and appends it to the retry
/// log when the suite keeps one.
pub fn record(what: &str, why: &str) {
    let line = format!("retried {what}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(LOG_VAR) {
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("opening the retry log {path:?}: {e}"));
        writeln!(log, "{line}").expect("writing the retry log");
    }
}

/// Runs `measure` until it gives a valid run, at most `tries` times; each
/// run it voids (`Err(why)`) is recorded. Panics, with every reason, when
/// none was valid.
pub fn until_valid<T>(what: &str, tries: u32, mut measure: impl FnMut() -> Result<T, String>) -> T {
    let mut reasons = Vec::new();
    for _ in 0..tries {
        match measure() {
            Ok(value) => return value,
            Err(why) => {
                record(what, &why);
                reasons.push(why);
            }
        }
    }
    panic!("{what}: no valid run in {tries}: {reasons:?}");
}
