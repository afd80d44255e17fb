//! Writing what the cluster sync decides into one program instance's
//! maps: a source's share (`CLUSTER_SHARES`, keyed by its window key) and
//! its share mark (`SHARE_MARKS`), its removal, and the cluster state
//! (`CLUSTER`); and what a push must make
//! true of a cluster-scoped rule for the kernel to hold it exactly
//! ([`kernel_ready`]). The kernel's side: `limiter_common::cluster` and
//! `limiter-ebpf/src/judge/cluster.rs`.

use std::collections::HashMap;

use aya::maps::MapError;
use limiter_common::{
    names, sketch, AddressFamily, ClusterShare, ClusterState, Rule, Scope, SourceKey,
};

use super::{Maps, MapsError};

#[cfg(any(test, feature = "test-util"))]
/// The key a source's share is stored under: its key with the rule's
/// `budget` byte as class, as its window is keyed (and as a cluster-hot
/// event names it).
pub fn share_key(source: &SourceKey, rule: &Rule) -> SourceKey {
    source.with_class(rule.budget)
}

/// Writes (or replaces) the share of the source whose window key is
/// `window_key`, and its share mark. A full map evicts its least recently
/// used share.
#[cfg(any(test, feature = "test-util"))]
pub fn write_share(
    maps: &mut Maps,
    window_key: &SourceKey,
    share: ClusterShare,
) -> Result<(), MapsError> {
    mark_shares(maps, &[(*window_key, share)])?;
    maps.cluster_shares
        .insert(window_key, share, 0)
        .map_err(MapsError::on(names::CLUSTER_SHARES))
}

/// Writes (or replaces) many shares at once, keyed by window key (one
/// syscall per `batch::BATCH`: a node with 100,000 sources synced in
/// turns rewrites thousands of shares a tick), their share marks first.
/// On an error, how many shares were written before it (in order), and
/// the error.
pub fn write_shares(
    maps: &mut Maps,
    shares: &[(SourceKey, ClusterShare)],
) -> Result<(), (usize, MapsError)> {
    mark_shares(maps, shares).map_err(|e| (0, e))?;
    let fd = super::batch::fd(maps.cluster_shares_data());
    super::batch::update(fd, shares).map_err(|(written, source)| {
        (
            written,
            MapsError::Batch {
                map: names::CLUSTER_SHARES,
                source,
            },
        )
    })
}

/// From this many cells to raise on, [`mark_shares`] reads every mark in
/// one batched read rather than each cell's alone.
pub const SHARE_MARKS_READ_WHOLE: usize = (sketch::SHARE_CELLS / 8) as usize;

/// Raises the share marks of the sources of `shares` to their shares'
/// expiry, before the shares exist: the cheap tier judges no frame of a
/// cluster-scoped source whose mark holds, so a source with a share (even
/// one smaller than the rule's cheap frames) is always held to it. One
/// batched read of the marks and one batched write of those that rise: the
/// daemon is their only writer, and a mark never goes down (an expired one
/// is as good as none).
fn mark_shares(maps: &mut Maps, shares: &[(SourceKey, ClusterShare)]) -> Result<(), MapsError> {
    let seed = maps.live_config()?.sketch_seed;
    let mut wanted: HashMap<u32, u64> = HashMap::new();
    for (key, share) in shares {
        // The window key's class is the rule's budget.
        let at = sketch::place(
            &key.addr,
            key.family() == AddressFamily::V6,
            key.prefix_len,
            key.class,
            seed,
        );
        let cell = sketch::mark_cell(at, sketch::SHARE_CELLS);
        let until = wanted.entry(cell).or_default();
        *until = (*until).max(share.expires_ns);
    }
    let batch_error = |source| MapsError::Batch {
        map: names::SHARE_MARKS,
        source,
    };
    // Few cells: a lookup each (a syscall, about 1 us); many: one batched
    // read of every cell (about 0.15 us a cell, 19 ms for all of them,
    // which every tick with shares paid when it was the only way), so the
    // lookups pay below an eighth of the cells.
    if wanted.len() < SHARE_MARKS_READ_WHOLE {
        let mut held = Vec::new();
        for (&cell, &until) in &wanted {
            let now = maps
                .share_marks
                .get(&cell, 0)
                .map_err(MapsError::on(names::SHARE_MARKS))?;
            if until <= now {
                held.push(cell);
            }
        }
        for cell in held {
            wanted.remove(&cell);
        }
    } else {
        let fd = super::batch::fd(maps.share_marks_data());
        super::batch::for_each_per_cpu::<u32, u64>(fd, 1, |cell, now| {
            if wanted.get(cell).is_some_and(|until| *until <= now[0]) {
                wanted.remove(cell);
            }
        })
        .map_err(batch_error)?;
    }
    let fd = super::batch::fd(maps.share_marks_data());
    let raised: Vec<(u32, u64)> = wanted.into_iter().collect();
    super::batch::update(fd, &raised).map_err(|(_, source)| batch_error(source))
}

/// Removes a source's share (it is then held to the cold cap); true if it
/// had one.
#[cfg(any(test, feature = "test-util"))]
pub fn remove_share(maps: &mut Maps, window_key: &SourceKey) -> Result<bool, MapsError> {
    match maps.cluster_shares.remove(window_key) {
        Ok(()) => Ok(true),
        Err(MapError::KeyNotFound) => Ok(false),
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
            Ok(false)
        }
        Err(e) => Err(MapsError::on(names::CLUSTER_SHARES)(e)),
    }
}

/// A source's share, if it has one (expired or not).
pub fn share(maps: &Maps, window_key: &SourceKey) -> Result<Option<ClusterShare>, MapsError> {
    match maps.cluster_shares.get(window_key, 0) {
        Ok(share) => Ok(Some(share)),
        Err(MapError::KeyNotFound) => Ok(None),
        Err(e) => Err(MapsError::on(names::CLUSTER_SHARES)(e)),
    }
}

/// Writes the cluster state (every sync: its `refreshed_ns` is what keeps
/// the kernel from falling back on its own).
pub fn write_state(maps: &mut Maps, state: ClusterState) -> Result<(), MapsError> {
    maps.cluster
        .set(0, state, 0)
        .map_err(MapsError::on(names::CLUSTER))
}

/// The cluster state as the kernel reads it.
pub fn state(maps: &Maps) -> Result<ClusterState, MapsError> {
    maps.cluster
        .get(&0, 0)
        .map_err(MapsError::on(names::CLUSTER))
}

/// Makes a compiled rule what the kernel needs of a cluster-scoped rule
/// (a node rule is left as it is): no lease, since a lease's unused frames
/// would count as admitted traffic to the sync (the kernel grants none to
/// cluster rules anyway). Its cheap-tier frames stay as compiled (a tenth
/// of the allowance per pair of epochs a window overlaps, never counted
/// in the window), capped to the cold cap in the kernel.
pub fn kernel_ready(rule: &mut Rule) {
    if rule.scope() == Some(Scope::Cluster) {
        rule.lease_packets = 1;
    }
}

#[cfg(test)]
mod tests {
    use limiter_common::Action;

    use super::*;

    #[test]
    fn a_cluster_rule_gets_no_lease_and_a_node_rule_keeps_its_own() {
        let mut rule = Rule::new(Action::Limit, false);
        rule.cheap_frames = 9;
        rule.lease_packets = 8;
        let node = rule;
        kernel_ready(&mut rule);
        assert_eq!(rule, node, "a node rule is untouched");
        rule.set_scope(Scope::Cluster);
        kernel_ready(&mut rule);
        assert_eq!((rule.cheap_frames, rule.lease_packets), (9, 1));
    }

    #[test]
    fn the_share_key_is_the_window_key() {
        let mut rule = Rule::new(Action::Limit, false);
        rule.budget = 3;
        let source = SourceKey::v4([192, 0, 2, 1]).with_class(1);
        assert_eq!(share_key(&source, &rule), source.with_class(3));
    }
}
