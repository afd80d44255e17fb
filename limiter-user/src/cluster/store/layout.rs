//! The store's key layout, shared by every node: which group (Redis
//! Cluster hash tag) a source's keys carry, the names of its keys, and how
//! a sync's reports are batched into script calls so that no call crosses
//! a hash slot.

use std::collections::BTreeMap;

use super::{Report, Store};
use crate::config::ClusterMode;

/// Most reports in one script call: a call blocks the Redis instance while
/// it runs (about 16 commands per report with 10 buckets), so batches stay
/// short enough (docs/cluster.md, "Redis load") that other nodes' calls
/// queued behind a few of them still meet a 50 ms timeout.
pub const MAX_BATCH: usize = 64;
/// How many hash-tag groups the sources are spread over. Part of the key
/// layout (every node must use the same), hence a constant: enough groups
/// to spread evenly over the primaries of a Redis Cluster, few enough that
/// a tick in cluster mode costs at most this many calls (plus one per
/// [`MAX_BATCH`] sources of a group).
pub const GROUPS: u16 = 256;

impl Store {
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
}

/// The reports' indices grouped into script calls: by group (so by Redis
/// Cluster hash slot) in cluster mode, as a call's keys must share a slot;
/// in order otherwise; at most [`MAX_BATCH`] per call.
pub fn batches(mode: ClusterMode, reports: &[Report]) -> Vec<Vec<usize>> {
    let groups: Vec<Vec<usize>> = match mode {
        ClusterMode::Single | ClusterMode::Sentinel => vec![(0..reports.len()).collect()],
        ClusterMode::Cluster => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::store::sync::tests::report;

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
        let b = batches(ClusterMode::Single, &reports);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0], (0..MAX_BATCH).collect::<Vec<_>>());
        assert_eq!(b[1], (MAX_BATCH..MAX_BATCH + 3).collect::<Vec<_>>());
        assert!(batches(ClusterMode::Single, &[]).is_empty());
    }

    #[test]
    fn cluster_mode_batches_never_mix_slots() {
        let n = 20_000;
        let reports: Vec<Report> = (0..n)
            .map(|i| report(&format!("10.{}.{}.1/32|r", i / 256, i % 256)))
            .collect();
        let b = batches(ClusterMode::Cluster, &reports);
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
}
