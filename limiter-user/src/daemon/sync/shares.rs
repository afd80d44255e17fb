//! The share writer: the kernel side of the tick. It owns every protected
//! interface's maps, writes each tracked source's allowance into
//! `CLUSTER_SHARES` (only where [`share_due`]) and the cluster state into
//! `CLUSTER`.

use std::time::Duration;

use limiter_common::{ClusterShare, ClusterState, SourceKey};
use tracing::warn;

use super::tracking::Tracking;
use crate::kernel::{cluster as kernel_cluster, Maps};

/// What becomes of the shares this tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shares {
    /// Written (where due) to hold until this kernel time.
    Until(u64),
    /// None written: the fallback applies (they lapse on their own).
    Lapse,
    /// Every share ends now and the allowances are forgotten.
    Revoke,
}

impl Shares {
    /// Written until `expires`, or left to lapse when there is none.
    pub(super) fn until(expires: Option<u64>) -> Self {
        expires.map_or(Shares::Lapse, Shares::Until)
    }
}

/// Each protected interface's maps, opened from their pins (typed handles
/// of their own: the task never waits on the main loop).
pub(super) struct ShareWriter {
    ifaces: Vec<(String, Maps)>,
    interval: Duration,
}

impl ShareWriter {
    pub(super) fn new(ifaces: Vec<(String, Maps)>, interval: Duration) -> Self {
        Self { ifaces, interval }
    }

    /// The interfaces and their maps, for reading.
    pub(super) fn ifaces(&self) -> &[(String, Maps)] {
        &self.ifaces
    }

    /// Applies `shares` to the tracked sources' allowances at kernel time
    /// `now_ns`.
    pub(super) fn write(&mut self, tracking: &mut Tracking, shares: Shares, now_ns: u64) {
        match shares {
            Shares::Until(expires) => self.write_due(tracking, expires, now_ns),
            Shares::Lapse => {}
            Shares::Revoke => {
                self.write_due(tracking, now_ns, now_ns);
                tracking.forget_allowances();
            }
        }
    }

    /// Writes every tracked source's last allowance with `expires_ns`
    /// where [`share_due`]: a share kept unchanged is rewritten only as it
    /// nears its expiry, not every tick (with many tracked sources the
    /// writes would be most of a tick's CPU). One batch per interface; a
    /// share not written is written again next tick.
    fn write_due(&mut self, tracking: &mut Tracking, expires_ns: u64, now_ns: u64) {
        let interval = self.interval;
        let mut due: Vec<_> = tracking
            .allowances_mut()
            .filter(|(_, _, written_until)| {
                share_due(**written_until, expires_ns, now_ns, interval)
            })
            .collect();
        if due.is_empty() {
            return;
        }
        let mut written = vec![true; due.len()];
        for (i, (iface, maps)) in self.ifaces.iter_mut().enumerate() {
            let shares: Vec<(SourceKey, ClusterShare)> = due
                .iter()
                .map(|(key, allowance, _)| {
                    let share = ClusterShare {
                        allowance_packets: allowance[i],
                        expires_ns,
                    };
                    (*key, share)
                })
                .collect();
            if let Err((done, e)) = kernel_cluster::write_shares(maps, &shares) {
                warn!(%iface, error = %e, failed = shares.len() - done,
                    "cluster: cannot write shares (written again next tick)");
                for w in &mut written[done..] {
                    *w = false;
                }
            }
        }
        for ((_, _, written_until), written) in due.iter_mut().zip(written) {
            **written_until = if written { expires_ns } else { 0 };
        }
    }

    /// Writes the cluster state on every interface.
    pub(super) fn write_state(&mut self, state: ClusterState) {
        for (iface, maps) in &mut self.ifaces {
            if let Err(e) = kernel_cluster::write_state(maps, state) {
                warn!(%iface, error = %e, "cluster: cannot write the cluster state");
            }
        }
    }
}

/// Whether a source's share must be written this tick (at kernel time
/// `now_ns`, to hold until `expires_ns`) when the one written last holds
/// until `written_until` (0: none, or its allowance changed): when it
/// changed, when it must end sooner (failing ticks and the grace period
/// hold shares shorter), or when it would otherwise lapse within one and
/// a half intervals, so a kept share (10 intervals, `tick::share_expiry`)
/// is pushed forward every ninth tick and still outlives a tick up
/// to half an interval late.
fn share_due(written_until: u64, expires_ns: u64, now_ns: u64, interval: Duration) -> bool {
    let ahead = (interval * 3 / 2).as_nanos() as u64;
    written_until == 0 || expires_ns < written_until || written_until < now_ns + ahead
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_share_is_rewritten_near_its_expiry_and_a_changed_or_shortened_one_at_once() {
        let t = Duration::from_millis(100);
        let ms = |n: u64| n * 1_000_000;
        // Written at 0 until 10T: not due at 8T (2T left), due at 9T (T
        // left).
        assert!(!share_due(ms(1000), ms(1800), ms(800), t));
        assert!(share_due(ms(1000), ms(1900), ms(900), t));
        // A tick half an interval late still finds it held (T/2 left at
        // 9.5 T), and rewrites it.
        assert!(share_due(ms(1000), ms(1950), ms(950), t));
        // The first failing tick holds shares 3T: shortened at once.
        assert!(share_due(ms(1000), ms(400), ms(100), t));
        // Changed (or never written): due whatever its expiry.
        assert!(share_due(0, ms(400), ms(100), t));
        // The grace period ends sooner than the share written: shortened.
        assert!(share_due(ms(300), ms(250), ms(100), t));
        // 1.5 T left: not yet.
        assert!(!share_due(ms(250), ms(1100), ms(100), t));
    }
}
