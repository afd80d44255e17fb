//! The sources being synced ([`Tracking`], keyed by [`ReportKey`]) and
//! the report phase: each tracked source's admitted and offered deltas
//! since the last tick, read from the kernel's maps into [`Reports`].
//!
//! Deltas are formed every tick whatever the sync's outcome: a failed
//! sync's deltas are dropped and never replayed; those of a tick that
//! failed before sending any sync go with the next report
//! ([`unsent_after_failure`]). A source is kept two windows after its last
//! traffic or hot listing; those tracked only because another node listed
//! them hot are bounded (`cluster.max_remote_sources`).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use limiter_common::{Rule, SourceKey};

use crate::{
    cluster::{
        tick::{self, first_bucket_of_window, AdmittedTracker, OfferedTracker},
        ReportKey,
    },
    kernel::Maps,
};

/// A cluster source being synced.
struct Tracked {
    /// Last time it was reported hot, carried deltas, or was listed hot by
    /// Redis: it is dropped two windows after.
    active: Instant,
    admitted: Vec<AdmittedTracker>,
    offered: Vec<OfferedTracker>,
    /// Its count per interface as the kernel will estimate it at the next
    /// tick if nothing more is admitted (`tick::estimate_at`).
    estimate: Vec<u64>,
    /// Frames offered per interface since the last tick: how the node's
    /// claim is split over its interfaces (`tick::split_claim`).
    offered_now: Vec<u64>,
    /// The allowance written per interface at its last successful sync
    /// (kept while failing).
    allowance: Option<Vec<u64>>,
    /// Until when (kernel ns) the share last written for it holds; 0 when
    /// the allowance changed since (`shares::share_due`).
    written_until: u64,
    /// Its rule's packet limit and window, as of the last tick.
    limit: u64,
    window: Duration,
    /// When it was last synced: a tick sends the stalest sources first,
    /// so a Redis that cannot serve every hot source in one tick serves
    /// them in turn.
    synced: Option<Instant>,
    /// Deltas (admitted, offered) of ticks that failed before sending any
    /// sync (connect or heartbeat failed): Redis never saw them, so the
    /// next report carries them ([`unsent_after_failure`]).
    unsent: (u64, u64),
    /// Tracked only because another node listed it hot (no event nor
    /// traffic here yet): counts against `cluster.max_remote_sources`.
    remote: bool,
}

impl Tracked {
    fn new(ifaces: usize, now: Instant, remote: bool) -> Self {
        Self {
            active: now,
            admitted: vec![AdmittedTracker::default(); ifaces],
            offered: vec![OfferedTracker::default(); ifaces],
            estimate: vec![0; ifaces],
            offered_now: vec![0; ifaces],
            allowance: None,
            written_until: 0,
            limit: 0,
            window: Duration::ZERO,
            synced: None,
            unsent: (0, 0),
            remote,
        }
    }
}

/// One source's report of a tick, before it is named for Redis.
pub(super) struct Pending {
    pub key: ReportKey,
    pub admitted: u64,
    pub offered: u64,
    /// The rule's cluster-wide limit.
    pub limit: u64,
    /// When it was last synced.
    pub synced: Option<Instant>,
}

/// A tick's reports, by window (bucket ms, buckets), stalest first in
/// each; `sent`: how many sources the tick took up (at most the cap).
pub(super) struct Reports {
    pub groups: HashMap<(u64, u32), Vec<Pending>>,
    pub sent: usize,
}

impl Reports {
    /// The longest window reported (1 s when none).
    pub(super) fn window(&self) -> Duration {
        self.groups
            .keys()
            .map(|&(ms, b)| Duration::from_millis(ms * u64::from(b)))
            .max()
            .unwrap_or(Duration::from_secs(1))
    }
}

/// A hot listing's keys (`None`: a key this build does not form) and how
/// many more Redis left out.
pub(super) struct Listed {
    pub keys: Vec<Option<ReportKey>>,
    pub omitted: u64,
}

/// What a tick that failed did with its reports' deltas, and so what
/// becomes of them. Deltas a tick never sent are carried to the next
/// report while the node is not degraded: a stall of Redis or of the
/// machine past the heartbeat's timeout would otherwise drop a tick of
/// every hot source's admissions, and the other nodes would be handed
/// that room again. Deltas of a sync that was sent are dropped even when
/// it failed: Redis may have counted them (a call cut at the deadline
/// stays queued and runs when Redis resumes), and a replay would count
/// them twice. An outage (degraded) drops everything: its counts are not
/// replayed.
fn unsent_after_failure(sent: bool, degraded: bool, pending: &Pending) -> (u64, u64) {
    if sent || degraded {
        (0, 0)
    } else {
        (pending.admitted, pending.offered)
    }
}

/// The tracked sources.
pub(super) struct Tracking {
    sources: HashMap<ReportKey, Tracked>,
    /// Interfaces each source is read on.
    ifaces: usize,
}

impl Tracking {
    pub(super) fn new(ifaces: usize) -> Self {
        Self {
            sources: HashMap::new(),
            ifaces,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.sources.len()
    }

    /// How many are tracked only because another node listed them hot.
    pub(super) fn remote(&self) -> usize {
        self.sources.values().filter(|t| t.remote).count()
    }

    /// The longest window of the tracked sources' rules.
    pub(super) fn longest_window(&self) -> Duration {
        self.sources
            .values()
            .map(|t| t.window)
            .max()
            .unwrap_or_default()
    }

    /// Tracks a source (`remote`: only because another node listed it
    /// hot); a source reported here is not remote any more.
    pub(super) fn track(&mut self, key: ReportKey, now: Instant, remote: bool) {
        let ifaces = self.ifaces;
        let tracked = self
            .sources
            .entry(key)
            .or_insert_with(|| Tracked::new(ifaces, now, remote));
        tracked.active = now;
        if !remote {
            tracked.remote = false;
        }
    }

    /// Tracks the sources of a hot listing: renews those tracked, adds the
    /// others while fewer than `limit` are tracked only for being listed.
    /// Returns how many were left out (over the bound, here or in Redis's
    /// reply).
    pub(super) fn take_listed(&mut self, listed: Listed, now: Instant, limit: usize) -> u64 {
        let mut remote = self.remote();
        let mut left_out = listed.omitted;
        for key in listed.keys {
            if let Some(tracked) = key.as_ref().and_then(|k| self.sources.get_mut(k)) {
                tracked.active = now;
            } else if remote >= limit {
                left_out += 1;
            } else if let Some(key) = key {
                self.track(key, now, true);
                remote += 1;
            }
        }
        left_out
    }

    /// The report phase: at most `cap` sources, the stalest first (the
    /// others keep their last allowance and their deltas wait in the
    /// kernel, their trackers not advanced, until their turn), read from
    /// `ifaces` at kernel time `now_ns`. Sources whose rule is no longer a
    /// cluster rule of the live generation (`rules`, by name), and those
    /// idle for two windows, stop being tracked.
    pub(super) fn report(
        &mut self,
        ifaces: &[(String, Maps)],
        rules: &HashMap<String, Rule>,
        cap: Option<usize>,
        started: Instant,
        now_ns: u64,
        interval: Duration,
    ) -> Reports {
        let keys = self.stalest(cap);
        let sent = keys.len();
        let mut groups: HashMap<(u64, u32), Vec<Pending>> = HashMap::new();
        let mut gone = Vec::new();
        for key in keys {
            let Some(tracked) = self.sources.get_mut(&key) else {
                continue;
            };
            let Some(rule) = rules.get(&key.rule) else {
                gone.push(key);
                continue;
            };
            let Some((admitted, offered)) =
                tracked.read(&key.key, ifaces, rule, started, now_ns, interval)
            else {
                gone.push(key);
                continue;
            };
            let bucket_ms = (rule.bucket_ns / 1_000_000).max(1);
            groups
                .entry((bucket_ms, rule.buckets))
                .or_default()
                .push(Pending {
                    key,
                    admitted,
                    offered,
                    limit: rule.allowance_packets,
                    synced: tracked.synced,
                });
        }
        // Stalest first (never synced before all): Redis serves a tick's
        // calls in the order sent.
        for entries in groups.values_mut() {
            entries.sort_by_key(|pending| pending.synced);
        }
        for key in gone {
            self.sources.remove(&key);
        }
        Reports { groups, sent }
    }

    /// The keys a tick reports: all, or the `cap` stalest by last sync
    /// only (a full sort, or ties broken by key, would cost a tenth of a
    /// tick with 100,000 sources).
    fn stalest(&self, cap: Option<usize>) -> Vec<ReportKey> {
        match cap {
            Some(cap) if cap < self.sources.len() => {
                let mut order: Vec<(Option<Instant>, &ReportKey)> =
                    self.sources.iter().map(|(k, t)| (t.synced, k)).collect();
                order.select_nth_unstable_by_key(cap, |&(synced, _)| synced);
                order.truncate(cap);
                order.into_iter().map(|(_, k)| k.clone()).collect()
            }
            _ => self.sources.keys().cloned().collect(),
        }
    }

    /// Turns each synced source's claim into its allowance per interface,
    /// each held by `cap(limit)` when there is one.
    pub(super) fn apply_claims(
        &mut self,
        claims: Vec<(ReportKey, u64)>,
        now: Instant,
        cap: impl Fn(u64) -> Option<u64>,
    ) {
        for (key, claim) in claims {
            if let Some(tracked) = self.sources.get_mut(&key) {
                tracked.synced = Some(now);
                tracked.allow(claim, cap(tracked.limit));
            }
        }
    }

    /// After a failed tick: the deltas of `reports` the tick never sent
    /// go with the next report ([`unsent_after_failure`]).
    pub(super) fn keep_unsent(&mut self, reports: &Reports, sent: bool, degraded: bool) {
        for pending in reports.groups.values().flatten() {
            if let Some(tracked) = self.sources.get_mut(&pending.key) {
                tracked.unsent = unsent_after_failure(sent, degraded, pending);
            }
        }
    }

    /// Forgets every allowance (their shares were revoked).
    pub(super) fn forget_allowances(&mut self) {
        for tracked in self.sources.values_mut() {
            tracked.allowance = None;
        }
    }

    /// Each source with an allowance: its window key, allowance per
    /// interface, and until when its written share holds.
    pub(super) fn allowances_mut(
        &mut self,
    ) -> impl Iterator<Item = (SourceKey, &[u64], &mut u64)> + '_ {
        self.sources.iter_mut().filter_map(|(key, tracked)| {
            let allowance = tracked.allowance.as_deref()?;
            Some((key.key, allowance, &mut tracked.written_until))
        })
    }
}

impl Tracked {
    /// Reads the deltas (admitted, offered) of the source `key` under
    /// `rule` since the last tick, with what failed ticks never sent;
    /// `None` once it has been idle for two windows. Kept two windows, not
    /// one: the listing is renewed once a window, so one window would drop
    /// (and re-create, from a fresh reading) a source kept only by it
    /// whenever a tick starts just after the window.
    fn read(
        &mut self,
        key: &SourceKey,
        ifaces: &[(String, Maps)],
        rule: &Rule,
        started: Instant,
        now_ns: u64,
        interval: Duration,
    ) -> Option<(u64, u64)> {
        let window = Duration::from_nanos(rule.bucket_ns.saturating_mul(u64::from(rule.buckets)));
        self.limit = rule.allowance_packets;
        self.window = window;
        let (mut admitted, mut offered) = (0u64, 0u64);
        for (i, (_, maps)) in ifaces.iter().enumerate() {
            if let Some(state) = maps.window(key) {
                let words = state.slots.map(|slot| slot[0]);
                let first = first_bucket_of_window(now_ns, state.bucket_ns.max(1), rule.buckets);
                admitted += self.admitted[i].advance(&words, first);
                self.estimate[i] = tick::estimate_at(
                    &state.slots,
                    state.bucket_ns,
                    rule.buckets,
                    now_ns + interval.as_nanos() as u64,
                );
            }
            self.offered_now[i] = match maps.sources.get(key, 0) {
                Ok(per_cpu) => {
                    let second = now_ns / 1_000_000_000;
                    let total: u64 = per_cpu.iter().map(|t| t.total.packets).sum();
                    let current: u64 = per_cpu
                        .iter()
                        .filter(|t| t.second + 1 >= second)
                        .map(|t| t.current.packets)
                        .sum();
                    self.offered[i].advance(total, current)
                }
                Err(_) => 0,
            };
            offered += self.offered_now[i];
        }
        // Frame classes other than the budget's count in other SOURCES
        // entries: offered is never below admitted.
        let offered = offered.max(admitted);
        let (carried_admitted, carried_offered) = std::mem::take(&mut self.unsent);
        let admitted = admitted + carried_admitted;
        let offered = offered + carried_offered;
        if offered > 0 {
            self.active = started;
            self.remote = false;
        } else if started.duration_since(self.active) > 2 * window {
            return None;
        }
        Some((admitted, offered))
    }

    /// Sets the allowance from the node's claim: relative to the kernel's
    /// own count, not Redis's view of this node (the two windows' bucket
    /// edges differ: kernel clock, Redis TIME, and an absolute allowance
    /// would let the kernel re-admit what its window forgot before
    /// Redis's did). One claim per node, split over the interfaces the
    /// source arrives on, or each would admit it all; each part held by
    /// `cap` (split the same way) when there is one.
    fn allow(&mut self, claim: u64, cap: Option<u64>) {
        let parts = tick::split_claim(claim, &self.offered_now);
        let mut allowance: Vec<u64> = self
            .estimate
            .iter()
            .zip(parts)
            .map(|(e, part)| e.saturating_add(part))
            .collect();
        if let Some(cap) = cap {
            let caps = tick::split_claim(cap, &self.offered_now);
            for (a, cap) in allowance.iter_mut().zip(caps) {
                *a = (*a).min(cap);
            }
        }
        self.allowance = Some(allowance);
        self.written_until = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What docs/cluster.md says a tracked source costs (about 1 KiB with
    /// one interface, what bounds `cluster.max_remote_sources`' memory):
    /// the entry (its key, its rule's name, the struct) and per interface
    /// its trackers, with room for the hash map's spare slots and the
    /// allocator's headers.
    #[test]
    fn a_tracked_source_costs_under_a_kilobyte_with_one_interface() {
        use std::mem::size_of;
        let key_text = "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff/128#7|a-rule-name".len();
        let entry = size_of::<ReportKey>() + key_text + size_of::<Tracked>() + 32;
        let per_interface = size_of::<AdmittedTracker>()
            + size_of::<OfferedTracker>()
            + 3 * size_of::<u64>()
            + 5 * 16;
        let total = (entry * 8 / 7) + per_interface;
        eprintln!("entry {entry} B, per interface {per_interface} B, total {total} B");
        assert!(total <= 1024, "{total} B");
    }

    #[test]
    fn only_deltas_never_sent_are_carried_and_never_past_degrading() {
        let pending = Pending {
            key: ReportKey::new(SourceKey::v4([192, 0, 2, 3]), "default"),
            admitted: 30,
            offered: 90,
            limit: 1000,
            synced: None,
        };
        // Connect or heartbeat failed: Redis never saw them.
        assert_eq!(unsent_after_failure(false, false, &pending), (30, 90));
        // A sync went out: Redis may have counted it.
        assert_eq!(unsent_after_failure(true, false, &pending), (0, 0));
        // Degraded: an outage's counts are not replayed.
        assert_eq!(unsent_after_failure(false, true, &pending), (0, 0));
    }
}
