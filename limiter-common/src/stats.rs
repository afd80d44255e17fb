//! Counters and the `Outcome` index of the global per-CPU stats array.

/// A packet and byte counter pair. Bytes are whole frame lengths as XDP
/// sees them (Ethernet header included).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}

impl Counter {
    /// Counts one frame of `len` bytes.
    #[inline(always)]
    pub fn add(&mut self, len: u64) {
        self.packets += 1;
        self.bytes += len;
    }

    /// Sum of two counters (used to fold per-CPU values).
    pub const fn merged(self, other: Counter) -> Counter {
        Counter {
            packets: self.packets + other.packets,
            bytes: self.bytes + other.bytes,
        }
    }
}

/// What happened to a frame; the index into the `STATS` per-CPU array.
///
/// Every frame counts under exactly one of the verdict outcomes (`Passed`
/// through `Malformed`). `NewSource` and `InsertFailure` count events on
/// the state maps in addition to the frame's verdict.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Under its limit (or no rules loaded yet): passed.
    Passed = 0,
    /// Over its limit, or blocked by a penalty: dropped.
    DroppedLimit = 1,
    /// Matched a `deny` rule: dropped.
    DroppedDeny = 2,
    /// Matched an `allow` rule: passed, never limited.
    Allowed = 3,
    /// Would have been dropped (limit, penalty or deny) but dry-run is on
    /// globally or for its rule: passed.
    DryRunWouldDrop = 4,
    /// Not IPv4/IPv6 (ARP, LLDP, ...): passed untouched.
    NonIp = 5,
    /// An IP frame too short for its headers or with invalid header fields:
    /// passed untouched for the stack to reject.
    Malformed = 6,
    /// The frame created state (a `SOURCES` entry) for its source.
    NewSource = 7,
    /// A state map refused a new source; the frame was judged without
    /// per-source state (limit rules fail closed).
    InsertFailure = 8,
    /// A "source limited" event was not sent: over the per-CPU rate of
    /// those events or the ring buffer was full (the frame counts here with
    /// no verdict).
    EventDropped = 9,
    /// The frame was judged in the cheap tier: no per-source state looked
    /// up or created (its source has sent at most its rule's
    /// `cheap_frames` this epoch).
    Cheap = 10,
    /// The frame created its source's shared window (`WINDOWS`), the exact
    /// tier; with the tiers on, per-CPU state (`NewSource`) comes later,
    /// if the source gets busy or refused.
    NewWindow = 11,
    /// A "cluster hot" report was not sent: over the per-CPU rate of those
    /// reports (a budget apart from "source limited" events) or the ring
    /// buffer was full. The window's claim is released, so a later frame
    /// of the source reports it.
    ClusterHotDropped = 12,
    /// The frame's source had no window and could not get one (`WINDOWS`
    /// full): refused (counted here besides its verdict; the source keeps
    /// its cheap frames; docs/architecture.md, "Full maps").
    WindowFull = 13,
    /// A penalty could not be kept apart from its window (`HOLDS` full):
    /// it lasts only while its window does (the daemon reclaims a window
    /// idle for its longest length, and the penalty goes with it).
    HoldFailed = 14,
    /// A level's aggregate had no window and could not get one
    /// (`AGGREGATES` full): the frame was judged on the level's overflow
    /// cell it hashes to (`AGG_CELLS`), shared with every other such
    /// aggregate of the level that hashes there (counted here besides its
    /// verdict).
    AggregateFull = 15,
    /// The frame created an aggregate within 61 s (the longest level window and an epoch) after `AGGREGATES`
    /// was found full: it starts with its overflow cell's counts (what its
    /// sources may have been admitted on the cell, and what other
    /// aggregates were), so nothing is admitted twice; the refusing side
    /// (counted here besides its verdict).
    FullSeeded = 16,
    /// The frame's source is banned (`xdp-limiter ban`, fail2ban,
    /// CrowdSec): refused as a deny (counted here besides its verdict).
    /// A list's frames count under their verdict (`Allowed`,
    /// `DroppedDeny`) and in their list's `LIST_HITS`.
    Banned = 17,
    /// The frame proved its TCP source (the handshake's last ACK carries
    /// a valid SYN cookie: the source received our SYN-ACK, so its
    /// address is its own) while no ticket was left: the source got its
    /// window with a ticket of the proven room, which a spoofed flood
    /// cannot fill (docs/architecture.md, "Proof before state"; counted
    /// here besides its verdict and `WindowFull`).
    Proven = 18,
    /// A TCP SYN of a source without a window, while no ticket was left,
    /// passed uncounted so that the source can prove itself: at most
    /// `sketch::UNPROVEN_SYNS` over two epochs by the sketch's reading
    /// (counted here besides its verdict).
    UnprovenSyn = 19,
    /// The frame's source had no window and its /48 could not get one
    /// more ticket (`tickets::Rooms::prefix`, read on both its cells in
    /// `PREFIX_TICKETS`): refused as `WindowFull` is (and counted as it
    /// too), so that one holder of a /48 takes its prefix's room of its
    /// rule's tickets, not all of them (counted here besides its verdict).
    PrefixFull = 20,
}

impl Outcome {
    /// Number of outcomes: the `STATS` array length.
    pub const COUNT: u32 = 21;

    /// Every outcome, in index order.
    pub const ALL: [Outcome; Self::COUNT as usize] = [
        Outcome::Passed,
        Outcome::DroppedLimit,
        Outcome::DroppedDeny,
        Outcome::Allowed,
        Outcome::DryRunWouldDrop,
        Outcome::NonIp,
        Outcome::Malformed,
        Outcome::NewSource,
        Outcome::InsertFailure,
        Outcome::EventDropped,
        Outcome::Cheap,
        Outcome::NewWindow,
        Outcome::ClusterHotDropped,
        Outcome::WindowFull,
        Outcome::HoldFailed,
        Outcome::AggregateFull,
        Outcome::FullSeeded,
        Outcome::Banned,
        Outcome::Proven,
        Outcome::UnprovenSyn,
        Outcome::PrefixFull,
    ];

    /// The verdicts, `Passed` through `Malformed`: every frame counts under
    /// exactly one of them. The outcomes after them count events.
    pub const VERDICTS: &'static [Outcome] = Self::ALL.split_at(Outcome::NewSource as usize).0;

    /// Stable snake_case name, used in logs and metrics labels.
    pub const fn name(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::DroppedLimit => "dropped_limit",
            Outcome::DroppedDeny => "dropped_deny",
            Outcome::Allowed => "allowed",
            Outcome::DryRunWouldDrop => "dry_run_would_drop",
            Outcome::NonIp => "non_ip",
            Outcome::Malformed => "malformed",
            Outcome::NewSource => "new_source",
            Outcome::InsertFailure => "insert_failure",
            Outcome::EventDropped => "event_dropped",
            Outcome::Cheap => "cheap",
            Outcome::NewWindow => "new_window",
            Outcome::ClusterHotDropped => "cluster_hot_dropped",
            Outcome::WindowFull => "window_full",
            Outcome::HoldFailed => "hold_failed",
            Outcome::AggregateFull => "aggregate_full",
            Outcome::FullSeeded => "full_seeded",
            Outcome::Banned => "banned",
            Outcome::Proven => "proven",
            Outcome::UnprovenSyn => "unproven_syn",
            Outcome::PrefixFull => "prefix_full",
        }
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: #[repr(C)], two u64: every bit pattern is valid, no padding.
    unsafe impl aya::Pod for super::Counter {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_dense_indices() {
        for (i, outcome) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*outcome as usize, i, "{}", outcome.name());
        }
        assert_eq!(Outcome::VERDICTS.last(), Some(&Outcome::Malformed));
    }

    #[test]
    fn counter_adds_and_merges() {
        let mut a = Counter::default();
        a.add(60);
        a.add(1500);
        let b = Counter {
            packets: 3,
            bytes: 10,
        };
        assert_eq!(
            a.merged(b),
            Counter {
                packets: 5,
                bytes: 1570
            }
        );
    }
}
