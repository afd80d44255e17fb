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
    /// Non-zero when the rule or the global configuration is in dry-run.
    pub dry_run: u8,
    pub _pad: [u8; 7],
}

/// Events each CPU may send per second; more are dropped (and counted in
/// the `EVENTS_DROPPED` stats slot).
pub const EVENTS_PER_CPU_PER_SECOND: u64 = 64;

/// A source refused again within this long is still the same episode.
pub const EPISODE_GAP_NS: u64 = 1_000_000_000;

#[cfg(test)]
mod tests {
    #[test]
    fn no_implicit_padding() {
        assert_eq!(core::mem::size_of::<super::LimitEvent>(), 20 + 4 + 8 + 8);
    }
}
