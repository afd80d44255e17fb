//! Listing the sources hot on any node (`hot.lua`), slice by slice of the
//! groups and bounded, so neither the reply nor what the daemon keeps of it
//! grows with the hot set.

use std::time::Duration;

use futures_util::future::join_all;
use redis::Value;

use super::{bounded, call_error, ms, Store, StoreError, GROUPS};
use crate::config::ClusterMode;

impl Store {
    /// The source keys some node synced with non-zero deltas within
    /// `within` (Redis time; the sync script keeps them for a window), in
    /// no particular order: the daemon syncs these too, so a source hot on
    /// other nodes is counted here even while it is light here. One call on
    /// a single instance, one per group (concurrently) on a Redis Cluster.
    #[cfg(any(test, feature = "test-util"))]
    pub async fn hot_sources(&self, within: Duration) -> Result<Vec<String>, StoreError> {
        self.hot_sources_in(within, 0..GROUPS, self.bulk_timeout)
            .await
    }

    /// [`Store::hot_sources`] of the groups in `groups` only, all within
    /// `budget` (the daemon lists a slice of the groups each tick, bounded:
    /// [`Store::hot_sources_bounded`]).
    #[cfg(any(test, feature = "test-util"))]
    pub async fn hot_sources_in(
        &self,
        within: Duration,
        groups: std::ops::Range<u16>,
        budget: Duration,
    ) -> Result<Vec<String>, StoreError> {
        Ok(self
            .hot_sources_bounded(within, groups, budget, UNBOUNDED)
            .await?
            .keys)
    }

    /// [`Store::hot_sources_in`] returning at most `limit` keys: Redis
    /// only counts the others ([`HotList::omitted`]), so neither the reply
    /// nor what the caller keeps of it grows with the hot set. In cluster
    /// mode each group's call returns at most its part of `limit`
    /// (rounded up), and the whole is cut to `limit`.
    pub async fn hot_sources_bounded(
        &self,
        within: Duration,
        groups: std::ops::Range<u16>,
        budget: Duration,
        limit: usize,
    ) -> Result<HotList, StoreError> {
        let within_ms = ms(within);
        let groups = groups.start.min(GROUPS)..groups.end.min(GROUPS);
        if groups.is_empty() || limit == 0 {
            return Ok(HotList::default());
        }
        let groups: Vec<Vec<u16>> = match self.mode {
            ClusterMode::Single | ClusterMode::Sentinel => vec![groups.collect()],
            ClusterMode::Cluster => groups.map(|g| vec![g]).collect(),
        };
        let limit = limit.min(UNBOUNDED);
        let per_call = limit.div_ceil(groups.len());
        let calls = groups.iter().map(|groups| async move {
            let mut call = self.hot.prepare_invoke();
            for &g in groups {
                call.key(self.hot_key(g));
            }
            call.arg(within_ms).arg(per_call);
            let mut con = self.con.clone();
            let reply = bounded(
                "hot sources",
                budget,
                call.invoke_async::<Vec<Value>>(&mut con),
            )
            .await?
            .map_err(|source| call_error("hot sources", budget, source))?;
            parse_hot_reply(reply)
        });
        let lists = join_all(calls)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let mut list = HotList::default();
        for part in lists {
            list.omitted += part.omitted;
            list.keys.extend(part.keys);
        }
        if list.keys.len() > limit {
            list.omitted += (list.keys.len() - limit) as u64;
            list.keys.truncate(limit);
        }
        Ok(list)
    }
}

/// What [`Store::hot_sources_in`] asks for when unbounded (Lua numbers
/// are doubles: exact up to 2^53).
const UNBOUNDED: usize = 1 << 40;

/// Sources hot on any node, as [`Store::hot_sources_bounded`] lists them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HotList {
    pub keys: Vec<String>,
    /// Hot sources left out of `keys` by the bound.
    pub omitted: u64,
}

/// `hot.lua`'s reply: `{left out, member, ...}`.
fn parse_hot_reply(reply: Vec<Value>) -> Result<HotList, StoreError> {
    let bad = |detail: String| StoreError::Reply {
        op: "hot sources",
        detail,
    };
    let mut items = reply.into_iter();
    let omitted = match items.next() {
        Some(Value::Int(n)) => u64::try_from(n).map_err(|_| bad(format!("{n} left out")))?,
        other => return Err(bad(format!("count {other:?}"))),
    };
    let keys = items
        .map(|item| match item {
            Value::BulkString(bytes) => {
                String::from_utf8(bytes).map_err(|e| bad(format!("key not UTF-8: {e}")))
            }
            other => Err(bad(format!("key {other:?}"))),
        })
        .collect::<Result<_, _>>()?;
    Ok(HotList { keys, omitted })
}
