//! "Source limited" events from the kernel's ring buffer, logged as they
//! arrive. The kernel sends one per CPU and episode of refusals (a source
//! refused again within a second is the same episode) and at most a few
//! dozen per CPU per second, so a spoofed flood cannot flood the log; what
//! it holds back is counted as `event_dropped`. The daemon logs one line
//! per source, rule and episode: the other CPUs' events of an episode
//! already logged are not logged again ([`Episodes`]).

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use aya::maps::{MapData, RingBuf};
use limiter_common::{event::EPISODE_GAP_NS, EventKind, LimitEvent, SourceKey};
use tokio::io::unix::AsyncFd;
use tracing::{info, warn};

/// Rule index -> name, refreshed on every reload.
pub type RuleNames = Arc<RwLock<Vec<(u32, String)>>>;

/// Logs the events of one interface until the task is dropped.
///
/// Cluster-hot events go to `cluster` (the sync task), when there is one;
/// a full queue drops the event (the kernel reports the source again the
/// next window).
pub fn watch(
    iface: String,
    ring: RingBuf<MapData>,
    names: RuleNames,
    cluster: Option<tokio::sync::mpsc::Sender<LimitEvent>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // SAFETY: the ring buffer owns its map fd for its whole life and
        // always returns that same fd; the AsyncFd owns the ring buffer.
        let registered =
            unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) };
        let mut episodes = Episodes::default();
        let mut ring = match registered {
            Ok(ring) => ring,
            Err(e) => {
                warn!(%iface, error = %e, "cannot poll the event ring buffer; no limit events");
                return;
            }
        };
        loop {
            let mut guard = match ring.readable_mut().await {
                Ok(guard) => guard,
                Err(e) => {
                    warn!(%iface, error = %e, "event ring buffer failed");
                    return;
                }
            };
            let ring = guard.get_inner_mut();
            while let Some(item) = ring.next() {
                if let Some(event) = parse(&item) {
                    if let Some(cluster) = &cluster {
                        if event.kind() == Some(EventKind::ClusterHot) {
                            let _ = cluster.try_send(event);
                        }
                    }
                    if is_logged(&event) && episodes.starts(&event) {
                        log(&iface, &event, &names);
                    }
                }
            }
            guard.clear_ready();
        }
    })
}

/// The episodes of refusals seen, by source and rule: each CPU that
/// starts refusing a source sends its own event, so an episode arrives as
/// up to one event per CPU, close together.
#[derive(Debug, Default)]
pub struct Episodes {
    /// (source, rule) -> the time of the latest event of its episode.
    last: HashMap<(SourceKey, u32), u64>,
}

/// Episodes remembered before the ended ones are forgotten. The kernel
/// sends at most 64 events per CPU and second, so this is reached only
/// on many CPUs, and then pruning keeps what is less than a gap old.
const EPISODES_KEPT: usize = 4096;

impl Episodes {
    /// Whether `event` starts an episode of its source and rule (log it),
    /// or belongs to one already seen: another CPU's event within
    /// [`EPISODE_GAP_NS`] of that episode's latest event. Events of
    /// different CPUs may arrive slightly out of time order, so the gap
    /// is measured either way.
    pub fn starts(&mut self, event: &LimitEvent) -> bool {
        let at = event.at_ns;
        let key = (event.key, event.rule);
        if let Some(latest) = self.last.get_mut(&key) {
            if at.abs_diff(*latest) <= EPISODE_GAP_NS {
                *latest = (*latest).max(at);
                return false;
            }
        }
        if self.last.len() >= EPISODES_KEPT {
            self.last
                .retain(|_, latest| at.saturating_sub(*latest) <= EPISODE_GAP_NS);
        }
        self.last.insert(key, at);
        true
    }
}

/// Whether `event` is one this log shows: only "source limited" events.
/// Cluster-hot events name sources for the cluster sync, which consumes
/// them from this ring.
pub fn is_logged(event: &LimitEvent) -> bool {
    event.kind() == Some(EventKind::Limited)
}

/// A `LimitEvent` from ring-buffer bytes (`None` if the size is wrong).
pub fn parse(bytes: &[u8]) -> Option<LimitEvent> {
    if bytes.len() != size_of::<LimitEvent>() {
        return None;
    }
    // SAFETY: the length matches and LimitEvent is plain old data
    // (#[repr(C)], integers and byte arrays only); read_unaligned copes
    // with any alignment.
    Some(unsafe { bytes.as_ptr().cast::<LimitEvent>().read_unaligned() })
}

fn log(iface: &str, event: &LimitEvent, names: &RuleNames) {
    let rule = names
        .read()
        .ok()
        .and_then(|names| {
            names
                .iter()
                .find(|(i, _)| *i == event.rule)
                .map(|(_, n)| n.clone())
        })
        .unwrap_or_else(|| format!("#{}", event.rule));
    info!(
        iface,
        source = %event.key,
        rule,
        dry_run = event.dry_run(),
        "source limited"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(last_octet: u8, rule: u32, at_ns: u64) -> LimitEvent {
        LimitEvent::new(SourceKey::v4([192, 0, 2, last_octet]), rule, at_ns, false)
    }

    #[test]
    fn cluster_hot_events_are_not_logged_as_limited() {
        assert!(is_logged(&event(1, 0, 1_000)));
        let hot = LimitEvent::cluster_hot(SourceKey::v4([192, 0, 2, 1]), 0, 1_000);
        assert!(!is_logged(&hot));
    }

    #[test]
    fn the_other_cpus_events_of_an_episode_are_not_logged_again() {
        let mut episodes = Episodes::default();
        assert!(episodes.starts(&event(3, 0, 5_000)));
        assert!(!episodes.starts(&event(3, 0, 9_000)), "a second CPU");
        assert!(!episodes.starts(&event(3, 0, 4_000)), "out of order");
        assert!(episodes.starts(&event(4, 0, 9_000)), "another source");
        assert!(episodes.starts(&event(3, 1, 9_000)), "another rule");
        // A gap measured from the episode's latest event (9,000 ns).
        assert!(!episodes.starts(&event(3, 0, 9_000 + EPISODE_GAP_NS)));
        assert!(episodes.starts(&event(3, 0, 10_000 + 3 * EPISODE_GAP_NS)));
    }

    #[test]
    fn ended_episodes_are_forgotten_when_many_are_kept() {
        let mut episodes = Episodes::default();
        for i in 0..EPISODES_KEPT as u32 {
            let key = SourceKey::v4(i.to_be_bytes());
            assert!(episodes.starts(&LimitEvent::new(key, 0, 1_000, false)));
        }
        let later = 2_000 + 2 * EPISODE_GAP_NS;
        assert!(episodes.starts(&event(3, 0, later)));
        assert_eq!(episodes.last.len(), 1, "only the live episode is kept");
    }
}
