//! `cargo xtask demo --cluster`: a cluster-wide limit in a
//! throwaway lab (`limiter_tests::cluster_lab`): three node namespaces,
//! each with its own real daemon guarding its veth with XDP, and one real
//! `redis-server` they share. One source floods at 5 times its limit,
//! spread evenly over the three nodes (as a load balancer would): every
//! second it shows what each node passed and what the cluster passed, held
//! at the limit cluster-wide. Then Redis is killed: the nodes degrade,
//! keep their last shares for the grace period, and fall back to `L / 3`
//! each (`fallback = "split"`), so the cluster stays at about L. It ends
//! with `xdp-limiter status` and the cluster metrics of a node, and tears
//! everything down (also on Ctrl-C). About 40 seconds.

use std::{
    net::{SocketAddrV4, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{
    cluster_lab::{node_addr, node_if, redis_addr, ClusterLab, SINK_PORT, SOURCE},
    daemon::{parse_metric, Daemon},
    redis::PORT,
};

const NODES: usize = 3;
/// The cluster-wide limit, packets per second (1 s window).
const L: u64 = 1000;
/// Seconds of flood with Redis up, then with Redis dead.
const WITH_REDIS: u64 = 12;
const WITHOUT_REDIS: u64 = 12;
const GRACE: &str = "3s";

fn config(i: usize) -> String {
    format!(
        "# node {i} of the demo cluster: one budget per source across the nodes\n\
         [daemon]\ntick = \"100ms\"\n\n\
         [cluster]\nredis = [\"redis://{}:{PORT}\"]\nnode = \"node-{i}\"\n\
         sync_interval = \"100ms\"\ntimeout = \"50ms\"\nthreshold = 0.25\n\
         grace = \"{GRACE}\"\nfallback = \"split\"\n\n\
         [default]\npps = {L}\nwindow = \"1s\"\nscope = \"cluster\"\ndry_run = false\n",
        redis_addr(i)
    )
}

/// A UDP socket on node `i` counting what the source got through, on a
/// thread of its own, until `stop`.
fn count(
    lab: &ClusterLab,
    i: usize,
    stop: Arc<AtomicBool>,
) -> (Arc<AtomicU64>, thread::JoinHandle<()>) {
    let socket = lab.nodes[i].ns.enter(|| {
        UdpSocket::bind(SocketAddrV4::new(node_addr(i), SINK_PORT)).expect("bind the counter")
    });
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("read timeout");
    let got = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&got);
    let thread = thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !stop.load(Ordering::Relaxed) {
            if let Ok((_, from)) = socket.recv_from(&mut buf) {
                if from.ip() == SOURCE {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    (got, thread)
}

/// A node's cluster state in a word, from its metrics.
fn state(daemon: &Daemon) -> String {
    let Some(metrics) = daemon.try_metrics() else {
        return "no metrics".into();
    };
    let get = |s: &str| parse_metric(&metrics, s).unwrap_or(0.0);
    if get("xdp_limiter_cluster_fallback{policy=\"split\"}") > 0.0 {
        "FALLBACK split".into()
    } else if get("xdp_limiter_cluster_degraded") > 0.0 {
        "DEGRADED (grace)".into()
    } else {
        format!(
            "synced, {} alive",
            get("xdp_limiter_cluster_nodes_alive") as u64
        )
    }
}

fn main() {
    let stop = limiter_bench::interrupt_flag();
    println!(
        "== lab: {NODES} node namespaces, each with its own xdp-limiter guarding its veth with XDP;\n   \
         one redis-server on a separate network; the source {SOURCE} floods at {} pps,\n   \
         spread evenly over the nodes",
        5 * L
    );
    let mut lab = ClusterLab::new(NODES);
    lab.start_daemons(config);
    println!("== node 0's config:\n{}", config(0));
    for i in 0..NODES {
        lab.daemon(i)
            .wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == NODES as f64);
    }
    println!(
        "== every daemon syncs with Redis and sees {NODES} nodes alive; limit {L} pps per source cluster-wide\n"
    );

    let sent: Vec<AtomicU64> = (0..NODES).map(|_| AtomicU64::new(0)).collect();
    let counters: Vec<_> = (0..NODES)
        .map(|i| count(&lab, i, Arc::clone(&stop)))
        .collect();
    let rates = [1667, 1667, 1666];
    let total = Duration::from_secs(WITH_REDIS + WITHOUT_REDIS);
    let mut killed_at = None;
    thread::scope(|scope| {
        scope.spawn(|| lab.flood_until(&rates, total, &stop, &sent));
        let start = Instant::now();
        println!(
            "{:>4}  {:>15} {:>15} {:>15}  {:>15}  node states",
            "s", "node-0 sent/got", "node-1 sent/got", "node-2 sent/got", "CLUSTER got/s"
        );
        let mut last_sent = [0u64; NODES];
        let mut last_got = [0u64; NODES];
        for second in 1..=WITH_REDIS + WITHOUT_REDIS {
            // Pacing the display: one line per second of the flood.
            let due = start + Duration::from_secs(second);
            while Instant::now() < due && !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(20));
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let mut cells = Vec::new();
            let mut cluster = 0;
            for i in 0..NODES {
                let s = sent[i].load(Ordering::Relaxed);
                let g = counters[i].0.load(Ordering::Relaxed);
                cells.push(format!("{:>7}/{:<7}", s - last_sent[i], g - last_got[i]));
                cluster += g - last_got[i];
                (last_sent[i], last_got[i]) = (s, g);
            }
            let states: Vec<String> = (0..NODES).map(|i| state(lab.daemon(i))).collect();
            println!(
                "{second:>4}  {} {} {}  {:>9} ({:>3}%)  {}",
                cells[0],
                cells[1],
                cells[2],
                cluster,
                cluster * 100 / L,
                states.join(" | ")
            );
            if second == WITH_REDIS {
                println!(
                    "\n== node 0's `xdp-limiter status` with Redis up:\n{}",
                    lab.nodes[0].files.cli_ok(&["status"])
                );
                lab.redis.kill_all();
                killed_at = Some(Instant::now());
                println!(
                    "== redis-server KILLED (SIGKILL): each node degrades after 3 failed syncs, keeps its \
                     last share for the grace ({GRACE}), then holds the source to L / {NODES} on its own\n"
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    for (_, thread) in counters {
        let _ = thread.join();
    }
    if killed_at.is_some() {
        println!(
            "\n== node 0's `xdp-limiter status` after Redis died:\n{}",
            lab.nodes[0].files.cli_ok(&["status"])
        );
        println!("== node 0's cluster metrics:");
        for line in lab
            .daemon(0)
            .metrics()
            .lines()
            .filter(|l| l.starts_with("xdp_limiter_cluster_") && !l.contains("_bucket"))
        {
            println!("  {line}");
        }
        println!("\n== what the daemons logged about the cluster:");
        for i in 0..NODES {
            for line in lab
                .daemon(i)
                .log()
                .lines()
                .filter(|l| l.contains("cluster:"))
            {
                println!("  node-{i}: {line}");
            }
        }
    }
    println!(
        "\n== stopping the daemons on {} and removing the lab",
        (0..NODES).map(node_if).collect::<Vec<_>>().join(", ")
    );
    for node in &mut lab.nodes {
        if let Some(daemon) = node.daemon.take() {
            daemon.stop();
        }
    }
    drop(lab);
    println!("== done: namespaces, veths, daemons, pins and Redis are gone");
}
