//! "Source limited" events from the kernel's ring buffer, logged as they
//! arrive. The kernel sends one per CPU and episode of refusals (a source
//! refused again within a second is the same episode) and at most a few
//! dozen per CPU per second; what it holds back is counted as
//! `event_dropped`. The daemon logs one line per source, rule and episode:
//! the other CPUs' events of an episode already logged are not logged again
//! ([`Episodes`]). A spoofed flood still starts a new episode per forged
//! source, on every interface and CPU, so the lines of all interfaces
//! together are capped ([`LogCap`]): what the cap holds back is counted in
//! a metric and summed up in one line per [`SUMMARY_PERIOD`].

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use limiter_common::{event::EPISODE_GAP_NS, EventKind, LimitEvent, SourceKey};
use prometheus::IntCounter;
use tokio::io::unix::AsyncFd;
use tracing::{error, info, warn};

use super::rule_table::{RuleTable, SharedRuleTable};

/// Logs the events of one interface until the task is dropped.
///
/// Cluster-hot events go to `cluster` (the sync task), when there is one;
/// a full queue drops the event (the kernel reports the source again the
/// next window).
pub fn watch(
    iface: String,
    ring: RingBuf<MapData>,
    rules: SharedRuleTable,
    cluster: Option<tokio::sync::mpsc::Sender<LimitEvent>>,
    cap: SharedLogCap,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // SAFETY: the ring buffer owns its map fd for its whole life and
        // always returns that same fd; the AsyncFd owns the ring buffer.
        let registered =
            unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) };
        let mut handler = Handler::new(iface.clone(), rules, cap);
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
                    handler.handle(&event, Instant::now());
                }
            }
            guard.clear_ready();
        }
    })
}

/// Turns one interface's events into "source limited" lines: one per
/// episode ([`Episodes`]), within the cap all interfaces share.
pub struct Handler {
    iface: String,
    rules: SharedRuleTable,
    episodes: Episodes,
    cap: SharedLogCap,
}

impl Handler {
    pub fn new(iface: String, rules: SharedRuleTable, cap: SharedLogCap) -> Self {
        Self {
            iface,
            rules,
            episodes: Episodes::default(),
            cap,
        }
    }

    /// Logs `event`, arrived at `now`, if it starts an episode and the cap
    /// lets it through (else counts it as suppressed); logs the summary
    /// of the period that ended, if one did.
    pub fn handle(&mut self, event: &LimitEvent, now: Instant) {
        if !is_logged(event) || !self.episodes.starts(event) {
            return;
        }
        if self.cap.admit(now) {
            log(&self.iface, event, &self.rules);
        }
    }
}

/// How often the number of lines the cap held back is logged (when any
/// were).
pub const SUMMARY_PERIOD: Duration = Duration::from_secs(10);

/// A token bucket for "source limited" lines: `per_second` lines a second
/// on average, up to `burst` at once (none with `per_second` 0); the
/// lines it refuses are counted.
#[derive(Debug)]
pub struct LogCap {
    per_second: u32,
    burst: u32,
    /// Lines that may be written now, in millionths of a line (whole
    /// numbers keep the refill exact).
    micro_tokens: u64,
    refilled: Instant,
    /// Lines refused since `period_start`.
    suppressed: u64,
    period_start: Instant,
    /// Every line refused, for the metrics.
    counter: IntCounter,
}

const MICRO: u64 = 1_000_000;

impl LogCap {
    /// A full bucket at `now`.
    pub fn new(per_second: u32, burst: u32, counter: IntCounter, now: Instant) -> Self {
        Self {
            per_second,
            burst,
            micro_tokens: u64::from(burst) * MICRO,
            refilled: now,
            suppressed: 0,
            period_start: now,
            counter,
        }
    }

    /// Whether a line may be written at `now` (it takes a token); if not,
    /// it is counted as suppressed.
    pub fn admit(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.refilled);
        let gained = elapsed.as_micros() as u64 * u64::from(self.per_second);
        let full = u64::from(self.burst) * MICRO;
        self.micro_tokens = self.micro_tokens.saturating_add(gained).min(full);
        self.refilled = now.max(self.refilled);
        if self.per_second > 0 && self.micro_tokens >= MICRO {
            self.micro_tokens -= MICRO;
            true
        } else {
            self.suppressed += 1;
            self.counter.inc();
            false
        }
    }

    /// Once [`SUMMARY_PERIOD`] has passed since the last summary: the
    /// lines suppressed since, and over how long (`None` before, and
    /// when none were; a period starts afresh either way).
    pub fn summary(&mut self, now: Instant) -> Option<(u64, Duration)> {
        let period = now.saturating_duration_since(self.period_start);
        if period < SUMMARY_PERIOD {
            return None;
        }
        let suppressed = std::mem::take(&mut self.suppressed);
        self.period_start = now;
        (suppressed > 0).then_some((suppressed, period))
    }
}

/// The one [`LogCap`] of a daemon, shared by every interface's watcher.
#[derive(Clone, Debug)]
pub struct SharedLogCap(Arc<Mutex<LogCap>>);

impl SharedLogCap {
    pub fn new(cap: LogCap) -> Self {
        Self(Arc::new(Mutex::new(cap)))
    }

    /// [`LogCap::admit`]; also logs the summary of a period that ended.
    pub fn admit(&self, now: Instant) -> bool {
        let Ok(mut cap) = self.0.lock() else {
            // A watcher panicked holding it: log rather than lose lines.
            return true;
        };
        let summary = cap.summary(now);
        let admitted = cap.admit(now);
        drop(cap);
        log_summary(summary);
        admitted
    }

    /// Logs the summary of a period that ended (a timer calls this, so a
    /// flood's last period is reported after it stops).
    pub fn flush(&self, now: Instant) {
        let summary = self.0.lock().ok().and_then(|mut cap| cap.summary(now));
        log_summary(summary);
    }
}

fn log_summary(summary: Option<(u64, Duration)>) {
    if let Some((suppressed, period)) = summary {
        warn!(
            event = "limited_suppressed",
            suppressed,
            seconds = period.as_secs(),
            "{suppressed} source-limited lines suppressed in the last {}s",
            period.as_secs()
        );
    }
}

/// Logs the summary of each ended period until the task is dropped.
pub fn summarise(cap: SharedLogCap) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut timer = tokio::time::interval(SUMMARY_PERIOD);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            timer.tick().await;
            cap.flush(Instant::now());
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

fn log(iface: &str, event: &LimitEvent, rules: &SharedRuleTable) {
    let Ok(table) = rules.read() else {
        return;
    };
    let rule = table
        .name(event.rule)
        .map_or_else(|| format!("#{}", event.rule), str::to_string);
    info!(
        event = "source_limited",
        iface,
        source = %event.key,
        rule,
        limit_level = level_label(event, &table),
        action = if event.dry_run() { "would-drop" } else { "drop" },
        dry_run = event.dry_run(),
        "source limited"
    );
}

/// Which limit refused the event's source, as the metrics label it:
/// `source` for its own limit, else its rule's level (`#N` if unknown).
fn level_label(event: &LimitEvent, table: &RuleTable) -> String {
    let Some(level) = event.level() else {
        return "source".into();
    };
    table
        .level_label(event.rule, level)
        .map_or_else(|| format!("#{level}"), str::to_string)
}

/// The guard event of a rollback (`crate::guard`): which guard of
/// `scope` was breached, by what measured value, against what threshold.
/// A warning: enforcement was lifted on its own.
pub fn guard_rolled_back(scope: &str, breach: &crate::guard::Breach) {
    let guard = &breach.guard;
    warn!(
        event = "guard_rolled_back",
        scope,
        guard = %guard,
        measured = %guard.show(breach.measured),
        threshold = %guard.show(guard.value),
        "guard breached: rolled back to dry-run ({guard}: measured {})",
        guard.show(breach.measured)
    );
}

/// The guard event of a breach whose rollback the scope's budget withheld
/// (`guard::MAX_ROLLBACKS` within `guard::ROLLBACK_SPAN`).
pub fn guard_withheld(scope: &str, breach: &crate::guard::Breach) {
    let guard = &breach.guard;
    error!(
        event = "guard_withheld",
        scope,
        guard = %guard,
        measured = %guard.show(breach.measured),
        threshold = %guard.show(guard.value),
        rollbacks = crate::guard::MAX_ROLLBACKS,
        "guard breached: rollback withheld, enforcement stays ({guard}: measured {}; {} rollbacks of {scope} within {}: look before enforcing again)",
        guard.show(breach.measured),
        crate::guard::MAX_ROLLBACKS,
        humantime::format_duration(crate::guard::ROLLBACK_SPAN)
    );
}

/// The guard event of a period that ended with every guard kept.
pub fn guard_passed(scope: &str, period: Duration) {
    info!(
        event = "guard_passed",
        scope,
        period = %humantime::format_duration(period),
        "guard period passed: enforcement stays"
    );
}

#[cfg(test)]
mod tests;
