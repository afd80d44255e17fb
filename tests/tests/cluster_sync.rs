//! The cluster sync end to end: real `redis-server`, three real
//! daemons in node namespaces each guarding its own veth with XDP, real
//! traffic from one source spread over the nodes, counted independently by
//! a UDP sink on every node (`limiter_tests::cluster_lab`). L = 1000 pps,
//! W = 1 s, T = 100 ms.

use std::time::{Duration, Instant};

use limiter_tests::{
    cluster_lab::{
        cluster_bins, node_config, windows, ClusterLab, LowestWindow, Ticks, BIN, SOURCE,
    },
    wait_until,
};
use nix::sys::signal::Signal;

const L: u64 = 1000;
/// T.
const T: Duration = Duration::from_millis(100);
/// W.
const W: Duration = Duration::from_secs(1);
const NODES: usize = 3;
/// Bins per window (W / 100 ms).
const W_BINS: usize = 10;

/// One lab at a time: six daemons and two 5L floods at once on a 2-core
/// machine would measure the machine, not the sync.
static ONE_LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lab(extra: &str) -> ClusterLab {
    let mut lab = ClusterLab::new(NODES);
    lab.start_daemons(|i| node_config(i, L, "1s", "100ms", extra));
    // Every daemon syncs and sees the others before any traffic: the
    // nodes-alive gauge reaches 3 on each (heartbeats through Redis).
    for i in 0..NODES {
        lab.daemon(i)
            .wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == NODES as f64);
    }
    lab
}

/// The lowest window the design gives (`LowestWindow`, docs/cluster.md
/// "The lowest window") with the lateness of `nodes`' ticks between `from`
/// and `to` as the probe measured it; printed with what it rests on.
fn floor_of(
    what: &str,
    ticks: &Ticks,
    nodes: &[usize],
    from: Instant,
    to: Instant,
) -> LowestWindow {
    let lateness = ticks.lateness(nodes, T, from, to);
    eprintln!(
        "{what}: ticks at most {lateness:?} late (probe polls at most {:?} apart)",
        ticks.longest_poll_gap
    );
    LowestWindow::new(T, W, NODES, lateness)
}

/// The bin index (of a sink started at `sink_start`) at `at`.
fn bin_at(sink_start: Instant, at: Instant) -> usize {
    (at.saturating_duration_since(sink_start).as_nanos() / BIN.as_nanos()) as usize
}

#[test]
fn a_source_flooding_at_5l_over_three_nodes_is_held_to_l_cluster_wide() {
    let _one = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let lab = lab("");
    let counted_before: Vec<_> = (0..NODES).map(|i| lab.xdp_counted(i)).collect();
    let sinks: Vec<_> = (0..NODES).map(|i| lab.sink(i)).collect();
    let probe = lab.tick_probe();
    let start = Instant::now();
    let first = bin_at(sinks[0].started(), start);
    let duration = Duration::from_millis(5000);
    let sent = lab.flood(&[1667, 1667, 1666], duration);
    let per_node: Vec<Vec<u64>> = sinks.into_iter().map(|s| s.finish()).collect();
    let floor = floor_of(
        "even 5L",
        &probe.finish(),
        &[0, 1, 2],
        start + W,
        Instant::now(),
    );
    let total = cluster_bins(&per_node);
    assert!(
        sent.iter().sum::<u64>() >= 5 * L * 4,
        "the flood ran at about 5L: {sent:?}"
    );
    // Every frame sent reached a node's XDP and was judged there, and
    // every frame XDP passed reached the node's sink: the sinks' counts
    // are the kernels' admissions, nothing lost on the way.
    for i in 0..NODES {
        let (passed, dropped) = lab.xdp_counted(i);
        let (passed, dropped) = (passed - counted_before[i].0, dropped - counted_before[i].1);
        let received: u64 = per_node[i].iter().sum();
        eprintln!(
            "node {i}: sent {}, XDP passed {passed} and dropped {dropped}, sink received {received}",
            sent[i]
        );
        assert_eq!(
            passed + dropped,
            sent[i],
            "node {i}: XDP judged {passed} + {dropped} of {} frames sent",
            sent[i]
        );
        assert_eq!(
            received, passed,
            "node {i}: the sink received {received} of the {passed} frames XDP passed"
        );
    }
    // Every full 1 s window starting 2 s into the flood and ending before
    // its last bin (which the sinks may have cut short).
    let from = first + 20;
    let to = first + (duration.as_millis() / BIN.as_millis()) as usize - 1;
    let sums = windows(&total[from.min(total.len())..to.min(total.len())], W_BINS);
    assert!(sums.len() >= 15, "too few windows: {total:?}");
    // Every window within what `floor` gives it (`floor_of`), the mean at
    // least 0.95L.
    for (k, &sum) in sums.iter().enumerate() {
        let (lowest, highest) = (floor.at(L, &total, from + k), floor.highest(L));
        assert!(
            (lowest..=highest).contains(&sum),
            "window {k} after 2 s admitted {sum} cluster-wide (not within {lowest}..{highest}, \
             {floor:?}); bins {total:?}; per node {per_node:?}"
        );
    }
    let mean = sums.iter().sum::<u64>() as f64 / sums.len() as f64;
    assert!(mean >= 950.0, "mean window {mean} under 0.95L: {sums:?}");
    eprintln!(
        "windows after 2 s: mean {mean:.0}, min {:?}, max {:?}",
        sums.iter().min(),
        sums.iter().max()
    );
    // Each node took part (the flood is split evenly: no node starved).
    for (i, bins) in per_node.iter().enumerate() {
        let admitted: u64 = bins[from.min(bins.len())..to.min(bins.len())].iter().sum();
        assert!(admitted > 0, "node {i} admitted nothing: {per_node:?}");
    }
    for i in 0..NODES {
        let d = lab.daemon(i);
        assert_eq!(d.metric("xdp_limiter_cluster_degraded"), Some(0.0));
        assert!(
            d.metric("xdp_limiter_cluster_sync_duration_seconds_count")
                .unwrap()
                > 10.0
        );
    }
    lab.assert_each_release_ends_an_episode();
    // `status` shows the live state.
    let status = lab.nodes[0].files.cli_ok(&["status", "--output", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status).expect("JSON");
    let live = &status["cluster"]["live"];
    assert_eq!(live["nodes_alive"], NODES as u64, "{status:#}");
    assert_eq!(live["degraded"], false, "{status:#}");
    assert!(
        live["last_sync_age_ms"].as_u64().unwrap() < 1000,
        "{status:#}"
    );
    assert!(live["fallback_in_force"].is_null(), "{status:#}");
}

#[test]
fn a_source_on_one_node_only_gets_the_whole_limit_there_not_l_over_3() {
    let _one = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let lab = lab("");
    let sinks: Vec<_> = (0..NODES).map(|i| lab.sink(i)).collect();
    let probe = lab.tick_probe();
    let start = Instant::now();
    let first = bin_at(sinks[0].started(), start);
    let duration = Duration::from_millis(3500);
    lab.flood(&[3 * L, 0, 0], duration);
    let per_node: Vec<Vec<u64>> = sinks.into_iter().map(|s| s.finish()).collect();
    let floor = floor_of(
        "node 0 alone",
        &probe.finish(),
        &[0],
        start + W / 2,
        Instant::now(),
    );
    let node0 = &per_node[0];
    // From 1.5 s (the cold cap's L/3 and the first syncs behind it), every
    // window on node 0 admits far more than the cold cap would (333):
    // the node claims the whole room: every window at least what `floor`
    // gives it (`floor_of`). Their mean is printed, not asserted: alone,
    // the node admits a freed bucket's room at once, and a window after
    // such a clump dips by what the clump admitted (the floor counts
    // it); how often that happens in 2 s of windows has no bound the
    // design gives, while each window's floor is one.
    let from = first + 15;
    let to = first + (duration.as_millis() / BIN.as_millis()) as usize - 1;
    let sums = windows(&node0[from.min(node0.len())..to.min(node0.len())], W_BINS);
    assert!(sums.len() >= 8, "too few windows: {node0:?}");
    eprintln!("node 0 alone: windows {sums:?}");
    for (k, &sum) in sums.iter().enumerate() {
        let (lowest, highest) = (floor.at(L, node0, from + k), floor.highest(L));
        assert!(
            (lowest..=highest).contains(&sum),
            "node 0 alone admitted {sum} in a window, not within {lowest}..{highest} (cold cap \
             333, L 1000, {floor:?}): {node0:?}"
        );
    }
    let mean = sums.iter().sum::<u64>() as f64 / sums.len() as f64;
    eprintln!("node 0 alone: mean window {mean:.0}");
    assert!(per_node[1].iter().chain(&per_node[2]).all(|&b| b == 0));
}

#[test]
fn redis_killed_mid_flood_degrades_within_3t_and_the_split_fallback_holds() {
    let _one = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    // A short grace (the shortest allowed: 3 intervals) so the fallback
    // shows within the test.
    let lab = lab("grace = \"300ms\"\n");
    let sinks: Vec<_> = (0..NODES).map(|i| lab.sink(i)).collect();
    let sink_start = sinks[0].started();
    let duration = Duration::from_millis(5000);
    let (killed_at, degraded_after) = std::thread::scope(|scope| {
        let flood = scope.spawn(|| lab.flood(&[1667, 1667, 1666], duration));
        // Normal syncing first: 2 s into the flood.
        let synced = wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
            (sink_start.elapsed() >= Duration::from_secs(2)).then_some(())
        });
        assert!(synced.is_some());
        let killed_at = Instant::now();
        lab.redis.kill_all();
        // Degraded within 3T plus the timeout (350 ms); the metrics scrape
        // and a tick's phase add up to about 200 ms of observation delay.
        let degraded = wait_until(Duration::from_secs(3), Duration::from_millis(10), || {
            (lab.daemon(0).metric("xdp_limiter_cluster_degraded") == Some(1.0)).then_some(())
        });
        assert!(
            degraded.is_some(),
            "node 0 never degraded:\n{}",
            lab.daemon(0).log()
        );
        let degraded_after = killed_at.elapsed();
        flood.join().expect("flood");
        (killed_at, degraded_after)
    });
    let per_node: Vec<Vec<u64>> = sinks.into_iter().map(|s| s.finish()).collect();
    let total = cluster_bins(&per_node);
    assert!(
        degraded_after <= Duration::from_millis(550),
        "degraded {degraded_after:?} after Redis died (3T + timeout = 350 ms)"
    );
    // Every node logged it once, and status shows the fallback in force
    // (grace 300 ms is long over).
    for i in 0..NODES {
        let log = lab.daemon(i).log();
        assert_eq!(log.matches("node degraded").count(), 1, "node {i}:\n{log}");
        let status = lab.nodes[i].files.cli_ok(&["status", "--output", "json"]);
        let status: serde_json::Value = serde_json::from_str(&status).expect("JSON");
        let live = &status["cluster"]["live"];
        assert_eq!(live["degraded"], true, "{status:#}");
        assert_eq!(live["fallback_in_force"], "split", "{status:#}");
        assert_eq!(live["nodes_alive"], NODES as u64, "last known: {status:#}");
    }
    // From a window after the fallback applies (kill + 3T + timeout +
    // grace, plus a window for what was admitted before to leave), the
    // split fallback (L / 3 per node) holds the cluster to about L.
    let from = bin_at(
        sink_start,
        killed_at + Duration::from_millis(350 + 300 + 1000),
    );
    let to = bin_at(sink_start, sink_start + duration) - 1;
    let sums = windows(&total[from.min(total.len())..to.min(total.len())], W_BINS);
    assert!(!sums.is_empty(), "no window after the fallback: {total:?}");
    for &sum in &sums {
        assert!(
            sum <= 1100,
            "{sum} admitted in a window under the fallback: {total:?}"
        );
        assert!(
            sum >= 800,
            "the fallback is not closed either: {sum}: {total:?}"
        );
    }
    for (i, bins) in per_node.iter().enumerate() {
        let node: u64 = bins[from.min(bins.len())..(from + W_BINS).min(bins.len())]
            .iter()
            .sum();
        assert!(
            node <= 333 + 40,
            "node {i} admitted {node} in a window of its L/3 fallback"
        );
    }
}

#[test]
fn a_sigstopped_daemon_leaves_its_kernel_at_the_fallback_and_sigcont_recovers() {
    let _one = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    // Policy `local` (fallback L on the node) tells the kernel's own
    // fallback apart from the cold cap (L / 3) an expired share gives.
    let lab = lab("fallback = \"local\"\n");
    let sinks: Vec<_> = (0..NODES).map(|i| lab.sink(i)).collect();
    let sink_start = sinks[0].started();
    let duration = Duration::from_millis(4500);
    let stopped_at = std::thread::scope(|scope| {
        let flood = scope.spawn(|| lab.flood(&[3 * L, 0, 0], duration));
        let ready = wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
            (sink_start.elapsed() >= Duration::from_millis(1500)).then_some(())
        });
        assert!(ready.is_some());
        let stopped_at = Instant::now();
        lab.daemon(0).signal(Signal::SIGSTOP);
        let resume = wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
            (stopped_at.elapsed() >= Duration::from_millis(2000)).then_some(())
        });
        assert!(resume.is_some());
        lab.daemon(0).signal(Signal::SIGCONT);
        flood.join().expect("flood");
        stopped_at
    });
    let node0 = sinks.into_iter().next().unwrap().finish();
    // While stopped: from 3T (+ 100 ms of slack) after the stop, the
    // kernel holds node 0 to the local fallback L: a window admits well
    // above the cold cap (333) an expired share would give.
    let from = bin_at(sink_start, stopped_at + Duration::from_millis(400));
    let sum: u64 = node0[from.min(node0.len())..(from + W_BINS).min(node0.len())]
        .iter()
        .sum();
    eprintln!("node 0 with its daemon stopped: {sum} in a window");
    assert!(
        (600..=1100).contains(&sum),
        "node 0 admitted {sum} in the window after its daemon stopped (local fallback L, cold cap 333): {node0:?}"
    );
    // SIGCONT: the daemon syncs again (its sync count grows) and is not
    // degraded (Redis never failed).
    let count = |d: &limiter_tests::daemon::Daemon| {
        d.metric("xdp_limiter_cluster_sync_duration_seconds_count")
            .unwrap_or(0.0)
    };
    let before = count(lab.daemon(0));
    lab.daemon(0)
        .wait_metric("xdp_limiter_cluster_sync_duration_seconds_count", |v| {
            v >= before + 5.0
        });
    assert_eq!(
        lab.daemon(0).metric("xdp_limiter_cluster_degraded"),
        Some(0.0)
    );
}

/// What node `node` admitted of [`SOURCE`] as Redis counted it: the
/// node's `a` field summed over every bucket key of the source.
fn redis_admitted(lab: &ClusterLab, node: &str) -> u64 {
    let pattern = format!("xl:*:{SOURCE}/*");
    let keys = lab.redis.cli(&["--scan", "--pattern", &pattern]);
    keys.lines()
        .map(str::trim)
        // Bucket keys end in the bucket number (claim keys in `:r`).
        .filter(|key| {
            key.rsplit_once(':')
                .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|key| {
            let field = format!("{node}:a");
            lab.redis
                .cli(&["hget", key, &field])
                .trim()
                .parse::<u64>()
                .unwrap_or(0)
        })
        .sum()
}

/// A tick that fails before it sends its syncs (here Redis stopped for
/// 160 ms: at least one heartbeat times out, at most two ticks fail, the
/// node does not degrade) carries its deltas to the next report: Redis
/// ends up counting every frame the node admitted. One node, a 10 s
/// window (nothing expires during the test), a source hot from 1.25 s on
/// and never refused, so Redis's count of it must match what the sink
/// received, less the cheap tier's frames (uncounted in any window: 16
/// at most over the 4 s, a sender that never falls silent).
#[test]
fn a_tick_that_fails_before_syncing_carries_its_deltas_to_the_next() {
    let _one = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = ClusterLab::new(1);
    // L = 500 pps x 10 s = 5,000; hot at a quarter of it.
    lab.start_daemons(|i| node_config(i, 500, "10s", "100ms", ""));
    let d = lab.daemon(0);
    d.wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == 1.0);
    let counted_before = lab.xdp_counted(0);
    let sink = lab.sink(0);
    let timeouts = "xdp_limiter_cluster_redis_errors_total{kind=\"timeout\"}";
    let before = d.metric(timeouts).expect("timeouts exported");
    let sent = std::thread::scope(|scope| {
        let flood = scope.spawn(|| lab.flood(&[1000], Duration::from_millis(4000)));
        // Hot (1,250 admitted, 1.25 s in) and synced.
        d.wait_metric("xdp_limiter_cluster_synced_sources", |v| v >= 1.0);
        lab.redis.pause();
        // How long Redis stays stopped, not synchronization.
        std::thread::sleep(Duration::from_millis(160));
        lab.redis.resume();
        flood.join().expect("flood")
    });
    // Three ticks after the flood: the last deltas are in Redis.
    let ticks = "xdp_limiter_cluster_sync_duration_seconds_count";
    let now = d.metric(ticks).unwrap_or(0.0);
    d.wait_metric(ticks, |v| v >= now + 3.0);
    let sent = sent[0];
    let received: u64 = sink.finish().iter().sum();
    let (passed, dropped) = lab.xdp_counted(0);
    let (passed, dropped) = (passed - counted_before.0, dropped - counted_before.1);
    let counted = redis_admitted(&lab, "node-0");
    let failed = d.metric(timeouts).unwrap_or(0.0) - before;
    eprintln!(
        "sent {sent}, XDP passed {passed} and dropped {dropped}, sink received {received}, \
         Redis counted {counted}; {failed} tick timeouts"
    );
    assert!(failed >= 1.0, "Redis stopped 160 ms but no tick timed out");
    assert_eq!(d.metric("xdp_limiter_cluster_degraded"), Some(0.0));
    // The source stays within its limit (4,000 of 5,000 a window): never
    // refused. XDP judged every frame sent and passed each, and the sink
    // received every frame passed.
    assert_eq!(
        (passed, dropped),
        (sent, 0),
        "XDP passed {passed} and dropped {dropped} of the {sent} frames of a source within its limit"
    );
    assert_eq!(
        received, passed,
        "the sink received {received} of the {passed} frames XDP passed"
    );
    // Without the carry, Redis missed the failed ticks' admissions (about
    // 100 a tick here).
    assert!(
        (received.saturating_sub(16)..=received).contains(&counted),
        "Redis counted {counted} of the {received} frames node 0 admitted:\n{}",
        d.log()
    );
}
