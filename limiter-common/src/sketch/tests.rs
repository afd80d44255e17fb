use super::*;

fn v4(i: u32) -> [u8; 16] {
    let mut addr = [0u8; 16];
    addr[..4].copy_from_slice(&i.to_be_bytes());
    addr
}

#[test]
fn a_window_overlaps_this_many_pairs_of_epochs() {
    assert_eq!(epoch_pairs(100_000_000), 1, "within two epochs");
    assert_eq!(epoch_pairs(EPOCH_NS), 1);
    assert_eq!(epoch_pairs(EPOCH_NS + 1), 2, "three epochs");
    assert_eq!(epoch_pairs(2 * EPOCH_NS), 2);
    assert_eq!(epoch_pairs(60 * EPOCH_NS), 31, "61 epochs");
}

#[test]
fn counts_restart_each_epoch_and_saturate() {
    let place = place(&v4(0x0a00_0001), false, 32, 0, 7);
    let t = tag(5 * EPOCH_NS);
    let mut word = 0;
    for expected in 1..=3 {
        word = bumped(word, t, place);
        assert_eq!(count(word, t, place), expected);
    }
    let next = tag(6 * EPOCH_NS);
    assert_eq!(count(word, next, place), 0, "another epoch reads as zero");
    assert_eq!(count(bumped(word, next, place), next, place), 1);
    for _ in 0..300 {
        word = bumped(word, t, place);
    }
    assert_eq!(count(word, t, place), MAX_COUNT);
    // Tags wrap after 256 epochs: an epoch 256 later reads the same.
    assert_eq!(tag(0), tag(256 * EPOCH_NS));
}

#[test]
fn other_sources_only_add() {
    let t = tag(0);
    let mine = place(&v4(0x0a00_0001), false, 32, 0, 7);
    let mut word = 0;
    // Every possible pair of the word, including mine, counts too.
    for a in 0..SLOTS {
        for b in 0..SLOTS {
            if a != b {
                word = bumped(word, t, Place { word: 0, a, b });
            }
        }
    }
    let before = count(word, t, mine);
    assert!(before >= 2, "my pair was counted twice: {before}");
    assert_eq!(count(bumped(word, t, mine), t, mine), before + 1);
}

/// Whatever other sources of the word do, a source reads at least the
/// frames it sent this epoch (the exactness of the cheap tier's bound
/// rests on it), and its k-th frame reads exactly k while nobody
/// shares its counters.
#[test]
fn a_source_never_reads_less_than_it_sent() {
    let t = tag(0);
    let mut lcg = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: u32| {
        lcg = lcg
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((lcg >> 33) % u64::from(n)) as u32
    };
    for _ in 0..200 {
        // A dozen sources in one word, each with its own pair.
        let places: std::vec::Vec<Place> = (0..12)
            .map(|_| {
                let a = next(SLOTS);
                let b = (a + 1 + next(SLOTS - 1)) % SLOTS;
                Place { word: 0, a, b }
            })
            .collect();
        let mut sent = [0u32; 12];
        let mut word = 0;
        for _ in 0..120 {
            let i = next(12) as usize;
            word = bumped(word, t, places[i]);
            sent[i] += 1;
            for (place, sent) in places.iter().zip(&sent) {
                assert!(count(word, t, *place) >= *sent);
            }
        }
    }
    let alone = place(&v4(0x0a00_0001), false, 32, 0, 7);
    let mut word = 0;
    for k in 1..=5 {
        word = bumped(word, t, alone);
        assert_eq!(count(word, t, alone), k);
    }
}

/// Sources that share a word must spread over its pairs, or a busy
/// source makes every neighbour look busy: the pair must not come
/// from the bits that chose the word.
/// A source reads this epoch's count and the last one's from its pair,
/// and nothing of older epochs; the mark reads as windowed in the
/// epoch it was set and the next, then ages out.
#[test]
fn a_pair_reads_two_epochs_and_the_mark_lasts_one_more() {
    let place = place(&v4(0x0a00_0001), false, 32, 0, 7);
    let mut pair: Pair = [0; 2];
    let (e, f, g) = (tag(4 * EPOCH_NS), tag(5 * EPOCH_NS), tag(6 * EPOCH_NS));
    for _ in 0..3 {
        pair[half(e)] = bumped(pair[half(e)], e, place);
    }
    assert_eq!(
        seen(&pair, e, place),
        Seen {
            current: 3,
            previous: 0
        }
    );
    pair[half(f)] = bumped(pair[half(f)], f, place);
    let in_f = seen(&pair, f, place);
    assert_eq!(
        in_f,
        Seen {
            current: 1,
            previous: 3
        }
    );
    assert_eq!(in_f.total(), 4);
    assert!(!in_f.windowed());
    // Two epochs on, the first is gone.
    assert_eq!(
        seen(&pair, g, place),
        Seen {
            current: 0,
            previous: 1
        }
    );

    pair[half(f)] = marked(pair[half(f)], f, place);
    assert!(seen(&pair, f, place).windowed());
    assert_eq!(seen(&pair, f, place).current, WINDOWED);
    assert!(
        seen(&pair, g, place).windowed(),
        "the next epoch still sees it"
    );
    let h = tag(7 * EPOCH_NS);
    assert!(!seen(&pair, h, place).windowed(), "then it ages out");
    // Marking a word of another epoch restarts it; marking twice is
    // marking once; a busier count stays.
    let fresh = marked(pair[half(e)], g, place);
    assert_eq!(count(fresh, g, place), WINDOWED);
    assert_eq!(marked(fresh, g, place), fresh);
    let mut busy = 0;
    for _ in 0..200 {
        busy = bumped(busy, g, place);
    }
    assert_eq!(count(marked(busy, g, place), g, place), 200);
}

/// A mark raises only the marked source's two counters: a source that
/// shares one of them still reads its own count.
#[test]
fn a_mark_leaves_other_pairs_of_the_word_alone() {
    let t = tag(0);
    let mine = Place {
        word: 0,
        a: 0,
        b: 1,
    };
    let neighbour = Place {
        word: 0,
        a: 1,
        b: 2,
    };
    let word = bumped(marked(0, t, mine), t, neighbour);
    assert_eq!(count(word, t, neighbour), 1);
    assert_eq!(count(word, t, mine), WINDOWED);
}

#[test]
fn mark_cells_are_the_low_bits_of_the_budgets_place() {
    let addr = v4(0xcb00_7101);
    let at = place(&addr, false, 32, 3, 9);
    assert_eq!(mark_cell(at, SHARE_CELLS), at.word);
    assert_eq!(mark_cell(at, 1 << 12), at.word % (1 << 12));
    let other = place(&addr, false, 32, 4, 9);
    assert_ne!(at.word, other.word, "another budget, another cell");
}

#[test]
fn a_word_is_touched_only_in_the_epoch_that_counted_in_it() {
    assert!(!touched(0, 0), "a word never counted in, at tag 0");
    let place = place(&v4(0x0a00_0001), false, 32, 0, 7);
    let word = bumped(0, 5, place);
    assert!(touched(word, 5));
    assert!(!touched(word, 4) && !touched(word, 6));
}

#[test]
fn sources_of_one_word_spread_over_its_pairs() {
    let mut pairs: std::collections::BTreeMap<u32, std::collections::BTreeSet<(u32, u32)>> =
        std::collections::BTreeMap::new();
    for i in 0u32..61 * WORDS {
        let p = place(&v4(0x0a00_0000 + i), false, 32, 0, 7);
        if p.word < 256 {
            pairs.entry(p.word).or_default().insert((p.a, p.b));
        }
    }
    // About 61 sources a word over 42 ordered pairs: about 32 distinct.
    let mean = pairs.values().map(|s| s.len()).sum::<usize>() as f64 / pairs.len() as f64;
    assert!(mean > 25.0, "{mean:.1} distinct pairs per word");
}

#[test]
fn places_spread_over_the_words_and_pairs_and_depend_on_the_seed() {
    let mut words = std::vec![0u32; 256];
    let mut pairs = [[0u32; SLOTS as usize]; SLOTS as usize];
    for i in 0u32..200_000 {
        let p = place(&v4(0x0a00_0000 + i), false, 32, 0, 7);
        assert!(p.word < WORDS && p.a < SLOTS && p.b < SLOTS && p.a != p.b);
        words[(p.word >> (WORDS.trailing_zeros() - 8)) as usize] += 1;
        pairs[p.a as usize][p.b as usize] += 1;
    }
    // 200,000 keys over 256 groups of words: about 781 each.
    let (min, max) = (words.iter().min().unwrap(), words.iter().max().unwrap());
    assert!(*min > 600 && *max < 1000, "uneven words: {min}..{max}");
    // Over the 42 ordered pairs: about 4,762 each.
    for (a, row) in pairs.iter().enumerate() {
        for (b, n) in row.iter().enumerate() {
            if a != b {
                assert!(*n > 3_500 && *n < 6_000, "pair {a},{b}: {n}");
            }
        }
    }
    let addr = v4(0x0a00_0001);
    assert_ne!(place(&addr, false, 32, 0, 1), place(&addr, false, 32, 0, 2));
    assert_ne!(place(&addr, false, 32, 0, 1), place(&addr, false, 32, 1, 1));
}

#[test]
fn unmarked_counts_take_the_marks_off() {
    let seen = |current, previous| Seen { current, previous };
    assert_eq!(seen(3, 2).unmarked(), 5);
    assert_eq!(seen(WINDOWED + 4, 2).unmarked(), 6);
    assert_eq!(seen(WINDOWED, WINDOWED + 1).unmarked(), 1);
}
