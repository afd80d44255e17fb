//! Per-source state: offered traffic per CPU (`SourceTraffic`, in the
//! per-CPU `SOURCES` map) and the shared admission window (`WindowState`,
//! in the `WINDOWS` map).

use crate::{
    window::{bytes_in, packets_in, slot_of, WindowCache, BYTES, PACKETS, RING},
    Counter,
};

/// One CPU's view of one source: what it offered, per second, and what was
/// dropped, plus this CPU's caches of the source's rule and window. Written
/// only by its CPU, so no atomics and no shared cache lines.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceTraffic {
    // The first 64 bytes are what every frame touches: keep them together.
    /// Monotonic-clock second that `current` counts.
    pub second: u64,
    /// Frames offered in `second`.
    pub current: Counter,
    /// Frames offered since the entry was created.
    pub total: Counter,
    /// `RULES` index resolved for this source, under `generation`.
    pub rule: u32,
    /// `Config::generation` `rule` was resolved under; 0 = never.
    pub generation: u32,
    /// Until this time (ns) this CPU refuses the source without looking at
    /// its window: it is blocked, or no frame can fit before then.
    pub hold_until_ns: u64,
    /// Frames this CPU may still admit from its lease in the bucket of
    /// `window` without looking at the shared window.
    pub lease_left: u32,
    /// Frames this CPU admitted from its lease that the shared window does
    /// not count yet: counted into the bucket of `window` (where they
    /// came) at this CPU's next look at it (`window::count_leased`).
    pub lease_owed: u32,
    /// Frames offered in `second - 1` (zero if the source was idle then).
    pub previous: Counter,
    /// Frames dropped (or would-be dropped in dry-run) since creation.
    pub dropped: Counter,
    /// When this CPU last refused the source (ns); 0 = never.
    pub last_refused_ns: u64,
    /// This CPU's view of the source's older buckets.
    pub window: WindowCache,
    /// Non-zero: at its last admission the source's window held more than
    /// its rule's `fair_packets`: its rule's levels judge it as heavy
    /// (`rules::level`).
    pub heavy: u32,
    /// Zero: the padding to 8 bytes, explicit.
    pub _pad: u32,
}

impl SourceTraffic {
    /// Counts a frame of `len` bytes at `now_ns` as the only one of the
    /// source so far: in a scratch value that becomes (or stands for) a
    /// new entry, not in a live one.
    #[inline(always)]
    pub fn count_first(&mut self, now_ns: u64, len: u64) {
        let first = Counter {
            packets: 1,
            bytes: len,
        };
        self.second = now_ns / NS_PER_SECOND;
        self.current = first;
        self.total = first;
    }

    /// Counts an offered frame of `len` bytes at `now_ns`.
    #[inline(always)]
    pub fn record_at(&mut self, now_ns: u64, len: u64) {
        // Same second as last time: no division on the common path.
        if now_ns.wrapping_sub(self.second * NS_PER_SECOND) < NS_PER_SECOND {
            self.current.add(len);
            self.total.add(len);
        } else {
            self.record(now_ns / NS_PER_SECOND, len);
        }
    }

    /// Counts an offered frame of `len` bytes in `second`.
    #[inline(always)]
    pub fn record(&mut self, second: u64, len: u64) {
        if second != self.second {
            self.previous = if second == self.second + 1 {
                self.current
            } else {
                Counter::default()
            };
            self.current = Counter::default();
            self.second = second;
        }
        self.current.add(len);
        self.total.add(len);
    }

    /// Frames offered during the last complete second before `now_second`
    /// (the per-second rate).
    pub fn last_second(&self, now_second: u64) -> Counter {
        if self.second + 1 == now_second {
            self.current
        } else if self.second == now_second {
            self.previous
        } else {
            Counter::default()
        }
    }
}

const NS_PER_SECOND: u64 = 1_000_000_000;

/// A source's admission window, shared by all CPUs. Only admitted frames
/// write it (compare-and-swap on one slot word); a flood over its limit is
/// refused from each CPU's own cache and does not even read it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowState {
    /// `[packets, bytes]` admitted per bucket, tagged words (`window`).
    pub slots: [[u64; 2]; RING],
    /// Hold: refused until this monotonic time (ns), while the rule in
    /// force carries `blocked_tag`.
    pub blocked_until_ns: u64,
    /// The `Rule::block_tag` of the rule that armed the penalty.
    pub blocked_tag: u64,
    /// Bucket width the slots are tagged with; a rule change that alters
    /// it clears the slots.
    pub bucket_ns: u64,
    /// When this window was last reported hot to the cluster sync (ns; 0:
    /// never): a cluster-scoped source is reported at most once per
    /// window length, whichever CPU finds it hot (compare-and-swap).
    pub hot_reported_ns: u64,
    /// Non-zero: at the source's last admission its window held more than
    /// its rule's `fair_packets` (heavy for the rule's levels); what a
    /// source without per-CPU state is judged as by the levels (a hot
    /// source keeps its own copy, `SourceTraffic::heavy`). Written only
    /// for a rule with levels, and only when it changes.
    pub heavy: u64,
}

impl WindowState {
    pub const ZERO: WindowState = WindowState {
        slots: [[0; 2]; RING],
        blocked_until_ns: 0,
        blocked_tag: 0,
        bucket_ns: 0,
        hot_reported_ns: 0,
        heavy: 0,
    };

    /// Whether a penalty armed by the rule tagged `block_tag` holds at
    /// `now_ns`.
    pub const fn blocked_at(&self, now_ns: u64, block_tag: u64) -> bool {
        block_tag != 0 && self.blocked_tag == block_tag && now_ns < self.blocked_until_ns
    }

    /// Frames admitted per second over the complete buckets of about the
    /// last second before `now_ns` (at least one bucket, at most `RING - 1`):
    /// what the daemon observes of a source that has a window but no
    /// per-CPU state. Zero for a window without a width yet.
    pub fn recent_pps(&self, now_ns: u64) -> u64 {
        if self.bucket_ns == 0 {
            return 0;
        }
        let now_bucket = now_ns / self.bucket_ns;
        let buckets = 1_000_000_000u64
            .div_ceil(self.bucket_ns)
            .clamp(1, RING as u64 - 1)
            .min(now_bucket);
        let packets: u64 = (now_bucket - buckets..now_bucket)
            .map(|bucket| packets_in(self.slots[slot_of(bucket)][PACKETS], bucket))
            .sum();
        let span_ns = (buckets * self.bucket_ns) as u128;
        (packets as u128 * 1_000_000_000 / span_ns.max(1)) as u64
    }

    /// Whether the window counts nothing at `now_ns`: no slot counts a
    /// frame or a byte in any bucket of the longest window its bucket
    /// width allows (`RING` buckets), nor in the bucket after now (a CPU's
    /// clock may run a bucket ahead of the caller's). Deleting it then
    /// changes no count: a window created again for its source starts from
    /// the same zero counts, and comes back blocked if `HOLDS` keeps a
    /// penalty for it (a penalty that did not fit there goes with the
    /// window: `Outcome::HoldFailed`).
    ///
    /// Walked slot by slot (a fixed `RING` steps, each looking at the at
    /// most two buckets of the span that land in it), so that the kernel
    /// program can run it too (`judge/tickets.rs`).
    pub fn idle_at(&self, now_ns: u64) -> bool {
        let ring = RING as u64;
        let mut i = 0;
        if self.bucket_ns == 0 {
            while i < RING {
                if self.slots[i] != [0, 0] {
                    return false;
                }
                i += 1;
            }
            return true;
        }
        let now_bucket = now_ns / self.bucket_ns;
        let first = now_bucket.saturating_sub(ring);
        let last = now_bucket + 1;
        while i < RING {
            let slot = &self.slots[i];
            // The newest bucket of the span in slot `i`, and the one a ring
            // before it.
            let back = last.wrapping_sub(i as u64) & (ring - 1);
            if back <= last {
                let newest = last - back;
                let counts = |bucket: u64| {
                    packets_in(slot[PACKETS], bucket) != 0 || bytes_in(slot[BYTES], bucket) != 0
                };
                if counts(newest) || (newest >= first + ring && counts(newest - ring)) {
                    return false;
                }
            }
            i += 1;
        }
        true
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY (all): #[repr(C)] structs of integers with no padding (the
    // size tests below): every bit pattern is valid and there are no
    // uninitialised bytes.
    unsafe impl aya::Pod for super::SourceTraffic {}
    unsafe impl aya::Pod for super::WindowState {}
    unsafe impl aya::Pod for super::Hold {}
}

/// A penalty, kept apart from the source's window in `HOLDS` (a plain
/// hash map, which never evicts): a window reclaimed idle and created
/// again while its source is blocked comes back blocked, whichever CPU
/// creates it, and a blocked window need not be kept for the penalty's
/// length.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hold {
    /// Held until then (ns).
    pub until_ns: u64,
    /// The `Rule::block_tag` of the rule that armed it (the source is
    /// dropped until `until_ns` while the rule in force carries it).
    pub tag: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::{pack_bytes, pack_packets};

    const BUCKET: u64 = 100_000_000;

    /// A window of 100 ms buckets counting `packets` in the bucket of `at`.
    fn window_counting(at: u64, packets: u64) -> WindowState {
        let bucket = at / BUCKET;
        let mut window = WindowState {
            bucket_ns: BUCKET,
            ..WindowState::ZERO
        };
        window.slots[slot_of(bucket)][PACKETS] = pack_packets(bucket, 0, packets);
        window
    }

    #[test]
    fn a_window_is_idle_once_its_last_count_is_older_than_the_ring() {
        let at = 1_000 * BUCKET + 5;
        let window = window_counting(at, 3);
        assert!(!window.idle_at(at), "counting now");
        assert!(!window.idle_at(at - BUCKET), "a clock a bucket behind");
        assert!(
            !window.idle_at(at + RING as u64 * BUCKET),
            "still in the ring"
        );
        assert!(window.idle_at(at + (RING as u64 + 1) * BUCKET));
        assert!(window.idle_at(at + 1_000 * BUCKET));
        assert!(WindowState::ZERO.idle_at(at), "never used");
    }

    /// The slot-by-slot walk agrees with the plain definition (no slot
    /// counts anything in any bucket from `RING` before now to the one
    /// after), for windows written anywhere around now.
    #[test]
    fn idle_at_is_its_definition() {
        let definition = |window: &WindowState, now: u64| {
            let now_bucket = now / window.bucket_ns;
            (now_bucket.saturating_sub(RING as u64)..=now_bucket + 1).all(|bucket| {
                let slot = &window.slots[slot_of(bucket)];
                packets_in(slot[PACKETS], bucket) == 0 && bytes_in(slot[BYTES], bucket) == 0
            })
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let bucket_ns = 1 + next() % 1_000;
            let mut window = WindowState::ZERO;
            window.bucket_ns = bucket_ns;
            let now = next() % (100 * bucket_ns);
            let now_bucket = now / bucket_ns;
            for _ in 0..(next() % 3) {
                let bucket = (now_bucket + 40).saturating_sub(next() % 60);
                let slot = slot_of(bucket);
                if next() % 2 == 0 {
                    window.slots[slot][PACKETS] = crate::window::pack_packets(bucket, 0, 1);
                } else {
                    window.slots[slot][BYTES] = crate::window::pack_bytes(bucket, 60);
                }
            }
            assert_eq!(
                window.idle_at(now),
                definition(&window, now),
                "{window:?} at {now}"
            );
        }
    }

    #[test]
    fn a_windows_recent_rate_is_its_last_complete_second() {
        let now = 1_000 * BUCKET + 50_000_000;
        let mut window = WindowState {
            bucket_ns: BUCKET,
            ..WindowState::ZERO
        };
        // 3 frames in each of the 10 buckets before now's, 40 in now's
        // (incomplete, not counted), 99 eleven buckets back (too old).
        for back in 1..=10 {
            let bucket = 1_000 - back;
            window.slots[slot_of(bucket)][PACKETS] = pack_packets(bucket, 0, 3);
        }
        window.slots[slot_of(1_000)][PACKETS] = pack_packets(1_000, 0, 40);
        window.slots[slot_of(989)][PACKETS] = pack_packets(989, 0, 99);
        assert_eq!(window.recent_pps(now), 30);
        // A 6 s bucket (a minute's window): the last complete one, per second.
        let wide = 6 * NS_PER_SECOND;
        let mut minute = WindowState {
            bucket_ns: wide,
            ..WindowState::ZERO
        };
        minute.slots[slot_of(99)][PACKETS] = pack_packets(99, 0, 60);
        assert_eq!(minute.recent_pps(100 * wide + 1), 10);
        assert_eq!(WindowState::ZERO.recent_pps(now), 0);
    }

    #[test]
    fn a_window_with_bytes_is_not_idle_and_a_penalty_does_not_keep_it() {
        let at = 1_000 * BUCKET;
        let later = at + 100 * BUCKET;
        let mut bytes = window_counting(at, 0);
        let bucket = later / BUCKET;
        bytes.slots[slot_of(bucket)][BYTES] = pack_bytes(bucket, 60);
        assert!(!bytes.idle_at(later));
        // `HOLDS` keeps the penalty; the window goes once it counts
        // nothing.
        let blocked = WindowState {
            blocked_until_ns: later + 1,
            blocked_tag: 7,
            ..window_counting(at, 1)
        };
        assert!(blocked.idle_at(later));
    }

    #[test]
    fn traffic_rolls_seconds_over() {
        let mut t = SourceTraffic::default();
        t.count_first(100 * NS_PER_SECOND, 60);
        t.record(100, 40);
        assert_eq!(
            t.current,
            Counter {
                packets: 2,
                bytes: 100
            }
        );
        t.record(101, 10);
        assert_eq!(
            t.previous,
            Counter {
                packets: 2,
                bytes: 100
            }
        );
        assert_eq!(
            t.current,
            Counter {
                packets: 1,
                bytes: 10
            }
        );
        assert_eq!(
            t.last_second(101),
            Counter {
                packets: 2,
                bytes: 100
            }
        );
        assert_eq!(
            t.last_second(102),
            Counter {
                packets: 1,
                bytes: 10
            }
        );
        assert_eq!(t.last_second(103), Counter::default());
        t.record(105, 1);
        assert_eq!(t.previous, Counter::default(), "an idle gap clears history");
        assert_eq!(
            t.total,
            Counter {
                packets: 4,
                bytes: 111
            }
        );
        t.record_at(105_500_000_000, 2);
        assert_eq!(t.current.packets, 2, "same second, no rollover");
        t.record_at(106_000_000_000, 2);
        assert_eq!(t.second, 106);
        assert_eq!(t.previous.packets, 2);
        assert_eq!(t.current.packets, 1);
    }

    #[test]
    fn a_first_frame_counted_in_a_scratch_is_the_second_of_its_time() {
        let mut t = SourceTraffic::default();
        t.count_first(100 * NS_PER_SECOND + 5, 60);
        assert_eq!((t.second, t.current.packets, t.total.bytes), (100, 1, 60));
        // Later frames of that second add to it without a division.
        t.record_at(100 * NS_PER_SECOND + 999_999_999, 40);
        assert_eq!((t.second, t.current.packets, t.total.bytes), (100, 2, 100));
    }

    #[test]
    fn the_per_frame_fields_share_the_first_cache_line() {
        assert_eq!(core::mem::offset_of!(SourceTraffic, previous), 64);
    }

    #[test]
    fn abi_sizes_have_no_implicit_padding() {
        let cache = 9 * 8;
        assert_eq!(
            core::mem::size_of::<SourceTraffic>(),
            8 + 4 * 16 + 4 + 4 + 8 + 4 + 4 + 8 + cache + 4 + 4
        );
        assert_eq!(core::mem::size_of::<Hold>(), 16);
        assert_eq!(core::mem::size_of::<WindowState>(), RING * 16 + 5 * 8);
    }
}
