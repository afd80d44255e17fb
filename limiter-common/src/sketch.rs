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
/// The SYNs of a TCP source without a window that pass, uncounted, while
/// `WINDOWS` is full (`Outcome::UnprovenSyn`): those of a source reading at
/// most this many frames over this epoch and the last. A SYN is how a new
/// client comes to prove its address (the handshake's last ACK carries the
/// cookie of our SYN-ACK); eight over two epochs leave a client its
/// retransmissions and a flood's noise in its counters (a spoofed
/// flood's one-frame sources add to a source's reading only when they
/// share its word and its pair: docs/architecture.md, "Full maps"),
/// and a real source's SYNs past them are refused.
pub const UNPROVEN_SYNS: u32 = 8;
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

    /// The frames counted over both epochs with the marks taken off: of
    /// an epoch marked windowed, those counted after its mark (the mark
    /// raised the count to [`WINDOWED`], hiding at most the frames before
    /// it: the source's cheap frames and one). What bounds the SYNs of a
    /// source without a window (`UNPROVEN_SYNS`), which a mark would
    /// otherwise refuse while the source keeps sending.
    pub const fn unmarked(self) -> u32 {
        const fn since_mark(count: u32) -> u32 {
            if count >= WINDOWED {
                count - WINDOWED
            } else {
                count
            }
        }
        since_mark(self.current) + since_mark(self.previous)
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
mod tests;
