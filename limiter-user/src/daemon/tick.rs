//! The daemon's tick, one call per phase, each interface in turn: what
//! the kernel holds is read (`read`: the link, the penalties, the next
//! slice of the per-CPU sweep, the kept windows' walk), the sources read
//! feed the known sample, the history and the rate histograms
//! (`observe_sources`), the levels' drops and aggregates' rates are read
//! (`observe_levels`), and the rest is exported (`record`). Then the
//! known sources past the history's horizon are forgotten and the guards
//! judge the tick.

use std::{
    collections::{BTreeSet, HashMap},
    time::Instant,
};

use limiter_common::{rules::rules_base, SourceKey};
use tracing::{debug, error, info, warn};

use super::{
    aggregate::{self, Snapshot},
    history::SeriesKey,
    known::Reading,
    level_rates,
    state::{record_level_drops, Daemon, Iface},
};
use crate::{
    config::{self, DaemonSection},
    kernel::{self, penalty, Attachment, Instance, LinkCheck},
};

/// Released sources logged by name per interface and tick; the rest are
/// counted in one line.
const RELEASED_LOGGED_PER_TICK: usize = 16;

/// What one tick read of an interface.
struct Reads {
    /// The sweep's slice of the per-CPU state.
    snapshot: Snapshot,
    /// The sources of the kept windows walked, with their recent rates.
    windowed: Vec<(SourceKey, u64)>,
    /// Penalties in force (`None` when the sweep of `HOLDS` failed).
    penalties: Option<usize>,
    /// When the reads ended, on the kernel's clock (ns).
    now_ns: u64,
}

impl Daemon {
    /// One tick: every interface's state read, observed and exported, then
    /// the guards judged.
    pub(super) fn tick(&mut self) {
        let started = Instant::now();
        // The rules' names read once a tick, not once an interface.
        let names = self.names();
        let series: HashMap<u32, SeriesKey> = names
            .iter()
            .map(|(index, name)| (*index, SeriesKey::rule(name)))
            .collect();
        for i in 0..self.ifaces.len() {
            let Some(mut reads) = read(&mut self.ifaces[i], &self.config.daemon) else {
                continue;
            };
            self.observe_sources(i, &mut reads, &series);
            self.observe_levels(i, reads.now_ns);
            self.record(i, reads, &names);
        }
        self.record_list_hits();
        self.sweep_bans();
        let now_ns = kernel::now().as_nanos() as u64;
        let pressured = self
            .ifaces
            .iter()
            .any(|iface| iface.instance.program.maps.tickets_taken_until() > now_ns);
        self.shield.observe(pressured);
        self.metrics.record_shield(self.shield.up());
        self.known
            .forget_older(kernel::now().as_nanos() as u64, self.history.horizon());
        self.metrics
            .record_known(self.known.len(), self.known.sampled_share());
        self.check_guards();
        self.metrics
            .aggregation
            .observe(started.elapsed().as_secs_f64());
    }

    /// The sources read: each into the known sample (and through it the
    /// history), the per-CPU ones with a rate into their rule's histogram.
    fn observe_sources(&mut self, i: usize, reads: &mut Reads, series: &HashMap<u32, SeriesKey>) {
        let iface = &self.ifaces[i].instance.iface;
        let base = rules_base(self.generation);
        // Each rule's histogram looked up once a tick, not once a source.
        let mut histograms = HashMap::new();
        for (rule, reading) in std::mem::take(&mut reads.snapshot.samples) {
            self.known
                .observe(reading, Some((rule, base)), reads.now_ns, &mut self.history);
            // A source whose state predates every rule generation the
            // daemon knows has no rule to count under.
            let Some(key) = series.get(&rule).filter(|_| reading.pps > 0) else {
                continue;
            };
            histograms
                .entry(rule)
                .or_insert_with(|| self.metrics.source_rate_of(iface, &key.rule))
                .observe(reading.pps as f64);
        }
        for (key, pps) in std::mem::take(&mut reads.windowed) {
            let reading = Reading {
                key,
                pps,
                refused: false,
                dropped_total: None,
            };
            self.known
                .observe(reading, None, reads.now_ns, &mut self.history);
        }
    }

    /// The levels' drops, and each live aggregate's rate into the history
    /// and its histogram (only rules with levels: most have none).
    fn observe_levels(&mut self, i: usize, now_ns: u64) {
        let instance = &self.ifaces[i].instance;
        let Ok(table) = self.rules.read() else {
            return;
        };
        record_level_drops(&mut self.metrics, instance, table.levels());
        if !table.has_levels() {
            return;
        }
        let read = level_rates::read(
            instance,
            table.levels(),
            self.generation,
            self.config.daemon.sources_per_tick,
            now_ns,
        );
        let (live, rates) = match read {
            Ok(read) => read,
            Err(e) => {
                error!(iface = %instance.iface, error = %e, "reading the aggregates' rates failed");
                return;
            }
        };
        let at_time = std::time::Duration::from_nanos(now_ns);
        for (at, pps) in rates {
            let key = SeriesKey {
                rule: live[at].rule.to_string(),
                level: Some(live[at].label.to_string()),
            };
            self.history.observe(&key, pps.ceil() as u64, at_time);
            self.metrics
                .observe_level_rate(&instance.iface, live[at].rule, live[at].label, pps);
        }
    }

    /// What the tick read, exported; the sources whose episode ended
    /// logged; the pass kept for `status` and `top`.
    fn record(&mut self, i: usize, reads: Reads, names: &[(u32, String)]) {
        let daemon = &self.config.daemon;
        let iface = &mut self.ifaces[i];
        let instance = &iface.instance;
        log_released(&instance.iface, &iface.refusing, &reads.snapshot.refusing);
        iface.refusing.clone_from(&reads.snapshot.refusing);
        self.metrics.record(
            &instance.iface,
            &reads.snapshot,
            daemon.max_hot_sources,
            self.config.rules.rules.len() + 1,
            names,
            instance.program.run_stats(),
        );
        self.metrics.record_link(
            &instance.iface,
            instance.reattachments,
            instance.link.is_attached(),
        );
        if let Some(penalties) = reads.penalties {
            self.metrics.record_penalties(&instance.iface, penalties);
        }
        self.metrics
            .record_windows(&instance.iface, &iface.reclaim, daemon.max_sources);
        let maps = &instance.program.maps;
        match (maps.tickets_held(), maps.ticket_rooms()) {
            (Ok(held), Ok(rooms)) => {
                self.metrics
                    .record_tickets(&instance.iface, &held, rooms, names)
            }
            (Err(e), _) | (_, Err(e)) => {
                error!(iface = %instance.iface, error = %e, "reading the windows' tickets failed")
            }
        }
        iface.observed.update(reads.snapshot);
    }
}

/// The read phase of one interface: its link kept (re-attached to a
/// re-created interface), the penalties swept, the sweep's next slice
/// and the kept windows' next walk. `None` when the sweep failed.
fn read(iface: &mut Iface, daemon: &DaemonSection) -> Option<Reads> {
    check_link(&mut iface.instance, daemon.mode);
    let now_ns = kernel::now().as_nanos() as u64;
    let penalties = match penalty::sweep(&mut iface.instance.program.maps, now_ns) {
        Ok(swept) => {
            if !swept.complete {
                debug!(iface = %iface.instance.iface, counted = swept.penalties, "the sweep of HOLDS stopped at its cap (the map is churning); the penalties gauge is a floor this tick");
            }
            Some(swept.penalties)
        }
        Err(e) => {
            error!(iface = %iface.instance.iface, error = %e, "sweeping the penalties failed");
            None
        }
    };
    let snapshot = match aggregate::pass(
        &iface.instance.program.maps,
        daemon.top_k,
        &mut iface.sweep,
        daemon.sources_per_tick,
    ) {
        Ok(snapshot) => snapshot,
        Err(e) => {
            error!(iface = %iface.instance.iface, error = %e, "aggregation failed");
            return None;
        }
    };
    let mut windowed = Vec::new();
    if let Err(e) = iface.reclaim.step(
        &mut iface.instance.program.maps,
        now_ns,
        daemon.sources_per_tick,
        &mut windowed,
    ) {
        error!(iface = %iface.instance.iface, error = %e, "reading the window maps failed");
    }
    Some(Reads {
        snapshot,
        windowed,
        penalties,
        now_ns: kernel::now().as_nanos() as u64,
    })
}

/// Keeps an instance attached to the interface of its name (re-attaching
/// to a re-created one), logging each change of state once.
fn check_link(instance: &mut Instance, mode: config::AttachMode) {
    let before = instance.link;
    let iface = instance.iface.clone();
    match instance.check_link(mode) {
        Ok(LinkCheck::Reattached) => {
            info!(
                iface,
                mode = instance.attachment.as_str(),
                "re-attached to the re-created interface"
            )
        }
        Ok(LinkCheck::InterfaceGone) if before != LinkCheck::InterfaceGone => {
            warn!(
                iface,
                "the interface vanished; protection resumes when it is back"
            )
        }
        Ok(LinkCheck::Unpinned) if before != LinkCheck::Unpinned => {
            if instance.attachment == Attachment::Dispatcher {
                warn!(
                    iface,
                    "the component was taken out of the XDP dispatcher by someone else (xdp-loader unload?); not joining again"
                )
            } else {
                warn!(
                    iface,
                    "the pinned link was removed by someone else (xdp-limiter detach?); not re-attaching"
                )
            }
        }
        Ok(_) => {}
        Err(e) => {
            // Retried every tick; said once until the state changes.
            if before != LinkCheck::InterfaceGone {
                error!(iface, error = %e, "re-attaching to the re-created interface failed; retrying every tick");
            }
            instance.link = LinkCheck::InterfaceGone;
        }
    }
}

/// Logs the sources whose episode of refusals ended: no CPU holds them and
/// none refused them for a second ("limited" comes from the kernel's
/// events, see events.rs, whose episodes end the same way): a few per tick
/// by name, the rest as a count, so a spoofed flood ending cannot flood
/// the log.
fn log_released(iface: &str, before: &BTreeSet<SourceKey>, now: &BTreeSet<SourceKey>) {
    let released: Vec<&SourceKey> = before.difference(now).collect();
    for key in released.iter().take(RELEASED_LOGGED_PER_TICK) {
        info!(event = "source_released", iface, source = %key, "source released");
    }
    if released.len() > RELEASED_LOGGED_PER_TICK {
        info!(
            event = "sources_released",
            iface,
            more = released.len() - RELEASED_LOGGED_PER_TICK,
            "more sources released (not listed)"
        );
    }
}
