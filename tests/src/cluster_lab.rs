//! The smallest multi-node lab for cluster-scoped limits (issue 13): one
//! traffic namespace with a veth to each node namespace, each node with
//! its own real daemon (and XDP program) guarding that veth, and a real
//! `redis-server` in a namespace of its own reached from every node over a
//! separate veth network, so XDP never sees (nor filters) Redis traffic.
//!
//! ```text
//!             traffic ns                           redis ns (redis-server)
//!  veth-t<i> 10.10.<i>.2  ──  veth-n<i> 10.10.<i>.1 (XDP, node i)
//!                              veth-r<i> 10.20.<i>.2 ── veth-s<i> 10.20.<i>.1
//! ```
//!
//! The flooding source [`SOURCE`] is the same address at every node (on
//! the traffic namespace's loopback; datagrams to node `i` leave by
//! `veth-t<i>`), as one client spread by a load balancer. What each node
//! admitted is counted independently by a UDP socket in the node's
//! namespace ([`Sink`]), in 100 ms bins by arrival time, never from the
//! daemons' counters.

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    daemon::{Daemon, Files},
    netns::{NetNs, Veth},
    redis::{RedisServer, PORT},
};

/// The one source every node sees.
pub const SOURCE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);
/// The sinks' UDP port.
pub const SINK_PORT: u16 = 9000;
/// Width of a sink's bins.
pub const BIN: Duration = Duration::from_millis(100);

/// Node `i`'s guarded interface (in its namespace).
pub fn node_if(i: usize) -> String {
    format!("veth-n{i}")
}

/// Node `i`'s address on the traffic network.
pub fn node_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 10, i as u8, 1)
}

/// Redis's address as node `i` reaches it.
pub fn redis_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 20, i as u8, 1)
}

pub struct Node {
    pub ns: NetNs,
    pub files: Files,
    pub daemon: Option<Daemon>,
}

pub struct ClusterLab {
    pub traffic: NetNs,
    pub nodes: Vec<Node>,
    pub redis: RedisServer,
}

impl ClusterLab {
    /// `nodes` node namespaces wired to a traffic namespace and to a fresh
    /// Redis; no daemon yet ([`ClusterLab::start_daemons`]).
    pub fn new(nodes: usize) -> Self {
        let redis = RedisServer::start_on_all_addresses();
        let traffic = NetNs::new("ctx");
        traffic.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
        traffic.ip(&["link", "set", "lo", "up"]);
        traffic.ip(&["addr", "add", &format!("{SOURCE}/32"), "dev", "lo"]);
        let mut all = Vec::with_capacity(nodes);
        for i in 0..nodes {
            let ns = NetNs::new(&format!("cn{i}"));
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
            ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1");
            ns.ip(&["link", "set", "lo", "up"]);
            let (t_if, n_if) = (format!("veth-t{i}"), node_if(i));
            Veth::connect(&traffic, &t_if, &ns, &n_if);
            traffic.ip(&["addr", "add", &format!("10.10.{i}.2/24"), "dev", &t_if]);
            ns.ip(&["addr", "add", &format!("{}/24", node_addr(i)), "dev", &n_if]);
            // The source is reached back through the traffic veth (nothing
            // answers it, but reverse-path checks must find a route).
            ns.ip(&["route", "add", &format!("{SOURCE}/32"), "dev", &n_if]);
            let (r_if, s_if) = (format!("veth-r{i}"), format!("veth-s{i}"));
            Veth::connect(&ns, &r_if, redis.ns(), &s_if);
            ns.ip(&["addr", "add", &format!("10.20.{i}.2/24"), "dev", &r_if]);
            redis.ns().ip(&[
                "addr",
                "add",
                &format!("{}/24", redis_addr(i)),
                "dev",
                &s_if,
            ]);
            all.push(Node {
                ns,
                files: Files::new(),
                daemon: None,
            });
        }
        Self {
            traffic,
            nodes: all,
            redis,
        }
    }

    /// Starts every node's daemon with `config(i)` as its configuration.
    pub fn start_daemons(&mut self, config: impl Fn(usize) -> String) {
        for (i, node) in self.nodes.iter_mut().enumerate() {
            node.files.write_config(&config(i));
            let path = node.files.config();
            node.daemon = Some(Daemon::start(
                &node.ns,
                &node.files,
                &["-i", &node_if(i), "-c", path.to_str().unwrap()],
            ));
        }
    }

    pub fn daemon(&self, i: usize) -> &Daemon {
        self.nodes[i].daemon.as_ref().expect("daemon started")
    }

    /// A sink on node `i`.
    pub fn sink(&self, i: usize) -> Sink {
        Sink::start(&self.nodes[i].ns, node_addr(i))
    }

    /// Sends from [`SOURCE`] at `rates[i]` datagrams per second to node
    /// `i`, for `duration`, paced in 10 ms slices; returns what was sent
    /// per node. Bounded: `sum(rates) x duration` datagrams in all.
    pub fn flood(&self, rates: &[u64], duration: Duration) -> Vec<u64> {
        self.traffic.enter(|| {
            let socket = UdpSocket::bind(SocketAddrV4::new(SOURCE, 0)).expect("bind the source");
            let slice = Duration::from_millis(10);
            let start = Instant::now();
            let mut sent = vec![0u64; rates.len()];
            let data = [7u8; 32];
            while start.elapsed() < duration {
                let elapsed = start.elapsed().as_secs_f64();
                for (i, &rate) in rates.iter().enumerate() {
                    // Catch up to the rate's schedule (so a late slice
                    // does not lower the rate).
                    let due = (rate as f64 * elapsed) as u64;
                    while sent[i] < due {
                        let _ = socket.send_to(&data, SocketAddrV4::new(node_addr(i), SINK_PORT));
                        sent[i] += 1;
                    }
                }
                // Pacing, not synchronization: the next slice of the rate.
                std::thread::sleep(slice);
            }
            sent
        })
    }
}

/// A UDP socket counting what reaches one node, in [`BIN`] bins from its
/// start, on a thread of its own.
pub struct Sink {
    start: Instant,
    bins: Arc<Mutex<Vec<u64>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sink {
    fn start(ns: &NetNs, addr: Ipv4Addr) -> Self {
        let socket = ns
            .enter(|| UdpSocket::bind(SocketAddrV4::new(addr, SINK_PORT)).expect("bind the sink"));
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBufForce, &(8 << 20))
            .expect("receive buffer");
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .expect("read timeout");
        let bins = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let thread = {
            let (bins, stop) = (bins.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((_, from)) = socket.recv_from(&mut buf) {
                        if from.ip() != SOURCE {
                            continue;
                        }
                        let bin = (start.elapsed().as_nanos() / BIN.as_nanos()) as usize;
                        let mut bins = bins.lock().unwrap();
                        if bins.len() <= bin {
                            bins.resize(bin + 1, 0);
                        }
                        bins[bin] += 1;
                    }
                }
            })
        };
        Self {
            start,
            bins,
            stop,
            thread: Some(thread),
        }
    }

    /// When its bin 0 started.
    pub fn started(&self) -> Instant {
        self.start
    }

    /// Stops counting; the bins.
    pub fn finish(mut self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("sink thread");
        }
        self.bins.lock().unwrap().clone()
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A daemon configuration for node `i` of a cluster lab: every source
/// limited to `pps` per `window`, cluster-scoped; sync every `interval`.
pub fn node_config(i: usize, pps: u64, window: &str, interval: &str, extra: &str) -> String {
    format!(
        "[daemon]\ntick = \"100ms\"\n\n\
         [cluster]\nredis = [\"redis://{}:{PORT}\"]\nnode = \"node-{i}\"\n\
         sync_interval = \"{interval}\"\ntimeout = \"50ms\"\nthreshold = 0.25\n{extra}\n\
         [default]\npps = {pps}\nwindow = \"{window}\"\nscope = \"cluster\"\ndry_run = false\n",
        redis_addr(i)
    )
}

/// Sums per-node bins into cluster-wide bins (as long as the longest).
pub fn cluster_bins(per_node: &[Vec<u64>]) -> Vec<u64> {
    let len = per_node.iter().map(Vec::len).max().unwrap_or(0);
    (0..len)
        .map(|b| {
            per_node
                .iter()
                .map(|bins| bins.get(b).copied().unwrap_or(0))
                .sum()
        })
        .collect()
}

/// Sliding sums of `width` bins: element `k` covers bins `k..k + width`.
pub fn windows(bins: &[u64], width: usize) -> Vec<u64> {
    if bins.len() < width {
        return Vec::new();
    }
    bins.windows(width).map(|w| w.iter().sum()).collect()
}
