//! The ring-buffer event the kernel sends when a source starts being
//! refused, or when a cluster-scoped source gets hot on this node
//! (rate-limited per CPU, so a spoofed flood cannot flood the log).

use crate::SourceKey;

/// What a [`LimitEvent`] reports.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A source began to be refused (an episode of refusals).
    Limited = 0,
    /// A cluster-scoped source's window on this node reached the cluster
    /// threshold (`ClusterState::threshold_permille`) of its effective
    /// allowance, or was refused: the daemon syncs it. Once per window.
    ClusterHot = 1,
}

impl EventKind {
    /// The kind a byte encodes (`None` for any other byte).
    #[inline(always)]
    pub const fn from_u8(value: u8) -> Option<EventKind> {
        match value {
            0 => Some(EventKind::Limited),
            1 => Some(EventKind::ClusterHot),
            _ => None,
        }
    }
}

/// A source began to be refused (dropped, or would-drop in dry-run), or
/// a cluster-scoped source got hot ([`LimitEvent::kind`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitEvent {
    /// [`EventKind::Limited`]: the source's key (its frame class as the
    /// class). [`EventKind::ClusterHot`]: its window key (the rule's
    /// `budget` byte as the class), the key of its `CLUSTER_SHARES` entry.
    pub key: SourceKey,
    /// The `RULES` index that refused it (or whose window got hot).
    pub rule: u32,
    /// Kernel monotonic (coarse) time of the first refusal (or of the
    /// frame that found the window hot), ns.
    pub at_ns: u64,
    /// Non-zero when the rule or the global configuration is in dry-run
    /// ([`LimitEvent::dry_run`]).
    dry_run: u8,
    /// An [`EventKind`] value; 0, limited, in events of daemons before
    /// cluster limits.
    kind: u8,
    /// Which limit refused the source: 0 its own, else 1 + the index of
    /// its rule's level ([`LimitEvent::level`]).
    level: u8,
    _pad0: u8,
    _pad1: u32,
}

impl LimitEvent {
    /// The event for `key` refused by rule `rule` at `at_ns` (only counted
    /// as would-drop when `dry_run`).
    #[inline(always)]
    pub const fn new(key: SourceKey, rule: u32, at_ns: u64, dry_run: bool) -> Self {
        Self {
            key,
            rule,
            at_ns,
            dry_run: dry_run as u8,
            kind: EventKind::Limited as u8,
            level: 0,
            _pad0: 0,
            _pad1: 0,
        }
    }

    /// The event for the cluster-scoped source whose window key is
    /// `window_key`, hot under rule `rule` at `at_ns`.
    #[inline(always)]
    pub const fn cluster_hot(window_key: SourceKey, rule: u32, at_ns: u64) -> Self {
        Self {
            key: window_key,
            rule,
            at_ns,
            dry_run: 0,
            kind: EventKind::ClusterHot as u8,
            level: 0,
            _pad0: 0,
            _pad1: 0,
        }
    }

    /// Writes [`LimitEvent::cluster_hot`] into `dst` field by field: the
    /// kernel writes it straight into ring-buffer memory, where an
    /// aggregate copy would become a `memmove`/`memset` call (a frame the
    /// verifier adds to every caller's stack).
    ///
    /// # Safety
    /// `dst` must be valid for writes of a `LimitEvent` and not overlap
    /// `window_key`.
    #[inline(always)]
    pub unsafe fn write_cluster_hot(dst: *mut Self, window_key: &SourceKey, rule: u32, at_ns: u64) {
        // SAFETY: the caller's guarantees; each write is one aligned field.
        unsafe {
            core::ptr::addr_of_mut!((*dst).key).copy_from_nonoverlapping(window_key, 1);
            core::ptr::addr_of_mut!((*dst).rule).write(rule);
            core::ptr::addr_of_mut!((*dst).at_ns).write(at_ns);
            core::ptr::addr_of_mut!((*dst).dry_run).write(0);
            core::ptr::addr_of_mut!((*dst).kind).write(EventKind::ClusterHot as u8);
            core::ptr::addr_of_mut!((*dst).level).write(0);
            core::ptr::addr_of_mut!((*dst)._pad0).write(0);
            core::ptr::addr_of_mut!((*dst)._pad1).write(0);
        }
    }

    /// The same event, refused by its rule's level `level` (1 + its
    /// index; 0: the source's own limit).
    #[inline(always)]
    pub const fn with_level(mut self, level: u8) -> Self {
        self.level = level;
        self
    }

    /// The index of the rule's level that refused the source; `None` when
    /// its own limit did.
    #[inline(always)]
    pub const fn level(&self) -> Option<usize> {
        match self.level {
            0 => None,
            level => Some(level as usize - 1),
        }
    }

    /// Whether the refusal only counted (dry-run), dropping nothing.
    #[inline(always)]
    pub const fn dry_run(&self) -> bool {
        self.dry_run != 0
    }

    /// What the event reports; `None` for a byte no [`EventKind`] encodes.
    #[inline(always)]
    pub const fn kind(&self) -> Option<EventKind> {
        EventKind::from_u8(self.kind)
    }
}

/// "Source limited" events each CPU may send per second; more are dropped
/// (and counted as `Outcome::EventDropped`).
pub const EVENTS_PER_CPU_PER_SECOND: u64 = 64;
/// "Cluster hot" reports each CPU may send per second, a budget of their
/// own: a flood of refused sources spends the other one, not this. More
/// are dropped (counted as `Outcome::ClusterHotDropped`) and retried by
/// the source's next frame.
pub const HOT_REPORTS_PER_CPU_PER_SECOND: u64 = 64;

/// A source refused again within this long is still the same episode.
pub const EPISODE_GAP_NS: u64 = 1_000_000_000;

#[cfg(feature = "user")]
mod user {
    // SAFETY: #[repr(C)], integers and byte arrays with explicit padding:
    // every bit pattern is valid and there are no uninitialised bytes.
    unsafe impl aya::Pod for super::LimitEvent {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_implicit_padding() {
        assert_eq!(core::mem::size_of::<super::LimitEvent>(), 20 + 4 + 8 + 8);
    }

    #[test]
    fn writing_a_cluster_hot_event_in_place_builds_the_same_event() {
        let key = SourceKey::v6([
            0x20, 0x01, 0x0d, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        ]);
        // Garbage first, as ring-buffer memory may hold.
        let mut slot = core::mem::MaybeUninit::new(LimitEvent::new(
            SourceKey::v4([9, 9, 9, 9]),
            u32::MAX,
            u64::MAX,
            true,
        ));
        // SAFETY: a local slot, valid for writes; the key lives apart.
        unsafe { LimitEvent::write_cluster_hot(slot.as_mut_ptr(), &key, 7, 42) };
        // SAFETY: every field was written.
        let written = unsafe { slot.assume_init() };
        assert_eq!(written, LimitEvent::cluster_hot(key, 7, 42));
    }

    #[test]
    fn the_dry_run_flag_reads_back() {
        let key = SourceKey::v4([192, 0, 2, 1]);
        assert!(LimitEvent::new(key, 3, 7, true).dry_run());
        let event = LimitEvent::new(key, 3, 7, false);
        assert!(!event.dry_run());
        assert_eq!((event.key, event.rule, event.at_ns), (key, 3, 7));
    }

    #[test]
    fn the_kind_reads_back_and_limited_is_the_old_zero_byte() {
        let key = SourceKey::v4([192, 0, 2, 1]);
        assert_eq!(
            LimitEvent::new(key, 3, 7, true).kind(),
            Some(EventKind::Limited)
        );
        let hot = LimitEvent::cluster_hot(key, 4, 9);
        assert_eq!(hot.kind(), Some(EventKind::ClusterHot));
        assert!(!hot.dry_run());
        assert_eq!((hot.key, hot.rule, hot.at_ns), (key, 4, 9));
        // The kind byte is the first byte after the dry-run flag, where
        // earlier layouts had zero padding.
        assert_eq!(core::mem::offset_of!(LimitEvent, kind), 20 + 4 + 8 + 1);
        assert_eq!(EventKind::from_u8(2), None);
    }
}
