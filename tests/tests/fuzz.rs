//! Parser fuzzing through the real kernel (see `limiter_tests::fuzz`):
//! 100,000 random and mutated frames from a fixed seed, every verdict,
//! outcome count and per-source counter checked against the reference
//! model of the documented semantics. `cargo xtask fuzz --frames N
//! [--seed S]` runs longer campaigns.

#[test]
fn a_hundred_thousand_fuzzed_frames_are_parsed_keyed_and_judged_as_documented() {
    let started = std::time::Instant::now();
    let summary = limiter_tests::fuzz::run(100_000, 0x5eed_f00d)
        .unwrap_or_else(|e| panic!("the kernel and the model disagree: {e}"));
    eprintln!("{summary:?} in {:?}", started.elapsed());
    assert_eq!(summary.frames, 100_000);
    // The frames reached every kind of verdict the rules can give.
    for outcome in [
        "passed",
        "allowed",
        "dropped_deny",
        "dry_run_would_drop",
        "non_ip",
        "malformed",
    ] {
        assert!(
            summary.outcomes.get(outcome).is_some_and(|n| *n > 100),
            "too few `{outcome}` frames: {summary:?}"
        );
    }
    assert!(summary.sources > 1000, "{summary:?}");
}
