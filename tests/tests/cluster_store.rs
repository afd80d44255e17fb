//! The cluster store (limiter-user/src/cluster/store.rs and its Lua
//! scripts) against a real `redis-server` in a namespace of its own: nodes
//! sharing totals, the sliding window on Redis time, key TTLs, heartbeats,
//! NOSCRIPT recovery, timeouts on a hung server, clear connection errors,
//! the same sync through a 3-primary Redis Cluster, and Redis behind TLS
//! and ACL logins (directly and through a Sentinel), whose every failure
//! is told without the password.

use std::time::{Duration, Instant};

use limiter_tests::{
    redis::{Pki, RedisServer, Security, ACL_USER},
    wait_until,
};
use limiter_user::{
    cluster::{
        node_claim,
        store::{
            batches, group, ErrorKind, Report, Store, StoreConfig, StoreError, Totals, WindowSpec,
            GROUPS, MAX_BATCH,
        },
    },
    config::ClusterMode as Mode,
};

/// A report under a cluster-wide limit of 100.
fn report(key: &str, admitted: u64, offered: u64) -> Report {
    Report {
        key: key.into(),
        admitted,
        offered,
        limit: 100,
    }
}

fn config(server: &RedisServer) -> StoreConfig {
    let mut config = StoreConfig::new(vec![server.url()], Mode::Single);
    // Generous for a shared 2-core machine, the syncs' bound too (its
    // 50 ms default timed a 600-source sync out under load); the timeout
    // test sets its own.
    config.timeout = Duration::from_secs(2);
    config.bulk_timeout = Duration::from_secs(2);
    config
}

async fn connect(config: &StoreConfig) -> Store {
    Store::connect_with(config)
        .await
        .unwrap_or_else(|e| panic!("connect {:?}: {e}", config.urls))
}

/// A long window (10 x 1 s): nothing slides out during a test.
/// The ACL user `store` is logged in as (`ACL WHOAMI`).
async fn whoami(store: &Store) -> String {
    redis::cmd("ACL")
        .arg("WHOAMI")
        .query_async(&mut store.connection())
        .await
        .unwrap()
}

fn long_window() -> WindowSpec {
    WindowSpec::new(Duration::from_secs(1), 10).unwrap()
}

/// Redis TIME in milliseconds, through redis-cli.
fn redis_time_ms(server: &RedisServer) -> u64 {
    let out = server.cli(&["time"]);
    let mut lines = out
        .lines()
        .map(|l| l.trim().parse::<u64>().expect("TIME line"));
    let (secs, micros) = (lines.next().unwrap(), lines.next().unwrap());
    secs * 1000 + micros / 1000
}

fn counts(t: &Totals) -> [u64; 4] {
    [
        t.cluster_admitted,
        t.cluster_offered,
        t.own_admitted,
        t.own_offered,
    ]
}

#[test]
fn nodes_read_the_same_cluster_totals_and_their_own() {
    let server = RedisServer::start();
    let config = config(&server);
    let window = long_window();
    let before = redis_time_ms(&server);
    let (a, b, c) = server.block_on(|| async {
        // One store (connection) per node, as on real nodes.
        let (na, nb, nc) = (
            connect(&config).await,
            connect(&config).await,
            connect(&config).await,
        );
        let src = "192.0.2.3/32|default";
        let other = "198.51.100.0/24|web";
        let a = na
            .sync("a", window, &[report(src, 10, 20), report(other, 1, 1)])
            .await
            .unwrap();
        let b = nb.sync("b", window, &[report(src, 5, 30)]).await.unwrap();
        // Node c saw nothing of them: zero deltas only read.
        let c = nc
            .sync("c", window, &[report(src, 0, 0), report(other, 0, 0)])
            .await
            .unwrap();
        (a, b, c)
    });
    let after = redis_time_ms(&server);
    assert_eq!(counts(&a[0]), [10, 20, 10, 20]);
    assert_eq!(counts(&a[1]), [1, 1, 1, 1]);
    assert_eq!(counts(&b[0]), [15, 50, 5, 30]);
    assert_eq!(counts(&c[0]), [15, 50, 0, 0]);
    assert_eq!(counts(&c[1]), [1, 1, 0, 0]);
    // Buckets come from Redis TIME.
    for t in a.iter().chain(&b).chain(&c) {
        assert!(
            (before / 1000..=after / 1000).contains(&t.bucket),
            "bucket {} outside Redis time {before}..{after} ms",
            t.bucket
        );
    }
    // The claims (`share::node_claim`, computed in the script): a came
    // first and claims all the room its traffic is entitled to (L 100 -
    // 10 admitted, a alone offered); b's fair part (100 x 30 / 50 less
    // its own 5 in the window = 55) is held back by a's live claim (90 of
    // a room of 85); c offered nothing.
    assert_eq!([a[0].claim, a[1].claim], [90, 99]);
    assert_eq!(b[0].claim, node_claim(100, 15, 5, 50, 30, 3, 90));
    assert_eq!(b[0].claim, 0);
    assert_eq!(c[0].claim, 0);
}

#[test]
fn claims_reserve_the_room_until_replaced_or_expired() {
    let server = RedisServer::start();
    let mut config = config(&server);
    // Claims hold 300 ms unless their node syncs again.
    config.claim_hold = Duration::from_millis(300);
    let window = long_window();
    let src = "192.0.2.9/32|default";
    server.block_on(|| async {
        let (na, nb) = (connect(&config).await, connect(&config).await);
        // a offered 60 and is the only sender so far: the whole room.
        let a = na.sync("a", window, &[report(src, 0, 60)]).await.unwrap()[0];
        assert_eq!(a.claim, 100, "{a:?}");
        // b's fair part is 40, but a claimed all the room: nothing yet.
        let b = nb.sync("b", window, &[report(src, 0, 40)]).await.unwrap()[0];
        assert_eq!(b.claim, node_claim(100, 0, 0, 100, 40, 1, 100));
        assert_eq!(b.claim, 0);
        // a stops syncing: once its claim expired (Redis time), b is the
        // only node claiming and its fair part is the whole room.
        let started = Instant::now();
        let freed = wait_until_async(Duration::from_secs(5), || async {
            let b = nb.sync("b", window, &[report(src, 0, 0)]).await.unwrap()[0];
            (b.claim == 100).then_some(b)
        })
        .await;
        assert!(freed.is_some(), "a's claim never expired");
        assert!(started.elapsed() >= Duration::from_millis(250));
        // a comes back having spent 50: b's claim holds the rest.
        let a = na.sync("a", window, &[report(src, 50, 50)]).await.unwrap()[0];
        assert_eq!(a.cluster_admitted, 50);
        assert_eq!(a.claim, node_claim(100, 50, 50, 150, 110, 1, 100));
        assert_eq!(a.claim, 0);
        // b syncs again: its own old claim is replaced (not counted against
        // it) and a, claiming again, counts in the split: b's part of the
        // window is 100 x 40 / 150, and it holds none of the window.
        let b = nb.sync("b", window, &[report(src, 0, 0)]).await.unwrap()[0];
        assert_eq!(b.claim, node_claim(100, 50, 0, 150, 40, 1, 0));
        assert_eq!(b.claim, 26);
    });
}

#[test]
fn the_window_slides_on_redis_time() {
    let server = RedisServer::start();
    let config = config(&server);
    // 4 x 50 ms: counts leave the window 200 ms after their bucket.
    let window = WindowSpec::new(Duration::from_millis(50), 4).unwrap();
    server.block_on(|| async {
        let store = connect(&config).await;
        let key = "203.0.113.9/32|default";
        let first = store.sync("a", window, &[report(key, 7, 9)]).await.unwrap()[0];
        assert_eq!(counts(&first), [7, 9, 7, 9]);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut polls = 0;
        loop {
            let t = store.sync("a", window, &[report(key, 0, 0)]).await.unwrap()[0];
            polls += 1;
            if t.bucket < first.bucket + 4 {
                // Still inside the window: still counted.
                assert_eq!(
                    counts(&t),
                    [7, 9, 7, 9],
                    "bucket {} (first {})",
                    t.bucket,
                    first.bucket
                );
            } else {
                assert_eq!(
                    counts(&t),
                    [0, 0, 0, 0],
                    "bucket {} (first {})",
                    t.bucket,
                    first.bucket
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "Redis time never passed the window"
            );
            // Polling interval, not synchronization: the loop ends on the
            // bucket Redis reports.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(polls > 1, "the window ended before a second read");
        // New deltas land in the new window only.
        let t = store.sync("a", window, &[report(key, 2, 3)]).await.unwrap()[0];
        assert_eq!(counts(&t), [2, 3, 2, 3]);
    });
}

#[test]
fn every_key_expires_a_window_and_two_buckets_after_its_last_write() {
    let server = RedisServer::start();
    let config = config(&server);
    let window = long_window();
    // More reports than one call takes: batches, answered in order.
    let n = MAX_BATCH * 2 + 10;
    let reports: Vec<Report> = (0..n as u64)
        .map(|i| report(&format!("10.{}.{}.1/32|r", i / 256, i % 256), i, 2 * i + 1))
        .collect();
    let totals = server.block_on(|| async {
        let store = connect(&config).await;
        let totals = store.sync("a", window, &reports).await.unwrap();
        store.heartbeat("a", window.window()).await.unwrap();
        totals
    });
    for (i, t) in totals.iter().enumerate() {
        let i = i as u64;
        assert_eq!(counts(t), [i, 2 * i + 1, i, 2 * i + 1], "report {i}");
    }
    let keys = server.cli(&["--scan", "--pattern", "xl:*"]);
    let keys: Vec<&str> = keys.lines().collect();
    // One bucket key and one claim key per report (each written once), a
    // hot set per group used, and the node set.
    let groups: std::collections::BTreeSet<u16> = reports.iter().map(|r| group(&r.key)).collect();
    assert_eq!(keys.len(), 2 * n + groups.len() + 1, "{keys:?}");
    let ttl_max = window.ttl().as_millis() as i64;
    for key in keys {
        if key.ends_with(":hot") {
            assert!(key.starts_with("xl:{g") && key.ends_with("}:hot"), "{key}");
        } else if key != "xl:nodes" {
            // xl:{g<group>}:<source key>:<bucket>, or :r for its claims
            let (head, bucket) = key.rsplit_once(':').unwrap();
            assert!(head.starts_with("xl:{g") && head.ends_with("|r"), "{key}");
            assert!(bucket.parse::<u64>().is_ok() || bucket == "r", "{key}");
        }
        let pttl: i64 = server.cli(&["pttl", key]).trim().parse().unwrap();
        assert!(pttl > 0 && pttl <= ttl_max * 2, "{key}: PTTL {pttl}");
        if key != "xl:nodes" {
            assert!(pttl <= ttl_max, "{key}: PTTL {pttl} > {ttl_max}");
        }
    }
}

#[test]
fn sources_hot_on_any_node_are_listed_for_a_window() {
    let server = RedisServer::start();
    let config = config(&server);
    // 4 x 50 ms: hot sources are forgotten 200 ms after their last deltas.
    let window = WindowSpec::new(Duration::from_millis(50), 4).unwrap();
    let (hot, light) = ("192.0.2.50/32|default", "192.0.2.51/32|default");
    server.block_on(|| async {
        let (a, b, c) = (
            connect(&config).await,
            connect(&config).await,
            connect(&config).await,
        );
        assert!(c.hot_sources(window.window()).await.unwrap().is_empty());
        a.sync("a", window, &[report(hot, 1, 5)]).await.unwrap();
        // A read without deltas does not make a source hot.
        b.sync("b", window, &[report(light, 0, 0)]).await.unwrap();
        assert_eq!(c.hot_sources(window.window()).await.unwrap(), vec![hot]);
        // A slice of the groups lists the source only if it holds its group.
        let g = group(hot);
        let within = window.window();
        let budget = config.bulk_timeout;
        assert_eq!(
            c.hot_sources_in(within, g..g + 1, budget).await.unwrap(),
            vec![hot]
        );
        assert!(c
            .hot_sources_in(within, 0..g, budget)
            .await
            .unwrap()
            .is_empty());
        assert!(c
            .hot_sources_in(within, g + 1..GROUPS, budget)
            .await
            .unwrap()
            .is_empty());
        // Forgotten once a window passes with no deltas (Redis time).
        let start = Instant::now();
        let gone = wait_until_async(Duration::from_secs(10), || async {
            c.hot_sources(window.window())
                .await
                .unwrap()
                .is_empty()
                .then_some(())
        })
        .await;
        assert!(gone.is_some(), "{hot} listed forever");
        assert!(
            start.elapsed() >= Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );
    });
}

#[test]
fn the_heartbeat_counts_nodes_alive_and_forgets_silent_ones() {
    let server = RedisServer::start();
    let config = config(&server);
    let alive = Duration::from_millis(300);
    server.block_on(|| async {
        let store = connect(&config).await;
        assert_eq!(store.heartbeat("a", alive).await.unwrap(), 1);
        assert_eq!(store.heartbeat("b", alive).await.unwrap(), 2);
        assert_eq!(store.heartbeat("c", alive).await.unwrap(), 3);
        // A node's second heartbeat is still one node.
        assert_eq!(store.heartbeat("a", alive).await.unwrap(), 3);
        let start = Instant::now();
        // Only a keeps beating: b and c go once silent for `alive`.
        let alone = wait_until_async(Duration::from_secs(5), || async {
            let n = store.heartbeat("a", alive).await.unwrap();
            assert!((1..=3).contains(&n), "{n} nodes");
            (n == 1).then_some(())
        })
        .await;
        assert!(alone.is_some(), "silent nodes never pruned");
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(200),
            "pruned after {took:?} only"
        );
        assert!(matches!(
            store.heartbeat("", alive).await,
            Err(StoreError::Node(_))
        ));
        assert!(store.heartbeat("a", Duration::ZERO).await.is_err());
    });
}

/// A second daemon instance heartbeating under a live node's name is
/// refused, writes nothing, and is told what to do; a distinct name is
/// counted as another node.
#[test]
fn a_second_instance_under_a_live_node_name_is_refused_and_a_distinct_name_is_not() {
    let server = RedisServer::start();
    let config = config(&server);
    let alive = Duration::from_secs(5);
    server.block_on(|| async {
        let (a, b) = (connect(&config).await, connect(&config).await);
        assert_eq!(a.heartbeat_as("edge-1", "tok-a", alive).await.unwrap(), 1);
        // The same instance renews its own name.
        assert_eq!(a.heartbeat_as("edge-1", "tok-a", alive).await.unwrap(), 1);
        let e = b
            .heartbeat_as("edge-1", "tok-b", alive)
            .await
            .expect_err("a second instance under a live name");
        let text = e.to_string();
        assert!(
            text.contains("node name `edge-1` is already in use")
                && text.contains("instance tok-a")
                && text.contains("distinct `node` under [cluster]"),
            "{text}"
        );
        match e {
            StoreError::DuplicateNode {
                node,
                holder,
                expires_in,
                nodes,
            } => {
                assert_eq!(
                    (node.as_str(), holder.as_str(), nodes),
                    ("edge-1", "tok-a", 1)
                );
                assert!(
                    expires_in <= alive && expires_in > Duration::ZERO,
                    "{expires_in:?}"
                );
            }
            other => panic!("not a duplicate: {other}"),
        }
        assert_eq!(e_kind_other(&b, alive).await, ErrorKind::Other);
        // Nothing written: the name is still a's, one node alive.
        assert_eq!(server.cli(&["get", &a.node_key("edge-1")]).trim(), "tok-a");
        assert_eq!(a.heartbeat_as("edge-1", "tok-a", alive).await.unwrap(), 1);
        // A distinct name is another node, for both.
        assert_eq!(b.heartbeat_as("edge-2", "tok-b", alive).await.unwrap(), 2);
        assert_eq!(a.heartbeat_as("edge-1", "tok-a", alive).await.unwrap(), 2);
        // A heartbeat without a token (the store's plain heartbeat) guards
        // nothing and is never refused.
        assert_eq!(b.heartbeat("edge-1", alive).await.unwrap(), 2);
    });
}

/// The kind a duplicate's error is counted under, if it were counted.
async fn e_kind_other(store: &Store, alive: Duration) -> ErrorKind {
    store
        .heartbeat_as("edge-1", "tok-b", alive)
        .await
        .expect_err("still refused")
        .kind()
}

/// A daemon restarted after a crash (a new instance token, the old
/// heartbeat still live) is refused only until the old heartbeat lapses,
/// one alive period after its last renewal; then it holds the name and the
/// old instance, were it to come back, is the one refused.
#[test]
fn a_restarted_node_takes_its_name_back_once_the_old_heartbeat_lapses() {
    let server = RedisServer::start();
    let config = config(&server);
    let alive = Duration::from_millis(400);
    server.block_on(|| async {
        let store = connect(&config).await;
        store.heartbeat_as("edge-1", "old", alive).await.unwrap();
        let crashed = Instant::now();
        assert!(matches!(
            store.heartbeat_as("edge-1", "new", alive).await,
            Err(StoreError::DuplicateNode { .. })
        ));
        let taken = wait_until_async(Duration::from_secs(5), || async {
            match store.heartbeat_as("edge-1", "new", alive).await {
                Ok(nodes) => Some(nodes),
                Err(StoreError::DuplicateNode { .. }) => None,
                Err(e) => panic!("{e}"),
            }
        })
        .await;
        let took = crashed.elapsed();
        assert_eq!(taken, Some(1), "the old heartbeat never lapsed");
        // Not before the old heartbeat's alive period (less the
        // round trips between its write and our clock).
        assert!(took >= alive - Duration::from_millis(50), "{took:?}");
        assert!(matches!(
            store.heartbeat_as("edge-1", "old", alive).await,
            Err(StoreError::DuplicateNode { holder, .. }) if holder == "new"
        ));
    });
}

/// On a Redis Cluster the heartbeat's two keys (the node set and the
/// name's guard) share a slot: no CROSSSLOT, and the guard holds there too.
#[test]
fn the_name_guard_works_on_a_redis_cluster() {
    let server = RedisServer::start_cluster();
    let mut config = config(&server);
    config.urls = server.urls();
    config.mode = Mode::Cluster;
    let alive = Duration::from_secs(5);
    server.block_on(|| async {
        let store = connect(&config).await;
        assert_eq!(
            store.heartbeat_as("edge-1", "tok-a", alive).await.unwrap(),
            1
        );
        assert!(matches!(
            store.heartbeat_as("edge-1", "tok-b", alive).await,
            Err(StoreError::DuplicateNode { holder, .. }) if holder == "tok-a"
        ));
        assert_eq!(
            store.heartbeat_as("edge-2", "tok-b", alive).await.unwrap(),
            2
        );
    });
}

/// The hot list is cut at the bound, on a single instance and across a
/// Redis Cluster's calls: the keys returned are hot ones, at most the
/// bound, and the rest are counted, not returned.
#[test]
fn the_hot_list_keeps_at_most_the_bound_and_counts_the_rest() {
    for server in [RedisServer::start(), RedisServer::start_cluster()] {
        let mut config = config(&server);
        if server.urls().len() > 1 {
            config.urls = server.urls();
            config.mode = Mode::Cluster;
        }
        let window = long_window();
        let n = 300;
        let reports: Vec<Report> = (0..n)
            .map(|i| report(&format!("10.1.{}.{}/32#0|default", i / 256, i % 256), 1, 2))
            .collect();
        let all: std::collections::BTreeSet<String> =
            reports.iter().map(|r| r.key.clone()).collect();
        server.block_on(|| async {
            let store = connect(&config).await;
            store.sync("other", window, &reports).await.unwrap();
            let within = window.window();
            let budget = config.bulk_timeout;
            for limit in [1, 100, 299] {
                let list = store
                    .hot_sources_bounded(within, 0..GROUPS, budget, limit)
                    .await
                    .unwrap();
                let taken = list.keys.len();
                if config.mode == Mode::Single {
                    assert_eq!(taken, limit);
                } else {
                    // Each group's call takes its part of the bound
                    // (rounded up): uneven groups leave some of it unused.
                    assert!((1..=limit).contains(&taken), "{taken} of {limit}");
                }
                assert_eq!(list.omitted, (n - taken) as u64, "{:?}", config.mode);
                let distinct: std::collections::BTreeSet<&String> = list.keys.iter().collect();
                assert_eq!(distinct.len(), taken);
                assert!(list.keys.iter().all(|k| all.contains(k)));
            }
            // A bound the hot set fits in returns it all (in cluster mode
            // once each group's part holds its group).
            let roomy: &[usize] = match config.mode {
                Mode::Single => &[300, 10_000],
                _ => &[10_000],
            };
            for &limit in roomy {
                let list = store
                    .hot_sources_bounded(within, 0..GROUPS, budget, limit)
                    .await
                    .unwrap();
                assert_eq!((list.keys.len(), list.omitted), (n, 0), "{:?}", config.mode);
            }
            let none = store
                .hot_sources_bounded(within, 0..GROUPS, budget, 0)
                .await
                .unwrap();
            assert!(none.keys.is_empty());
        });
    }
}

#[test]
fn scripts_are_reloaded_after_script_flush() {
    let server = RedisServer::start();
    let config = config(&server);
    let window = long_window();
    let key = "192.0.2.77/32|default";
    let sha = limiter_user_sync_sha();
    let t = server.block_on(|| async {
        // The same store (connection) before and after the flush: connecting
        // again would load the scripts and hide the NOSCRIPT path.
        let store = connect(&config).await;
        store.sync("a", window, &[report(key, 1, 2)]).await.unwrap();
        store.heartbeat("a", window.window()).await.unwrap();
        assert_eq!(server.cli(&["script", "exists", &sha]).trim(), "1");
        assert_eq!(server.cli(&["script", "flush"]).trim(), "OK");
        assert_eq!(server.cli(&["script", "exists", &sha]).trim(), "0");
        let t = store.sync("a", window, &[report(key, 3, 4)]).await.unwrap();
        assert_eq!(store.heartbeat("a", window.window()).await.unwrap(), 1);
        t
    });
    // Both scripts met NOSCRIPT (the server says so) and were loaded and
    // run again: counted once, not lost.
    let errors = server.cli(&["info", "errorstats"]);
    assert!(
        errors.contains("errorstat_NOSCRIPT:count=2"),
        "expected two NOSCRIPT replies: {errors}"
    );
    assert_eq!(counts(&t[0]), [4, 6, 4, 6]);
    assert_eq!(server.cli(&["script", "exists", &sha]).trim(), "1");
}

/// The SHA1 the store's sync script is called by.
fn limiter_user_sync_sha() -> String {
    redis::Script::new(include_str!("../../limiter-user/src/cluster/sync.lua"))
        .get_hash()
        .to_owned()
}

#[test]
fn a_hung_server_costs_a_timeout_not_a_hang() {
    let server = RedisServer::start();
    let mut config = config(&server);
    config.timeout = Duration::from_millis(100);
    config.bulk_timeout = Duration::from_millis(100);
    let window = long_window();
    let key = "192.0.2.8/32|default";
    server.block_on(|| async {
        let store = connect(&config).await;
        store.sync("a", window, &[report(key, 1, 1)]).await.unwrap();
        server.pause();
        // Several batches, bounded together (they run concurrently), not
        // one timeout after another.
        let mut many = vec![report(key, 1, 1)];
        many.extend(
            (0..3 * MAX_BATCH).map(|i| report(&format!("10.8.{}.{}/32|r", i / 256, i % 256), 0, 1)),
        );
        let start = Instant::now();
        let e = store.sync("a", window, &many).await.unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(e, StoreError::Timeout { op: "sync", .. }),
            "expected a timeout, got {e}"
        );
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(took < Duration::from_secs(1), "sync took {took:?}");
        let start = Instant::now();
        let e = store.heartbeat("a", window.window()).await.unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::Timeout {
                    op: "heartbeat",
                    ..
                }
            ),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(1));
        server.resume();
        // The same store recovers once the server answers again.
        let back = wait_until_async(Duration::from_secs(10), || async {
            store.sync("a", window, &[report(key, 0, 0)]).await.ok()
        })
        .await
        .expect("sync never recovered after SIGCONT");
        // The first delta counted; the timed-out ones may or may not have
        // reached Redis (the server read them before stopping or after).
        assert!((1..=2).contains(&back[0].cluster_admitted), "{:?}", back[0]);
    });
}

#[test]
fn connection_errors_are_clear() {
    let server = RedisServer::start();
    server.block_on(|| async {
        // Nothing listens on 6390 in the namespace.
        let mut config = StoreConfig::new(vec!["redis://127.0.0.1:6390".into()], Mode::Single);
        config.timeout = Duration::from_millis(200);
        let start = Instant::now();
        let e = Store::connect_with(&config)
            .await
            .err()
            .expect("connected to nothing");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        let text = format!(
            "{e}: {}",
            std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_default()
        );
        assert!(matches!(e, StoreError::Connect { .. }), "{text}");
        assert_eq!(e.kind(), ErrorKind::Connection, "{text}");
        assert!(text.contains("127.0.0.1:6390"), "{text}");
        assert!(text.to_lowercase().contains("refused"), "{text}");

        // The same through the Redis Cluster client.
        let mut cluster = StoreConfig::new(
            vec![
                "redis://127.0.0.1:6390".into(),
                "redis://127.0.0.1:6391".into(),
            ],
            Mode::Cluster,
        );
        cluster.timeout = Duration::from_millis(200);
        let start = Instant::now();
        let e = Store::connect_with(&cluster)
            .await
            .err()
            .expect("connected to nothing");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert!(matches!(e, StoreError::Connect { .. }), "{e}");
        assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
        assert!(e.to_string().contains("127.0.0.1:6391"), "{e}");
        assert!(e.to_string().to_lowercase().contains("refused"), "{e}");

        let bad = StoreConfig::new(vec!["http://nope".into()], Mode::Single);
        assert!(matches!(
            Store::connect_with(&bad).await,
            Err(StoreError::Url { .. })
        ));
        let none = StoreConfig::new(vec![], Mode::Single);
        assert!(matches!(
            Store::connect_with(&none).await,
            Err(StoreError::NoUrl)
        ));
        let two = StoreConfig::new(vec![server.url(), server.url()], Mode::Single);
        assert!(matches!(
            Store::connect_with(&two).await,
            Err(StoreError::SingleWithSeveralUrls(2))
        ));
        let mut braces = StoreConfig::new(vec![server.url()], Mode::Single);
        braces.prefix = "x{y}".into();
        assert!(matches!(
            Store::connect_with(&braces).await,
            Err(StoreError::Prefix(_))
        ));
    });
}

#[test]
fn bad_reports_are_refused_before_anything_is_written() {
    let server = RedisServer::start();
    let config = config(&server);
    server.block_on(|| async {
        let store = connect(&config).await;
        let w = long_window();
        let good = report("192.0.2.1/32|default", 1, 1);
        let e = store
            .sync("a", w, &[good.clone(), report("", 1, 1)])
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Key(_)), "{e}");
        let e = store
            .sync("a", w, &[good.clone(), report("k", 2, 1)])
            .await
            .unwrap_err();
        assert!(e.to_string().contains("exceeds offered"), "{e}");
        let e = store.sync("", w, &[good]).await.unwrap_err();
        assert!(matches!(e, StoreError::Node(_)), "{e}");
    });
    assert_eq!(server.cli(&["dbsize"]).trim(), "0");
}

#[test]
fn a_redis_cluster_takes_the_same_sync_without_cross_slot_errors() {
    let server = RedisServer::start_cluster();
    let mut config = StoreConfig::new(server.urls(), Mode::Cluster);
    config.timeout = Duration::from_secs(2);
    // Two 600-source syncs over three primaries: the 50 ms default is too
    // short for a loaded machine.
    config.bulk_timeout = Duration::from_secs(2);
    let window = long_window();
    // Sources all over the slot space, some sharing a slot.
    let reports: Vec<Report> = (0..600u64)
        .map(|i| report(&format!("10.9.{}.{}/32|r", i / 256, i % 256), 1, 2))
        .collect();
    let (a, b, nodes) = server.block_on(|| async {
        let na = connect(&config).await;
        let nb = connect(&config).await;
        let a = na.sync("a", window, &reports).await.unwrap();
        let b = nb.sync("b", window, &reports).await.unwrap();
        na.heartbeat("a", window.window()).await.unwrap();
        let nodes = nb.heartbeat("b", window.window()).await.unwrap();
        (a, b, nodes)
    });
    assert!(a.iter().all(|t| counts(t) == [1, 2, 1, 2]), "{:?}", &a[..3]);
    assert!(b.iter().all(|t| counts(t) == [2, 4, 1, 2]), "{:?}", &b[..3]);
    assert_eq!(nodes, 2);
    // The keys really are spread over the three primaries.
    let per_node: Vec<u64> = server
        .urls()
        .iter()
        .map(|url| {
            let port = url.rsplit(':').next().unwrap();
            server
                .ns()
                .run("redis-cli", &["-p", port, "dbsize"])
                .stdout
                .iter()
                .map(|&c| c as char)
                .collect::<String>()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");
    // A claim key per source, a hot set per group used, the node set, and
    // a bucket key per source, or two where a's and b's syncs fell on
    // either side of a bucket edge (the calls of a sync run concurrently
    // and take a while on a loaded machine).
    let mut kinds = std::collections::BTreeMap::<&str, u64>::new();
    for url in server.urls() {
        let port = url.rsplit(':').next().unwrap().to_owned();
        let keys = server.cli_at(port.parse().unwrap(), &["--scan", "--pattern", "xl:*"]);
        for key in keys.lines() {
            let kind = if key == "xl:nodes" {
                "nodes"
            } else if key.ends_with(":hot") {
                "hot"
            } else if key.ends_with(":r") {
                "claims"
            } else {
                "buckets"
            };
            *kinds.entry(kind).or_default() += 1;
        }
    }
    let groups: std::collections::BTreeSet<u16> = reports.iter().map(|r| group(&r.key)).collect();
    assert_eq!(kinds.get("claims"), Some(&600), "{kinds:?}");
    assert_eq!(kinds.get("hot"), Some(&(groups.len() as u64)), "{kinds:?}");
    assert_eq!(kinds.get("nodes"), Some(&1), "{kinds:?}");
    let buckets = kinds.get("buckets").copied().unwrap_or(0);
    assert!((600..=1200).contains(&buckets), "{kinds:?}");
    assert_eq!(per_node.iter().sum::<u64>(), kinds.values().sum::<u64>());
    // One EVALSHA per group batch per node and one per heartbeat, no more
    // (no retries, no per-source calls): far fewer calls than sources.
    let calls: u64 = server
        .urls()
        .iter()
        .map(|url| {
            let port = url.rsplit(':').next().unwrap();
            let out = server
                .ns()
                .run("redis-cli", &["-p", port, "info", "commandstats"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.lines()
                .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
                .map(|rest| rest.split(',').next().unwrap().parse::<u64>().unwrap())
                .unwrap_or(0)
        })
        .sum();
    let per_sync = batches(Mode::Cluster, &reports).len() as u64;
    assert!(per_sync < 300, "{per_sync} calls for 600 sources");
    assert_eq!(calls, 2 * per_sync + 2);
    // Every source was synced with deltas: all hot, listed once each.
    let mut hot = server.block_on(|| async {
        connect(&config)
            .await
            .hot_sources(window.window())
            .await
            .unwrap()
    });
    hot.sort_unstable();
    let mut keys: Vec<String> = reports.iter().map(|r| r.key.clone()).collect();
    keys.sort_unstable();
    assert_eq!(hot, keys);
    // Listed in slices of the groups (as the daemon does, a slice a tick),
    // each source comes in its group's slice and in no other.
    let slices = [0..1, 1..100, 100..GROUPS];
    let listed = server.block_on(|| async {
        let store = connect(&config).await;
        let mut listed = Vec::new();
        for slice in slices.clone() {
            listed.push(
                store
                    .hot_sources_in(window.window(), slice, config.bulk_timeout)
                    .await
                    .unwrap(),
            );
        }
        listed
    });
    for (slice, keys) in slices.iter().zip(&listed) {
        assert!(
            keys.iter().all(|k| slice.contains(&group(k))),
            "{slice:?}: {keys:?}"
        );
    }
    let mut union: Vec<String> = listed.concat();
    union.sort_unstable();
    assert_eq!(union, hot);
}

/// `limiter_tests::wait_until`'s async twin, for polls that call the store.
async fn wait_until_async<T, F, Fut>(limit: Duration, mut poll: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = poll().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn a_sentinel_names_the_primary_and_the_store_follows_a_failover() {
    use limiter_tests::redis::{SENTINEL_MASTER, SENTINEL_PRIMARY_PORT};
    let server = RedisServer::start_sentinel();
    let mut config = StoreConfig::new(vec![server.sentinel_url()], Mode::Sentinel);
    config.timeout = Duration::from_secs(2);
    config.bulk_timeout = Duration::from_secs(2);
    config.sentinel_master = Some(SENTINEL_MASTER.into());
    let window = long_window();
    let key = "192.0.2.77/32|default";
    let first = server.block_on(|| async {
        let store = connect(&config).await;
        store.sync("a", window, &[report(key, 3, 4)]).await.unwrap()[0]
    });
    assert_eq!(counts(&first), [3, 4, 3, 4]);
    // The counts went to the primary (and replicated).
    let on_primary = server.cli_at(SENTINEL_PRIMARY_PORT, &["--scan", "--pattern", "xl:*"]);
    assert!(on_primary.contains(key), "{on_primary}");
    // Without a master name, a clear error.
    let mut nameless = config.clone();
    nameless.sentinel_master = None;
    let e = server.block_on(|| async { Store::connect_with(&nameless).await.err() });
    assert!(matches!(e, Some(StoreError::NoSentinelMaster)), "{e:?}");
    // Replication is asynchronous: wait until the replica has the counts.
    let replicated = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let keys = server.cli_at(SENTINEL_PRIMARY_PORT + 1, &["--scan", "--pattern", "xl:*"]);
        keys.contains(key).then_some(())
    });
    assert!(replicated.is_some(), "the replica never got the counts");
    // The primary dies: the Sentinel promotes the replica, and a store
    // connected again through the Sentinel (what the daemon does after a
    // failed tick) syncs there, with the replicated counts.
    server.kill_port(SENTINEL_PRIMARY_PORT);
    let promoted = wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
        server
            .sentinel_primary_port()
            .filter(|&p| p == SENTINEL_PRIMARY_PORT + 1)
    });
    assert!(
        promoted.is_some(),
        "the Sentinel never promoted the replica"
    );
    let after = wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
        server.block_on(|| async {
            let store = Store::connect_with(&config).await.ok()?;
            store.sync("a", window, &[report(key, 1, 1)]).await.ok()
        })
    })
    .expect("no sync through the Sentinel after the failover")[0];
    assert_eq!(counts(&after), [4, 5, 4, 5]);
}

#[test]
fn a_sync_that_part_of_redis_cannot_serve_syncs_the_rest() {
    let server = RedisServer::start();
    let config = config(&server);
    let window = long_window();
    // Four batches in a single instance: 64, 64, 64 and 8 reports.
    let reports: Vec<Report> = (0..200u64)
        .map(|i| report(&format!("10.8.{}.{}/32|r", i / 256, i % 256), 1, 2))
        .collect();
    let outcome = server.block_on(|| async {
        let store = connect(&config).await;
        // The second batch's script fails: one of its sources' claim key
        // is a string (WRONGTYPE), as a call Redis cannot serve.
        let broken = format!("{}:r", store.source_key(&reports[70].key));
        let mut con = store.connection();
        redis::cmd("SET")
            .arg(&broken)
            .arg("x")
            .query_async::<()>(&mut con)
            .await
            .unwrap();
        store
            .sync_partial("a", window, &reports, Duration::from_secs(2))
            .await
            .unwrap()
    });
    // The other batches synced; the failed batch's sources are missing.
    for (i, t) in outcome.totals.iter().enumerate() {
        if (64..128).contains(&i) {
            assert!(t.is_none(), "report {i}: {t:?}");
        } else {
            let t = t.unwrap_or_else(|| panic!("report {i} not synced"));
            assert_eq!(counts(&t), [1, 2, 1, 2], "report {i}");
        }
    }
    assert_eq!(outcome.failed_batches, 1);
    let e = outcome.error.expect("the failed batch's error");
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    // An error reply of the server: its own kind for the metric.
    assert_eq!(e.kind(), ErrorKind::Server, "{e}");
    // The all-or-nothing sync reports that error.
    let all = server.block_on(|| async {
        let store = connect(&config).await;
        store.sync("a", window, &reports).await.err()
    });
    assert!(all.is_some_and(|e| e.to_string().contains("WRONGTYPE")));
}

/// The ACL user's password on the secured servers: no error may show it.
const PASSWORD: &str = "xl-Secret-7f3a";
/// A wrong password tried against them: no error may show it either.
const WRONG_PASSWORD: &str = "xl-Wrong-93c1";
/// The Sentinel's own password (`requirepass` of the Sentinel).
const SENTINEL_PASSWORD: &str = "xl-Sentinel-5d2e";

/// TLS, client certificates and an ACL user with [`PASSWORD`].
fn locked_down() -> Security {
    Security {
        tls: true,
        client_certs: true,
        acl_password: Some(PASSWORD.into()),
        ..Security::default()
    }
}

/// The certificates a client of `pki` is configured with: `ca` as the CA
/// (the right one or `pki.other_ca`), and the client certificate if
/// `client`.
fn certs(pki: &Pki, ca: &std::path::Path, client: bool) -> redis::TlsCertificates {
    let read = |p: &std::path::Path| std::fs::read(p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    redis::TlsCertificates {
        root_cert: Some(read(ca)),
        client_tls: client.then(|| redis::ClientTlsConfig {
            client_cert: read(&pki.client_cert),
            client_key: read(&pki.client_key),
        }),
    }
}

/// An error and every error under it, Display and Debug: all of what a
/// log line or a `status` could be made of.
fn everything_said(e: &StoreError) -> String {
    let mut text = format!("{e} | {e:?}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(" | {s} | {s:?}"));
        source = s.source();
    }
    text
}

#[track_caller]
fn assert_no_password(text: &str) {
    for secret in [PASSWORD, WRONG_PASSWORD, SENTINEL_PASSWORD] {
        assert!(!text.contains(secret), "{secret} shown in: {text}");
    }
}

#[test]
fn tls_with_client_certificates_and_an_acl_user_syncs_as_that_user() {
    let server = RedisServer::start_secured(locked_down());
    let url = server.url();
    assert!(url.starts_with("rediss://xl-node:"), "{url}");
    let mut config = config(&server);
    config.tls = Some(certs(server.pki(), &server.pki().ca, true));
    let key = "192.0.2.41/32|default";
    let (totals, whoami) = server.block_on(|| async {
        let store = connect(&config).await;
        let totals = store
            .sync("a", long_window(), &[report(key, 2, 3)])
            .await
            .unwrap();
        (totals, whoami(&store).await)
    });
    assert_eq!(counts(&totals[0]), [2, 3, 2, 3]);
    assert_eq!(whoami, ACL_USER);
    // Redis has the counts (read over TLS by redis-cli, as the ACL user).
    let keys = server.cli(&["--scan", "--pattern", "xl:*"]);
    assert!(keys.contains(key), "{keys}");
}

#[test]
fn the_acl_user_of_the_url_is_who_the_store_logs_in_as() {
    // No TLS: the login alone (the default user is off, so only the ACL
    // user gets in at all).
    let server = RedisServer::start_secured(Security {
        acl_password: Some(PASSWORD.into()),
        ..Security::default()
    });
    let url = server.url();
    assert_eq!(url, format!("redis://{ACL_USER}:{PASSWORD}@127.0.0.1:6379"));
    let config = config(&server);
    let whoami = server.block_on(|| async {
        let store = connect(&config).await;
        store.heartbeat("a", Duration::from_secs(1)).await.unwrap();
        whoami(&store).await
    });
    assert_eq!(whoami, ACL_USER);
    // Without the login the server refuses the store's scripts.
    let anonymous = StoreConfig::new(vec!["redis://127.0.0.1:6379".into()], Mode::Single);
    let e = server
        .block_on(|| async { Store::connect_with(&anonymous).await.err() })
        .expect("connected without logging in");
    assert!(e.to_string().contains("NOAUTH"), "{e}");
}

#[test]
fn a_redis_cluster_behind_tls_and_an_acl_user_takes_the_sync() {
    let server = RedisServer::start_cluster_secured(locked_down());
    let urls = server.urls();
    assert!(
        urls.iter().all(|u| u.starts_with("rediss://xl-node:")),
        "{urls:?}"
    );
    let mut config = StoreConfig::new(urls, Mode::Cluster);
    config.timeout = Duration::from_secs(2);
    config.bulk_timeout = Duration::from_secs(2);
    config.tls = Some(certs(server.pki(), &server.pki().ca, true));
    // Sources over many slots, so every primary is reached (each over its
    // own TLS connection, logged in as the ACL user).
    let reports: Vec<Report> = (0..100u64)
        .map(|i| report(&format!("10.8.0.{i}/32|r"), 1, 2))
        .collect();
    let totals = server.block_on(|| async {
        let store = connect(&config).await;
        store.sync("a", long_window(), &reports).await.unwrap()
    });
    assert!(totals.iter().all(|t| counts(t) == [1, 2, 1, 2]));
    for port in server.server_ports() {
        let keys = server.cli_at(port, &["dbsize"]);
        assert_ne!(keys.trim(), "0", "primary {port} got no key");
    }
}

/// The ACL rules docs/operations.md gives the daemon's user: its keys
/// and the commands of its scripts, nothing else.
const LEAST_RIGHTS: &[&str] = &[
    "~xl:*",
    "+evalsha",
    "+eval",
    "+script|load",
    "+ping",
    "+time",
    "+hincrby",
    "+hmget",
    "+hset",
    "+hdel",
    "+hgetall",
    "+pexpire",
    "+zadd",
    "+zcard",
    "+zrangebyscore",
    "+zremrangebyscore",
];

#[test]
fn the_documented_least_rights_are_enough_for_every_call() {
    let rules: Vec<String> = LEAST_RIGHTS.iter().map(|r| r.to_string()).collect();
    let server = RedisServer::start_secured(Security {
        acl_password: Some(PASSWORD.into()),
        acl_rules: rules.clone(),
        ..Security::default()
    });
    let config = config(&server);
    let key = "192.0.2.90/32|default";
    let window = long_window();
    let hot = server.block_on(|| async {
        let store = connect(&config).await;
        store.heartbeat("a", window.window()).await.unwrap();
        let totals = store.sync("a", window, &[report(key, 1, 2)]).await.unwrap();
        assert_eq!(counts(&totals[0]), [1, 2, 1, 2]);
        // A key outside the prefix is refused: the rules do bind.
        let other: Result<i64, _> = redis::cmd("HINCRBY")
            .arg("other")
            .arg("f")
            .arg(1)
            .query_async(&mut store.connection())
            .await;
        assert!(other.is_err(), "{other:?}");
        store.hot_sources(window.window()).await.unwrap()
    });
    assert_eq!(hot, vec![key.to_string()]);
}

#[test]
fn a_redis_cluster_takes_the_sync_with_the_least_rights_and_cluster_slots() {
    let mut rules: Vec<String> = LEAST_RIGHTS.iter().map(|r| r.to_string()).collect();
    rules.push("+cluster|slots".into());
    let server = RedisServer::start_cluster_secured(Security {
        acl_password: Some(PASSWORD.into()),
        acl_rules: rules,
        ..Security::default()
    });
    let mut config = StoreConfig::new(server.urls(), Mode::Cluster);
    config.timeout = Duration::from_secs(2);
    config.bulk_timeout = Duration::from_secs(2);
    let reports: Vec<Report> = (0..50u64)
        .map(|i| report(&format!("10.7.0.{i}/32|r"), 1, 2))
        .collect();
    let window = long_window();
    server.block_on(|| async {
        let store = connect(&config).await;
        store.heartbeat("a", window.window()).await.unwrap();
        let totals = store.sync("a", window, &reports).await.unwrap();
        assert!(totals.iter().all(|t| counts(t) == [1, 2, 1, 2]));
        store.hot_sources(window.window()).await.unwrap();
    });
}

#[test]
fn every_connection_failure_is_clear_and_never_shows_the_password() {
    let server = RedisServer::start_secured(locked_down());
    let pki = server.pki().clone();
    let good = certs(&pki, &pki.ca, true);
    let login = |password: &str, host: &str, port: u16| {
        format!("rediss://{ACL_USER}:{password}@{host}:{port}")
    };
    let cases: Vec<(&str, String, Option<redis::TlsCertificates>, &[&str])> = vec![
        (
            "connection refused",
            login(PASSWORD, "127.0.0.1", 6390),
            Some(good.clone()),
            &["refused"],
        ),
        (
            "DNS failure",
            login(PASSWORD, "no-such-redis.invalid", 6379),
            Some(good.clone()),
            &["failed to lookup address"],
        ),
        (
            "wrong password",
            login(WRONG_PASSWORD, "127.0.0.1", 6379),
            Some(good.clone()),
            &["authentication failed"],
        ),
        (
            "a CA that did not sign the server's certificate",
            login(PASSWORD, "127.0.0.1", 6379),
            Some(certs(&pki, &pki.other_ca, true)),
            &["UnknownIssuer"],
        ),
        (
            "an address the certificate does not name",
            login(PASSWORD, "127.0.0.2", 6379),
            Some(good.clone()),
            &["not valid for name"],
        ),
        (
            "no client certificate",
            login(PASSWORD, "127.0.0.1", 6379),
            Some(certs(&pki, &pki.ca, false)),
            &["CertificateRequired"],
        ),
        (
            "plain TCP to the TLS port",
            format!("redis://{ACL_USER}:{PASSWORD}@127.0.0.1:6379"),
            None,
            &[],
        ),
    ];
    for (what, url, tls, says) in cases {
        let mut config = StoreConfig::new(vec![url.clone()], Mode::Single);
        config.timeout = Duration::from_millis(500);
        config.bulk_timeout = Duration::from_millis(500);
        config.tls = tls;
        let e = server
            .block_on(|| async { Store::connect_with(&config).await.err() })
            .unwrap_or_else(|| panic!("{what}: connected"));
        let text = everything_said(&e);
        assert_no_password(&text);
        assert!(matches!(e, StoreError::Connect { .. }), "{what}: {text}");
        // The URL is named, with its password hidden.
        let shown = url.replace(PASSWORD, "***").replace(WRONG_PASSWORD, "***");
        assert!(text.contains(&shown), "{what}: {shown} not in {text}");
        for word in says {
            assert!(
                text.to_lowercase().contains(&word.to_lowercase()),
                "{what}: {word:?} not in {text}"
            );
        }
    }
    // A URL the client cannot parse is shown without its password too.
    let bad = StoreConfig::new(vec![format!("redis://u:{PASSWORD}@h:99999")], Mode::Single);
    let e = server
        .block_on(|| async { Store::connect_with(&bad).await.err() })
        .expect("an invalid URL connected");
    assert!(matches!(e, StoreError::Url { .. }), "{e}");
    assert_no_password(&everything_said(&e));
}

#[test]
fn a_primary_behind_an_authenticating_sentinel_is_logged_in_to_over_tls() {
    use limiter_tests::redis::{SENTINEL_MASTER, SENTINEL_PRIMARY_PORT};
    let server = RedisServer::start_sentinel_secured(locked_down(), Some(SENTINEL_PASSWORD));
    let mut config = StoreConfig::new(
        vec![server.sentinel_url_with_password(SENTINEL_PASSWORD)],
        Mode::Sentinel,
    );
    config.timeout = Duration::from_secs(2);
    config.bulk_timeout = Duration::from_secs(2);
    config.sentinel_master = Some(SENTINEL_MASTER.into());
    config.tls = Some(certs(server.pki(), &server.pki().ca, true));
    config.primary_username = Some(ACL_USER.into());
    config.primary_password = Some(PASSWORD.into());
    let key = "192.0.2.78/32|default";
    let (totals, whoami) = server.block_on(|| async {
        let store = connect(&config).await;
        let totals = store
            .sync("a", long_window(), &[report(key, 3, 4)])
            .await
            .unwrap();
        (totals, whoami(&store).await)
    });
    assert_eq!(counts(&totals[0]), [3, 4, 3, 4]);
    assert_eq!(whoami, ACL_USER);
    let on_primary = server.cli_at(SENTINEL_PRIMARY_PORT, &["--scan", "--pattern", "xl:*"]);
    assert!(on_primary.contains(key), "{on_primary}");

    // The Sentinel's password wrong, the primary's wrong, or none given:
    // refused, and no error shows a password.
    let mut wrong_sentinel = config.clone();
    wrong_sentinel.urls = vec![server.sentinel_url_with_password(WRONG_PASSWORD)];
    let mut wrong_primary = config.clone();
    wrong_primary.primary_password = Some(WRONG_PASSWORD.into());
    let mut no_primary_login = config.clone();
    no_primary_login.primary_username = None;
    no_primary_login.primary_password = None;
    for (what, config) in [
        ("wrong Sentinel password", wrong_sentinel),
        ("wrong primary password", wrong_primary),
        ("no primary login", no_primary_login),
    ] {
        let e = server
            .block_on(|| async { Store::connect_with(&config).await.err() })
            .unwrap_or_else(|| panic!("{what}: connected"));
        let text = everything_said(&e);
        assert_no_password(&text);
        assert!(matches!(e, StoreError::Connect { .. }), "{what}: {text}");
    }
}

#[test]
fn tls_files_are_checked_when_the_configuration_is_read_naming_the_field() {
    use limiter_user::config::Config;
    let dir = std::env::temp_dir().join(format!("xlt-tls-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pki = Pki::new(&dir, &[]);
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n").unwrap();
    let section = |files: &[(&str, &std::path::Path)]| {
        let mut text =
            String::from("[cluster]\nredis = [\"rediss://u:pw@10.0.0.1:6379\"]\nnode = \"n1\"\n");
        for (field, path) in files {
            text.push_str(&format!("{field} = \"{}\"\n", path.display()));
        }
        text
    };
    let ok = Config::parse(
        &section(&[
            ("tls_ca_file", &pki.ca),
            ("tls_cert_file", &pki.client_cert),
            ("tls_key_file", &pki.client_key),
        ]),
        "tls.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let tls = ok.cluster.unwrap().tls.expect("TLS files");
    assert_eq!(tls.ca.unwrap().path, pki.ca);
    assert_eq!(tls.client.unwrap().1.path, pki.client_key);
    let missing = dir.join("missing.pem");
    for (files, expect) in [
        (
            vec![("tls_ca_file", missing.as_path())],
            format!("cluster.tls_ca_file: cannot read {}", missing.display()),
        ),
        (
            vec![("tls_ca_file", pki.client_key.as_path())],
            "cluster.tls_ca_file: ".to_string()
                + &format!("{} holds no certificate", pki.client_key.display()),
        ),
        (
            vec![("tls_ca_file", garbage.as_path())],
            format!(
                "cluster.tls_ca_file: {} is not a PEM certificate file",
                garbage.display()
            ),
        ),
        (
            vec![
                ("tls_cert_file", pki.client_key.as_path()),
                ("tls_key_file", pki.client_key.as_path()),
            ],
            format!(
                "cluster.tls_cert_file: {} holds no certificate",
                pki.client_key.display()
            ),
        ),
        (
            vec![
                ("tls_cert_file", pki.client_cert.as_path()),
                ("tls_key_file", pki.client_cert.as_path()),
            ],
            format!(
                "cluster.tls_key_file: {} holds no usable private key",
                pki.client_cert.display()
            ),
        ),
        (
            // The server's key with the client's certificate.
            vec![
                ("tls_cert_file", pki.client_cert.as_path()),
                ("tls_key_file", pki.server_key.as_path()),
            ],
            format!(
                "cluster.tls_key_file: {} cannot be used with the certificate of {}",
                pki.server_key.display(),
                pki.client_cert.display()
            ),
        ),
    ] {
        let e = Config::parse(&section(&files), "tls.toml")
            .err()
            .unwrap_or_else(|| panic!("{files:?} accepted"));
        assert!(e.to_string().starts_with(&expect), "{files:?}: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
