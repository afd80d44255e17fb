//! The fallback policy: where the node stands with Redis ([`Standing`])
//! and what that does to its shares. Three failed ticks in a row make the
//! node degraded (one log line); the last shares are kept, pushed forward
//! but never past the end of the grace period; then the state carries the
//! fallback policy's divisor as the cold divisor, so every source is held
//! to `L / nodes alive` (`split`) or `L` (`local`): never open. The first
//! successful tick recovers (one log line), and holds every source to the
//! fallback cap for one more window. A node whose name another daemon
//! heartbeats under is in the fallback at once, its shares revoked.

use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

use crate::{
    cluster::{
        fallback_cap,
        tick::{Change, Health, Phase},
        StoreError,
    },
    config::{ClusterConfig, Fallback},
    daemon::metrics::ClusterMetrics,
};

/// Where the node stands with Redis.
#[derive(Debug, Default)]
pub(super) struct Standing {
    health: Health,
    nodes_alive: u32,
    /// Another daemon heartbeats under this node's name: no sync, shares
    /// gone, the fallback cap in force.
    duplicate: bool,
    /// Until when, after a recovery, each source stays held to the
    /// fallback cap (see [`Standing::synced`]).
    recovering_until: Option<Instant>,
    /// The nodes alive before the outage the node recovered from.
    recovering_nodes: u32,
}

/// How a synced tick's allowances are held: by the fallback cap while the
/// node recovers, else only by the claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Recovery {
    /// The nodes the fallback cap divides by, while recovering.
    divisor: Option<u32>,
}

impl Recovery {
    /// The cap on a source of limit `limit` with `nodes` alive, if any.
    pub(super) fn cap(self, policy: Fallback, limit: u64, nodes: u32) -> Option<u64> {
        self.divisor
            .map(|known| fallback_cap(policy, limit, nodes.max(known)))
    }
}

impl Standing {
    pub(super) fn nodes_alive(&self) -> u32 {
        self.nodes_alive
    }

    pub(super) fn duplicate(&self) -> bool {
        self.duplicate
    }

    pub(super) fn degraded(&self) -> bool {
        self.health.degraded()
    }

    pub(super) fn failed_ticks(&self) -> u64 {
        self.health.failed_ticks
    }

    /// Where the node stands: the health's phase, or the fallback at once
    /// while another daemon holds this node's name.
    pub(super) fn phase(&self, now: Instant, grace: Duration) -> Phase {
        if self.duplicate {
            Phase::Fallback
        } else {
            self.health.phase(now, grace)
        }
    }

    /// A tick that synced with `nodes` alive; `window` is the longest
    /// window of the tracked sources. Returns how its allowances are held.
    pub(super) fn synced(
        &mut self,
        nodes: u32,
        now: Instant,
        window: Duration,
        node: &str,
    ) -> Recovery {
        let known = self.nodes_alive;
        self.nodes_alive = nodes;
        let was_duplicate = std::mem::take(&mut self.duplicate);
        if was_duplicate {
            info!(node = %node, nodes,
                "cluster: no other daemon heartbeats under this node name any more: syncing again");
        }
        let recovered = self.health.success() == Some(Change::Recovered);
        if recovered {
            info!(
                nodes,
                "cluster: Redis reachable again, node recovered (outage counts not replayed)"
            );
        }
        if recovered || was_duplicate {
            // Redis holds nothing of what the nodes admitted while
            // degraded (dropped, or lost with a restart) or while this
            // node's name was another daemon's, but the kernels' windows
            // still do: for one window the fallback cap stays on top of
            // the claims, or the cluster would admit the outage's L again.
            self.recovering_until = Some(now + window);
            // A restarted Redis knows only the nodes that have heartbeat
            // into it yet (this one first): the cap divides by the nodes
            // known before the outage until the others are back.
            self.recovering_nodes = known;
        }
        let recovering = self.recovering_until.is_some_and(|until| now < until);
        Recovery {
            divisor: recovering.then_some(self.recovering_nodes),
        }
    }

    /// A tick that failed with `e`. Returns whether the shares must be
    /// revoked now: another daemon was just found under this node's name,
    /// and shares claimed under a name two daemons used are not this
    /// node's to keep (the fallback applies at once, no grace).
    pub(super) fn failed(
        &mut self,
        e: &StoreError,
        now: Instant,
        config: &ClusterConfig,
        metrics: &ClusterMetrics,
    ) -> bool {
        let mut revoke = false;
        if let StoreError::DuplicateNode { holder, nodes, .. } = e {
            // This node is not in Redis's count of the nodes alive (the
            // other daemon holds its name): the fallback's split counts it
            // too.
            self.nodes_alive = nodes.saturating_add(1);
            if !self.duplicate {
                error!(node = %config.node, %holder, error = %e,
                    "cluster: another daemon heartbeats under this node's name: not syncing, cluster sources held to the fallback cap until the name is free; give each node a distinct cluster.node");
                self.duplicate = true;
                revoke = true;
            }
        } else {
            metrics.redis_error(e);
        }
        // The first failure of a run is logged (its cause says what to
        // look at); the third degrades the node, logged below.
        if self.duplicate {
            debug!(error = %e, "cluster: sync tick refused (duplicate node name)");
        } else if self.health.phase(now, config.grace) == Phase::Normal {
            info!(error = %e, kind = e.kind().name(),
                "cluster: a sync tick failed (the node degrades after 3 in a row)");
        } else {
            debug!(error = %e, "cluster: sync tick failed");
        }
        // A duplicate's ticks count as failed too (degraded after 3), but
        // its fallback is already in force: no grace line.
        if self.health.failure(now) == Some(Change::Degraded) && !self.duplicate {
            warn!(error = %e, grace = ?config.grace, fallback = config.fallback.name(),
                "cluster: 3 sync ticks failed, node degraded: keeping the last shares for the grace period, then the fallback");
        }
        revoke
    }
}
