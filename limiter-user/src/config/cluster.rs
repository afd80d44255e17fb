//! `[cluster]`: where cluster-scoped rules share their budgets (Redis) and
//! how this node takes part (its name, how often it syncs, how it falls
//! back). The file form ([`ClusterSection`], what serde reads and `--save`
//! writes back) and its validated form ([`ClusterConfig`], what the daemon
//! runs with). An absent section means no cluster: every rule is then
//! node-scoped. The sync itself lives in `crate::daemon::sync` and
//! `crate::cluster`; this module only decides what an operator may write:
//! the two forms here, their validation in `validate`, the Redis URLs in
//! `url` (passwords never reach a log or `status`: [`RedisUrl::redacted`],
//! [`Secret`]). The TLS files of `rediss://` URLs are read and checked with
//! them ([`super::tls`]).

use std::{fmt, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

mod url;
mod validate;

pub(crate) use self::validate::hostname;
pub use self::{
    url::{parse_redis_url, redact_secrets, redact_url, RedisEndpoint, RedisUrl},
    validate::check_node_name,
};
use super::tls::TlsFiles;

/// Shortest and longest `cluster.sync_interval`: below 10 ms the round
/// trips to Redis are most of the interval; above 10 s a cluster-wide limit
/// over a 1 s window is no limit at all.
pub const MIN_SYNC_INTERVAL: Duration = Duration::from_millis(10);
pub const MAX_SYNC_INTERVAL: Duration = Duration::from_secs(10);
/// Shortest `cluster.timeout` (a zero timeout would fail every call).
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);
/// Longest `cluster.grace`: a node that has not reached Redis for an hour
/// is not holding "the last share" any more, it is guessing.
pub const MAX_GRACE: Duration = Duration::from_secs(3600);
/// `cluster.grace` is at least this many sync intervals: the node is only
/// declared degraded after 3 failed ticks, so a shorter grace would apply
/// the fallback before a share could ever have been kept.
pub const GRACE_INTERVALS: u32 = 3;
/// Longest node name (a Linux hostname's limit, `HOST_NAME_MAX`).
pub const MAX_NODE_NAME: usize = 64;
/// Default and largest `cluster.max_remote_sources`. Each source a node
/// tracks costs it under a kilobyte of daemon memory (about 0.7 KiB with
/// one interface, 0.25 KiB more per further interface) and a sync per
/// tick; past the default, one Redis core no longer syncs them all each
/// tick anyway (docs/cluster.md, "Redis load"), and the kernel keeps
/// 65,536 shares. The largest caps the daemon's memory for them under a
/// gigabyte with one interface.
pub const DEFAULT_MAX_REMOTE_SOURCES: usize = 50_000;
pub const MAX_MAX_REMOTE_SOURCES: usize = 1_000_000;
/// Port of a `redis://` URL that names none.
pub const DEFAULT_REDIS_PORT: u16 = 6379;

/// `cluster.mode`: one Redis, the seed nodes of a Redis Cluster, or the
/// Sentinels of a primary with replicas.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ClusterMode {
    /// One Redis instance (one URL).
    #[default]
    Single,
    /// A Redis Cluster; the URLs are seed nodes (one is enough).
    Cluster,
    /// Redis Sentinel: the URLs are Sentinels, which name the primary
    /// monitored as `cluster.sentinel_master` (followed across failovers).
    Sentinel,
}

impl ClusterMode {
    pub const fn name(self) -> &'static str {
        match self {
            ClusterMode::Single => "single",
            ClusterMode::Cluster => "cluster",
            ClusterMode::Sentinel => "sentinel",
        }
    }
}

/// `cluster.fallback`: what a node degraded past its grace period admits
/// per cluster-scoped source.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// The limit divided by the nodes last seen alive: the cluster stays
    /// within the limit (strict).
    #[default]
    Split,
    /// The whole limit on every node: availability over strictness.
    Local,
}

impl Fallback {
    pub const fn name(self) -> &'static str {
        match self {
            Fallback::Split => "split",
            Fallback::Local => "local",
        }
    }
}

/// `[cluster]` as the file spells it (Debug hides passwords, see below).
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// Redis URLs: one for a single instance, the seed nodes of a Redis
    /// Cluster with `mode = "cluster"`.
    pub redis: Vec<String>,
    pub mode: ClusterMode,
    /// With `mode = "sentinel"`: the name the Sentinels monitor the
    /// primary under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentinel_master: Option<String>,
    /// This node's name in the cluster; unset: the hostname (kept unset
    /// in the file so that `--save` does not pin one machine's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// How often the daemon syncs the hot sources with Redis.
    #[serde(with = "humantime_serde")]
    pub sync_interval: Duration,
    /// Deadline of each Redis call.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Fraction of a source's limit on this node past which it is synced.
    pub threshold: f64,
    /// The most sources this node tracks because other nodes listed them
    /// hot (sources its own kernel reports are always tracked).
    pub max_remote_sources: usize,
    pub fallback: Fallback,
    /// How long a degraded node keeps each source's last share.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// With `rediss://` URLs: the CA certificate(s), PEM, that Redis's
    /// certificate must chain to; unset: the system's trust store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<PathBuf>,
    /// With `rediss://` URLs: this node's certificate (PEM), for a Redis
    /// that authenticates its clients (`tls-auth-clients yes`); with
    /// `tls_key_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of `tls_cert_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// With `mode = "sentinel"`: the ACL user the primary is logged in as
    /// (the URLs' own credentials are the Sentinels').
    #[serde(skip_serializing_if = "Option::is_none")]
    pub primary_username: Option<String>,
    /// With `mode = "sentinel"`: the primary's password (`requirepass`, or
    /// that of `primary_username`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub primary_password: Option<String>,
    /// A file whose first line is the password every URL logs in with, so
    /// the secret lives outside the configuration (a systemd credential,
    /// a file only root reads); the URLs then carry no password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// A file whose first line is the ACL user of `password_file`; the
    /// URLs then carry no user.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username_file: Option<PathBuf>,
    /// With `mode = "sentinel"`: a file whose first line is the primary's
    /// password, instead of `primary_password`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub primary_password_file: Option<PathBuf>,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            redis: Vec::new(),
            mode: ClusterMode::Single,
            sentinel_master: None,
            node: None,
            sync_interval: Duration::from_millis(100),
            timeout: Duration::from_millis(50),
            threshold: 0.25,
            max_remote_sources: DEFAULT_MAX_REMOTE_SOURCES,
            fallback: Fallback::Split,
            grace: Duration::from_secs(10),
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            primary_username: None,
            primary_password: None,
            password_file: None,
            username_file: None,
            primary_password_file: None,
        }
    }
}

/// Debug with every URL's password hidden: the file form is printed
/// wherever a `Config` is.
impl fmt::Debug for ClusterSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redis: Vec<String> = self.redis.iter().map(|u| redact_url(u)).collect();
        f.debug_struct("ClusterSection")
            .field("redis", &redis)
            .field("mode", &self.mode)
            .field("sentinel_master", &self.sentinel_master)
            .field("node", &self.node)
            .field("sync_interval", &self.sync_interval)
            .field("timeout", &self.timeout)
            .field("threshold", &self.threshold)
            .field("max_remote_sources", &self.max_remote_sources)
            .field("fallback", &self.fallback)
            .field("grace", &self.grace)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("primary_username", &self.primary_username)
            .field(
                "primary_password",
                &self.primary_password.as_ref().map(|_| "***"),
            )
            .field("password_file", &self.password_file)
            .field("username_file", &self.username_file)
            .field("primary_password_file", &self.primary_password_file)
            .finish()
    }
}

/// A password: Debug shows `***`, so a configuration printed in a log, an
/// error or a test failure never carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The password itself, for the Redis client only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

/// `[cluster]` validated: what the daemon runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterConfig {
    pub redis: Vec<RedisUrl>,
    pub mode: ClusterMode,
    /// Set exactly when `mode` is `Sentinel`.
    pub sentinel_master: Option<String>,
    /// This node's name (the configured one, else the hostname).
    pub node: String,
    pub sync_interval: Duration,
    pub timeout: Duration,
    pub threshold: f64,
    pub max_remote_sources: usize,
    pub fallback: Fallback,
    pub grace: Duration,
    /// Set exactly when the URLs are `rediss://`: the files read and
    /// checked (each optional inside).
    pub tls: Option<TlsFiles>,
    /// With `mode = "sentinel"`: how the primary is logged in to.
    pub primary_username: Option<String>,
    pub primary_password: Option<Secret>,
    /// The login every URL uses, read from `password_file` (and
    /// `username_file`); `None`: what each URL says.
    pub login: Option<Login>,
}

/// A login read from files (`cluster.password_file`, `username_file`).
#[derive(Clone, Debug, PartialEq)]
pub struct Login {
    pub username: Option<String>,
    pub password: Secret,
}
