//! Connecting the store: one code path serves a single Redis instance (a
//! [`ConnectionManager`], which reconnects on its own), a primary found
//! through Redis Sentinel, and a Redis Cluster (the async cluster client,
//! which routes each call by its first key): [`Connection`] hides which.

use redis::{
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClientBuilder,
    cluster_async::ClusterConnection,
    sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType},
    Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisError, RedisFuture, Script, TlsMode, Value,
};
use std::time::Duration;

use super::{bounded, Store, StoreConfig, StoreError, HEARTBEAT_LUA, HOT_LUA, SYNC_LUA};
use crate::config::{redact_url, ClusterConfig, ClusterMode};

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

impl Store {
    /// Connects for the validated `[cluster]` section (within four
    /// timeouts: TCP, handshake, and in cluster mode the topology) and
    /// loads the scripts (each within the timeout). Validation has checked
    /// the URLs, the mode, the Sentinel and the node name: nothing is
    /// checked again here.
    pub async fn connect(config: &ClusterConfig) -> Result<Self, StoreError> {
        Self::open(&StoreConfig::from_cluster(config)).await
    }

    /// [`Store::connect`] with a configuration built by hand (tests and
    /// benchmarks: another prefix, other timeouts), which is checked first
    /// for what validation would have refused.
    #[cfg(any(test, feature = "test-util"))]
    pub async fn connect_with(config: &StoreConfig) -> Result<Self, StoreError> {
        // A brace in the prefix would become the hash tag of every key.
        if config.prefix.is_empty() || config.prefix.contains(['{', '}']) {
            return Err(StoreError::Prefix(config.prefix.clone()));
        }
        match (config.mode, config.urls.len()) {
            (_, 0) => return Err(StoreError::NoUrl),
            (ClusterMode::Single, n) if n > 1 => return Err(StoreError::SingleWithSeveralUrls(n)),
            (ClusterMode::Sentinel, _) if config.sentinel_master.is_none() => {
                return Err(StoreError::NoSentinelMaster)
            }
            _ => {}
        }
        Self::open(config).await
    }

    async fn open(config: &StoreConfig) -> Result<Self, StoreError> {
        let urls = &config.urls;
        let mut infos = Vec::with_capacity(urls.len());
        for url in urls {
            let mut info = redis::IntoConnectionInfo::into_connection_info(url.as_str()).map_err(
                |source| StoreError::Url {
                    url: redact_url(url),
                    source,
                },
            )?;
            if let Some(login) = &config.login {
                let mut settings = info
                    .redis_settings()
                    .clone()
                    .set_password(login.password.expose());
                if let Some(user) = &login.username {
                    settings = settings.set_username(user);
                }
                info = info.set_redis_settings(settings);
            }
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
            ClusterMode::Single => {
                let info = infos.into_iter().next().ok_or(StoreError::NoUrl)?;
                let client = client(info, &config.tls).map_err(connect_err)?;
                Connection::Single(
                    single(client, timeout, response)
                        .await
                        .map_err(connect_err)?,
                )
            }
            ClusterMode::Sentinel => {
                let master = config
                    .sentinel_master
                    .clone()
                    .ok_or(StoreError::NoSentinelMaster)?;
                let mut sentinels = sentinel_client(&infos, master, config).map_err(connect_err)?;
                // Asks the Sentinels (in order) for the primary and checks
                // its role; the connection then goes to that address. After
                // a failover the old address refuses writes or is gone: the
                // sync loop drops the store on a failed tick and connects
                // again through the Sentinels (`daemon::sync`).
                let client = bounded("connect", timeout * 4, sentinels.async_get_client())
                    .await?
                    .map_err(connect_err)?;
                Connection::Single(
                    single(client, timeout, response)
                        .await
                        .map_err(connect_err)?,
                )
            }
            ClusterMode::Cluster => {
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
            #[cfg(any(test, feature = "test-util"))]
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
