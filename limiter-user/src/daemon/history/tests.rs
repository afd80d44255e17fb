//! Unit tests of the rate history: the buckets' error, quantiles of a
//! known distribution, what a limit would have done, the ring's expiry and
//! the memory bound.

use super::*;

/// A deterministic generator (64-bit LCG), so the tests need no crate.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 11
    }

    /// Log-uniform in 1..=max.
    fn log_uniform(&mut self, max: f64) -> u64 {
        let u = self.next() as f64 / (1u64 << 53) as f64;
        max.powf(u).round().max(1.0) as u64
    }
}

#[test]
fn every_rate_lies_in_its_bucket_and_a_bucket_is_at_most_6_25_percent_wide() {
    let mut rng = Lcg(1);
    let values = (0..20_000u64)
        .chain((0..20_000).map(|_| rng.log_uniform(4e9)))
        .chain([u64::from(u32::MAX), (1 << 32) - 1]);
    for v in values {
        let (lower, upper) = bounds(bucket(v));
        assert!(lower <= v && v <= upper, "{v} outside [{lower}, {upper}]");
        assert!(
            (upper - lower) as f64 <= lower as f64 / 16.0,
            "bucket of {v} is [{lower}, {upper}]"
        );
    }
    // Rates past the last bucket land in it rather than out of range.
    assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    // Consecutive buckets tile the rates with no gap.
    for b in 1..BUCKETS {
        assert_eq!(bounds(b).0, bounds(b - 1).1 + 1, "gap before bucket {b}");
    }
}

#[test]
fn quantiles_of_10000_known_samples_land_within_the_bucket_error() {
    let mut history = History::new(Duration::from_secs(3600));
    let key = SeriesKey::rule("default");
    let mut rng = Lcg(7);
    let mut samples: Vec<u64> = (0..10_000).map(|_| rng.log_uniform(100_000.0)).collect();
    for (i, pps) in samples.iter().enumerate() {
        // Spread over the first 10 minutes.
        history.observe(&key, *pps, Duration::from_millis(i as u64 * 60));
    }
    samples.sort_unstable();
    let now = Duration::from_secs(600);
    let dist = history.distribution(&key, Duration::from_secs(3600), now);
    assert_eq!(dist.samples(), 10_000);
    assert_eq!(dist.packets(), samples.iter().sum::<u64>());
    for q in [0.1f64, 0.5, 0.9, 0.99, 0.999, 1.0] {
        let rank = (q * 10_000.0).ceil() as usize;
        let truth = samples[rank - 1];
        let got = dist.quantile(q).unwrap();
        assert!(
            got >= truth && (got - truth) as f64 <= truth as f64 / 16.0,
            "q{q}: {got} for {truth}"
        );
    }
}

#[test]
fn the_effect_of_a_limit_counts_the_sources_and_the_packets_above_it() {
    let mut history = History::new(Duration::from_secs(3600));
    let key = SeriesKey::rule("rules[0]");
    let at = Duration::from_secs(5);
    for _ in 0..90 {
        history.observe(&key, 10, at);
    }
    for _ in 0..10 {
        history.observe(&key, 100, at);
    }
    let dist = history.distribution(&key, Duration::from_secs(60), at);
    assert_eq!(dist.quantile(0.9), Some(10));
    assert_eq!(dist.quantile(0.91), Some(103));
    let effect = dist.effect(50);
    assert!((effect.limited_share - 0.1).abs() < 1e-9, "{effect:?}");
    // 10 sources x (100 - 50) above, of 900 + 1000.
    assert!(
        (effect.traffic_share - 500.0 / 1900.0).abs() < 1e-9,
        "{effect:?}"
    );
    assert_eq!(dist.effect(200), Effect::default());
    let all = dist.effect(5);
    assert!((all.limited_share - 1.0).abs() < 1e-9);
    assert!((all.traffic_share - (1900.0 - 500.0) / 1900.0).abs() < 1e-9);
    // A limit inside the 100s' bucket: by their mean (100), over 99...
    assert!((dist.effect(99).limited_share - 0.1).abs() < 1e-9);
    // ...and not over 100.
    assert_eq!(dist.effect(100).limited_share, 0.0);
}

#[test]
fn observations_expire_after_the_horizon_and_since_selects_the_last_slots() {
    let horizon = Duration::from_secs(600); // slots of 10 s
    let mut history = History::new(horizon);
    let key = SeriesKey::rule("default");
    history.observe(&key, 7, Duration::from_secs(1));
    history.observe(&key, 9, Duration::from_secs(305));
    let samples = |since: u64, now: u64| {
        history
            .distribution(&key, Duration::from_secs(since), Duration::from_secs(now))
            .samples()
    };
    assert_eq!(samples(600, 305), 2);
    assert_eq!(samples(10, 305), 1, "the last slot only");
    assert_eq!(samples(600, 599), 2);
    // A horizon later the first slot has left the ring...
    assert_eq!(samples(600, 605), 1);
    assert_eq!(samples(600, 905), 0);
    // ...and an observation in its place a turn later replaces it.
    history.observe(&key, 11, Duration::from_secs(1201));
    let dist = history.distribution(&key, horizon, Duration::from_secs(1201));
    assert_eq!(dist.samples(), 1);
    assert_eq!(dist.quantile(1.0), Some(11));
    // An unknown series has nothing.
    assert_eq!(
        history
            .distribution(&SeriesKey::rule("rules[9]"), horizon, Duration::ZERO)
            .samples(),
        0
    );
}

#[test]
fn memory_is_bounded_whatever_the_number_of_sources() {
    let mut history = History::new(Duration::from_secs(60));
    let key = SeriesKey::rule("default");
    let mut rng = Lcg(3);
    // A million sources' observations over two minutes (two turns).
    for i in 0..1_000_000u64 {
        let at = Duration::from_micros(i * 120);
        history.observe(&key, rng.log_uniform(1e9), at);
    }
    let held = history.cells_held();
    assert!(held <= SLOTS as usize * BUCKETS, "{held} cells");
    // 16 a power of two over 30 powers: far fewer than a million.
    assert!(held <= SLOTS as usize * 500, "{held} cells");
    let a_slot = history
        .distribution(&key, Duration::from_secs(1), Duration::from_secs(119))
        .cells
        .len();
    assert!(a_slot <= BUCKETS, "{a_slot}");
}

#[test]
fn a_proposal_is_rounded_up_to_two_significant_digits() {
    assert_eq!(propose(10, 2.0), 20);
    assert_eq!(propose(103, 2.0), 210);
    assert_eq!(propose(617, 2.0), 1300);
    assert_eq!(propose(7, 1.5), 11);
    assert_eq!(propose(0, 2.0), 1);
    assert_eq!(propose(1000, 1.0), 1000);
}
