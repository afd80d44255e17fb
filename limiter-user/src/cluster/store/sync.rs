//! The sync: each report's deltas added to the current bucket and the
//! window totals read back, in one `sync.lua` call per batch.

use std::time::Duration;

use futures_util::future::join_all;

use super::{batches, bounded, call_error, check_node, ms, Store, StoreError, WindowSpec, MAX_KEY};

/// One source's deltas from this node since its last sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The source and rule, as the daemon names them (e.g.
    /// `192.0.2.3/32|default`); the Redis Cluster hash tag of its keys.
    pub key: String,
    /// Frames this node admitted.
    pub admitted: u64,
    /// Frames offered to this node (admitted or refused).
    pub offered: u64,
    /// The source's cluster-wide limit over the window (the rule's `L`):
    /// what the claim is made against.
    pub limit: u64,
}

/// What Redis holds for one report after adding its deltas, over the
/// window that ends with the current bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub cluster_admitted: u64,
    pub cluster_offered: u64,
    pub own_admitted: u64,
    pub own_offered: u64,
    /// The current bucket number, `floor(Redis TIME / bucket length)`.
    pub bucket: u64,
    /// What this node may admit until its next sync
    /// ([`super::share::node_claim`], computed in the script so that it
    /// reads and reserves the room atomically).
    pub claim: u64,
}

/// What [`Store::sync_partial`] got: each report's totals (`None` when its
/// batch failed), the first error and how many batches failed.
#[derive(Debug, Default)]
pub struct SyncOutcome {
    pub totals: Vec<Option<Totals>>,
    pub error: Option<StoreError>,
    pub failed_batches: usize,
}

impl Store {
    /// Adds each report's deltas to the current bucket as `node` and
    /// returns, in the order of `reports`, the window totals after that.
    ///
    /// All or nothing for the caller: [`Store::sync_partial`] within
    /// `bulk_timeout`, and the first error if any batch failed.
    #[cfg(any(test, feature = "test-util"))]
    pub async fn sync(
        &self,
        node: &str,
        window: WindowSpec,
        reports: &[Report],
    ) -> Result<Vec<Totals>, StoreError> {
        let outcome = self
            .sync_partial(node, window, reports, self.bulk_timeout)
            .await?;
        if let Some(e) = outcome.error {
            return Err(e);
        }
        Ok(outcome.totals.into_iter().flatten().collect())
    }

    /// As [`Store::sync`], batch by batch: reports are sent in batches (by
    /// hash slot in cluster mode, up to [`MAX_BATCH`] per call, in the
    /// order of `reports` otherwise) that go out together and all end
    /// within `budget` (Redis serves them in the order sent, so put first
    /// what matters most). A batch that fails or is cut at the budget
    /// leaves its reports `None` (and its error in `error`) without
    /// failing the others: a Redis that is reachable but cannot serve
    /// every hot source in one tick syncs some of them, not none. The
    /// caller drops the deltas of a failed batch rather than replaying
    /// them (Redis may have counted them before the cut).
    pub async fn sync_partial(
        &self,
        node: &str,
        window: WindowSpec,
        reports: &[Report],
        budget: Duration,
    ) -> Result<SyncOutcome, StoreError> {
        check_node(node)?;
        for report in reports {
            check_report(report)?;
        }
        let batches = batches(self.mode, reports);
        let calls = batches
            .iter()
            .map(|batch| self.sync_batch(node, window, reports, batch, budget));
        let replies = join_all(calls).await;
        let mut outcome = SyncOutcome {
            totals: vec![None; reports.len()],
            error: None,
            failed_batches: 0,
        };
        for (batch, reply) in batches.iter().zip(replies) {
            match reply {
                Ok(reply) => {
                    for (&index, total) in batch.iter().zip(reply) {
                        outcome.totals[index] = Some(total);
                    }
                }
                Err(e) => {
                    outcome.failed_batches += 1;
                    outcome.error.get_or_insert(e);
                }
            }
        }
        Ok(outcome)
    }

    async fn sync_batch(
        &self,
        node: &str,
        window: WindowSpec,
        reports: &[Report],
        batch: &[usize],
        budget: Duration,
    ) -> Result<Vec<Totals>, StoreError> {
        let mut call = self.sync.prepare_invoke();
        call.arg(node)
            .arg(window.bucket_ms)
            .arg(window.buckets)
            .arg(ms(window.ttl()))
            .arg(ms(self.claim_horizon))
            .arg(ms(self.claim_hold))
            .arg(
                self.nodes_alive
                    .load(std::sync::atomic::Ordering::Relaxed)
                    .max(1),
            );
        for &index in batch {
            let report = &reports[index];
            call.key(self.source_key(&report.key))
                .arg(report.admitted)
                .arg(report.offered)
                .arg(report.limit);
        }
        let mut con = self.con.clone();
        let reply: Vec<i64> = bounded("sync", budget, call.invoke_async(&mut con))
            .await?
            .map_err(|source| call_error("sync", budget, source))?;
        parse_sync_reply(&reply, batch.len())
    }
}

fn check_report(report: &Report) -> Result<(), StoreError> {
    let key = &report.key;
    // Braces are harmless: the group's tag comes first in every key.
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(StoreError::Key(key.clone()));
    }
    if report.admitted > report.offered {
        return Err(StoreError::Deltas {
            key: key.clone(),
            admitted: report.admitted,
            offered: report.offered,
        });
    }
    // Lua numbers are doubles: limits and deltas past 2^53 would lose
    // precision (no real tick sees that many frames).
    if report.limit > 1 << 53 {
        return Err(StoreError::Limit {
            key: key.clone(),
            limit: report.limit,
        });
    }
    if report.offered > 1 << 53 {
        return Err(StoreError::Deltas {
            key: key.clone(),
            admitted: report.admitted,
            offered: report.offered,
        });
    }
    Ok(())
}

fn parse_sync_reply(reply: &[i64], reports: usize) -> Result<Vec<Totals>, StoreError> {
    let bad = |detail: String| StoreError::Reply { op: "sync", detail };
    if reply.len() != 1 + 5 * reports {
        return Err(bad(format!(
            "{} integers for {reports} reports (expected {})",
            reply.len(),
            1 + 5 * reports
        )));
    }
    let count = |v: i64| u64::try_from(v).map_err(|_| bad(format!("negative count {v}")));
    let bucket = count(reply[0])?;
    reply[1..]
        .chunks_exact(5)
        .map(|c| {
            Ok(Totals {
                cluster_admitted: count(c[0])?,
                cluster_offered: count(c[1])?,
                own_admitted: count(c[2])?,
                own_offered: count(c[3])?,
                bucket,
                claim: count(c[4])?,
            })
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A report of `key` under a limit of 100.
    pub(in crate::cluster::store) fn report(key: &str) -> Report {
        Report {
            key: key.into(),
            admitted: 1,
            offered: 2,
            limit: 100,
        }
    }

    #[test]
    fn bad_reports_are_refused_with_the_reason() {
        assert!(check_report(&report("192.0.2.3/32|default")).is_ok());
        assert!(check_report(&report("odd{rule}name")).is_ok());
        for key in ["", &"x".repeat(MAX_KEY + 1)] {
            let e = check_report(&report(key)).unwrap_err();
            assert!(matches!(e, StoreError::Key(_)), "{e}");
        }
        let e = check_report(&Report {
            limit: (1 << 53) + 1,
            ..report("k")
        })
        .unwrap_err();
        assert!(matches!(e, StoreError::Limit { .. }), "{e}");
        let e = check_report(&Report {
            key: "k".into(),
            admitted: 3,
            offered: 2,
            limit: 10,
        })
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("admitted delta 3 exceeds offered delta 2"),
            "{e}"
        );
        assert!(matches!(check_node(""), Err(StoreError::Node(_))));
    }

    #[test]
    fn sync_replies_are_checked() {
        let t = parse_sync_reply(&[7, 1, 2, 3, 4, 5], 1).unwrap();
        assert_eq!(
            t,
            vec![Totals {
                cluster_admitted: 1,
                cluster_offered: 2,
                own_admitted: 3,
                own_offered: 4,
                bucket: 7,
                claim: 5,
            }]
        );
        assert!(parse_sync_reply(&[7, 1, 2, 3, 4], 1).is_err());
        assert!(parse_sync_reply(&[7, -1, 2, 3, 4, 5], 1).is_err());
    }
}
