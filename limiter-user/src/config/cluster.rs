//! `[cluster]`: where cluster-scoped rules share their budgets (Redis) and
//! how this node takes part (its name, how often it syncs, how it falls
//! back). The file form ([`ClusterSection`], what serde reads and `--save`
//! writes back) and its validated form ([`ClusterConfig`], what the daemon
//! runs with). An absent section means no cluster: every rule is then
//! node-scoped. The sync itself lives in `crate::daemon::cluster` and
//! `crate::cluster`; this file only decides what an operator may write.
//!
//! Redis URLs are checked here, by hand, so that a typo is refused when the
//! file is read rather than when the first sync fails, and so that passwords
//! never reach a log or `status` ([`RedisUrl::redacted`], [`Secret`]). The
//! TLS files of `rediss://` URLs are read and checked here too
//! ([`super::tls`]).

use std::{fmt, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use super::{tls::TlsFiles, ConfigError};

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

/// Where a Redis URL points (no password in it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisEndpoint {
    /// `redis://host:port` (or `rediss://`, see [`RedisUrl::tls`]).
    Tcp { host: String, port: u16 },
    /// `redis+unix:///path` or `unix:///path`.
    Unix { path: String },
}

/// A checked Redis URL. `url` is exactly what the file says (what the
/// Redis client is given); everything shown to people is
/// [`redacted`](Self::redacted).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    pub url: String,
    pub endpoint: RedisEndpoint,
    /// The database number (0 unless the URL names one).
    pub db: u32,
    /// `rediss://`: the connection is TLS.
    pub tls: bool,
    /// What the URL logs in with (`user:password` before the `@`, or the
    /// socket's `user`/`pass` parameters), to compare URLs by.
    login: Option<String>,
    redacted: String,
}

impl RedisUrl {
    /// The URL with its password replaced by `***`: for logs and `status`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }
}

/// Debug shows the redacted URL: a `Config` printed in a log or a test
/// failure must not leak a password.
impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({:?})", self.redacted)
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
}

fn field(name: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: format!("cluster.{name}"),
        message: message.into(),
    }
}

impl ClusterSection {
    /// Checks every field; errors name it (`cluster.sync_interval`).
    pub fn validate(&self) -> Result<ClusterConfig, ConfigError> {
        if self.redis.is_empty() {
            return Err(field(
                "redis",
                "no Redis URL; give one (redis://host:6379) or remove [cluster]",
            ));
        }
        let mut redis = Vec::with_capacity(self.redis.len());
        for (i, text) in self.redis.iter().enumerate() {
            let url = parse_redis_url(text).map_err(|m| field(&format!("redis[{i}]"), m))?;
            if let Some(j) = redis.iter().position(|u: &RedisUrl| u.url == url.url) {
                return Err(field(
                    &format!("redis[{i}]"),
                    format!("{} is listed twice (also redis[{j}])", url.redacted()),
                ));
            }
            redis.push(url);
        }
        match self.mode {
            ClusterMode::Single if redis.len() > 1 => {
                return Err(field(
                    "redis",
                    format!(
                        "{} URLs with mode = \"single\": a single instance has one URL \
                         (several are the seed nodes of a Redis Cluster: mode = \"cluster\")",
                        redis.len()
                    ),
                ))
            }
            ClusterMode::Cluster | ClusterMode::Sentinel => {
                let what = match self.mode {
                    ClusterMode::Cluster => "a Redis Cluster",
                    _ => "a Sentinel",
                };
                for (i, url) in redis.iter().enumerate() {
                    if matches!(url.endpoint, RedisEndpoint::Unix { .. }) {
                        return Err(field(
                            &format!("redis[{i}]"),
                            format!(
                                "{}: {what} is reached over TCP (redis://host:port), \
                                 not a Unix socket",
                                url.redacted()
                            ),
                        ));
                    }
                    if self.mode == ClusterMode::Sentinel {
                        // The client logs in to every Sentinel with one
                        // login: a different one would be ignored.
                        if url.login != redis[0].login {
                            return Err(field(
                                &format!("redis[{i}]"),
                                format!(
                                    "{}: logs in to its Sentinel differently from redis[0] ({}); \
                                     the Sentinels share one user and password",
                                    url.redacted(),
                                    redis[0].redacted()
                                ),
                            ));
                        }
                        continue;
                    }
                    if url.db != 0 {
                        return Err(field(
                            &format!("redis[{i}]"),
                            format!("{}: a Redis Cluster has only database 0", url.redacted()),
                        ));
                    }
                }
            }
            ClusterMode::Single => {}
        }
        let tls = self.tls(&redis)?;
        let (primary_username, primary_password) = self.primary_login()?;
        let sentinel_master = match (self.mode, &self.sentinel_master) {
            (ClusterMode::Sentinel, None) => {
                return Err(field(
                    "sentinel_master",
                    "unset with mode = \"sentinel\": give the name the Sentinels monitor the \
                     primary under (sentinel monitor <name> ...)",
                ))
            }
            (ClusterMode::Sentinel, Some(name)) => {
                check_node_name(name)
                    .map_err(|m| field("sentinel_master", format!("{name:?} {m}")))?;
                Some(name.clone())
            }
            (mode, Some(_)) => {
                return Err(field(
                    "sentinel_master",
                    format!(
                        "only applies with mode = \"sentinel\" (mode is \"{}\")",
                        mode.name()
                    ),
                ))
            }
            (_, None) => None,
        };
        let node = match &self.node {
            Some(node) => {
                check_node_name(node).map_err(|m| field("node", format!("{node:?} {m}")))?;
                node.clone()
            }
            None => {
                let host = hostname().map_err(|e| {
                    field(
                        "node",
                        format!("unset, and the hostname cannot be read ({e}); set it"),
                    )
                })?;
                check_node_name(&host).map_err(|m| {
                    field(
                        "node",
                        format!("unset, and the hostname {host:?} {m}; set cluster.node"),
                    )
                })?;
                host
            }
        };
        if self.sync_interval < MIN_SYNC_INTERVAL || self.sync_interval > MAX_SYNC_INTERVAL {
            return Err(field(
                "sync_interval",
                format!("{:?} is outside 10ms..=10s", self.sync_interval),
            ));
        }
        if self.timeout < MIN_TIMEOUT || self.timeout >= self.sync_interval {
            return Err(field(
                "timeout",
                format!(
                    "{:?} must be at least 1ms and shorter than cluster.sync_interval ({:?}): \
                     a sync tick never outlasts its interval",
                    self.timeout, self.sync_interval
                ),
            ));
        }
        // Written so that NaN fails too.
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(field(
                "threshold",
                format!(
                    "{} is outside (0, 1]: the fraction of a source's limit on this node \
                     past which it is synced",
                    self.threshold
                ),
            ));
        }
        if !(1..=MAX_MAX_REMOTE_SOURCES).contains(&self.max_remote_sources) {
            return Err(field(
                "max_remote_sources",
                format!(
                    "{} is outside 1..={MAX_MAX_REMOTE_SOURCES}: the most sources this node \
                     tracks because other nodes listed them hot (each costs under a kilobyte \
                     of daemon memory and a sync per tick)",
                    self.max_remote_sources
                ),
            ));
        }
        let min_grace = self.sync_interval * GRACE_INTERVALS;
        if self.grace < min_grace || self.grace > MAX_GRACE {
            return Err(field(
                "grace",
                format!(
                    "{:?} is outside {min_grace:?}..=1h: at least {GRACE_INTERVALS} x \
                     cluster.sync_interval (a node is degraded after {GRACE_INTERVALS} failed \
                     syncs)",
                    self.grace
                ),
            ));
        }
        Ok(ClusterConfig {
            redis,
            mode: self.mode,
            sentinel_master,
            node,
            sync_interval: self.sync_interval,
            timeout: self.timeout,
            threshold: self.threshold,
            max_remote_sources: self.max_remote_sources,
            fallback: self.fallback,
            grace: self.grace,
            tls,
            primary_username,
            primary_password,
        })
    }

    /// The TLS files, read and checked, when the URLs are `rediss://`;
    /// every URL is TLS or none is (one client setting serves them all).
    fn tls(&self, redis: &[RedisUrl]) -> Result<Option<TlsFiles>, ConfigError> {
        let first_tls = redis.iter().position(|u| u.tls);
        if let Some(j) = first_tls {
            if let Some((i, plain)) = redis.iter().enumerate().find(|(_, u)| !u.tls) {
                return Err(field(
                    &format!("redis[{i}]"),
                    format!(
                        "{} is not TLS but redis[{j}] ({}) is: every URL is rediss:// or none is",
                        plain.redacted(),
                        redis[j].redacted()
                    ),
                ));
            }
        }
        let files = [
            ("tls_ca_file", &self.tls_ca_file),
            ("tls_cert_file", &self.tls_cert_file),
            ("tls_key_file", &self.tls_key_file),
        ];
        if first_tls.is_none() {
            if let Some((name, _)) = files.iter().find(|(_, path)| path.is_some()) {
                return Err(field(
                    name,
                    "applies to rediss:// (TLS) URLs only, and no URL of cluster.redis is one",
                ));
            }
            return Ok(None);
        }
        TlsFiles::load(
            self.tls_ca_file.as_deref(),
            self.tls_cert_file.as_deref(),
            self.tls_key_file.as_deref(),
        )
        .map(Some)
        .map_err(|(name, message)| field(name, message))
    }

    /// `primary_username` and `primary_password`: only behind Sentinel,
    /// and a user needs its password (Redis logs in with both or with the
    /// password alone).
    fn primary_login(&self) -> Result<(Option<String>, Option<Secret>), ConfigError> {
        if self.mode != ClusterMode::Sentinel {
            for (name, set) in [
                ("primary_username", self.primary_username.is_some()),
                ("primary_password", self.primary_password.is_some()),
            ] {
                if set {
                    return Err(field(
                        name,
                        format!(
                            "only applies with mode = \"sentinel\" (mode is \"{}\"; the URL \
                             carries the login: redis://user:password@host)",
                            self.mode.name()
                        ),
                    ));
                }
            }
        }
        match (&self.primary_username, &self.primary_password) {
            (Some(user), _) if user.is_empty() || user.contains(char::is_whitespace) => Err(field(
                "primary_username",
                format!("{user:?} is not an ACL user name"),
            )),
            (Some(_), None) => Err(field(
                "primary_password",
                "unset, but cluster.primary_username is set: give the user's password",
            )),
            (_, Some(password)) if password.is_empty() => {
                Err(field("primary_password", "is empty"))
            }
            (user, password) => Ok((user.clone(), password.as_deref().map(Secret::from))),
        }
    }
}

/// Node names end up inside Redis keys and in other nodes' logs and
/// metrics labels: ASCII letters, digits, `.`, `-` and `_` only (no space,
/// no `:` or `{}` that key layouts and hash tags use, nothing a glob
/// pattern reads), 1 to [`MAX_NODE_NAME`] characters. What is wrong, as
/// the end of a sentence that starts with the name.
pub fn check_node_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(format!(
            "contains {c:?}; a node name has ASCII letters, digits, '.', '-' and '_' only"
        ));
    }
    // ASCII by now: bytes are characters.
    if name.len() > MAX_NODE_NAME {
        return Err(format!(
            "is {} characters long; at most {MAX_NODE_NAME}",
            name.len()
        ));
    }
    Ok(())
}

/// This machine's hostname (of the daemon's UTS namespace).
fn hostname() -> std::io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/hostname")?
        .trim()
        .to_string())
}

/// Checks one Redis URL: `redis://[user[:password]@]host[:port][/db]`
/// (`rediss://` the same over TLS),
/// `redis+unix:///path[?db=N&user=U&pass=P]` or `unix:///path[...]`. The
/// error is the message after the field name (without the password).
pub fn parse_redis_url(text: &str) -> Result<RedisUrl, String> {
    let Some((scheme, rest)) = text.split_once("://") else {
        return Err(format!(
            "{:?} is not a URL (redis://host:6379 or unix:///path/to/redis.sock)",
            redact_guess(text)
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "redis" => parse_tcp(text, rest, false),
        "rediss" => parse_tcp(text, rest, true),
        "redis+unix" | "unix" => parse_unix(text, rest),
        _ => Err(format!(
            "unsupported scheme {scheme:?} (redis://, rediss:// for TLS, redis+unix:// or \
             unix://)"
        )),
    }
}

/// `text` (a Redis URL as written, valid or not) without its password: what
/// errors and logs about a URL show.
pub fn redact_url(text: &str) -> String {
    parse_redis_url(text).map_or_else(|_| redact_guess(text), |u| u.redacted)
}

/// `message` (about the TOML `text`, which TOML's errors quote) with every
/// password `text` holds replaced by `***`: those of URLs (between `:` and
/// `@`, and `pass=` parameters) and the values of keys that name a
/// password (`primary_password`, also misspelled: anything with `pas` or
/// `pw` in the key).
pub fn redact_secrets(message: &str, text: &str) -> String {
    let mut secrets: Vec<&str> = Vec::new();
    for (at, _) in text.match_indices("://") {
        let rest = &text[at + 3..];
        let end = rest
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ']'))
            .unwrap_or(rest.len());
        let url = &rest[..end];
        let (authority, query) = url.split_once('?').unwrap_or((url, ""));
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            if let Some((_, password)) = userinfo.split_once(':') {
                secrets.push(password);
            }
        }
        secrets.extend(
            query
                .split('&')
                .filter_map(|pair| pair.strip_prefix("pass=")),
        );
    }
    for line in text.lines() {
        if let Some((key, value)) = line.split_once('=') {
            let key = key.trim().to_ascii_lowercase();
            if key.contains("pas") || key.contains("pw") {
                secrets.push(value.trim().trim_matches(['"', '\'']));
            }
        }
    }
    // Longest first, so a password that contains another is hidden whole.
    secrets.retain(|s| !s.is_empty());
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
        .iter()
        .fold(message.to_string(), |m, secret| m.replace(secret, "***"))
}

/// Shows `text` with anything between `:` and `@` hidden, for errors about
/// a string that is not even a URL.
fn redact_guess(text: &str) -> String {
    let text = match (text.find(':'), text.rfind('@')) {
        (Some(colon), Some(at)) if colon < at => format!("{}:***{}", &text[..colon], &text[at..]),
        _ => text.to_string(),
    };
    // A Unix socket URL carries its password as a parameter.
    match text.split_once('?') {
        Some((path, query)) => {
            let query: Vec<&str> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some(("pass", _)) => "pass=***",
                    _ => pair,
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => text,
    }
}

fn parse_tcp(text: &str, rest: &str, tls: bool) -> Result<RedisUrl, String> {
    let (userinfo, hostpart) = match rest.rsplit_once('@') {
        Some((userinfo, hostpart)) => (Some(userinfo), hostpart),
        None => (None, rest),
    };
    let redacted_userinfo = userinfo.map(|u| match u.split_once(':') {
        Some((user, _)) => format!("{user}:***@"),
        None => format!("{u}@"),
    });
    let redacted = format!(
        "{}://{}{hostpart}",
        if tls { "rediss" } else { "redis" },
        redacted_userinfo.clone().unwrap_or_default()
    );
    if hostpart.contains(['?', '#']) {
        return Err(format!(
            "{}: query parameters are not supported in redis:// URLs (the database goes in \
             the path: redis://host:6379/2)",
            redacted
        ));
    }
    let (authority, path) = match hostpart.split_once('/') {
        Some((authority, path)) => (authority, path),
        None => (hostpart, ""),
    };
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        // An IPv6 literal: [::1]:6379.
        let (addr, after) = bracketed
            .split_once(']')
            .ok_or_else(|| format!("{}: unclosed '[' in the host", redacted))?;
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{}: {addr:?} is not an IPv6 address", redacted));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("{}: expected ':port' after the address", redacted))?,
            ),
        };
        (format!("[{addr}]"), port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(format!("{}: no host", redacted));
    }
    if host.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(format!("{}: {host:?} is not a host name", redacted));
    }
    let port = match port {
        None => DEFAULT_REDIS_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{}: port {p:?} is not 1..=65535", redacted))?,
    };
    let db = match path {
        "" => 0,
        db => db
            .parse::<u32>()
            .map_err(|_| format!("{}: database {db:?} is not a number", redacted))?,
    };
    Ok(RedisUrl {
        url: text.to_string(),
        endpoint: RedisEndpoint::Tcp { host, port },
        db,
        tls,
        login: userinfo.map(str::to_string),
        redacted,
    })
}

fn parse_unix(text: &str, rest: &str) -> Result<RedisUrl, String> {
    let scheme = &text[..text.len() - rest.len() - 3];
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    let mut db = 0;
    let mut shown_query = Vec::new();
    let mut login = Vec::new();
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "db" => {
                db = value
                    .parse()
                    .map_err(|_| format!("database {value:?} is not a number"))?;
                shown_query.push(pair.to_string());
            }
            "user" => {
                shown_query.push(pair.to_string());
                login.push(pair);
            }
            "pass" => {
                shown_query.push("pass=***".to_string());
                login.push(pair);
            }
            other => {
                return Err(format!(
                    "unknown parameter {other:?} in a Unix socket URL (db, user, pass)"
                ))
            }
        }
    }
    let redacted = if shown_query.is_empty() {
        format!("{scheme}://{path}")
    } else {
        format!("{scheme}://{path}?{}", shown_query.join("&"))
    };
    if !path.starts_with('/') || path.len() < 2 {
        return Err(format!(
            "{redacted}: the socket's path must be absolute ({scheme}:///run/redis/redis.sock)"
        ));
    }
    Ok(RedisUrl {
        url: text.to_string(),
        endpoint: RedisEndpoint::Unix {
            path: path.to_string(),
        },
        db,
        tls: false,
        login: (!login.is_empty()).then(|| login.join("&")),
        redacted,
    })
}
