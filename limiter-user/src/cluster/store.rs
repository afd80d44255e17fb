//! The Redis side of cluster-scoped limits: a [`Store`] that adds this
//! node's admitted and offered deltas to per-bucket counters and reads back
//! the window totals (`sync.lua`), records node heartbeats
//! (`heartbeat.lua`) and lists the sources hot on any node (`hot.lua`).
//!
//! One code path serves a single Redis instance (a [`ConnectionManager`],
//! which reconnects on its own) and a Redis Cluster (the async cluster
//! client, which routes each call by its first key): [`Connection`] hides
//! which. Sources are spread over [`GROUPS`] groups and every key of a
//! source carries its group's hash tag; a call only carries sources of one
//! group in cluster mode, so Redis Cluster never sees a cross-slot request
//! and a tick makes at most a few hundred calls however many sources are
//! hot (a tag per source would cost one call per hash slot, up to 16384).
//! A single instance takes many sources per call whatever their group.
//!
//! Scripts run with EVALSHA; on NOSCRIPT (Redis restarted, `SCRIPT FLUSH`,
//! a failover) the redis crate's [`Script`] loads the script and retries.
//! Every call is bounded by the configured timeout, in the crate (response
//! timeout) and around it ([`tokio::time::timeout`]), so a hung server
//! costs a timeout error, never a hang.
//!
//! Buckets are numbered from Redis `TIME` inside the script: node clocks
//! never move window edges. Bucket keys expire a window plus two buckets
//! after their last write and nothing is written to disk by us (run Redis
//! without persistence, see docs/cluster.md).

use std::{collections::BTreeMap, future::Future, time::Duration};

use futures_util::future::join_all;

use redis::{
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClientBuilder,
    cluster_async::ClusterConnection,
    sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType},
    Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisError, RedisFuture, Script, TlsMode, Value,
};

use crate::config::{redact_url, Secret};

/// The sync script (see the file for its keys and arguments).
const SYNC_LUA: &str = include_str!("sync.lua");
/// The heartbeat script.
const HEARTBEAT_LUA: &str = include_str!("heartbeat.lua");
/// The script listing recently hot sources.
const HOT_LUA: &str = include_str!("hot.lua");

/// Most reports in one script call: a call blocks the Redis instance while
/// it runs (about 16 commands per report with 10 buckets, measured at about
/// 20 us per report in all), so batches stay short enough (about 1.5 ms)
/// that other nodes' calls queued behind a few of them still meet a 50 ms
/// timeout.
pub const MAX_BATCH: usize = 64;
/// Longest node name and report key accepted (they become key and field
/// names on every call).
pub const MAX_NAME: usize = 256;
/// Longest window accepted, in buckets: each sync reads every bucket of
/// every source it carries (`buckets x MAX_BATCH` HMGETs in one call at
/// most), so a long window takes longer buckets, not more of them (a 60 s
/// window: 10 buckets of 6 s).
pub const MAX_BUCKETS: u32 = 64;
/// How many hash-tag groups the sources are spread over. Part of the key
/// layout (every node must use the same), hence a constant: enough groups
/// to spread evenly over the primaries of a Redis Cluster, few enough that
/// a tick in cluster mode costs at most this many calls (plus one per
/// [`MAX_BATCH`] sources of a group).
pub const GROUPS: u16 = 256;

/// Errors of the cluster store, each saying what was being done.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid Redis URL `{url}`: {source}")]
    Url {
        url: String,
        #[source]
        source: RedisError,
    },
    #[error("invalid key prefix `{0}`: must be non-empty, without `{{` or `}}`")]
    Prefix(String),
    #[error("no Redis URL given")]
    NoUrl,
    #[error("mode `sentinel` needs the name the Sentinels monitor the primary under")]
    NoSentinelMaster,
    #[error("mode `single` takes exactly one Redis URL, got {0}")]
    SingleWithSeveralUrls(usize),
    #[error("cannot connect to Redis at {target}: {source}")]
    Connect {
        target: String,
        #[source]
        source: RedisError,
    },
    #[error("Redis {op} timed out after {after:?}")]
    Timeout { op: &'static str, after: Duration },
    #[error("Redis {op} failed: {source}")]
    Redis {
        op: &'static str,
        #[source]
        source: RedisError,
    },
    #[error("Redis {op} returned an unexpected reply: {detail}")]
    Reply { op: &'static str, detail: String },
    #[error("invalid window: {0}")]
    Window(String),
    #[error("invalid node name `{0}`: must be 1 to {MAX_NAME} bytes")]
    Node(String),
    #[error("invalid report key `{0}`: must be 1 to {MAX_NAME} bytes")]
    Key(String),
    #[error("invalid instance token `{0}`: must be at most {MAX_NAME} bytes")]
    Token(String),
    #[error("report `{key}`: limit {limit} is above 2^53 (Lua numbers are doubles)")]
    Limit { key: String, limit: u64 },
    #[error("report `{key}`: admitted delta {admitted} exceeds offered delta {offered}")]
    Deltas {
        key: String,
        admitted: u64,
        offered: u64,
    },
    /// Another daemon heartbeats under this node's name
    /// ([`Store::heartbeat_as`]): nothing was written.
    #[error(
        "node name `{node}` is already in use: another xdp-limiter daemon (instance {holder}) \
         heartbeats into Redis under it (its claim on the name expires in {expires_in:?} \
         unless renewed); two daemons with one name would each claim the whole limit of a \
         source. Give each node a distinct `node` under [cluster] (the default is the hostname)"
    )]
    DuplicateNode {
        node: String,
        /// The other daemon's instance token.
        holder: String,
        /// When its claim on the name lapses if it stops renewing it.
        expires_in: Duration,
        /// Nodes alive as Redis counts them (the other one included,
        /// this one not).
        nodes: u32,
    },
}

/// What kind of failure a [`StoreError`] is, as operators tell them apart
/// (the `kind` label of `xdp_limiter_cluster_redis_errors_total`): a
/// timeout is a slow or hung Redis (or a stalled machine), a connection
/// failure an unreachable one, a server error a Redis that answered with
/// an error (CROSSSLOT, WRONGTYPE, CLUSTERDOWN, READONLY, ...: a
/// deployment or version problem), `other` a reply the store did not
/// expect or an input it refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    Timeout,
    Connection,
    Server,
    Other,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 4] = [
        ErrorKind::Timeout,
        ErrorKind::Connection,
        ErrorKind::Server,
        ErrorKind::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Connection => "connection",
            ErrorKind::Server => "server",
            ErrorKind::Other => "other",
        }
    }
}

impl StoreError {
    /// Which kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Timeout { .. } => ErrorKind::Timeout,
            StoreError::Connect { source, .. } if source.is_timeout() => ErrorKind::Timeout,
            StoreError::Connect { .. } => ErrorKind::Connection,
            StoreError::Redis { source, .. } => redis_error_kind(source),
            StoreError::Url { .. }
            | StoreError::Prefix(_)
            | StoreError::NoUrl
            | StoreError::NoSentinelMaster
            | StoreError::SingleWithSeveralUrls(_)
            | StoreError::Reply { .. }
            | StoreError::Window(_)
            | StoreError::Node(_)
            | StoreError::Key(_)
            | StoreError::Token(_)
            | StoreError::Limit { .. }
            | StoreError::Deltas { .. }
            | StoreError::DuplicateNode { .. } => ErrorKind::Other,
        }
    }
}

/// The kind of a redis crate error: its I/O errors (refused, reset,
/// dropped) and lost cluster connections are connection failures, an
/// error reply from the server (which always has a code) is a server
/// error.
fn redis_error_kind(e: &RedisError) -> ErrorKind {
    use redis::ErrorKind as K;
    if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.kind() == K::ClusterConnectionNotFound
    {
        ErrorKind::Connection
    } else if e.code().is_some() {
        ErrorKind::Server
    } else {
        ErrorKind::Other
    }
}

/// Single instance, Redis Cluster, or a primary found through Redis
/// Sentinel (the `[cluster] mode` setting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Single,
    Cluster,
    /// The URLs are Sentinels; the primary they monitor under
    /// [`StoreConfig::sentinel_master`] is used as a single instance.
    Sentinel,
}

/// How to reach Redis.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// `redis://host:port[/db]` URLs: one for a single instance, the seed
    /// nodes of a Redis Cluster.
    pub urls: Vec<String>,
    pub mode: Mode,
    /// Bound on every Redis call (and on connecting), except the calls of
    /// one sync and the hot-source listing, which share `bulk_timeout`.
    pub timeout: Duration,
    /// Bound on a whole [`Store::sync_partial`] or [`Store::hot_sources`]:
    /// their calls go out together and Redis serves them one after the
    /// other, so the last waits for all the others; bounding each by
    /// `timeout` would fail a sync that is merely large. The daemon gives
    /// them what is left of its tick.
    pub bulk_timeout: Duration,
    /// Prefix of every key, so several deployments can share a Redis.
    pub prefix: String,
    /// How far ahead a sync claims room (`sync.lua`): the sync interval,
    /// since the claim is spent until the next sync.
    pub claim_horizon: Duration,
    /// How long a node's claim holds the others back if it does not sync
    /// again: as long as its kernel keeps the share (three intervals).
    pub claim_hold: Duration,
    /// With [`Mode::Sentinel`]: the name the Sentinels monitor the primary
    /// under (`sentinel monitor <name> ...`).
    pub sentinel_master: Option<String>,
    /// With `rediss://` URLs: the CA that Redis's certificate must chain to
    /// (`None` inside: the system's trust store) and this client's
    /// certificate and key (mutual TLS). Behind Sentinel, for the
    /// Sentinels and the primary alike.
    pub tls: Option<redis::TlsCertificates>,
    /// With [`Mode::Sentinel`]: the primary's ACL user and password (the
    /// URLs' own are the Sentinels').
    pub primary_username: Option<String>,
    pub primary_password: Option<Secret>,
}

impl StoreConfig {
    /// A configuration with the documented defaults: 50 ms per call, keys
    /// under `xl`, claims for a 100 ms sync interval.
    pub fn new(urls: Vec<String>, mode: Mode) -> Self {
        Self {
            urls,
            mode,
            timeout: Duration::from_millis(50),
            bulk_timeout: Duration::from_millis(50),
            prefix: "xl".into(),
            claim_horizon: Duration::from_millis(100),
            claim_hold: Duration::from_millis(300),
            sentinel_master: None,
            tls: None,
            primary_username: None,
            primary_password: None,
        }
    }
}

/// The sliding window the counts are kept over: `buckets` buckets of
/// `bucket` each (for example 10 x 100 ms for a 1 s window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    bucket_ms: u64,
    buckets: u32,
}

impl WindowSpec {
    /// A window of `buckets` buckets of `bucket` (whole milliseconds, at
    /// least 1 ms; 1 to [`MAX_BUCKETS`] buckets).
    pub fn new(bucket: Duration, buckets: u32) -> Result<Self, StoreError> {
        if bucket.is_zero() || !bucket.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(StoreError::Window(format!(
                "bucket length {bucket:?} must be a whole number of milliseconds, at least 1 ms"
            )));
        }
        if buckets == 0 || buckets > MAX_BUCKETS {
            return Err(StoreError::Window(format!(
                "{buckets} buckets per window: must be 1 to {MAX_BUCKETS}"
            )));
        }
        let bucket_ms = u64::try_from(bucket.as_millis())
            .map_err(|_| StoreError::Window(format!("bucket length {bucket:?} is too long")))?;
        Ok(Self { bucket_ms, buckets })
    }

    pub fn bucket(&self) -> Duration {
        Duration::from_millis(self.bucket_ms)
    }

    pub fn buckets(&self) -> u32 {
        self.buckets
    }

    /// The window, `bucket x buckets`.
    pub fn window(&self) -> Duration {
        self.bucket() * self.buckets
    }

    /// How long a bucket key lives after its last write: a window plus two
    /// buckets, so a bucket is still there for every read that can include
    /// it (a node whose call lands just after a bucket edge) and gone soon
    /// after.
    pub fn ttl(&self) -> Duration {
        self.bucket() * (self.buckets + 2)
    }
}

/// One source's deltas from this node since its last sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The source and rule, as the daemon names them (e.g.
    /// `192.0.2.3/32|default`); the Redis Cluster hash tag of its keys.
    pub key: String,
    /// Frames this node admitted.
    pub admitted: u64,
    /// Frames offered to this node (admitted or refused).
    pub offered: u64,
    /// The source's cluster-wide limit over the window (the rule's `L`):
    /// what the claim is made against.
    pub limit: u64,
}

/// What Redis holds for one report after adding its deltas, over the
/// window that ends with the current bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub cluster_admitted: u64,
    pub cluster_offered: u64,
    pub own_admitted: u64,
    pub own_offered: u64,
    /// The current bucket number, `floor(Redis TIME / bucket length)`.
    pub bucket: u64,
    /// What this node may admit until its next sync
    /// ([`super::share::node_claim`], computed in the script so that it
    /// reads and reserves the room atomically).
    pub claim: u64,
}

/// What [`Store::sync_partial`] got: each report's totals (`None` when its
/// batch failed), the first error and how many batches failed.
#[derive(Debug, Default)]
pub struct SyncOutcome {
    pub totals: Vec<Option<Totals>>,
    pub error: Option<StoreError>,
    pub failed_batches: usize,
}

/// Either kind of connection, so the script calls are written once. Both
/// are cheap to clone (a handle on one multiplexed connection), which lets
/// a sync run its batches concurrently.
#[derive(Clone)]
pub enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// The cluster store: a connection and the two scripts.
pub struct Store {
    con: Connection,
    mode: Mode,
    timeout: Duration,
    prefix: String,
    bulk_timeout: Duration,
    claim_horizon: Duration,
    claim_hold: Duration,
    /// Nodes alive at the last heartbeat: how a sync splits the room of a
    /// source nobody offered anything for yet.
    nodes_alive: std::sync::atomic::AtomicU32,
    sync: Script,
    heartbeat: Script,
    hot: Script,
}

impl Store {
    /// Checks the configuration, connects (within four timeouts: TCP,
    /// handshake, and in cluster mode the topology) and loads the scripts
    /// (each within the timeout).
    pub async fn connect(config: &StoreConfig) -> Result<Self, StoreError> {
        let urls = &config.urls;
        // A brace in the prefix would become the hash tag of every key.
        if config.prefix.is_empty() || config.prefix.contains(['{', '}']) {
            return Err(StoreError::Prefix(config.prefix.clone()));
        }
        if urls.is_empty() {
            return Err(StoreError::NoUrl);
        }
        let mut infos = Vec::with_capacity(urls.len());
        for url in urls {
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str()).map_err(
                |source| StoreError::Url {
                    url: redact_url(url),
                    source,
                },
            )?;
            infos.push(info);
        }
        // Errors name the URLs without their passwords.
        let target = urls
            .iter()
            .map(|url| redact_url(url))
            .collect::<Vec<_>>()
            .join(", ");
        let timeout = config.timeout;
        // The crate's own bound on a reply: the longest of ours (each call
        // is also bounded by `timeout` or a bulk budget around it).
        let response = config.timeout.max(config.bulk_timeout);
        let connect_err = |source| StoreError::Connect {
            target: target.clone(),
            source,
        };
        let con = match config.mode {
            Mode::Single => {
                if infos.len() != 1 {
                    return Err(StoreError::SingleWithSeveralUrls(infos.len()));
                }
                let client = client(infos.remove(0), &config.tls).map_err(connect_err)?;
                Connection::Single(
                    single(client, timeout, response)
                        .await
                        .map_err(connect_err)?,
                )
            }
            Mode::Sentinel => {
                let master = config
                    .sentinel_master
                    .clone()
                    .ok_or(StoreError::NoSentinelMaster)?;
                let mut sentinels = sentinel_client(&infos, master, config).map_err(connect_err)?;
                // Asks the Sentinels (in order) for the primary and checks
                // its role; the connection then goes to that address. After
                // a failover the old address refuses writes or is gone: the
                // sync loop drops the store on a failed tick and connects
                // again through the Sentinels (`daemon::cluster`).
                let client = bounded("connect", timeout * 4, sentinels.async_get_client())
                    .await?
                    .map_err(connect_err)?;
                Connection::Single(
                    single(client, timeout, response)
                        .await
                        .map_err(connect_err)?,
                )
            }
            Mode::Cluster => {
                let mut builder = ClusterClientBuilder::new(infos);
                if let Some(certs) = &config.tls {
                    builder = builder.certs(certs.clone());
                }
                let client = builder
                    .connection_timeout(timeout)
                    .response_timeout(response)
                    .retries(1)
                    .build()
                    .map_err(connect_err)?;
                let con = bounded("connect", timeout * 4, client.get_async_connection())
                    .await?
                    .map_err(connect_err)?;
                Connection::Cluster(con)
            }
        };
        let store = Self {
            con,
            mode: config.mode,
            timeout,
            prefix: config.prefix.clone(),
            bulk_timeout: config.bulk_timeout,
            claim_horizon: config.claim_horizon,
            claim_hold: config.claim_hold,
            nodes_alive: std::sync::atomic::AtomicU32::new(1),
            sync: Script::new(SYNC_LUA),
            heartbeat: Script::new(HEARTBEAT_LUA),
            hot: Script::new(HOT_LUA),
        };
        store.load_scripts().await?;
        Ok(store)
    }

    /// Loads both scripts (on every primary of a Redis Cluster: the crate
    /// routes SCRIPT LOAD to all), so the first sync's concurrent batches
    /// do not each meet NOSCRIPT and load the script again. Later NOSCRIPT
    /// (a restart, a failover, SCRIPT FLUSH) is still handled per call.
    async fn load_scripts(&self) -> Result<(), StoreError> {
        for script in [&self.sync, &self.heartbeat, &self.hot] {
            let mut con = self.con.clone();
            bounded("script load", self.timeout, script.load_async(&mut con))
                .await?
                .map_err(|source| call_error("script load", self.timeout, source))?;
        }
        Ok(())
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The connection, for callers (tests, status) that need a plain
    /// command; every call should still be bounded by a timeout.
    pub fn connection(&self) -> Connection {
        self.con.clone()
    }

    /// The key prefix of a report's bucket keys, `<prefix>:{g<group>}:<key>`
    /// with the group of [`group`]; bucket `n` is that plus `:<n>`.
    pub fn source_key(&self, key: &str) -> String {
        format!("{}:{{g{}}}:{key}", self.prefix, group(key))
    }

    /// The sorted set of a group's recently hot sources.
    pub fn hot_key(&self, group: u16) -> String {
        format!("{}:{{g{group}}}:hot", self.prefix)
    }

    /// The sorted set of node heartbeats.
    pub fn nodes_key(&self) -> String {
        format!("{}:nodes", self.prefix)
    }

    /// The guard of a node's name (`heartbeat.lua`): the instance token of
    /// the daemon heartbeating under it. Its hash tag is the node set's
    /// name, so both keys of a heartbeat are in one Redis Cluster slot.
    pub fn node_key(&self, node: &str) -> String {
        format!("{0}:{{{0}:nodes}}:node:{node}", self.prefix)
    }

    /// Adds each report's deltas to the current bucket as `node` and
    /// returns, in the order of `reports`, the window totals after that.
    ///
    /// All or nothing for the caller: [`Store::sync_partial`] within
    /// `bulk_timeout`, and the first error if any batch failed.
    pub async fn sync(
        &self,
        node: &str,
        window: WindowSpec,
        reports: &[Report],
    ) -> Result<Vec<Totals>, StoreError> {
        let outcome = self
            .sync_partial(node, window, reports, self.bulk_timeout)
            .await?;
        if let Some(e) = outcome.error {
            return Err(e);
        }
        Ok(outcome.totals.into_iter().flatten().collect())
    }

    /// As [`Store::sync`], batch by batch: reports are sent in batches (by
    /// hash slot in cluster mode, up to [`MAX_BATCH`] per call, in the
    /// order of `reports` otherwise) that go out together and all end
    /// within `budget` (Redis serves them in the order sent, so put first
    /// what matters most). A batch that fails or is cut at the budget
    /// leaves its reports `None` (and its error in `error`) without
    /// failing the others: a Redis that is reachable but cannot serve
    /// every hot source in one tick syncs some of them, not none. The
    /// caller drops the deltas of a failed batch rather than replaying
    /// them (Redis may have counted them before the cut).
    pub async fn sync_partial(
        &self,
        node: &str,
        window: WindowSpec,
        reports: &[Report],
        budget: Duration,
    ) -> Result<SyncOutcome, StoreError> {
        check_node(node)?;
        for report in reports {
            check_report(report)?;
        }
        let batches = batches(self.mode, reports);
        let calls = batches
            .iter()
            .map(|batch| self.sync_batch(node, window, reports, batch, budget));
        let replies = join_all(calls).await;
        let mut outcome = SyncOutcome {
            totals: vec![None; reports.len()],
            error: None,
            failed_batches: 0,
        };
        for (batch, reply) in batches.iter().zip(replies) {
            match reply {
                Ok(reply) => {
                    for (&index, total) in batch.iter().zip(reply) {
                        outcome.totals[index] = Some(total);
                    }
                }
                Err(e) => {
                    outcome.failed_batches += 1;
                    outcome.error.get_or_insert(e);
                }
            }
        }
        Ok(outcome)
    }

    async fn sync_batch(
        &self,
        node: &str,
        window: WindowSpec,
        reports: &[Report],
        batch: &[usize],
        budget: Duration,
    ) -> Result<Vec<Totals>, StoreError> {
        let mut call = self.sync.prepare_invoke();
        call.arg(node)
            .arg(window.bucket_ms)
            .arg(window.buckets)
            .arg(ms(window.ttl()))
            .arg(ms(self.claim_horizon))
            .arg(ms(self.claim_hold))
            .arg(
                self.nodes_alive
                    .load(std::sync::atomic::Ordering::Relaxed)
                    .max(1),
            );
        for &index in batch {
            let report = &reports[index];
            call.key(self.source_key(&report.key))
                .arg(report.admitted)
                .arg(report.offered)
                .arg(report.limit);
        }
        let mut con = self.con.clone();
        let reply: Vec<i64> = bounded("sync", budget, call.invoke_async(&mut con))
            .await?
            .map_err(|source| call_error("sync", budget, source))?;
        parse_sync_reply(&reply, batch.len())
    }

    /// The source keys some node synced with non-zero deltas within
    /// `within` (Redis time; the sync script keeps them for a window), in
    /// no particular order: the daemon syncs these too, so a source hot on
    /// other nodes is counted here even while it is light here. One call on
    /// a single instance, one per group (concurrently) on a Redis Cluster.
    pub async fn hot_sources(&self, within: Duration) -> Result<Vec<String>, StoreError> {
        self.hot_sources_in(within, 0..GROUPS, self.bulk_timeout)
            .await
    }

    /// [`Store::hot_sources`] of the groups in `groups` only, all within
    /// `budget`: the daemon lists a slice of the groups each tick, in what
    /// is left of the tick, so a large hot set is read over a window in
    /// replies a tick can take, not in one reply that outlasts every tick
    /// (100,000 hot sources did).
    pub async fn hot_sources_in(
        &self,
        within: Duration,
        groups: std::ops::Range<u16>,
        budget: Duration,
    ) -> Result<Vec<String>, StoreError> {
        Ok(self
            .hot_sources_bounded(within, groups, budget, UNBOUNDED)
            .await?
            .keys)
    }

    /// [`Store::hot_sources_in`] returning at most `limit` keys: Redis
    /// only counts the others ([`HotList::omitted`]), so neither the reply
    /// nor what the caller keeps of it grows with the hot set. In cluster
    /// mode each group's call returns at most its part of `limit`
    /// (rounded up), and the whole is cut to `limit`.
    pub async fn hot_sources_bounded(
        &self,
        within: Duration,
        groups: std::ops::Range<u16>,
        budget: Duration,
        limit: usize,
    ) -> Result<HotList, StoreError> {
        let within_ms = ms(within);
        let groups = groups.start.min(GROUPS)..groups.end.min(GROUPS);
        if groups.is_empty() || limit == 0 {
            return Ok(HotList::default());
        }
        let groups: Vec<Vec<u16>> = match self.mode {
            Mode::Single | Mode::Sentinel => vec![groups.collect()],
            Mode::Cluster => groups.map(|g| vec![g]).collect(),
        };
        let limit = limit.min(UNBOUNDED);
        let per_call = limit.div_ceil(groups.len());
        let calls = groups.iter().map(|groups| async move {
            let mut call = self.hot.prepare_invoke();
            for &g in groups {
                call.key(self.hot_key(g));
            }
            call.arg(within_ms).arg(per_call);
            let mut con = self.con.clone();
            let reply = bounded(
                "hot sources",
                budget,
                call.invoke_async::<Vec<Value>>(&mut con),
            )
            .await?
            .map_err(|source| call_error("hot sources", budget, source))?;
            parse_hot_reply(reply)
        });
        let lists = join_all(calls)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let mut list = HotList::default();
        for part in lists {
            list.omitted += part.omitted;
            list.keys.extend(part.keys);
        }
        if list.keys.len() > limit {
            list.omitted += (list.keys.len() - limit) as u64;
            list.keys.truncate(limit);
        }
        Ok(list)
    }

    /// Records `node` alive now (Redis time), forgets nodes not heard from
    /// within `alive` and returns how many nodes are alive, this one
    /// included.
    pub async fn heartbeat(&self, node: &str, alive: Duration) -> Result<u32, StoreError> {
        self.heartbeat_as(node, "", alive).await
    }

    /// [`Store::heartbeat`] as the daemon instance `token` (random per
    /// run), guarding the name: while another instance's heartbeat under
    /// `node` is live (renewed within `alive`), nothing is written and the
    /// call fails with [`StoreError::DuplicateNode`]. An empty token does
    /// not guard the name. A daemon that stopped frees its name `alive`
    /// after its last heartbeat.
    pub async fn heartbeat_as(
        &self,
        node: &str,
        token: &str,
        alive: Duration,
    ) -> Result<u32, StoreError> {
        check_node(node)?;
        if token.len() > MAX_NAME {
            return Err(StoreError::Token(token.to_owned()));
        }
        let alive_ms = ms(alive);
        if alive_ms == 0 {
            return Err(StoreError::Window(format!(
                "alive period {alive:?} must be at least 1 ms"
            )));
        }
        let mut call = self.heartbeat.prepare_invoke();
        call.key(self.nodes_key())
            .key(self.node_key(node))
            .arg(node)
            .arg(alive_ms)
            .arg(token);
        let mut con = self.con.clone();
        let (count, holder, expires_ms): (i64, String, i64) =
            bounded("heartbeat", self.timeout, call.invoke_async(&mut con))
                .await?
                .map_err(|source| call_error("heartbeat", self.timeout, source))?;
        let count = u32::try_from(count).map_err(|_| StoreError::Reply {
            op: "heartbeat",
            detail: format!("node count {count}"),
        })?;
        if !holder.is_empty() {
            return Err(StoreError::DuplicateNode {
                node: node.to_owned(),
                holder,
                // PTTL: -1 (no expiry, set by hand) or -2 (gone since).
                expires_in: Duration::from_millis(u64::try_from(expires_ms).unwrap_or(0)),
                nodes: count,
            });
        }
        self.nodes_alive
            .store(count, std::sync::atomic::Ordering::Relaxed);
        Ok(count)
    }
}

/// The client of one Redis: with the TLS certificates when there are.
fn client(
    info: ConnectionInfo,
    tls: &Option<redis::TlsCertificates>,
) -> Result<redis::Client, RedisError> {
    match tls {
        Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
        None => redis::Client::open(info),
    }
}

/// The Sentinels' client: logged in to each Sentinel as its URL says (the
/// first URL's login serves them all: the crate takes one), to the primary
/// as `primary_username`/`primary_password` say, in the first URL's
/// database; over TLS to both when the URLs are `rediss://`.
fn sentinel_client(
    infos: &[ConnectionInfo],
    master: String,
    config: &StoreConfig,
) -> Result<SentinelClient, RedisError> {
    let addrs = infos.iter().map(|info| info.addr().clone());
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?;
    if let Some(first) = infos.first() {
        let login = first.redis_settings();
        if let Some(user) = login.username() {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = login.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
        builder = builder.set_client_to_redis_db(login.db());
        if matches!(first.addr(), ConnectionAddr::TcpTls { .. }) {
            builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
            if let Some(certs) = &config.tls {
                builder = builder
                    .set_client_to_sentinel_certificates(certs.clone())
                    .set_client_to_redis_certificates(certs.clone());
            }
        }
    }
    if let Some(user) = &config.primary_username {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = &config.primary_password {
        builder = builder.set_client_to_redis_password(password.expose());
    }
    builder.build()
}

/// A connection manager on `client` with few reconnection retries: the
/// sync loop calls again next tick anyway, and a refused connection should
/// say so now rather than after seconds of backoff. Bounded by four
/// timeouts.
async fn single(
    client: redis::Client,
    timeout: Duration,
    response: Duration,
) -> Result<ConnectionManager, RedisError> {
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(response))
        .set_number_of_retries(1)
        .set_max_delay(timeout);
    match tokio::time::timeout(
        timeout * 4,
        ConnectionManager::new_with_config(client, manager_config),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no connection within {:?}", timeout * 4),
        ))),
    }
}

/// Runs `future` for at most `after`.
async fn bounded<T>(
    op: &'static str,
    after: Duration,
    future: impl Future<Output = T>,
) -> Result<T, StoreError> {
    tokio::time::timeout(after, future)
        .await
        .map_err(|_| StoreError::Timeout { op, after })
}

/// A failed call's error: the crate's own response timeout (set to the
/// same bound, it may fire first) is a timeout like ours.
fn call_error(op: &'static str, after: Duration, source: RedisError) -> StoreError {
    if source.is_timeout() {
        StoreError::Timeout { op, after }
    } else {
        StoreError::Redis { op, source }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn check_node(node: &str) -> Result<(), StoreError> {
    if node.is_empty() || node.len() > MAX_NAME {
        return Err(StoreError::Node(node.to_owned()));
    }
    Ok(())
}

fn check_report(report: &Report) -> Result<(), StoreError> {
    let key = &report.key;
    // Braces are harmless: the group's tag comes first in every key.
    if key.is_empty() || key.len() > MAX_NAME {
        return Err(StoreError::Key(key.clone()));
    }
    if report.admitted > report.offered {
        return Err(StoreError::Deltas {
            key: key.clone(),
            admitted: report.admitted,
            offered: report.offered,
        });
    }
    // Lua numbers are doubles: limits and deltas past 2^53 would lose
    // precision (no real tick sees that many frames).
    if report.limit > 1 << 53 {
        return Err(StoreError::Limit {
            key: key.clone(),
            limit: report.limit,
        });
    }
    if report.offered > 1 << 53 {
        return Err(StoreError::Deltas {
            key: key.clone(),
            admitted: report.admitted,
            offered: report.offered,
        });
    }
    Ok(())
}

/// The reports' indices grouped into script calls: by group (so by Redis
/// Cluster hash slot) in cluster mode, as a call's keys must share a slot;
/// in order otherwise; at most [`MAX_BATCH`] per call.
pub fn batches(mode: Mode, reports: &[Report]) -> Vec<Vec<usize>> {
    let groups: Vec<Vec<usize>> = match mode {
        Mode::Single | Mode::Sentinel => vec![(0..reports.len()).collect()],
        Mode::Cluster => {
            let mut by_group: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
            for (index, report) in reports.iter().enumerate() {
                by_group.entry(group(&report.key)).or_default().push(index);
            }
            by_group.into_values().collect()
        }
    };
    groups
        .into_iter()
        .flat_map(|group| {
            group
                .chunks(MAX_BATCH)
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>()
        })
        .filter(|batch| !batch.is_empty())
        .collect()
}

/// A report's group, 0 to [`GROUPS`] - 1: a hash of its key (CRC16, as
/// good a spread as Redis Cluster's own). Its keys' hash tag is
/// `g<group>`.
pub fn group(key: &str) -> u16 {
    crc16(key.as_bytes()) % GROUPS
}

/// The Redis Cluster slot of a key whose hash tag is `tag`: CRC16 (XMODEM)
/// of the tag modulo 16384.
pub fn key_slot(tag: &[u8]) -> u16 {
    crc16(tag) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// What [`Store::hot_sources_in`] asks for when unbounded (Lua numbers
/// are doubles: exact up to 2^53).
const UNBOUNDED: usize = 1 << 40;

/// Sources hot on any node, as [`Store::hot_sources_bounded`] lists them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HotList {
    pub keys: Vec<String>,
    /// Hot sources left out of `keys` by the bound.
    pub omitted: u64,
}

/// `hot.lua`'s reply: `{left out, member, ...}`.
fn parse_hot_reply(reply: Vec<Value>) -> Result<HotList, StoreError> {
    let bad = |detail: String| StoreError::Reply {
        op: "hot sources",
        detail,
    };
    let mut items = reply.into_iter();
    let omitted = match items.next() {
        Some(Value::Int(n)) => u64::try_from(n).map_err(|_| bad(format!("{n} left out")))?,
        other => return Err(bad(format!("count {other:?}"))),
    };
    let keys = items
        .map(|item| match item {
            Value::BulkString(bytes) => {
                String::from_utf8(bytes).map_err(|e| bad(format!("key not UTF-8: {e}")))
            }
            other => Err(bad(format!("key {other:?}"))),
        })
        .collect::<Result<_, _>>()?;
    Ok(HotList { keys, omitted })
}

fn parse_sync_reply(reply: &[i64], reports: usize) -> Result<Vec<Totals>, StoreError> {
    let bad = |detail: String| StoreError::Reply { op: "sync", detail };
    if reply.len() != 1 + 5 * reports {
        return Err(bad(format!(
            "{} integers for {reports} reports (expected {})",
            reply.len(),
            1 + 5 * reports
        )));
    }
    let count = |v: i64| u64::try_from(v).map_err(|_| bad(format!("negative count {v}")));
    let bucket = count(reply[0])?;
    reply[1..]
        .chunks_exact(5)
        .map(|c| {
            Ok(Totals {
                cluster_admitted: count(c[0])?,
                cluster_offered: count(c[1])?,
                own_admitted: count(c[2])?,
                own_offered: count(c[3])?,
                bucket,
                claim: count(c[4])?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(key: &str) -> Report {
        Report {
            key: key.into(),
            admitted: 1,
            offered: 2,
            limit: 100,
        }
    }

    /// The daemon shares one store between tasks of a multi-thread
    /// runtime: the store and its futures must be Send (and the store
    /// Sync). Compiles or not; never called.
    #[allow(dead_code)]
    fn store_and_its_futures_are_send(store: &Store, window: WindowSpec, reports: &[Report]) {
        fn send<T: Send>(_: &T) {}
        fn sync<T: Sync>(_: &T) {}
        sync(store);
        send(&store.sync("a", window, reports));
        send(&store.heartbeat("a", Duration::from_secs(1)));
        send(&Store::connect(&StoreConfig::new(vec![], Mode::Single)));
    }

    #[test]
    fn key_slots_match_redis_cluster() {
        // Values from `CLUSTER KEYSLOT` (and the Redis Cluster spec).
        // CRC16/XMODEM check value 0x31C3 (below 16384, so the slot).
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn single_mode_batches_in_order_up_to_the_batch_size() {
        let reports: Vec<Report> = (0..MAX_BATCH + 3)
            .map(|i| report(&format!("s{i}")))
            .collect();
        let b = batches(Mode::Single, &reports);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0], (0..MAX_BATCH).collect::<Vec<_>>());
        assert_eq!(b[1], (MAX_BATCH..MAX_BATCH + 3).collect::<Vec<_>>());
        assert!(batches(Mode::Single, &[]).is_empty());
    }

    #[test]
    fn cluster_mode_batches_never_mix_slots() {
        let n = 20_000;
        let reports: Vec<Report> = (0..n)
            .map(|i| report(&format!("10.{}.{}.1/32|r", i / 256, i % 256)))
            .collect();
        let b = batches(Mode::Cluster, &reports);
        let mut seen: Vec<usize> = b.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
        let slot = |i: usize| key_slot(format!("g{}", group(&reports[i].key)).as_bytes());
        for batch in &b {
            assert!(batch.len() <= MAX_BATCH);
            assert!(batch.iter().all(|&i| slot(i) == slot(batch[0])));
        }
        // Calls per tick are bounded by the groups, not the sources: every
        // group used, none overfull.
        assert!(b.len() >= usize::from(GROUPS), "{} calls", b.len());
        assert!(
            b.len() <= n.div_ceil(MAX_BATCH) + usize::from(GROUPS),
            "{} calls",
            b.len()
        );
    }

    #[test]
    fn window_spec_validates() {
        let w = WindowSpec::new(Duration::from_millis(100), 10).unwrap();
        assert_eq!(w.window(), Duration::from_secs(1));
        assert_eq!(w.ttl(), Duration::from_millis(1200));
        assert!(WindowSpec::new(Duration::ZERO, 10).is_err());
        assert!(WindowSpec::new(Duration::from_micros(1500), 10).is_err());
        assert!(WindowSpec::new(Duration::from_millis(100), 0).is_err());
        assert!(WindowSpec::new(Duration::from_millis(100), MAX_BUCKETS + 1).is_err());
    }

    #[test]
    fn bad_reports_are_refused_with_the_reason() {
        assert!(check_report(&report("192.0.2.3/32|default")).is_ok());
        assert!(check_report(&report("odd{rule}name")).is_ok());
        for key in ["", &"x".repeat(MAX_NAME + 1)] {
            let e = check_report(&report(key)).unwrap_err();
            assert!(matches!(e, StoreError::Key(_)), "{e}");
        }
        let e = check_report(&Report {
            limit: (1 << 53) + 1,
            ..report("k")
        })
        .unwrap_err();
        assert!(matches!(e, StoreError::Limit { .. }), "{e}");
        let e = check_report(&Report {
            key: "k".into(),
            admitted: 3,
            offered: 2,
            limit: 10,
        })
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("admitted delta 3 exceeds offered delta 2"),
            "{e}"
        );
        assert!(matches!(check_node(""), Err(StoreError::Node(_))));
    }

    #[test]
    fn sync_replies_are_checked() {
        let t = parse_sync_reply(&[7, 1, 2, 3, 4, 5], 1).unwrap();
        assert_eq!(
            t,
            vec![Totals {
                cluster_admitted: 1,
                cluster_offered: 2,
                own_admitted: 3,
                own_offered: 4,
                bucket: 7,
                claim: 5,
            }]
        );
        assert!(parse_sync_reply(&[7, 1, 2, 3, 4], 1).is_err());
        assert!(parse_sync_reply(&[7, -1, 2, 3, 4, 5], 1).is_err());
    }
}
