//! This node in Redis: the token its heartbeats carry, the claim on its
//! name at start-up, how long it counts as alive, and how the daemon
//! reaches Redis for its configuration.
//!
//! Each daemon run heartbeats with a random instance token
//! ([`instance_token`]), and a name another live daemon heartbeats under
//! is refused, at start-up ([`claim_node_name`]: the daemon exits before
//! attaching) and while running (the node stops syncing and holds its
//! sources to the fallback cap until the name is free:
//! `super::fallback`): two daemons with one name would each claim the
//! whole room of a source.

use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::{
    cluster::{Store, StoreError},
    config::ClusterConfig,
};

/// How long a node counts as alive after its last heartbeat: five sync
/// intervals (at least half a second), so one slow tick on a loaded
/// machine does not make it vanish from the others' divisors, while a
/// stopped daemon leaves them within about half a second.
pub(super) fn alive_period(interval: Duration) -> Duration {
    (interval * 5).max(Duration::from_millis(500))
}

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
    let host = crate::config::hostname().unwrap_or_default();
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let host: String = host.chars().take(64).collect();
    format!("{host}:{}:{hex}", std::process::id())
}

/// At start-up, before anything is attached: claims `config.node` in
/// Redis for the daemon instance `token`, or fails when another live
/// daemon heartbeats under that name. A heartbeat still live under the
/// name may be this node's own from before a restart: a daemon that
/// stopped no longer renews it, and it lapses within one alive period
/// ([`alive_period`], half a second by default), so the claim is retried
/// until then; only a heartbeat renewed past that is another daemon. A
/// Redis that cannot be reached is no reason not to start (the sync
/// degrades as it would at any other time, and checks the name at every
/// heartbeat).
pub async fn claim_node_name(config: &ClusterConfig, token: &str) -> anyhow::Result<()> {
    let store = match Store::connect(config).await {
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
