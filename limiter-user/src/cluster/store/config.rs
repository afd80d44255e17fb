//! How the store reaches Redis ([`StoreConfig`], built for the daemon from
//! the validated `[cluster]` section) and the window its counts are kept
//! over ([`WindowSpec`]).

use std::time::Duration;

use super::{StoreError, MAX_BUCKETS};
use crate::config::{ClusterConfig, ClusterMode, Login, Secret};

/// How to reach Redis.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// `redis://host:port[/db]` URLs: one for a single instance, the seed
    /// nodes of a Redis Cluster.
    pub urls: Vec<String>,
    pub mode: ClusterMode,
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
    /// With [`ClusterMode::Sentinel`]: the name the Sentinels monitor the primary
    /// under (`sentinel monitor <name> ...`).
    pub sentinel_master: Option<String>,
    /// With `rediss://` URLs: the CA that Redis's certificate must chain to
    /// (`None` inside: the system's trust store) and this client's
    /// certificate and key (mutual TLS). Behind Sentinel, for the
    /// Sentinels and the primary alike.
    pub tls: Option<redis::TlsCertificates>,
    /// With [`ClusterMode::Sentinel`]: the primary's ACL user and password (the
    /// URLs' own are the Sentinels').
    pub primary_username: Option<String>,
    pub primary_password: Option<Secret>,
    /// The login every URL uses instead of its own (`cluster.password_file`
    /// and `username_file`, read).
    pub login: Option<Login>,
}

/// The prefix of every key the daemon writes.
const PREFIX: &str = "xl";

impl StoreConfig {
    /// A configuration with the documented defaults: 50 ms per call, keys
    /// under `xl`, claims for a 100 ms sync interval (for
    /// [`super::Store::connect_with`]).
    #[cfg(any(test, feature = "test-util"))]
    pub fn new(urls: Vec<String>, mode: ClusterMode) -> Self {
        Self {
            urls,
            mode,
            timeout: Duration::from_millis(50),
            bulk_timeout: Duration::from_millis(50),
            prefix: PREFIX.into(),
            claim_horizon: Duration::from_millis(100),
            claim_hold: Duration::from_millis(300),
            sentinel_master: None,
            tls: None,
            primary_username: None,
            primary_password: None,
            login: None,
        }
    }

    /// How the daemon reaches Redis for the validated `config`: the sync's
    /// batches and the hot listing may take the whole tick, and a claim is
    /// spent until the next tick and holds the other nodes back as long as
    /// this node's kernel keeps the share it became (three intervals).
    pub(super) fn from_cluster(config: &ClusterConfig) -> Self {
        Self {
            urls: config.redis.iter().map(|u| u.url.clone()).collect(),
            mode: config.mode,
            timeout: config.timeout,
            bulk_timeout: config.sync_interval,
            prefix: PREFIX.into(),
            claim_horizon: config.sync_interval,
            claim_hold: 3 * config.sync_interval,
            sentinel_master: config.sentinel_master.clone(),
            tls: config.tls.as_ref().map(|files| redis::TlsCertificates {
                root_cert: files.ca.as_ref().map(|ca| ca.pem.clone()),
                client_tls: files
                    .client
                    .as_ref()
                    .map(|(cert, key)| redis::ClientTlsConfig {
                        client_cert: cert.pem.clone(),
                        client_key: key.pem.clone(),
                    }),
            }),
            primary_username: config.primary_username.clone(),
            primary_password: config.primary_password.clone(),
            login: config.login.clone(),
        }
    }
}

/// The sliding window the counts are kept over: `buckets` buckets of
/// `bucket` each (for example 10 x 100 ms for a 1 s window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    pub(super) bucket_ms: u64,
    pub(super) buckets: u32,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
