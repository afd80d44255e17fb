//! Per-source state: offered traffic per CPU (`SourceTraffic`, in the
//! per-CPU `SOURCES` map) and the shared admission window (`WindowState`,
//! in the `WINDOWS` map).

use crate::{
    window::{SlotRead, RING},
    Counter,
};

/// One CPU's view of one source: what it offered, per second, and what was
/// dropped. Written only by its CPU, so no atomics and no shared lines.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceTraffic {
    /// Monotonic-clock second that `current` counts.
    pub second: u64,
    /// Frames offered in `second`.
    pub current: Counter,
    /// Frames offered in `second - 1` (zero if the source was idle then).
    pub previous: Counter,
    /// Frames offered since the entry was created.
    pub total: Counter,
    /// Frames dropped (or would-be dropped in dry-run) since creation.
    pub dropped: Counter,
}

impl SourceTraffic {
    /// State for a first frame of `len` bytes in `second`.
    #[inline(always)]
    pub fn first(second: u64, len: u64) -> Self {
        let first = Counter {
            packets: 1,
            bytes: len,
        };
        Self {
            second,
            current: first,
            previous: Counter::default(),
            total: first,
            dropped: Counter::default(),
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

/// A source's admission window, shared by all CPUs. Only admitted frames
/// write it (compare-and-swap on one slot word), so a flood over the limit
/// reads it without bouncing cache lines between CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowState {
    /// `[packets, bytes]` admitted per bucket, tagged words (`window::pack`).
    pub slots: [[u64; 2]; RING],
    /// Penalty: dropped until this monotonic time (ns).
    pub blocked_until_ns: u64,
    /// Bucket width the slots are tagged with; a rule change that alters
    /// it clears the slots.
    pub bucket_ns: u64,
    /// `RULES` index resolved for this source.
    pub rule: u32,
    /// `Config::generation` `rule` was resolved under; 0 = never.
    pub generation: u32,
}

impl WindowState {
    pub const ZERO: WindowState = WindowState {
        slots: [[0; 2]; RING],
        blocked_until_ns: 0,
        bucket_ns: 0,
        rule: 0,
        generation: 0,
    };
}

impl SlotRead for WindowState {
    fn load(&self, slot: usize, field: usize) -> u64 {
        self.slots[slot][field]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_rolls_seconds_over() {
        let mut t = SourceTraffic::first(100, 60);
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
    }

    #[test]
    fn abi_sizes_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<SourceTraffic>(), 8 + 4 * 16);
        assert_eq!(
            core::mem::size_of::<WindowState>(),
            RING * 16 + 8 + 8 + 4 + 4
        );
    }
}
