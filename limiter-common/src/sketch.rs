//! The cold tier: epoch-tagged frame counters that every CPU shares
//! (`SKETCH`), found by a keyed hash of the source key. What a source's
//! counters read is at least the frames it sent in the current epoch
//! (other sources hashing to the same counters only add to them), so "at
//! most `T` counted" is a sound test for "sent at most `T` frames this
//! epoch", whatever the flood around it: sharing counters can only make a
//! source look busier, never quieter.
//!
//! An entry ([`Pair`]) holds the words of the two latest epochs, by the
//! parity of the epoch, in one cache line: a source reads what it sent
//! this epoch and the last ([`Seen`]): the cheap tier admits a source's
//! frame only while that reads at most its rule's cheap frames, so it
//! admits at most that many in any two consecutive epochs (and nothing it
//! admits is counted anywhere else: what the sketch reads may be other
//! sources' frames). A source that has a window marks its counters
//! [`WINDOWED`] (once an epoch, on its first frame past the cheap tier):
//! while either epoch holds the mark, its frames skip the cheap tier.
//!
//! A word is a `u64`: an 8-bit epoch tag and seven 8-bit counters. A
//! source owns two of the seven counters of its word (a count-min sketch
//! of two rows whose rows share the word) and reads the smaller; a frame
//! raises that by one, each counter only as far as needed (conservative
//! update). One compare-and-swap of the whole word counts a frame, so
//! frames are totally ordered per word and the k-th frame of a source in
//! an epoch reads a count of at least k: the bound is exact, on any number
//! of CPUs. A word of another epoch reads as zero and restarts on its first
//! frame of the new epoch, so the sketch is never cleared.
//!
//! Size: 2^16 entries of two words, 1 MiB, whatever the CPU count. Large
//! enough that a spoofed flood of a million frames a second leaves few of
//! its one-frame sources reading more than ten over two epochs (the cheap
//! frames of a rule of 10 pps; docs/architecture.md has the figures), small
//! enough to stay in the second-level cache (a larger sketch costs a new
//! source more in cache misses than it saves:
//! docs/benchmarks.md). Two counters
//! of seven per source keep the noise of a flood low (another source adds
//! to both of a source's counters only when it has the same word and the
//! same pair, one chance in 21 within a word).

/// Entries in the sketch (each a [`Pair`] of words).
pub const WORDS: u32 = 1 << 16;
/// An entry: the word of the even epoch and the word of the odd one.
pub type Pair = [u64; 2];
/// A count that marks a source as windowed (it has, or had, a window in
/// the exact tier or per-CPU state), above any cheap-frame limit (at most
/// 64) and below [`HOT_FRAMES`]: a source that reads at least this counted
/// past the cheap tier already, or was marked by its own frames.
pub const WINDOWED: u32 = 128;
/// A source that sends more than this many frames in an epoch is busy: it
/// gets per-CPU state (for its leases, which make a busy source's frames
/// cheap), and the sketch stops counting it (its counters are then only
/// read, so a flood from one source does not bounce a cache line between
/// CPUs).
pub const HOT_FRAMES: u32 = 200;
/// Length of an epoch: counts start afresh every second.
pub const EPOCH_NS: u64 = 1_000_000_000;
/// The pairs of consecutive epochs a window of `window_ns` overlaps at
/// most: it overlaps at most `ceil(W / epoch) + 1` epochs, taken two at a
/// time. A source's reading covers two epochs (this one and the last), so
/// a bound on what it reads bounds its frames in any window by that bound
/// times this.
#[inline(always)]
pub const fn epoch_pairs(window_ns: u64) -> u64 {
    (window_ns.div_ceil(EPOCH_NS) + 1).div_ceil(2)
}

/// Counters per word.
pub const SLOTS: u32 = 7;
/// The largest count a counter holds (it saturates there).
pub const MAX_COUNT: u32 = 255;
const TAG_SHIFT: u32 = 56;

/// Where a source counts: its word and its two counters in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub word: u32,
    a: u32,
    b: u32,
}

/// The epoch tag of time `now_ns`.
#[inline(always)]
pub const fn tag(now_ns: u64) -> u64 {
    (now_ns / EPOCH_NS) & 0xff
}

#[inline(always)]
const fn counter(word: u64, slot: u32) -> u32 {
    ((word >> (slot * 8)) & 0xff) as u32
}

/// What a source at `place` reads in `word` for the epoch tagged `tag`:
/// the smaller of its two counters (zero for a word of another epoch).
#[inline(always)]
pub const fn count(word: u64, tag: u64, place: Place) -> u32 {
    if word >> TAG_SHIFT != tag {
        return 0;
    }
    let (a, b) = (counter(word, place.a), counter(word, place.b));
    if a < b {
        a
    } else {
        b
    }
}

/// The index in a [`Pair`] of the word of the epoch tagged `tag`.
#[inline(always)]
pub const fn half(tag: u64) -> usize {
    (tag & 1) as usize
}

/// The tag of the epoch before the one tagged `tag`.
#[inline(always)]
pub const fn previous(tag: u64) -> u64 {
    tag.wrapping_sub(1) & 0xff
}

/// What a source reads in its [`Pair`]: its count in this epoch and in
/// the last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub current: u32,
    pub previous: u32,
}

impl Seen {
    /// What a source whose counting keeps losing its compare-and-swap
    /// reads: busy, and windowed.
    pub const BUSY: Seen = Seen {
        current: MAX_COUNT,
        previous: MAX_COUNT,
    };

    /// The frames counted over both epochs: at least what the source sent
    /// since the start of the last epoch.
    #[inline(always)]
    pub const fn total(self) -> u32 {
        self.current + self.previous
    }

    /// Whether either epoch holds the [`WINDOWED`] mark (or that many
    /// frames).
    #[inline(always)]
    pub const fn windowed(self) -> bool {
        self.current >= WINDOWED || self.previous >= WINDOWED
    }
}

/// What the source at `place` reads in `pair` in the epoch tagged `tag`.
#[inline(always)]
pub const fn seen(pair: &Pair, tag: u64, place: Place) -> Seen {
    Seen {
        current: count(pair[half(tag)], tag, place),
        previous: count(pair[half(tag) ^ 1], previous(tag), place),
    }
}

/// `word` with the source at `place` marked windowed in the epoch tagged
/// `tag` (restarted if it held another epoch): both its counters raised to
/// at least [`WINDOWED`], so it reads at least that.
#[inline(always)]
pub const fn marked(word: u64, tag: u64, place: Place) -> u64 {
    let mut word = if word >> TAG_SHIFT == tag {
        word
    } else {
        tag << TAG_SHIFT
    };
    let (a, b) = (counter(word, place.a), counter(word, place.b));
    if a < WINDOWED {
        word += ((WINDOWED - a) as u64) << (place.a * 8);
    }
    if b < WINDOWED {
        word += ((WINDOWED - b) as u64) << (place.b * 8);
    }
    word
}

/// Cells of the share marks (`SHARE_MARKS`): until when a source whose cell
/// it is may have a cluster share (ns; 0: never). As many as the sketch's
/// entries: there may be as many shares as cluster sources synced.
pub const SHARE_CELLS: u32 = WORDS;

/// The mark cell, among `cells` (a power of two), of the source whose
/// place in the sketch, as keyed by its rule's budget rather than its
/// frame's class, is `place` (penalties and shares belong to a window,
/// and a window is keyed by the budget): the low bits of its entry, so
/// that a source whose class is its budget (every source of a rule set
/// without matches) needs no second hash.
#[inline(always)]
pub const fn mark_cell(place: Place, cells: u32) -> u32 {
    place.word & (cells - 1)
}

/// Whether `word` counted a frame in the epoch tagged `tag` (a word never
/// counted in is all zero, whatever the tag).
#[inline(always)]
pub const fn touched(word: u64, tag: u64) -> bool {
    word >> TAG_SHIFT == tag && word & ((1 << TAG_SHIFT) - 1) != 0
}

/// `word` with one more frame of the source at `place` in the epoch
/// tagged `tag` (restarted if it held another epoch), by conservative
/// update: what the source reads goes up by one (saturating at
/// [`MAX_COUNT`]), and each of its two counters only as far as that, so a
/// counter another source already pushed higher stays as it is. The
/// source still reads at least its own frames (both counters are at least
/// what it read, plus one), while a flood of other sources adds to
/// counters about half as fast as adding one to both would.
#[inline(always)]
pub const fn bumped(word: u64, tag: u64, place: Place) -> u64 {
    let mut word = if word >> TAG_SHIFT == tag {
        word
    } else {
        tag << TAG_SHIFT
    };
    let (a, b) = (counter(word, place.a), counter(word, place.b));
    let least = if a < b { a } else { b };
    let target = if least < MAX_COUNT { least + 1 } else { least };
    if a < target {
        word += ((target - a) as u64) << (place.a * 8);
    }
    if b < target {
        word += ((target - b) as u64) << (place.b * 8);
    }
    word
}

/// One mixing round of the hash (a multiply-xorshift, cheap in BPF).
#[inline(always)]
const fn mix(hash: u32, word: u32) -> u32 {
    let h = (hash ^ word).wrapping_mul(0x9e37_79b1);
    h ^ (h >> 15)
}

/// Where a source counts: a hash of its key's address, prefix length and
/// class, keyed by `seed` (chosen at random by userspace, so that nobody
/// outside can aim frames at one word).
#[inline(always)]
pub fn place(addr: &[u8; 16], ipv6: bool, prefix_len: u8, class: u8, seed: u32) -> Place {
    let word = |i: usize| u32::from_le_bytes([addr[i], addr[i + 1], addr[i + 2], addr[i + 3]]);
    let mut hash = mix(seed, word(0));
    if ipv6 {
        hash = mix(hash, word(4));
        hash = mix(hash, word(8));
        hash = mix(hash, word(12));
    }
    hash = mix(hash, (u32::from(prefix_len) << 8) | u32::from(class));
    // The top bits pick the word (they are the best mixed); the pair of
    // counters, any two distinct of the seven, comes from the bits below
    // them (independent of the word: sources sharing a word spread over
    // its 21 pairs), by multiply-shift range reduction (a remainder would
    // be a division, slow in BPF).
    let word_bits = WORDS.trailing_zeros();
    let range = |value: u32, n: u32| ((u64::from(value) * u64::from(n)) >> 32) as u32;
    let a = range(hash << word_bits, SLOTS);
    let mut b = a + 1 + range(hash << (32 - 8), SLOTS - 1);
    if b >= SLOTS {
        b -= SLOTS;
    }
    Place {
        word: hash >> (32 - word_bits),
        a,
        b,
    }
}

#[cfg(test)]
mod tests {
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
}
