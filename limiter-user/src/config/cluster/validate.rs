//! Validation of `[cluster]`: the file form ([`ClusterSection`]) checked
//! field by field into what the daemon runs with ([`ClusterConfig`]); the
//! one check of node names ([`check_node_name`]), which the store applies
//! too.

use std::path::Path;

use super::{
    parse_redis_url, ClusterConfig, ClusterMode, ClusterSection, Login, RedisEndpoint, RedisUrl,
    Secret, GRACE_INTERVALS, MAX_GRACE, MAX_MAX_REMOTE_SOURCES, MAX_NODE_NAME, MAX_SYNC_INTERVAL,
    MIN_SYNC_INTERVAL, MIN_TIMEOUT,
};
use crate::config::{tls::TlsFiles, ConfigError};

fn field(name: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: format!("cluster.{name}"),
        message: message.into(),
    }
}

impl ClusterSection {
    /// Checks every field; errors name it (`cluster.sync_interval`).
    pub fn validate(&self) -> Result<ClusterConfig, ConfigError> {
        let redis = self.redis_urls()?;
        self.check_mode(&redis)?;
        let tls = self.tls(&redis)?;
        let (primary_username, primary_password) = self.primary_login()?;
        let login = self.file_login(&redis)?;
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
        self.check_timing()?;
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
            login,
        })
    }

    /// The `redis` URLs, each parsed, none twice.
    fn redis_urls(&self) -> Result<Vec<RedisUrl>, ConfigError> {
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
        Ok(redis)
    }

    /// The URLs as the mode wants them: one for a single instance; TCP for
    /// a Redis Cluster or Sentinels, database 0 for a Cluster, one login
    /// for every Sentinel.
    fn check_mode(&self, redis: &[RedisUrl]) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// The sync's timing and thresholds within their bounds.
    fn check_timing(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// `password_file` and `username_file`, read: the login of every URL,
    /// which then carries none of its own (two logins for one connection
    /// would leave the reader guessing which one is used).
    fn file_login(&self, redis: &[RedisUrl]) -> Result<Option<Login>, ConfigError> {
        let Some(password_file) = &self.password_file else {
            if self.username_file.is_some() {
                return Err(field(
                    "username_file",
                    "set without cluster.password_file: give the user's password in a file too",
                ));
            }
            return Ok(None);
        };
        for (i, url) in redis.iter().enumerate() {
            // The parsed login: `user:password@`, or a socket's `user=` and
            // `pass=` parameters.
            let clash = if url.redacted() != url.url {
                Some("carries a password and cluster.password_file is set")
            } else if url.login.is_some() && self.username_file.is_some() {
                Some("names a user and cluster.username_file is set")
            } else {
                None
            };
            if let Some(clash) = clash {
                return Err(field(
                    &format!("redis[{i}]"),
                    format!("{} {clash}: keep one", url.redacted()),
                ));
            }
        }
        let password = read_secret(password_file).map_err(|m| field("password_file", m))?;
        let username = match &self.username_file {
            Some(path) => Some(read_secret(path).map_err(|m| field("username_file", m))?),
            None => None,
        };
        Ok(Some(Login {
            username,
            password: Secret::new(password),
        }))
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
                (
                    "primary_password_file",
                    self.primary_password_file.is_some(),
                ),
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
        let from_file = match (&self.primary_password, &self.primary_password_file) {
            (Some(_), Some(_)) => {
                return Err(field(
                    "primary_password_file",
                    "set beside cluster.primary_password: keep one",
                ))
            }
            (None, Some(path)) => {
                Some(read_secret(path).map_err(|m| field("primary_password_file", m))?)
            }
            _ => None,
        };
        match (
            &self.primary_username,
            &self.primary_password.clone().or(from_file),
        ) {
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

/// A secret's file: its first line, without the line end. What is wrong,
/// as the end of a sentence that starts with the setting's name.
fn read_secret(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{} cannot be read: {e}", path.display()))?;
    let line = text.lines().next().unwrap_or_default();
    if line.is_empty() {
        return Err(format!(
            "{} is empty (its first line is the secret)",
            path.display()
        ));
    }
    Ok(line.to_string())
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

/// This machine's hostname (of the daemon's UTS namespace), from
/// uname(2): the unit's `ProcSubset=pid` hides /proc/sys.
pub(crate) fn hostname() -> std::io::Result<String> {
    Ok(nix::unistd::gethostname()?
        .to_string_lossy()
        .trim()
        .to_string())
}
