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
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_named_after_the_limit_that_made_it() {
        let mut levels = RuleTable::default();
        levels.insert(3, "web", &["prefix/24/48@1s", "rule@1m"]);
        let event = LimitEvent::new(SourceKey::v4([192, 0, 2, 1]), 3, 1_000, false);
        assert_eq!(level_label(&event, &levels), "source");
        assert_eq!(level_label(&event.with_level(2), &levels), "rule@1m");
        assert_eq!(
            level_label(&event.with_level(1), &levels),
            "prefix/24/48@1s"
        );
        // A rule the labels do not know (pushed meanwhile): its index.
        assert_eq!(level_label(&event.with_level(4), &levels), "#3");
    }

    fn event(last_octet: u8, rule: u32, at_ns: u64) -> LimitEvent {
        LimitEvent::new(SourceKey::v4([192, 0, 2, last_octet]), rule, at_ns, false)
    }

    /// What `run` logs, as text (one line per event).
    fn logged(run: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("sink").extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, run);
        let text = sink.0.lock().expect("sink").clone();
        String::from_utf8(text).expect("utf-8")
    }

    fn cap(per_second: u32, burst: u32, counter: &IntCounter, now: Instant) -> SharedLogCap {
        SharedLogCap::new(LogCap::new(per_second, burst, counter.clone(), now))
    }

    #[test]
    fn a_flood_of_episodes_is_logged_within_the_cap_and_the_rest_summed_up() {
        let counter = IntCounter::new("suppressed", "test").expect("counter");
        let start = Instant::now();
        let shared = cap(10, 20, &counter, start);
        let names = SharedRuleTable::default();
        // Two interfaces share the one cap.
        let mut eth0 = Handler::new("eth0".into(), names.clone(), shared.clone());
        let mut eth1 = Handler::new("eth1".into(), names, shared.clone());
        let mut sent = 0u32;
        let mut flood = |handler: &mut Handler, at: Instant, n: u32| {
            for _ in 0..n {
                // A new forged source each time: each its own episode.
                let key = SourceKey::v4((0x0a00_0000 + sent).to_be_bytes());
                handler.handle(&LimitEvent::new(key, 0, 1_000, false), at);
                sent += 1;
            }
        };
        let log = logged(|| {
            // 64 events per CPU and second on 2 CPUs, for 3 seconds, on
            // each interface.
            for second in 0..3 {
                let at = start + Duration::from_secs(second);
                flood(&mut eth0, at, 128);
                flood(&mut eth1, at, 128);
            }
            shared.flush(start + Duration::from_secs(9));
            shared.flush(start + SUMMARY_PERIOD);
            shared.flush(start + SUMMARY_PERIOD + Duration::from_secs(1));
        });
        let lines = log.lines().filter(|l| l.contains("source limited")).count();
        // The burst, then 10 a second for the two seconds after.
        assert_eq!(lines, 20 + 2 * 10, "{log}");
        let suppressed = 3 * 256 - lines as u64;
        assert_eq!(counter.get(), suppressed);
        let summaries: Vec<&str> = log.lines().filter(|l| l.contains("suppressed")).collect();
        assert_eq!(summaries.len(), 1, "one summary per period:\n{log}");
        assert!(
            summaries[0].contains(&format!(
                "{suppressed} source-limited lines suppressed in the last 10s"
            )),
            "{log}"
        );
    }

    #[test]
    fn the_cap_refills_at_its_rate_up_to_its_burst_and_zero_writes_none() {
        let counter = IntCounter::new("suppressed", "test").expect("counter");
        let start = Instant::now();
        let mut cap = LogCap::new(10, 3, counter.clone(), start);
        let admitted =
            |cap: &mut LogCap, at: Instant, n: usize| (0..n).filter(|_| cap.admit(at)).count();
        assert_eq!(admitted(&mut cap, start, 5), 3, "the burst");
        assert_eq!(admitted(&mut cap, start + Duration::from_millis(150), 5), 1);
        assert_eq!(
            admitted(&mut cap, start + Duration::from_secs(60), 5),
            3,
            "no more than the burst"
        );
        assert_eq!(counter.get(), 4 + 2 + 2);
        assert_eq!(
            cap.summary(start + Duration::from_secs(5)),
            None,
            "a period is 10s"
        );
        assert_eq!(
            cap.summary(start + Duration::from_secs(60)),
            Some((8, Duration::from_secs(60)))
        );
        assert_eq!(
            cap.summary(start + Duration::from_secs(75)),
            None,
            "nothing since"
        );

        let mut none = LogCap::new(0, 3, counter, start);
        assert_eq!(admitted(&mut none, start + Duration::from_secs(60), 5), 0);
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
