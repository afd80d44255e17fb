//! What a spoofed flood's one-frame sources read in the cheap tier's
//! sketch (`limiter_common::sketch`), the figures docs/architecture.md's
//! "The bounds" quotes: a flood stays in the cheap tier under a rule only
//! while few of its sources read more than the rule's cheap frames `T`.
//! Every source sends one frame, at a random address, in two consecutive
//! epochs of `rate` sources each; a source reads, with its own frame
//! counted, what the sketch holds of its place over both epochs (the
//! kernel's test against `T`). Deterministic: a fixed key and addresses.

use limiter_common::sketch::{self, Pair, WORDS};

/// The share of the second epoch's sources that read more than each of
/// `thresholds`.
fn over(rate: u32, thresholds: &[u32]) -> Vec<f64> {
    let mut sketch: Vec<Pair> = vec![[0; 2]; WORDS as usize];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        // xorshift64*: deterministic, no dependency.
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let seed = 0x5eed_cafe;
    let mut over = vec![0u32; thresholds.len()];
    for epoch in 0..2u64 {
        let tag = sketch::tag(epoch * sketch::EPOCH_NS);
        for _ in 0..rate {
            let mut addr = [0u8; 16];
            addr[..4].copy_from_slice(&(next() as u32).to_le_bytes());
            let place = sketch::place(&addr, false, 32, 0, seed);
            let pair = &mut sketch[place.word as usize];
            pair[sketch::half(tag)] = sketch::bumped(pair[sketch::half(tag)], tag, place);
            if epoch == 1 {
                let read = sketch::seen(pair, tag, place).total();
                for (count, &t) in over.iter_mut().zip(thresholds) {
                    *count += u32::from(read > t);
                }
            }
        }
    }
    over.iter()
        .map(|&n| f64::from(n) / f64::from(rate))
        .collect()
}

#[test]
fn a_flood_of_a_million_a_second_reads_over_ten_in_well_under_a_thousandth() {
    let shares = over(1_000_000, &[8, 10, 12]);
    eprintln!("1,000,000 a second, over 8 / 10 / 12: {shares:?}");
    assert!(shares[0] < 0.03, "over 8: {}", shares[0]);
    assert!(shares[1] < 0.001, "over 10: {}", shares[1]);
    assert!(shares[2] < 0.0001, "over 12: {}", shares[2]);
}

#[test]
fn a_quarter_million_a_second_reads_over_five_in_under_a_thousandth() {
    let shares = over(262_144, &[5]);
    eprintln!("262,144 a second, over 5: {shares:?}");
    assert!(shares[0] < 0.001, "over 5: {}", shares[0]);
}

/// One cheap frame (a 10 pps rule) keeps a modest flood in the cheap tier
/// only in part: a fifth of its sources read two or more.
#[test]
fn at_a_hundred_thousand_a_second_a_fifth_read_over_one() {
    let shares = over(100_000, &[1, 2, 3]);
    eprintln!("100,000 a second, over 1 / 2 / 3: {shares:?}");
    assert!((0.1..0.3).contains(&shares[0]), "over 1: {}", shares[0]);
    assert!(shares[1] < 0.03, "over 2: {}", shares[1]);
    assert!(shares[2] < 0.002, "over 3: {}", shares[2]);
}
