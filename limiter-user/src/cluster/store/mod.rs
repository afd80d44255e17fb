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

mod config;
mod connect;
mod error;
mod hot;
mod layout;
mod sync;

use std::{future::Future, time::Duration};

use redis::{RedisError, Script};

use crate::config::ClusterMode;

pub use self::{
    config::{StoreConfig, WindowSpec},
    connect::Connection,
    error::{ErrorKind, StoreError},
    hot::HotList,
    layout::{batches, group, key_slot, GROUPS, MAX_BATCH},
    sync::{Report, SyncOutcome, Totals},
};

/// The sync script (see the file for its keys and arguments).
const SYNC_LUA: &str = include_str!("../sync.lua");
/// The heartbeat script.
const HEARTBEAT_LUA: &str = include_str!("../heartbeat.lua");
/// The script listing recently hot sources.
const HOT_LUA: &str = include_str!("../hot.lua");

/// Longest report key and instance token accepted (they become key and
/// field names on every call). Node names are shorter
/// (`config::check_node_name`).
pub const MAX_KEY: usize = 256;
/// Longest window accepted, in buckets: each sync reads every bucket of
/// every source it carries (`buckets x MAX_BATCH` HMGETs in one call at
/// most), so a long window takes longer buckets, not more of them (a 60 s
/// window: 10 buckets of 6 s).
pub const MAX_BUCKETS: u32 = 64;

/// The cluster store: a connection and the two scripts.
pub struct Store {
    con: Connection,
    mode: ClusterMode,
    timeout: Duration,
    prefix: String,
    /// The bound of the all-or-nothing calls ([`Store::sync`],
    /// [`Store::hot_sources`]); the daemon gives each call its own.
    #[cfg(any(test, feature = "test-util"))]
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

    /// The connection, for tests that need a plain command; every call
    /// should still be bounded by a timeout.
    #[cfg(any(test, feature = "test-util"))]
    pub fn connection(&self) -> Connection {
        self.con.clone()
    }

    /// Records `node` alive now (Redis time), forgets nodes not heard from
    /// within `alive` and returns how many nodes are alive, this one
    /// included.
    #[cfg(any(test, feature = "test-util"))]
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
        if token.len() > MAX_KEY {
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
    crate::config::check_node_name(node)
        .map_err(|reason| StoreError::Node(format!("{node:?} {reason}")))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        send(&Store::connect_with(&StoreConfig::new(
            vec![],
            ClusterMode::Single,
        )));
    }
}
