//! The ring-buffer event the kernel sends when a source starts being
//! refused (rate-limited per CPU, so a spoofed flood cannot flood the log).

use crate::SourceKey;

/// A source began to be refused (dropped, or would-drop in dry-run).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitEvent {
    pub key: SourceKey,
    /// The `RULES` index that refused it.
    pub rule: u32,
    /// Kernel monotonic (coarse) time of the first refusal, ns.
    pub at_ns: u64,
    /// Non-zero when the rule or the global configuration is in dry-run
    /// ([`LimitEvent::dry_run`]).
    dry_run: u8,
    _pad: [u8; 7],
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
            _pad: [0; 7],
        }
    }

    /// Whether the refusal only counted (dry-run), dropping nothing.
    #[inline(always)]
    pub const fn dry_run(&self) -> bool {
        self.dry_run != 0
    }
}

/// Events each CPU may send per second; more are dropped (and counted in
/// the `EVENTS_DROPPED` stats slot).
pub const EVENTS_PER_CPU_PER_SECOND: u64 = 64;

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
    fn the_dry_run_flag_reads_back() {
        let key = SourceKey::v4([192, 0, 2, 1]);
        assert!(LimitEvent::new(key, 3, 7, true).dry_run());
        let event = LimitEvent::new(key, 3, 7, false);
        assert!(!event.dry_run());
        assert_eq!((event.key, event.rule, event.at_ns), (key, 3, 7));
    }
}
