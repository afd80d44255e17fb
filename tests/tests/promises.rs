//! The differential adversarial harness: the real program through
//! BPF_PROG_TEST_RUN, in real time on both CPUs, runs traffic scripts
//! generated from a seed (`promises::script`: polite sources steady and
//! bursty, on one CPU or moving, silent and back; heavy ones at 1.1 to 100
//! times their limits; floods of spoofed sources at one to four times the
//! kept windows, the aggregates, the penalties or the sketch, and of /64s
//! of one /48 at one to four times the kept windows), under every
//! kind of rule (`promises::zoo`), with the daemon's upkeep between ticks;
//! and every source, level and penalty is checked against the documented
//! semantics (`promises::check`): a source within its limit is never
//! dropped, none gets more than its allowance and the documented bound,
//! and a full map is counted where it happens.
//!
//! Each family runs its seeds below, the first of them the ones that
//! found the defects of issue 33 on the program before it was fixed
//! (fe93fc7): small 1 (polite bursts within 10 pps dropped), penalty 3
//! (a polite source under a blocking rule dropped for 2 s), levels 1 (a
//! polite source under a /24 aggregate dropped), cluster 1 (a polite
//! cluster-scope source dropped for half a second), mixed 1 (a heavy
//! source's per-source level over its allowance: 136 against 100) and
//! mixed 6 with the tiers off (a heavy source moving CPUs: 75 against
//! 60); large found none. A
//! failure names its family and seed: `LIMITER_PROMISES_ONLY=family:seed`
//! replays that script alone; `LIMITER_PROMISES_SEEDS=a,b,...` runs more
//! seeds in every family.

use limiter_tests::{
    promises::{
        check::{check, After},
        run,
        script::{self, Family, HOT, WINDOWS},
        zoo,
    },
    testrun::{online_cpus, Harness},
};
use limiter_user::kernel::LoadOptions;

/// The seeds each family runs (more with `LIMITER_PROMISES_SEEDS`), or
/// the one `LIMITER_PROMISES_ONLY` names for it (none for the others).
fn seeds(family: Family, own: &[u64]) -> Vec<u64> {
    if let Ok(only) = std::env::var("LIMITER_PROMISES_ONLY") {
        return only
            .split(',')
            .filter_map(|one| one.split_once(':'))
            .filter(|(name, _)| Family::parse(name) == Some(family))
            .map(|(_, seed)| seed.parse().expect("LIMITER_PROMISES_ONLY: family:seed"))
            .collect();
    }
    let mut seeds = own.to_vec();
    if let Ok(more) = std::env::var("LIMITER_PROMISES_SEEDS") {
        seeds.extend(more.split(',').map(|s| {
            s.trim()
                .parse::<u64>()
                .expect("LIMITER_PROMISES_SEEDS: numbers")
        }));
    }
    seeds
}

/// Runs `family`'s scripts for `own` seeds on a fresh program each, with
/// the tiers on (as the daemon's default) or off, and checks each.
fn family(family: Family, own: &[u64], tiered: bool) {
    assert!(online_cpus() >= 2, "the scripts run on two CPUs");
    for seed in seeds(family, own) {
        let script = script::generate(family, seed);
        let mut harness = Harness::load_with(&LoadOptions {
            max_sources: WINDOWS,
            max_hot_sources: Some(HOT),
            ..LoadOptions::default()
        });
        assert_eq!(harness.push(&zoo::rules(tiered)), 1, "first generation");
        let run = run::run(&mut harness, &script);
        let after = After::read(&harness);
        let report = check(&script, &run, &after);
        let name = family.name();
        eprintln!(
            "{name} seed {seed} (tiers {}): {} frames; {}",
            if tiered { "on" } else { "off" },
            run.sent.len(),
            report.summary()
        );
        assert!(
            report.violations.is_empty(),
            "{name} seed {seed}: {} violations (replay: LIMITER_PROMISES_ONLY={name}:{seed}):\n{}\n\
             actors:\n{}",
            report.violations.len(),
            report.violations[..report.violations.len().min(20)].join("\n"),
            script
                .actors
                .iter()
                .map(|a| format!("  {:?}: {}", a.role, a.what))
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(
            report.polite_sources > 0,
            "{name} seed {seed}: no source stayed within its limit (the machine starved the \
             senders?): the script checked nothing of the first promise"
        );
    }
}

#[test]
fn small_limits_keep_both_promises() {
    family(Family::Small, &[1, 2, 3], true);
}

#[test]
fn large_limits_keep_both_promises() {
    family(Family::Large, &[1, 2, 3], true);
}

#[test]
fn penalties_keep_both_promises() {
    family(Family::Penalty, &[3, 1, 2], true);
}

#[test]
fn levels_keep_both_promises() {
    family(Family::Levels, &[1, 2, 3], true);
}

#[test]
fn cluster_scope_keeps_both_promises() {
    family(Family::Cluster, &[1, 2], true);
}

#[test]
fn a_mix_keeps_both_promises() {
    family(Family::Mixed, &[1, 2, 3], true);
}

#[test]
fn a_mix_keeps_both_promises_with_the_tiers_off() {
    family(Family::Mixed, &[6, 4, 5], false);
}
