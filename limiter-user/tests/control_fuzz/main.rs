//! Property tests of the control plane, without a kernel: the control
//! protocol's parser (`proto::parse_request`), configuration validation
//! (`Config::parse`) and rule edits (`daemon::apply_rule_edit`, the pure
//! part of what the daemon does with a `rules` request) never panic, answer
//! every bad input with a clear error, and a rejected edit leaves the
//! configuration in force exactly as it was.
//!
//! Inputs are random text and bytes, and structure-aware mutations of
//! valid requests (keys dropped, duplicated, renamed, inserted; values of
//! the wrong type, huge, negative, NaN-like, deeply nested; other versions;
//! every truncation) and of the shipped example configuration. The seed is
//! fixed so a failure reproduces; `PROPTEST_RNG_SEED` and `PROPTEST_CASES`
//! explore further.

mod config;
mod edits;
mod json;
mod protocol;
mod regressions;
mod strategies;

use proptest::test_runner::{Config as ProptestConfig, RngSeed};

/// The fixed seed of every property below (see the module comment).
const SEED: u64 = 0xc04e_f022;

/// `cases` cases from the fixed seed, unless the environment asks for
/// other ones; no regression files (the seed replays a failure).
fn config(cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(SEED);
    }
    config
}
