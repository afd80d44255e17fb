//! The cluster sync task (issue 13): with `[cluster]` configured, one task
//! per daemon ties the Redis store (`crate::cluster::store`) to the
//! kernel's cluster maps of every protected interface. Every sync interval
//! `T` (ticks never overlap: `MissedTickBehavior::Skip`, and the syncs are
//! cut at `0.9 T`, the hot listing at `0.95 T`: `TickPlan`), it:
//!
//! 1. gathers the hot cluster sources: reported by the kernel's
//!    cluster-hot events (forwarded by the event watchers through a
//!    channel), synced with traffic within the last window, or listed hot
//!    by Redis (step 5);
//! 2. reads this node's admitted (the shared window's slots) and offered
//!    (the per-CPU totals) deltas per source since the last tick
//!    (`cluster::tick`; formed every tick: a failed sync's deltas are
//!    dropped and never replayed, those of a tick that failed before
//!    sending any sync go with the next report: `unsent_after_failure`);
//! 3. calls `Store::heartbeat` and `Store::sync` (each under the
//!    configured timeout, the whole under `0.9 T`);
//! 4. writes each source's allowance into `CLUSTER_SHARES` and the state
//!    into `CLUSTER` (refreshed every tick, even a failed one: the
//!    kernel's own fallback is for a daemon that stopped ticking);
//! 5. lists a slice of the sources hot on any node
//!    (`Store::hot_sources_in`, each group once per window), after the
//!    writes so the shares are not delayed by it, by `0.95 T`.
//!
//! Failures: three failed ticks in a row make the node degraded (one log
//! line); the last shares are kept, pushed forward but never past the end
//! of the grace period; then the state carries the fallback policy's
//! divisor as the cold divisor, so every source is held to `L / nodes
//! alive` (`split`) or `L` (`local`): never open. The first successful
//! tick recovers (one log line).
//!
//! Node names: each daemon run heartbeats with a random instance token
//! (`instance_token`), and a name another live daemon heartbeats under is
//! refused, at start-up (`claim_node_name`: the daemon exits before
//! attaching) and while running (the node stops syncing and holds its
//! sources to the fallback cap until the name is free): two daemons with
//! one name would each claim the whole room of a source.
//!
//! The sources a node takes from the other nodes' hot lists are bounded
//! (`cluster.max_remote_sources`): those over the bound are counted and
//! logged once a minute, never tracked.
//!
//! The task opens the interfaces' pinned maps itself (the daemon pins them
//! all), so it never waits on the daemon's main loop and the main loop
//! never waits on Redis.

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use limiter_common::{
    rules::{rules_base, MAX_RULES},
    ClusterShare, EventKind, LimitEvent, Rule, Scope, SourceKey,
};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::{events::RuleNames, metrics::ClusterMetrics};
use crate::{
    cluster::{
        fallback_cap,
        store::GROUPS,
        tick::{
            self, first_bucket_of_window, kernel_state, parse_report_key, report_key, share_expiry,
            AdmittedTracker, Change, Health, OfferedTracker, Phase,
        },
        HotList, Mode, Report, Store, StoreConfig, StoreError, WindowSpec,
    },
    config::{ClusterConfig, ClusterMode, Fallback},
    kernel::{cluster as kernel_cluster, pins, Maps},
    proto::ClusterLive,
};

/// Cluster-hot events queued for the sync task at most; the kernel sends
/// at most 64 events per CPU and second, so this is only reached if the
/// task stalls, and then an event lost is a source synced one window
/// later (its next report).
pub const EVENT_QUEUE: usize = 4096;

/// What `status` shows of the sync, updated by the task every tick.
#[derive(Debug, Default)]
pub struct Live {
    nodes_alive: u32,
    last_sync: Option<Instant>,
    degraded: bool,
    synced_sources: usize,
    fallback_in_force: Option<Fallback>,
    failed_ticks: u64,
    duplicate_node: bool,
    remote_sources: usize,
}

pub type SharedLive = Arc<Mutex<Live>>;

impl Live {
    pub fn status(&self) -> ClusterLive {
        ClusterLive {
            nodes_alive: self.nodes_alive,
            last_sync_age_ms: self
                .last_sync
                .map(|t| t.elapsed().as_millis().min(u128::from(u64::MAX)) as u64),
            degraded: self.degraded,
            synced_sources: self.synced_sources,
            fallback_in_force: self.fallback_in_force,
            failed_ticks: self.failed_ticks,
            duplicate_node: self.duplicate_node,
            remote_sources: self.remote_sources,
        }
    }
}

/// A cluster source being synced.
struct Tracked {
    key: SourceKey,
    rule: String,
    /// Last time it was reported hot, carried deltas, or was listed hot by
    /// Redis: it is dropped a window after.
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
    /// the allowance changed since (`share_due`).
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
    /// next report carries them (`unsent_after_failure`).
    unsent: (u64, u64),
    /// Tracked only because another node listed it hot (no event nor
    /// traffic here yet): counts against `cluster.max_remote_sources`.
    remote: bool,
}

/// What a tick that failed did with its reports' deltas, and so what
/// becomes of them. Deltas a tick never sent are carried to the next
/// report while the node is not degraded: a stall of Redis or of the
/// machine past the heartbeat's timeout would otherwise drop a tick of
/// every hot source's admissions, and the other nodes would be handed
/// that room again (a 120 ms stall of Redis measured windows of up to
/// 1.097L). Deltas of a sync that was sent are dropped even when it
/// failed: Redis may have counted them (a call cut at the deadline stays
/// queued and runs when Redis resumes), and a replay would count them
/// twice. An outage (degraded) drops everything: its counts are not
/// replayed.
fn unsent_after_failure(syncs_sent: bool, degraded: bool, report: &Report) -> (u64, u64) {
    if syncs_sent || degraded {
        (0, 0)
    } else {
        (report.admitted, report.offered)
    }
}

/// A tick's reports by window (bucket ms, buckets): (report key, report,
/// when it was last synced).
type Groups = HashMap<(u64, u32), Vec<(String, Report, Option<Instant>)>>;

/// The sync task's state.
pub struct Sync {
    config: ClusterConfig,
    /// Each protected interface's maps, opened from their pins (typed
    /// handles of their own: the task never waits on the main loop).
    ifaces: Vec<(String, Maps)>,
    store: Option<Store>,
    names: RuleNames,
    events: mpsc::Receiver<LimitEvent>,
    tracked: HashMap<String, Tracked>,
    health: Health,
    nodes_alive: u32,
    /// The first hot-set group the next tick lists (`hot_slice`).
    hot_cursor: u16,
    /// Until when, after a recovery, each source stays held to the
    /// fallback cap (see where it is set).
    recovering_until: Option<Instant>,
    /// The nodes alive before the outage the node recovered from.
    recovering_nodes: u32,
    /// How many sources a tick reports at most (stalest first; `None`:
    /// all), learnt from what Redis served (`next_cap`).
    sync_cap: Option<usize>,
    /// Whether the last tick's syncs were partial.
    last_partial: bool,
    /// Whether this tick has sent a sync to Redis yet (set before the
    /// first is sent; see `unsent_after_failure`).
    syncs_sent: bool,
    /// This daemon run's token in its heartbeats (`instance_token`).
    token: String,
    /// Another daemon heartbeats under this node's name: no sync, shares
    /// gone, the fallback cap in force.
    duplicate: bool,
    /// Hot sources of other nodes left out by the bound since the last
    /// log line about them, and when that line was.
    remote_left_out: u64,
    remote_logged: Option<Instant>,
    metrics: ClusterMetrics,
    live: SharedLive,
}

/// The kernel's clock for the limiter, in ns (`kernel::now`: what the
/// program's `bpf_ktime_get_coarse_ns` reads).
fn kernel_ns() -> u64 {
    crate::kernel::now().as_nanos() as u64
}

/// The next tick's cap on the sources it reports, from this tick's: a
/// partial tick (Redis served only part of the batches in time) caps the
/// next at 90% of what was served, so the calls Redis cannot serve are
/// not sent to queue in front of the next tick's (its heartbeat would time
/// out behind them); a tick that failed while sending more than a batch
/// halves the cap (an overload looks like that too; a Redis that is down
/// costs nothing more); a complete tick raises the cap by half when it
/// took under 60% of the interval, by a tenth under 90% (close to what
/// Redis serves, the cap creeps up and a partial tick brings it back),
/// and lifts it once it covers every tracked source. Never under one
/// batch, so a few sources are never capped.
fn next_cap(
    cap: Option<usize>,
    sent: usize,
    synced: Option<usize>,
    partial: bool,
    took: Duration,
    interval: Duration,
    tracked: usize,
) -> Option<usize> {
    use crate::cluster::store::MAX_BATCH;
    match synced {
        Some(count) if partial => Some((count * 9 / 10).max(MAX_BATCH)),
        None if sent > MAX_BATCH => Some((sent / 2).max(MAX_BATCH)),
        None => cap,
        Some(_) => match cap {
            Some(cap) if took < interval * 9 / 10 => {
                let grown = if took < interval * 6 / 10 {
                    cap + cap / 2
                } else {
                    cap + cap / 10 + 1
                };
                (grown < tracked).then_some(grown)
            }
            other => other,
        },
    }
}

/// How much sooner than the tick's cut a sync gives up on the batches
/// Redis has not served, returning those it has (`Store::sync_partial`).
const PARTIAL_MARGIN: Duration = Duration::from_millis(2);

/// How a tick starting at `started` spends its interval `T`: the
/// heartbeat and the syncs until `syncs_until`; then the kernel's maps and
/// the hot list's slice, which ends by `listing_until`; the rest is slack
/// for a late wake-up on a loaded machine, so a tick whose Redis hangs
/// still ends within `T` (a tick over `T` would cost the next one:
/// `MissedTickBehavior::Skip`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TickPlan {
    syncs_until: Instant,
    listing_until: Instant,
    /// A listing is skipped (its slice waits for the next tick) when less
    /// than this is left: a reply cut short would stay queued in Redis
    /// ahead of the next tick's heartbeat.
    listing_least: Duration,
}

impl TickPlan {
    /// Slack: a twentieth of `T` (at least 2 ms); writes and listing:
    /// another twentieth (at least 3 ms); at least a fiftieth (1 ms) for a
    /// listing. At `T` = 100 ms: syncs until 90 ms, listing until 95 ms.
    /// The syncs are not cut sooner to make room for the listing: at 5,000
    /// hot sources per node Redis needs about 85 ms for them, so every ms
    /// taken from them is sources synced in turns. A node whose syncs fill
    /// the tick lists the hot set in the ticks that leave time for it.
    fn new(started: Instant, interval: Duration) -> Self {
        let slack = (interval / 20).max(Duration::from_millis(2));
        let after = (interval / 20).max(Duration::from_millis(3));
        let listing_until = started + interval.saturating_sub(slack);
        TickPlan {
            syncs_until: started + interval.saturating_sub(slack + after),
            listing_until,
            listing_least: (interval / 50).max(Duration::from_millis(1)),
        }
    }
}

/// How long a node counts as alive after its last heartbeat: five sync
/// intervals (at least half a second), so one slow tick on a loaded
/// machine does not make it vanish from the others' divisors, while a
/// stopped daemon leaves them within about half a second.
fn alive_period(interval: Duration) -> Duration {
    (interval * 5).max(Duration::from_millis(500))
}

/// The hot-set groups a tick starting at group `cursor` lists: a slice
/// sized so that, at one tick per `interval`, every group is listed once
/// per `window` (all of them when the window is a tick or less). One reply
/// then carries about `interval / window` of the hot set: 10,000 keys of
/// 100,000 at `T` = 100 ms and `W` = 1 s, where the whole set in one reply
/// outlasted every tick of a debug build and was never read.
fn hot_slice(cursor: u16, interval: Duration, window: Duration) -> std::ops::Range<u16> {
    let ticks = (window.as_nanos() / interval.as_nanos().max(1)).clamp(1, u128::from(GROUPS));
    let size = GROUPS.div_ceil(ticks as u16);
    let start = cursor % GROUPS;
    start..(start + size).min(GROUPS)
}

/// How often at most the sources left out by `cluster.max_remote_sources`
/// are logged (one line with their count, not one per source).
const REMOTE_LOG_EVERY: Duration = Duration::from_secs(60);

/// A token for this daemon run's heartbeats: where it runs (hostname and
/// pid, for the operator who meets a duplicate name) and 64 random bits,
/// so a restart of the same daemon is another instance.
pub fn instance_token() -> String {
    let mut random = [0u8; 8];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut random));
    if read.is_err() {
        // Unique enough without /dev/urandom: the pid is in the token too.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        random = nanos.to_le_bytes();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let host: String = host.chars().take(64).collect();
    format!("{host}:{}:{hex}", std::process::id())
}

/// At start-up, before anything is attached: claims `config.node` in
/// Redis for the daemon instance `token`, or fails when another live
/// daemon heartbeats under that name. A heartbeat still live under the
/// name may be this node's own from before a restart: a daemon that
/// stopped no longer renews it, and it lapses within one alive period
/// (`alive_period`, half a second by default), so the claim is retried
/// until then; only a heartbeat renewed past that is another daemon. A
/// Redis that cannot be reached is no reason not to start (the sync
/// degrades as it would at any other time, and checks the name at every
/// heartbeat).
pub async fn claim_node_name(config: &ClusterConfig, token: &str) -> anyhow::Result<()> {
    let store = match Store::connect(&store_config(config)).await {
        Ok(store) => store,
        Err(e) => {
            warn!(error = %e, node = %config.node,
                "cluster: Redis unreachable at start-up; the node name is checked at every heartbeat");
            return Ok(());
        }
    };
    let alive = alive_period(config.sync_interval);
    let started = Instant::now();
    let deadline = started + alive + config.sync_interval;
    let mut announced = false;
    loop {
        match store.heartbeat_as(&config.node, token, alive).await {
            Ok(_) => {
                if announced {
                    info!(node = %config.node, waited = ?started.elapsed(),
                        "cluster: the previous heartbeat under this node name lapsed (a daemon that stopped); starting");
                }
                return Ok(());
            }
            Err(StoreError::DuplicateNode { holder, .. }) if Instant::now() < deadline => {
                if !announced {
                    info!(node = %config.node, %holder, wait = ?alive,
                        "cluster: a heartbeat under this node name is live; waiting one alive period to see whether its daemon still runs");
                    announced = true;
                }
                tokio::time::sleep(config.sync_interval).await;
            }
            Err(e @ StoreError::DuplicateNode { .. }) => {
                return Err(anyhow::anyhow!(
                    "cluster: {e}. Its heartbeat was still renewed {:?} after this daemon \
                     first saw it (a daemon that stopped lets it lapse within {alive:?}), so \
                     this daemon does not start beside it",
                    started.elapsed()
                ));
            }
            Err(e) => {
                warn!(error = %e, node = %config.node,
                    "cluster: cannot check the node name at start-up; it is checked at every heartbeat");
                return Ok(());
            }
        }
    }
}

/// How the daemon reaches Redis for `config`.
fn store_config(config: &ClusterConfig) -> StoreConfig {
    let mut store = StoreConfig::new(
        config.redis.iter().map(|u| u.url.clone()).collect(),
        match config.mode {
            ClusterMode::Single => Mode::Single,
            ClusterMode::Cluster => Mode::Cluster,
            ClusterMode::Sentinel => Mode::Sentinel,
        },
    );
    store.sentinel_master = config.sentinel_master.clone();
    store.tls = config.tls.as_ref().map(|files| redis::TlsCertificates {
        root_cert: files.ca.as_ref().map(|ca| ca.pem.clone()),
        client_tls: files
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.pem.clone(),
                client_key: key.pem.clone(),
            }),
    });
    store.primary_username = config.primary_username.clone();
    store.primary_password = config.primary_password.clone();
    store.timeout = config.timeout;
    // A sync's batches and the hot listing may take the whole tick.
    store.bulk_timeout = config.sync_interval;
    // A claim is spent until the next tick, and holds the other nodes
    // back as long as this node's kernel keeps the share it became.
    store.claim_horizon = config.sync_interval;
    store.claim_hold = 3 * config.sync_interval;
    store
}

/// Starts the sync task for `ifaces` (pinned under `pin_dir`), heartbeating
/// as the instance `token`.
#[allow(clippy::too_many_arguments)]
pub fn start(
    config: ClusterConfig,
    token: String,
    pin_dir: &Path,
    ifaces: &[String],
    names: RuleNames,
    events: mpsc::Receiver<LimitEvent>,
    metrics: ClusterMetrics,
    live: SharedLive,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut opened = Vec::with_capacity(ifaces.len());
    for iface in ifaces {
        let dir = pins::maps_dir(&pins::iface_dir(pin_dir, iface));
        let maps = Maps::from_pins(&dir)
            .map_err(|e| anyhow::anyhow!("{iface}: cannot open the pinned maps: {e}"))?;
        opened.push((iface.clone(), maps));
    }
    let mut sync = Sync {
        config,
        ifaces: opened,
        store: None,
        names,
        events,
        tracked: HashMap::new(),
        health: Health::default(),
        nodes_alive: 0,
        hot_cursor: 0,
        recovering_until: None,
        recovering_nodes: 0,
        sync_cap: None,
        last_partial: false,
        syncs_sent: false,
        token,
        duplicate: false,
        remote_left_out: 0,
        remote_logged: None,
        metrics,
        live,
    };
    Ok(tokio::spawn(async move {
        let mut interval = tokio::time::interval(sync.config.sync_interval);
        // A slow tick is cut at the deadline and the next one starts on the
        // schedule: missed ticks are skipped, never run back to back.
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            interval.tick().await;
            sync.tick().await;
        }
    }))
}

impl Sync {
    fn store_config(&self) -> StoreConfig {
        store_config(&self.config)
    }

    /// The live generation's rules by name: (RULES index, rule).
    fn live_rules(&self) -> HashMap<String, Rule> {
        let Some((_, maps)) = self.ifaces.first() else {
            return HashMap::new();
        };
        let Ok(config) = maps.live_config() else {
            return HashMap::new();
        };
        let base = rules_base(config.generation);
        let names = self.names.read().map(|n| n.clone()).unwrap_or_default();
        names
            .into_iter()
            .filter(|(index, _)| (base..base + MAX_RULES).contains(index))
            .filter_map(|(index, name)| maps.rule(index).ok().map(|rule| (name, rule)))
            .filter(|(_, rule)| rule.scope() == Some(Scope::Cluster))
            .collect()
    }

    fn rule_name(&self, index: u32) -> Option<String> {
        let names = self.names.read().ok()?;
        names
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, n)| n.clone())
    }

    /// Tracks a source (`remote`: only because another node listed it
    /// hot); a source reported here is not remote any more.
    fn track(&mut self, key: SourceKey, rule: String, now: Instant, remote: bool) {
        let count = self.ifaces.len();
        let text = report_key(&key, &rule);
        self.tracked
            .entry(text.clone())
            .or_insert_with(|| Tracked {
                key,
                rule,
                active: now,
                admitted: vec![AdmittedTracker::default(); count],
                offered: vec![OfferedTracker::default(); count],
                estimate: vec![0; count],
                offered_now: vec![0; count],
                allowance: None,
                written_until: 0,
                limit: 0,
                window: Duration::ZERO,
                synced: None,
                unsent: (0, 0),
                remote,
            })
            .active = now;
        if !remote {
            if let Some(tracked) = self.tracked.get_mut(&text) {
                tracked.remote = false;
            }
        }
    }

    async fn tick(&mut self) {
        let started = Instant::now();
        // (a) Sources the kernel reported hot since the last tick.
        while let Ok(event) = self.events.try_recv() {
            if event.kind() == Some(EventKind::ClusterHot) {
                if let Some(rule) = self.rule_name(event.rule) {
                    self.track(event.key, rule, started, false);
                }
            }
        }
        let rules = self.live_rules();
        // (b) Deltas since the last tick, formed whatever the sync's outcome.
        let kernel_now = kernel_ns();
        let mut groups: Groups = HashMap::new();
        let mut gone = Vec::new();
        // At most `sync_cap` sources, the stalest first: the others keep
        // their last allowance and their deltas wait in the kernel (the
        // trackers are not advanced) until their turn.
        let keys: Vec<String> = match self.sync_cap {
            Some(cap) if cap < self.tracked.len() => {
                // The `cap` stalest, by last sync only (a full sort, or
                // ties broken by key, cost a tenth of a tick at 100,000).
                let mut order: Vec<(Option<Instant>, &String)> =
                    self.tracked.iter().map(|(k, t)| (t.synced, k)).collect();
                order.select_nth_unstable_by_key(cap, |&(synced, _)| synced);
                order.truncate(cap);
                order.into_iter().map(|(_, k)| k.clone()).collect()
            }
            _ => self.tracked.keys().cloned().collect(),
        };
        let sent = keys.len();
        for text in keys {
            let Some(tracked) = self.tracked.get_mut(&text) else {
                continue;
            };
            let Some(rule) = rules.get(&tracked.rule) else {
                // Not a cluster rule (any more) in the live generation.
                gone.push(text.clone());
                continue;
            };
            let window =
                Duration::from_nanos(rule.bucket_ns.saturating_mul(u64::from(rule.buckets)));
            tracked.limit = rule.allowance_packets;
            tracked.window = window;
            let (mut admitted, mut offered) = (0u64, 0u64);
            for (i, (_, maps)) in self.ifaces.iter().enumerate() {
                if let Some(state) = maps.window(&tracked.key) {
                    let words = state.slots.map(|slot| slot[0]);
                    let first =
                        first_bucket_of_window(kernel_now, state.bucket_ns.max(1), rule.buckets);
                    admitted += tracked.admitted[i].advance(&words, first);
                    tracked.estimate[i] = tick::estimate_at(
                        &state.slots,
                        state.bucket_ns,
                        rule.buckets,
                        kernel_now + self.config.sync_interval.as_nanos() as u64,
                    );
                }
                if let Ok(per_cpu) = maps.sources.get(&tracked.key, 0) {
                    let second = kernel_now / 1_000_000_000;
                    let total: u64 = per_cpu.iter().map(|t| t.total.packets).sum();
                    let current: u64 = per_cpu
                        .iter()
                        .filter(|t| t.second + 1 >= second)
                        .map(|t| t.current.packets)
                        .sum();
                    tracked.offered_now[i] = tracked.offered[i].advance(total, current);
                    offered += tracked.offered_now[i];
                } else {
                    tracked.offered_now[i] = 0;
                }
            }
            // Frame classes other than the budget's count in other SOURCES
            // entries: offered is never below admitted.
            let offered = offered.max(admitted);
            // What failed ticks never sent goes with this report.
            let (carried_admitted, carried_offered) = std::mem::take(&mut tracked.unsent);
            let admitted = admitted + carried_admitted;
            let offered = offered + carried_offered;
            // Kept two windows after its last traffic or hot listing: the
            // listing is renewed once a window, so one window would drop
            // (and re-create, from a fresh reading) a source kept only by
            // it whenever a tick starts just after the window.
            if offered > 0 {
                tracked.active = started;
                tracked.remote = false;
            } else if started.duration_since(tracked.active) > 2 * window {
                gone.push(text.clone());
                continue;
            }
            let bucket_ms = (rule.bucket_ns / 1_000_000).max(1);
            groups.entry((bucket_ms, rule.buckets)).or_default().push((
                text.clone(),
                Report {
                    key: text.clone(),
                    admitted,
                    offered,
                    limit: rule.allowance_packets,
                },
                tracked.synced,
            ));
        }
        // Stalest first (never synced before all): Redis serves a tick's
        // calls in the order sent.
        for entries in groups.values_mut() {
            entries.sort_by_key(|(_, _, synced)| *synced);
        }
        for text in gone {
            self.tracked.remove(&text);
        }
        // (c) Redis, cut before the tick's deadline (`TickPlan`): the rest
        // of the tick writes the kernel's maps and lists a slice of the hot
        // set (a Redis busy with the syncs up to the deadline would leave
        // the listing no time at all).
        self.last_partial = false;
        self.syncs_sent = false;
        let plan = TickPlan::new(started, self.config.sync_interval);
        let budget = plan.syncs_until.saturating_duration_since(Instant::now());
        let outcome = tokio::time::timeout(budget, self.redis(&groups, plan.syncs_until)).await;
        let outcome = match outcome {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout {
                op: "sync tick",
                after: self.config.sync_interval,
            }),
        };
        // (d) The kernel.
        let now = Instant::now();
        let kernel_now = kernel_ns();
        let synced = match outcome {
            Ok((nodes, allowances)) => {
                let known = self.nodes_alive;
                self.nodes_alive = nodes;
                let was_duplicate = std::mem::take(&mut self.duplicate);
                if was_duplicate {
                    info!(node = %self.config.node, nodes,
                        "cluster: no other daemon heartbeats under this node name any more: syncing again");
                }
                let recovered = self.health.success() == Some(Change::Recovered);
                if recovered {
                    info!(nodes, "cluster: Redis reachable again, node recovered (outage counts not replayed)");
                }
                if recovered || was_duplicate {
                    // Redis holds nothing of what the nodes admitted while
                    // degraded (dropped, or lost with a restart) or while
                    // this node's name was another daemon's, but the
                    // kernels' windows still do: for one window the
                    // fallback cap stays on top of the claims, or the
                    // cluster would admit the outage's L again.
                    let window = self
                        .tracked
                        .values()
                        .map(|t| t.window)
                        .max()
                        .unwrap_or_default();
                    self.recovering_until = Some(now + window);
                    // A restarted Redis knows only the nodes that have
                    // heartbeat into it yet (this one first): the cap
                    // divides by the nodes known before the outage until
                    // the others are back.
                    self.recovering_nodes = known;
                }
                let recovering = self.recovering_until.is_some_and(|until| now < until);
                let expires =
                    share_expiry(kernel_now, self.config.sync_interval, Phase::Normal, now);
                let count = allowances.len();
                for (text, share) in allowances {
                    if let Some(tracked) = self.tracked.get_mut(&text) {
                        tracked.synced = Some(now);
                        // Relative to the kernel's own count, not Redis's
                        // view of this node: the two windows' bucket edges
                        // differ (kernel clock, Redis TIME), and an
                        // absolute allowance would let the kernel re-admit
                        // what its window forgot before Redis's did.
                        // One claim per node: split over the interfaces the
                        // source arrives on, or each would admit it all.
                        let parts = tick::split_claim(share, &tracked.offered_now);
                        let mut allowance: Vec<u64> = tracked
                            .estimate
                            .iter()
                            .zip(parts)
                            .map(|(e, part)| e.saturating_add(part))
                            .collect();
                        if recovering {
                            let cap = fallback_cap(
                                self.config.fallback,
                                tracked.limit,
                                nodes.max(self.recovering_nodes),
                            );
                            let caps = tick::split_claim(cap, &tracked.offered_now);
                            for (a, cap) in allowance.iter_mut().zip(caps) {
                                *a = (*a).min(cap);
                            }
                        }
                        tracked.allowance = Some(allowance);
                        tracked.written_until = 0;
                    }
                }
                if let Some(expires) = expires {
                    self.write_shares(expires, kernel_now);
                }
                Some(count)
            }
            Err(e) => {
                if let StoreError::DuplicateNode { holder, nodes, .. } = &e {
                    // This node is not in Redis's count of the nodes
                    // alive (the other daemon holds its name): the
                    // fallback's split counts it too.
                    self.nodes_alive = nodes.saturating_add(1);
                    if !self.duplicate {
                        error!(node = %self.config.node, %holder, error = %e,
                            "cluster: another daemon heartbeats under this node's name: not syncing, cluster sources held to the fallback cap until the name is free; give each node a distinct cluster.node");
                        self.duplicate = true;
                        // Shares claimed under a name two daemons used
                        // are not this node's to keep: they end now and
                        // the fallback applies at once (no grace).
                        self.write_shares(kernel_now, kernel_now);
                        for tracked in self.tracked.values_mut() {
                            tracked.allowance = None;
                        }
                    }
                } else {
                    self.metrics.redis_error(&e);
                }
                // The first failure of a run is logged (its cause says what
                // to look at); the third degrades the node, logged below.
                if self.duplicate {
                    debug!(error = %e, "cluster: sync tick refused (duplicate node name)");
                } else if self.health.phase(now, self.config.grace) == Phase::Normal {
                    info!(error = %e, kind = e.kind().name(),
                        "cluster: a sync tick failed (the node degrades after 3 in a row)");
                } else {
                    debug!(error = %e, "cluster: sync tick failed");
                }
                // Behind Sentinel the primary may have moved: ask the
                // Sentinels again next tick (a single instance's or a
                // Redis Cluster's connection reconnects and follows the
                // topology on its own).
                if self.config.mode == ClusterMode::Sentinel && !self.duplicate {
                    self.store = None;
                }
                // A duplicate's ticks count as failed too (degraded after
                // 3), but its fallback is already in force: no grace line.
                if self.health.failure(now) == Some(Change::Degraded) && !self.duplicate {
                    warn!(error = %e, grace = ?self.config.grace, fallback = self.config.fallback.name(),
                        "cluster: 3 sync ticks failed, node degraded: keeping the last shares for the grace period, then the fallback");
                }
                // A duplicate's deltas are not this name's to report later.
                let degraded = self.health.degraded() || self.duplicate;
                for (text, report, _) in groups.values().flatten() {
                    if let Some(tracked) = self.tracked.get_mut(text) {
                        tracked.unsent = unsent_after_failure(self.syncs_sent, degraded, report);
                    }
                }
                let phase = self.phase(now);
                if let Some(expires) =
                    share_expiry(kernel_now, self.config.sync_interval, phase, now)
                {
                    self.write_shares(expires, kernel_now);
                }
                None
            }
        };
        self.sync_cap = next_cap(
            self.sync_cap,
            sent,
            synced,
            self.last_partial,
            started.elapsed(),
            self.config.sync_interval,
            self.tracked.len(),
        );
        let phase = self.phase(now);
        let state = kernel_state(
            kernel_now,
            self.config.sync_interval,
            self.nodes_alive,
            self.config.fallback,
            self.config.threshold,
            phase,
        );
        for (iface, maps) in &mut self.ifaces {
            if let Err(e) = kernel_cluster::write_state(maps, state) {
                warn!(%iface, error = %e, "cluster: cannot write the cluster state");
            }
        }
        // (e) Sources hot on other nodes, once the kernel has this tick's
        // shares, and only when Redis answered.
        if synced.is_some() {
            let window = groups
                .keys()
                .map(|&(ms, b)| Duration::from_millis(ms * u64::from(b)))
                .max()
                .unwrap_or(Duration::from_secs(1));
            self.list_hot(window, plan).await;
        }
        // Operators.
        let fallback = (phase == Phase::Fallback).then_some(self.config.fallback);
        let remote = self.tracked.values().filter(|t| t.remote).count();
        self.metrics.remote_sources.set(remote as i64);
        self.metrics.duplicate_node.set(i64::from(self.duplicate));
        self.metrics.degraded.set(i64::from(self.health.degraded()));
        self.metrics.nodes_alive.set(i64::from(self.nodes_alive));
        for f in [Fallback::Split, Fallback::Local] {
            self.metrics
                .fallback
                .with_label_values(&[f.name()])
                .set(i64::from(fallback == Some(f)));
        }
        if let Some(count) = synced {
            self.metrics.synced_sources.set(count as i64);
        }
        self.metrics
            .sync_duration
            .observe(started.elapsed().as_secs_f64());
        if let Ok(mut live) = self.live.lock() {
            live.nodes_alive = self.nodes_alive;
            live.degraded = self.health.degraded();
            live.fallback_in_force = fallback;
            live.failed_ticks = self.health.failed_ticks;
            live.duplicate_node = self.duplicate;
            live.remote_sources = remote;
            if let Some(count) = synced {
                live.last_sync = Some(now);
                live.synced_sources = count;
            }
        }
    }

    /// Where the node stands: the health's phase, or the fallback at once
    /// while another daemon holds this node's name.
    fn phase(&self, now: Instant) -> Phase {
        if self.duplicate {
            Phase::Fallback
        } else {
            self.health.phase(now, self.config.grace)
        }
    }

    /// Connects if needed, heartbeats and syncs; returns the nodes alive
    /// and the claim of each report synced (`cluster::share::node_claim`).
    ///
    /// The heartbeat is bounded by the call timeout (a hung Redis shows
    /// there first). The syncs share what is left of the tick: a batch cut
    /// at the deadline fails only its sources, which keep their last
    /// allowance and go first next tick; the tick fails only when nothing
    /// synced.
    async fn redis(
        &mut self,
        groups: &Groups,
        deadline: Instant,
    ) -> Result<(u32, Vec<(String, u64)>), StoreError> {
        if self.store.is_none() {
            self.store = Some(Store::connect(&self.store_config()).await?);
        }
        let node = self.config.node.clone();
        let nodes = self
            .store
            .as_ref()
            .expect("connected above")
            .heartbeat_as(&node, &self.token, alive_period(self.config.sync_interval))
            .await?;
        // From here on Redis may count what this tick reports.
        self.syncs_sent = !groups.is_empty();
        let store = self.store.as_ref().expect("connected above");
        let mut allowances = Vec::new();
        let (mut failed, mut first_error) = (0usize, None);
        for (&(bucket_ms, buckets), entries) in groups {
            let spec = WindowSpec::new(Duration::from_millis(bucket_ms), buckets)?;
            let reports: Vec<Report> = entries.iter().map(|(_, r, _)| r.clone()).collect();
            // Ends a little before the cut around this call, so the
            // batches served in time come back as a partial sync instead
            // of racing the cut, which would lose them all.
            let budget = deadline
                .saturating_duration_since(Instant::now())
                .saturating_sub(PARTIAL_MARGIN);
            let outcome = store.sync_partial(&node, spec, &reports, budget).await?;
            failed += outcome.failed_batches;
            if first_error.is_none() {
                first_error = outcome.error;
            }
            for ((text, _, _), totals) in entries.iter().zip(outcome.totals) {
                if let Some(totals) = totals {
                    allowances.push((text.clone(), totals.claim));
                }
            }
        }
        if let Some(e) = first_error {
            if allowances.is_empty() {
                return Err(e);
            }
            self.metrics.redis_error(&e);
            self.metrics.partial_ticks.inc();
            self.last_partial = true;
            debug!(failed, synced = allowances.len(), error = %e,
                "cluster: part of the hot sources not synced this tick (they go first next tick)");
        }
        Ok((nodes, allowances))
    }

    /// Lists a slice of the hot set (`hot_slice`: every group once per
    /// window) and tracks the sources hot on other nodes: they are synced
    /// from the next tick on. Called after the kernel's maps are written,
    /// never before: a listing ahead of the writes would delay every
    /// share by its round trip, and a share written late lets the kernel
    /// re-admit what left its window meanwhile (`bench cluster` saw windows
    /// up to 1,050 at T = 50 ms with it ahead). By `plan.listing_until`;
    /// skipped, its slice left for the next tick, when too little time is
    /// left or the listing runs out of it (neither counts as a Redis
    /// error); a slice Redis fails is listed again a window later. Never
    /// fails the tick.
    async fn list_hot(&mut self, window: Duration, plan: TickPlan) {
        let Some(store) = self.store.as_ref() else {
            return;
        };
        let budget = plan.listing_until.saturating_duration_since(Instant::now());
        if budget < plan.listing_least {
            return;
        }
        let slice = hot_slice(self.hot_cursor, self.config.sync_interval, window);
        let slice_start = slice.start;
        self.hot_cursor = slice.end % GROUPS;
        let limit = self.config.max_remote_sources;
        match store
            .hot_sources_bounded(window, slice, budget, limit)
            .await
        {
            Ok(list) => {
                let now = Instant::now();
                let left_out = self.take_listed(list, now);
                self.remote_left_out(left_out, now);
            }
            Err(StoreError::Timeout { .. }) => {
                // Out of the tick's time (Redis still busy with syncs cut
                // at their deadline, at capacity): the same slice next
                // tick; not a Redis failure.
                self.hot_cursor = slice_start;
                debug!("cluster: no time left to list the hot set this tick");
            }
            Err(e) => {
                self.metrics.redis_error(&e);
                warn!(error = %e, "cluster: cannot list the sources hot on other nodes (these groups are listed again in a window)");
            }
        }
    }

    /// Tracks the sources of a hot listing: renews those tracked, adds the
    /// others while fewer than `cluster.max_remote_sources` are tracked
    /// only for being listed. Returns how many were left out (over the
    /// bound, here or in Redis's reply).
    fn take_listed(&mut self, list: HotList, now: Instant) -> u64 {
        let limit = self.config.max_remote_sources;
        let mut remote = self.tracked.values().filter(|t| t.remote).count();
        let mut left_out = list.omitted;
        for key in list.keys {
            if let Some(tracked) = self.tracked.get_mut(&key) {
                tracked.active = now;
            } else if remote >= limit {
                left_out += 1;
            } else if let Some((source, rule)) = parse_report_key(&key) {
                self.track(source, rule, now, true);
                remote += 1;
            }
        }
        left_out
    }

    /// Counts hot sources of other nodes left out by the bound, and logs
    /// them once per `REMOTE_LOG_EVERY` (the first at once), not once per
    /// source or listing.
    fn remote_left_out(&mut self, count: u64, now: Instant) {
        if count == 0 {
            return;
        }
        self.metrics.remote_sources_over_limit.inc_by(count);
        self.remote_left_out += count;
        if self
            .remote_logged
            .is_none_or(|at| now.duration_since(at) >= REMOTE_LOG_EVERY)
        {
            warn!(left_out = self.remote_left_out, limit = self.config.max_remote_sources, every = ?REMOTE_LOG_EVERY,
                "cluster: sources hot on other nodes not tracked here (cluster.max_remote_sources reached); on this node they stay at the cold cap until they are hot here");
            self.remote_left_out = 0;
            self.remote_logged = Some(now);
        }
    }

    /// Writes every tracked source's last allowance with `expires_ns`
    /// where `share_due`: a share kept unchanged is rewritten only as it
    /// nears its expiry, not every tick (at 100,000 tracked sources the
    /// writes were most of a tick's CPU).
    fn write_shares(&mut self, expires_ns: u64, now_ns: u64) {
        let interval = self.config.sync_interval;
        let mut due: Vec<&mut Tracked> = self
            .tracked
            .values_mut()
            .filter(|t| {
                t.allowance.is_some() && share_due(t.written_until, expires_ns, now_ns, interval)
            })
            .collect();
        if due.is_empty() {
            return;
        }
        // One batch per interface (thousands of shares a tick with
        // 100,000 sources synced in turns: one syscall each cost a third
        // of the tick); a share not written is written again next tick.
        let mut written = vec![true; due.len()];
        for (i, (iface, maps)) in self.ifaces.iter_mut().enumerate() {
            let shares: Vec<(SourceKey, ClusterShare)> = due
                .iter()
                .map(|t| {
                    let allowance = t.allowance.as_ref().map_or(0, |a| a[i]);
                    let share = ClusterShare {
                        allowance_packets: allowance,
                        expires_ns,
                    };
                    (t.key, share)
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
        for (tracked, written) in due.iter_mut().zip(written) {
            tracked.written_until = if written { expires_ns } else { 0 };
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

    /// What docs/cluster.md says a tracked source costs (about 1 KiB with
    /// one interface, what bounds `cluster.max_remote_sources`' memory):
    /// the entry (its key's text, the struct) and per interface its
    /// trackers, with room for the hash map's spare slots and the
    /// allocator's headers.
    #[test]
    fn a_tracked_source_costs_under_a_kilobyte_with_one_interface() {
        use std::mem::size_of;
        let key_text = "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff/128#7|a-rule-name".len();
        let entry = size_of::<String>() + key_text + size_of::<Tracked>() + 32;
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
        let report = Report {
            key: "192.0.2.3/32#0|default".into(),
            admitted: 30,
            offered: 90,
            limit: 1000,
        };
        // Connect or heartbeat failed: Redis never saw them.
        assert_eq!(unsent_after_failure(false, false, &report), (30, 90));
        // A sync went out: Redis may have counted it.
        assert_eq!(unsent_after_failure(true, false, &report), (0, 0));
        // Degraded: an outage's counts are not replayed.
        assert_eq!(unsent_after_failure(false, true, &report), (0, 0));
    }

    #[test]
    fn a_tick_cuts_the_syncs_then_the_listing_and_keeps_slack() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let plan = TickPlan::new(start, ms(100));
        assert_eq!(plan.syncs_until, start + ms(90));
        assert_eq!(plan.listing_until, start + ms(95));
        assert_eq!(plan.listing_least, ms(2));
        // Short intervals keep at least 2 ms of slack and 3 ms after the
        // syncs.
        let plan = TickPlan::new(start, ms(20));
        assert_eq!(plan.syncs_until, start + ms(15));
        assert_eq!(plan.listing_until, start + ms(18));
        assert_eq!(plan.listing_least, ms(1));
        // Never past the interval, however short.
        let plan = TickPlan::new(start, ms(3));
        assert_eq!(
            (plan.syncs_until, plan.listing_until),
            (start, start + ms(1))
        );
    }

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

    #[test]
    fn each_group_is_listed_once_per_window_in_slices_of_a_tick() {
        let t = Duration::from_millis(100);
        for (window, ticks) in [
            (Duration::from_secs(1), 10),
            (Duration::from_millis(250), 2),
            (Duration::from_secs(60), 256),
            (Duration::from_millis(100), 1),
            (Duration::from_millis(50), 1),
        ] {
            // From the first group, the slices cover every group once in
            // `ticks` ticks (the last slice shorter), then start over.
            let mut listed = vec![0u32; usize::from(GROUPS)];
            let (mut cursor, mut count, mut largest) = (0, 0, 0);
            while count == 0 || cursor != 0 {
                let slice = hot_slice(cursor, t, window);
                assert!(!slice.is_empty() && slice.end <= GROUPS, "{slice:?}");
                largest = largest.max(slice.len());
                for g in slice.clone() {
                    listed[usize::from(g)] += 1;
                }
                cursor = slice.end % GROUPS;
                count += 1;
                assert!(count <= ticks, "{window:?}: over {ticks} ticks");
            }
            assert_eq!(count, ticks, "{window:?}");
            assert!(listed.iter().all(|&n| n == 1), "{window:?}: {listed:?}");
            assert_eq!(largest, usize::from(GROUPS.div_ceil(ticks as u16)));
        }
        // A cursor past the last group (never kept, but cheap) wraps.
        assert_eq!(hot_slice(GROUPS, t, Duration::from_secs(1)), 0..26);
    }

    #[test]
    fn the_cap_follows_what_redis_served() {
        let t = Duration::from_millis(100);
        let fast = Duration::from_millis(20);
        // Uncapped and keeping up: stays uncapped.
        assert_eq!(next_cap(None, 5000, Some(5000), false, fast, t, 5000), None);
        // Partial: 90% of what was served.
        assert_eq!(
            next_cap(None, 10_000, Some(4000), true, t, t, 10_000),
            Some(3600)
        );
        // Fast ticks grow it by half, and lift it once it covers all.
        assert_eq!(
            next_cap(Some(3600), 3600, Some(3600), false, fast, t, 10_000),
            Some(5400)
        );
        assert_eq!(
            next_cap(Some(8000), 8000, Some(8000), false, fast, t, 10_000),
            None
        );
        // A complete tick close to the interval grows it by a tenth; one
        // that took the whole interval keeps it.
        let close = Duration::from_millis(80);
        assert_eq!(
            next_cap(Some(3600), 3600, Some(3600), false, close, t, 10_000),
            Some(3961)
        );
        assert_eq!(
            next_cap(Some(3600), 3600, Some(3600), false, t, t, 10_000),
            Some(3600)
        );
        // A failed tick that sent many halves it; one that sent few keeps it.
        assert_eq!(
            next_cap(None, 10_000, None, false, t, t, 10_000),
            Some(5000)
        );
        assert_eq!(next_cap(Some(300), 10, None, false, t, t, 10), Some(300));
        // Never under one batch.
        assert_eq!(next_cap(None, 100, Some(1), true, t, t, 100), Some(64));
        assert_eq!(next_cap(None, 100, None, false, t, t, 100), Some(64));
    }
}
