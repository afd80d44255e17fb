//! Cluster node names and the hot sources a node takes from the others,
//! end to end: real daemons in the cluster lab (`limiter_tests::cluster_lab`)
//! and a real `redis-server`. Two daemons under one `cluster.node` name would
//! each claim the whole room of a source, so the second is refused at
//! start-up (before attaching) and a name taken while running stops the
//! sync and applies the fallback cap; a restart after a crash gets its name
//! back. The sources taken from other nodes' hot lists stay within
//! `cluster.max_remote_sources`, the rest counted.

use std::{collections::BTreeMap, time::Duration};

use limiter_tests::{
    cluster_lab::{node_config, node_if, ClusterLab},
    daemon::{parse_metric, Daemon},
    wait_until,
};
use limiter_user::cluster::store::group;

const L: u64 = 1000;

/// One lab at a time (each runs real daemons).
static ONE_LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The guard of node `name`'s name in Redis (`Store::node_key`, prefix `xl`).
fn node_key(name: &str) -> String {
    format!("xl:{{xl:nodes}}:node:{name}")
}

/// `config` for node `i` of the lab with `cluster.node` set to `name`.
fn named(i: usize, name: &str, extra: &str) -> String {
    named_every(i, name, "100ms", extra)
}

/// [`named`], syncing every `interval`.
fn named_every(i: usize, name: &str, interval: &str, extra: &str) -> String {
    let config = node_config(i, L, "1s", interval, extra);
    let own = format!("node = \"node-{i}\"");
    assert!(config.contains(&own), "{config}");
    config.replace(&own, &format!("node = \"{name}\""))
}

/// Starts node `i`'s daemon with `config`.
fn start(lab: &mut ClusterLab, i: usize, config: &str) {
    let node = &mut lab.nodes[i];
    node.files.write_config(config);
    let path = node.files.config();
    node.daemon = Some(Daemon::start(
        &node.ns,
        &node.files,
        &["-i", &node_if(i), "-c", path.to_str().unwrap()],
    ));
}

/// Whether an XDP program is attached to node `i`'s guarded interface.
fn attached(lab: &ClusterLab, i: usize) -> bool {
    let out = lab.nodes[i]
        .ns
        .ip(&["-details", "link", "show", &node_if(i)]);
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp id ")
}

/// `status --output json`'s live cluster block of node `i`.
fn live(lab: &ClusterLab, i: usize) -> serde_json::Value {
    let status = lab.nodes[i].files.cli_ok(&["status", "--output", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status).expect("JSON");
    status["cluster"]["live"].clone()
}

#[test]
fn a_second_daemon_under_a_live_node_name_is_refused_before_attaching() {
    let _one = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = ClusterLab::new(2);
    start(&mut lab, 0, &named(0, "edge", ""));
    lab.daemon(0)
        .wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == 1.0);
    // Node 1 configured with node 0's name: refused, non-zero, nothing
    // attached, and the error says whose name it is and what to do.
    let node = &lab.nodes[1];
    node.files.write_config(&named(1, "edge", ""));
    let path = node.files.config();
    let (status, log) = Daemon::start_failing(
        &node.ns,
        &node.files,
        &["-i", &node_if(1), "-c", path.to_str().unwrap()],
    );
    assert!(!status.success(), "{status:?}\n{log}");
    assert!(
        log.contains("node name `edge` is already in use")
            && log.contains("Give each node a distinct `node` under [cluster]")
            && log.contains("still renewed"),
        "{log}"
    );
    assert!(!attached(&lab, 1), "the refused daemon attached:\n{log}");
    // Node 0 never noticed: it holds its name and syncs.
    assert_eq!(
        lab.daemon(0).metric("xdp_limiter_cluster_duplicate_node"),
        Some(0.0)
    );
    assert!(!lab.redis.cli(&["get", &node_key("edge")]).trim().is_empty());
    // A distinct name starts, attaches and is counted as a node.
    start(&mut lab, 1, &named(1, "edge-2", ""));
    assert!(attached(&lab, 1));
    for i in 0..2 {
        lab.daemon(i)
            .wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == 2.0);
        assert_eq!(
            lab.daemon(i).metric("xdp_limiter_cluster_duplicate_node"),
            Some(0.0)
        );
    }
}

#[test]
fn a_node_restarted_after_a_crash_gets_its_name_back() {
    let _one = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = ClusterLab::new(1);
    // A sync interval of 1 s: the guard of the name lives 5 s after the
    // last heartbeat, so the restart below surely finds it live.
    let config = named_every(0, "edge", "1s", "");
    start(&mut lab, 0, &config);
    lab.daemon(0)
        .wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == 1.0);
    let before = lab.redis.cli(&["get", &node_key("edge")]);
    // SIGKILL: its heartbeat (and the guard of its name) is left in Redis.
    lab.nodes[0].daemon.take().expect("started").kill();
    let pttl: i64 = lab
        .redis
        .cli(&["pttl", &node_key("edge")])
        .trim()
        .parse()
        .unwrap();
    assert!(pttl > 1000, "the old guard is not live: PTTL {pttl}");
    start(&mut lab, 0, &config);
    let daemon = lab.daemon(0);
    daemon.wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == 1.0);
    assert_eq!(
        daemon.metric("xdp_limiter_cluster_duplicate_node"),
        Some(0.0)
    );
    // The new run holds the name under its own token, and syncs.
    let after = lab.redis.cli(&["get", &node_key("edge")]);
    assert!(
        !after.trim().is_empty() && after != before,
        "{before:?} -> {after:?}"
    );
    let live = live(&lab, 0);
    assert_eq!(live["duplicate_node"], false, "{live:#}");
    assert_eq!(live["degraded"], false, "{live:#}");
    // It waited the old heartbeat out rather than being refused.
    let log = daemon.log();
    assert!(
        log.contains("a heartbeat under this node name is live")
            && log.contains("the previous heartbeat under this node name lapsed"),
        "{log}"
    );
    assert!(!log.contains("already in use"), "{log}");
}

#[test]
fn a_name_taken_while_running_stops_the_sync_and_applies_the_fallback_cap() {
    let _one = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = ClusterLab::new(1);
    start(&mut lab, 0, &named(0, "edge", ""));
    let daemon = lab.daemon(0);
    daemon.wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == 1.0);
    // Another daemon's heartbeat under this name, as a failover to a
    // replica that has it would leave: its guard and its entry in the node
    // set, live for an hour.
    let time = lab.redis.cli(&["time"]);
    let secs: u64 = time.split_whitespace().next().unwrap().parse().unwrap();
    let later = ((secs + 3600) * 1000).to_string();
    lab.redis.cli(&["zadd", "xl:nodes", &later, "edge"]);
    lab.redis
        .cli(&["set", &node_key("edge"), "other-host:1:00", "px", "3600000"]);
    daemon.wait_metric("xdp_limiter_cluster_duplicate_node", |v| v == 1.0);
    daemon.wait_metric("xdp_limiter_cluster_fallback{policy=\"split\"}", |v| {
        v == 1.0
    });
    // The fallback splits over the other daemon and this one.
    assert_eq!(daemon.metric("xdp_limiter_cluster_nodes_alive"), Some(2.0));
    let live = live(&lab, 0);
    assert_eq!(live["duplicate_node"], true, "{live:#}");
    assert_eq!(live["fallback_in_force"], "split", "{live:#}");
    let text = lab.nodes[0].files.cli_ok(&["status"]);
    assert!(text.contains("DUPLICATE NODE NAME"), "{text}");
    // Its guard is left alone: the other daemon keeps the name.
    assert_eq!(
        lab.redis.cli(&["get", &node_key("edge")]).trim(),
        "other-host:1:00"
    );
    // One error line for the whole episode, however many ticks.
    let log = daemon.log();
    let said = |log: &str| {
        log.lines()
            .filter(|l| l.contains("another daemon heartbeats under this node's name"))
            .count()
    };
    assert_eq!(said(&log), 1, "{log}");
    assert!(log.contains("other-host:1:00"), "{log}");
    // The other daemon goes: the name is free again and the node syncs.
    lab.redis.cli(&["del", &node_key("edge")]);
    daemon.wait_metric("xdp_limiter_cluster_duplicate_node", |v| v == 0.0);
    daemon.wait_metric("xdp_limiter_cluster_fallback{policy=\"split\"}", |v| {
        v == 0.0
    });
    daemon.wait_log("syncing again");
    assert_eq!(said(&daemon.log()), 1, "{}", daemon.log());
    assert_ne!(
        lab.redis.cli(&["get", &node_key("edge")]).trim(),
        "other-host:1:00"
    );
}

/// More sources listed hot in Redis than `cluster.max_remote_sources`: the
/// node tracks (and syncs) at most the bound, counts the rest in the
/// metric and logs them once, not per source or listing.
#[test]
fn more_hot_sources_in_redis_than_the_bound_are_counted_not_tracked() {
    let _one = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    const BOUND: usize = 50;
    const LISTED: u32 = 300;
    let mut lab = ClusterLab::new(1);
    start(
        &mut lab,
        0,
        &named(0, "edge", &format!("max_remote_sources = {BOUND}\n")),
    );
    let daemon = lab.daemon(0);
    daemon.wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == 1.0);
    // Sources another node synced with traffic, as its syncs list them in
    // their groups' hot sets; scored an hour ahead so they stay listed.
    let time = lab.redis.cli(&["time"]);
    let secs: u64 = time.split_whitespace().next().unwrap().parse().unwrap();
    let later = ((secs + 3600) * 1000).to_string();
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..LISTED {
        let member = format!("10.1.{}.{}/32#0|default", i / 256, i % 256);
        by_key
            .entry(format!("xl:{{g{}}}:hot", group(&member)))
            .or_default()
            .push(member);
    }
    for (key, members) in &by_key {
        let mut args = vec!["zadd", key.as_str()];
        for m in members {
            args.push(&later);
            args.push(m);
        }
        lab.redis.cli(&args);
    }
    daemon.wait_metric("xdp_limiter_cluster_remote_sources", |v| v == BOUND as f64);
    let left_out = daemon.wait_metric("xdp_limiter_cluster_remote_sources_over_limit_total", |v| {
        v > 0.0
    });
    // Over two windows the set stays at the bound and the count grows
    // with every listing that leaves sources out.
    let mut highest = 0.0f64;
    let grew = wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
        let text = daemon.metrics();
        let remote = parse_metric(&text, "xdp_limiter_cluster_remote_sources").unwrap();
        let synced = parse_metric(&text, "xdp_limiter_cluster_synced_sources").unwrap();
        highest = highest.max(remote).max(synced);
        let count =
            parse_metric(&text, "xdp_limiter_cluster_remote_sources_over_limit_total").unwrap();
        (count >= left_out + (LISTED as f64 - BOUND as f64)).then_some(count)
    });
    assert!(
        grew.is_some(),
        "the count of sources left out stopped growing"
    );
    assert!(
        highest <= BOUND as f64,
        "tracked or synced {highest} > {BOUND}"
    );
    let live = live(&lab, 0);
    assert_eq!(live["remote_sources"], BOUND as u64, "{live:#}");
    // One log line (once a minute at most), not one per source.
    let log = daemon.log();
    let lines = log
        .lines()
        .filter(|l| l.contains("sources hot on other nodes not tracked here"))
        .count();
    assert_eq!(lines, 1, "{log}");
}
