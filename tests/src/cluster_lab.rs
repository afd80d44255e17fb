//! The smallest multi-node lab for cluster-scoped limits: one
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
//! namespace ([`Sink`]), in 100 ms bins by the kernel's receive time of
//! each frame, never from the daemons' counters.

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::Receiver,
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime},
};

use limiter_user::kernel::{cluster, pins, Maps};

use crate::{
    daemon::{Daemon, Files},
    netns::{NetNs, Veth},
    redis::{RedisServer, PORT},
};

/// The one source every node sees.
pub const SOURCE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);
/// Light sources ([`ClusterLab::spray`]): any address of 10.100.0.0/16 is
/// local in the traffic namespace (a `local` route), so a socket binds to
/// each without 65,536 addresses on an interface.
pub const LIGHT_PREFIX: &str = "10.100.0.0/16";
/// The address a Redis Cluster in the lab announces
/// ([`RedisServer::start_cluster_announcing`]), routed from every node
/// over its own Redis veth.
pub const REDIS_CLUSTER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 30, 0, 1);
/// The sinks' UDP port.
pub const SINK_PORT: u16 = 9000;
/// Width of a sink's bins.
pub const BIN: Duration = Duration::from_millis(100);
/// The lowest window the design gives a flood (docs/cluster.md, "The
/// lowest window"), for a limit of `L` per window `W` synced every `T` by
/// `nodes` nodes, when no node went longer than `T + lateness` between two
/// ticks (what [`TickProbe`] measures). A frame's room is admitted again
/// at most `T + 2 x lateness` after the frame left the window (reported
/// at its node's next tick, granted by the tick that syncs the window
/// without it, admitted once the node's kernel has faded it), and a flood
/// takes room as soon as it is granted, so a window misses at most the
/// room of what was admitted in that span before it, and the claims'
/// rounding (a packet per node and tick). At an even rate that is
/// `L x (1 - (T + 2 x lateness) / W)`: 0.9L with ticks on time; a flood
/// admitted in clumps misses more after a clump, and says so here.
///
/// And the highest (docs/cluster.md, "Error bound"): a sync hands out the
/// room of the Redis buckets that leave the window before the next sync,
/// and Redis drops buckets whole, so a frame's room can be admitted again
/// up to `T` (the horizon) plus a bucket (`T` here) before the frame
/// leaves the true window, on the other nodes only (a node's kernel still
/// counts its own frames), and a late tick re-admits what left its node's
/// own window while it was late: at most
/// `L x (1 + (2 T + 2 x lateness) / W x (1 - 1/N))`, 1.133L with ticks on
/// time.
#[derive(Clone, Copy, Debug)]
pub struct LowestWindow {
    /// How late the ticks were at most.
    pub lateness: Duration,
    /// `T + 2 x lateness` in whole bins, rounded up.
    span_bins: usize,
    /// `L x (2 T + 2 x lateness) / W x (1 - 1/N)` over `L`.
    early_share: f64,
    /// A packet per node and tick of a window.
    rounding: u64,
}

impl LowestWindow {
    pub fn new(t: Duration, w: Duration, nodes: usize, lateness: Duration) -> Self {
        let span = t + 2 * lateness;
        Self {
            lateness,
            span_bins: span.as_nanos().div_ceil(BIN.as_nanos()) as usize,
            early_share: (span + t).as_secs_f64() / w.as_secs_f64() * (nodes as f64 - 1.0)
                / nodes as f64,
            rounding: nodes as u64 * w.as_nanos().div_ceil(t.as_nanos()) as u64,
        }
    }

    /// The fewest the window of `bins` starting at bin `start` may hold
    /// under a limit of `l`: `l` less what `bins` admitted in the
    /// `T + 2 x lateness` before it, less the rounding.
    pub fn at(&self, l: u64, bins: &[u64], start: usize) -> u64 {
        let from = start.saturating_sub(self.span_bins).min(bins.len());
        let before: u64 = bins[from..start.min(bins.len())].iter().sum();
        l.saturating_sub(before).saturating_sub(self.rounding)
    }

    /// The most a window may hold under a limit of `l`.
    pub fn highest(&self, l: u64) -> u64 {
        l + (l as f64 * self.early_share).floor() as u64
    }
}

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
        Self::with_redis(nodes, RedisServer::start_on_all_addresses())
    }

    /// As [`ClusterLab::new`] with `redis` (a single instance listening on
    /// every address, or [`RedisServer::start_cluster_announcing`] on
    /// [`REDIS_CLUSTER_ADDR`]) in the Redis namespace.
    pub fn with_redis(nodes: usize, redis: RedisServer) -> Self {
        let traffic = NetNs::new("ctx");
        traffic.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
        traffic.ip(&["link", "set", "lo", "up"]);
        traffic.ip(&["addr", "add", &format!("{SOURCE}/32"), "dev", "lo"]);
        traffic.ip(&["route", "add", "local", LIGHT_PREFIX, "dev", "lo"]);
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
            ns.ip(&["route", "add", LIGHT_PREFIX, "dev", &n_if]);
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
            ns.ip(&[
                "route",
                "add",
                &format!("{REDIS_CLUSTER_ADDR}/32"),
                "via",
                &redis_addr(i).to_string(),
                "dev",
                &r_if,
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
        self.start_daemons_with_env(config, |_| Vec::new());
    }

    /// As [`ClusterLab::start_daemons`], node `i`'s daemon with the extra
    /// environment `env(i)` (e.g. libfaketime for a clock that is off).
    pub fn start_daemons_with_env(
        &mut self,
        config: impl Fn(usize) -> String,
        env: impl Fn(usize) -> Vec<(String, String)>,
    ) {
        for (i, node) in self.nodes.iter_mut().enumerate() {
            node.files.write_config(&config(i));
            let path = node.files.config();
            let env = env(i);
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            node.daemon = Some(Daemon::start_with_env(
                &node.ns,
                &node.files,
                &["-i", &node_if(i), "-c", path.to_str().unwrap()],
                &env,
            ));
        }
    }

    pub fn daemon(&self, i: usize) -> &Daemon {
        self.nodes[i].daemon.as_ref().expect("daemon started")
    }

    /// Asserts that every node logged [`SOURCE`] limited and at most as
    /// many "source released" lines: a source refused in bursts (each
    /// node's claim spent, then a new one a tick later) stays in one
    /// episode of refusals (refused again within a second) and is released
    /// once, when it ends, not each time its refusals pause.
    pub fn assert_each_release_ends_an_episode(&self) {
        let source = format!("source={SOURCE}");
        for i in 0..self.nodes.len() {
            let log = self.daemon(i).log();
            // The source is a field of its own (the released line ends with
            // it), not a prefix of another address.
            let names_source = |line: &str| {
                line.split_whitespace()
                    .any(|field| field.trim_end_matches('"') == source)
            };
            let count = |what: &str| {
                log.lines()
                    .filter(|l| l.contains(what) && names_source(l))
                    .count()
            };
            let (limited, released) = (count("source limited"), count("source released"));
            assert!(
                limited >= 1,
                "node {i} never logged {SOURCE} limited:\n{log}"
            );
            assert!(
                released <= limited,
                "node {i}: {released} releases for {limited} episodes of refusals:\n{log}"
            );
        }
    }

    /// What node `i`'s XDP counted so far, summed over its interfaces:
    /// (frames passed, frames dropped over a limit), from the daemon's
    /// `xdp_limiter_packets_total` once a complete aggregation pass has
    /// started after this call (every frame counted before it included).
    pub fn xdp_counted(&self, i: usize) -> (u64, u64) {
        let daemon = self.daemon(i);
        daemon.next_pass();
        let series = crate::daemon::parse_series(&daemon.metrics());
        let outcome = |name: &str| -> u64 {
            let label = format!("outcome=\"{name}\"");
            series
                .iter()
                .filter(|(k, _)| k.starts_with("xdp_limiter_packets_total{") && k.contains(&label))
                .map(|(_, v)| *v as u64)
                .sum()
        };
        (outcome("passed"), outcome("dropped_limit"))
    }

    /// A [`TickProbe`] on every node's daemon (started).
    pub fn tick_probe(&self) -> TickProbe {
        let dirs: Vec<_> = (0..self.nodes.len())
            .map(|i| pins::maps_dir(&pins::iface_dir(&self.nodes[i].files.pin_dir, &node_if(i))))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let maps: Vec<Maps> = dirs
                    .iter()
                    .map(|d| Maps::from_pins(d).unwrap_or_else(|e| panic!("{}: {e}", d.display())))
                    .collect();
                let mut ticks = Ticks {
                    refreshes: vec![Vec::new(); maps.len()],
                    longest_poll_gap: Duration::ZERO,
                };
                let mut polled = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    ticks.longest_poll_gap = ticks.longest_poll_gap.max(now - polled);
                    polled = now;
                    for (seen, maps) in ticks.refreshes.iter_mut().zip(&maps) {
                        let Ok(state) = cluster::state(maps) else {
                            continue;
                        };
                        if seen.last().map(|&(_, ns)| ns) != Some(state.refreshed_ns) {
                            seen.push((now, state.refreshed_ns));
                        }
                    }
                    // Polling, not synchronization: a refresh is seen
                    // within 2 ms (ticks are 100 ms apart).
                    std::thread::sleep(Duration::from_millis(2));
                }
                ticks
            })
        };
        TickProbe {
            stop,
            thread: Some(thread),
        }
    }

    /// A sink on node `i`.
    pub fn sink(&self, i: usize) -> Sink {
        Sink::start(&self.nodes[i].ns, node_addr(i))
    }

    /// Sends from [`SOURCE`] at `rates[i]` datagrams per second to node
    /// `i`, for `duration`, paced in 10 ms slices; returns what was sent
    /// per node. Bounded: `sum(rates) x duration` datagrams in all.
    pub fn flood(&self, rates: &[u64], duration: Duration) -> Vec<u64> {
        let sent: Vec<AtomicU64> = rates.iter().map(|_| AtomicU64::new(0)).collect();
        self.flood_until(rates, duration, &AtomicBool::new(false), &sent);
        sent.iter().map(|s| s.load(Ordering::Relaxed)).collect()
    }

    /// As [`ClusterLab::flood`], until `stop` is set or `limit` passes;
    /// what was sent per node is added to `sent` as it goes (the demo
    /// shows it live and stops on Ctrl-C).
    pub fn flood_until(
        &self,
        rates: &[u64],
        limit: Duration,
        stop: &AtomicBool,
        sent: &[AtomicU64],
    ) {
        self.traffic.enter(|| {
            let socket = UdpSocket::bind(SocketAddrV4::new(SOURCE, 0)).expect("bind the source");
            let start = Instant::now();
            let mut done = vec![0u64; rates.len()];
            let data = [7u8; 32];
            while start.elapsed() < limit && !stop.load(Ordering::Relaxed) {
                let elapsed = start.elapsed().as_secs_f64();
                for (i, &rate) in rates.iter().enumerate() {
                    // Catch up to the rate's schedule (so a late slice
                    // does not lower the rate).
                    let due = (rate as f64 * elapsed) as u64;
                    while done[i] < due {
                        let _ = socket.send_to(&data, SocketAddrV4::new(node_addr(i), SINK_PORT));
                        done[i] += 1;
                        sent[i].fetch_add(1, Ordering::Relaxed);
                    }
                }
                // Pacing, not synchronization: the next slice of the rate.
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    }

    /// As [`ClusterLab::flood`] in phases: `(duration, rates)` one after
    /// the other (a node's rate may drop to 0: the load balancer took it
    /// out). Bounded like `flood`; returns what was sent per node.
    pub fn flood_phases(&self, phases: &[(Duration, Vec<u64>)]) -> Vec<u64> {
        let nodes = phases.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
        let total: Duration = phases.iter().map(|(d, _)| *d).sum();
        // Datagrams due to node `i` `at` into the flood.
        let due = |i: usize, at: Duration| -> u64 {
            let (mut begin, mut sum) = (Duration::ZERO, 0.0);
            for (length, rates) in phases {
                let end = begin + *length;
                let overlap = at.min(end).saturating_sub(begin);
                sum += rates.get(i).copied().unwrap_or(0) as f64 * overlap.as_secs_f64();
                begin = end;
            }
            sum as u64
        };
        self.traffic.enter(|| {
            let socket = UdpSocket::bind(SocketAddrV4::new(SOURCE, 0)).expect("bind the source");
            let start = Instant::now();
            let mut sent = vec![0u64; nodes];
            let data = [7u8; 32];
            while start.elapsed() < total {
                let elapsed = start.elapsed();
                for (i, sent) in sent.iter_mut().enumerate() {
                    let due = due(i, elapsed);
                    while *sent < due {
                        let _ = socket.send_to(&data, SocketAddrV4::new(node_addr(i), SINK_PORT));
                        *sent += 1;
                    }
                }
                // Pacing, not synchronization.
                std::thread::sleep(Duration::from_millis(10));
            }
            sent
        })
    }

    /// Several flows at once, each `(source, node, rate)`: `source` (an
    /// address of [`LIGHT_PREFIX`], or [`SOURCE`]) sends to `node` at
    /// `rate` datagrams per second for `duration`, paced like
    /// [`ClusterLab::flood`]; returns what each flow sent. The sinks count
    /// [`SOURCE`] only, so other sources' frames are never in their bins.
    pub fn flood_flows(&self, flows: &[(Ipv4Addr, usize, u64)], duration: Duration) -> Vec<u64> {
        self.traffic.enter(|| {
            let sockets: Vec<UdpSocket> = flows
                .iter()
                .map(|(source, _, _)| {
                    UdpSocket::bind(SocketAddrV4::new(*source, 0))
                        .unwrap_or_else(|e| panic!("bind {source}: {e}"))
                })
                .collect();
            let start = Instant::now();
            let mut sent = vec![0u64; flows.len()];
            let data = [5u8; 32];
            while start.elapsed() < duration {
                let elapsed = start.elapsed().as_secs_f64();
                for (k, &(_, node, rate)) in flows.iter().enumerate() {
                    let due = (rate as f64 * elapsed) as u64;
                    while sent[k] < due {
                        let _ = sockets[k]
                            .send_to(&data, SocketAddrV4::new(node_addr(node), SINK_PORT));
                        sent[k] += 1;
                    }
                }
                // Pacing, not synchronization.
                std::thread::sleep(Duration::from_millis(10));
            }
            sent
        })
    }

    /// `count` light sources (10.100.0.1 on, in [`LIGHT_PREFIX`]), each
    /// sending `per_source` datagrams, to node `k % nodes`, then `k + 1`,
    /// and so on, paced evenly over `duration`; returns the datagrams
    /// sent. Bounded: `count x per_source` datagrams.
    pub fn spray(&self, count: u32, per_source: u32, duration: Duration) -> u64 {
        assert!(count < 65_535, "{count} sources do not fit the /16");
        let nodes = self.nodes.len() as u32;
        self.traffic.enter(|| {
            let start = Instant::now();
            let data = [9u8; 32];
            let mut sent = 0u64;
            for k in 1..=count {
                // Pacing: source k is due at k / count of the duration.
                let due = duration.mul_f64(f64::from(k) / f64::from(count));
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
                let addr = Ipv4Addr::new(10, 100, (k >> 8) as u8, k as u8);
                let socket = UdpSocket::bind(SocketAddrV4::new(addr, 0))
                    .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
                for f in 0..per_source {
                    let node = ((k + f) % nodes) as usize;
                    if socket
                        .send_to(&data, SocketAddrV4::new(node_addr(node), SINK_PORT))
                        .is_ok()
                    {
                        sent += 1;
                    }
                }
            }
            sent
        })
    }
}

/// A UDP socket counting what reaches one node, in [`BIN`] bins from its
/// start, on a thread of its own. Each frame is binned by the kernel's
/// receive time (`SO_TIMESTAMPNS`), not by when the thread read it, so a
/// descheduled sink thread moves no count between bins.
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
        Self::counting(socket, SOURCE, None)
    }

    /// Counts the datagrams from `from` that reach `socket`. The thread
    /// reads nothing before `hold` (if any) yields or hangs up: the unit
    /// test delays the reads that way.
    fn counting(socket: UdpSocket, from: Ipv4Addr, hold: Option<Receiver<()>>) -> Self {
        use nix::sys::socket::{setsockopt, sockopt};
        setsockopt(&socket, sockopt::RcvBufForce, &(8 << 20)).expect("receive buffer");
        setsockopt(&socket, sockopt::ReceiveTimestampns, &true).expect("SO_TIMESTAMPNS");
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .expect("read timeout");
        let bins = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        // Bin 0 starts at `start` (what the tests map their `Instant`s
        // from) and at `start_wall` on the clock of SCM_TIMESTAMPNS
        // (CLOCK_REALTIME): one pair, taken together.
        let (start, start_wall) = (Instant::now(), SystemTime::now());
        let thread = {
            let (bins, stop) = (bins.clone(), stop.clone());
            std::thread::spawn(move || {
                if let Some(hold) = hold {
                    let _ = hold.recv();
                }
                loop {
                    // Once stopped, what is still queued is read (without
                    // waiting) and counted: every frame that reached the
                    // socket is in a bin.
                    let stopping = stop.load(Ordering::Relaxed);
                    let at = match receive(&socket, from, stopping) {
                        Received::Frame(at) => at,
                        Received::Foreign => continue,
                        Received::Nothing if stopping => break,
                        Received::Nothing => continue,
                    };
                    let bin = bin_of(start_wall, at);
                    let mut bins = bins.lock().unwrap();
                    if bins.len() <= bin {
                        bins.resize(bin + 1, 0);
                    }
                    bins[bin] += 1;
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

/// What one read of a sink's socket found.
enum Received {
    /// A datagram from the counted source, at its kernel receive time
    /// (SCM_TIMESTAMPNS, CLOCK_REALTIME).
    Frame(SystemTime),
    /// A datagram from another address.
    Foreign,
    /// None: the read timed out (or, `drain`, the queue is empty).
    Nothing,
}

/// Reads one datagram from `socket`, waiting up to its read timeout, or
/// not at all when `drain`.
fn receive(socket: &UdpSocket, from: Ipv4Addr, drain: bool) -> Received {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrIn};
    let mut buf = [0u8; 2048];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
    let flags = if drain {
        MsgFlags::MSG_DONTWAIT
    } else {
        MsgFlags::empty()
    };
    let Ok(msg) = recvmsg::<SockaddrIn>(socket.as_raw_fd(), &mut iov, Some(&mut cmsg), flags)
    else {
        return Received::Nothing;
    };
    if msg.address.map(|a| a.ip()) != Some(from) {
        return Received::Foreign;
    }
    let stamp = msg
        .cmsgs()
        .expect("control messages")
        .find_map(|c| match c {
            ControlMessageOwned::ScmTimestampns(ts) => Some(ts),
            _ => None,
        })
        .expect("SO_TIMESTAMPNS is set: every datagram carries its receive time");
    let since_epoch = Duration::new(stamp.tv_sec() as u64, stamp.tv_nsec() as u32);
    Received::Frame(SystemTime::UNIX_EPOCH + since_epoch)
}

/// The bin (of a sink whose bin 0 started at `start` on the realtime
/// clock) of a frame received at `at`; bin 0 for a frame received before.
fn bin_of(start: SystemTime, at: SystemTime) -> usize {
    let since = at.duration_since(start).unwrap_or_default();
    (since.as_nanos() / BIN.as_nanos()) as usize
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Watches when each node's daemon refreshes its kernel's cluster state
/// (`CLUSTER`'s `refreshed_ns`, written at the end of every tick, failed
/// or not, right after the tick's shares), polled every 2 ms from the
/// pinned map on a thread of its own; the gaps between refreshes are the
/// ticks' spacing as the kernel saw it.
pub struct TickProbe {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Ticks>>,
}

/// What a [`TickProbe`] saw: per node, each refresh (when the probe saw it,
/// the state's `refreshed_ns`); and the probe's own longest gap between
/// two polls (a gap over `T` may hide a refresh, and the lateness it
/// measures is then up to a `T` too long).
#[derive(Debug, Default)]
pub struct Ticks {
    pub refreshes: Vec<Vec<(Instant, u64)>>,
    pub longest_poll_gap: Duration,
}

impl Ticks {
    /// The longest any of `nodes` went past `t` between two refreshes of its
    /// state, over the refreshes seen between `from` and `to` (and the one
    /// before each): a tick's lateness, the delay of its shares included.
    pub fn lateness(&self, nodes: &[usize], t: Duration, from: Instant, to: Instant) -> Duration {
        nodes
            .iter()
            .filter_map(|&i| self.refreshes.get(i))
            .flat_map(|node| {
                node.windows(2)
                    .filter(|pair| pair[1].0 >= from && pair[1].0 <= to)
                    .map(|pair| Duration::from_nanos(pair[1].1.saturating_sub(pair[0].1)))
            })
            .map(|gap| gap.saturating_sub(t))
            .max()
            .unwrap_or_default()
    }
}

impl TickProbe {
    /// Stops watching; what it saw.
    pub fn finish(mut self) -> Ticks {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map(|thread| thread.join().expect("tick probe"))
            .unwrap_or_default()
    }
}

impl Drop for TickProbe {
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

/// [`node_config`] for a Redis Cluster: `urls` are its seed nodes
/// (`mode = "cluster"`).
pub fn node_config_redis_cluster(i: usize, pps: u64, urls: &[String], extra: &str) -> String {
    let single = format!("redis = [\"redis://{}:{PORT}\"]", redis_addr(i));
    let seeds: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    let config = node_config(i, pps, "1s", "100ms", extra);
    assert!(config.contains(&single), "{config}");
    config.replace(
        &single,
        &format!("redis = [{}]\nmode = \"cluster\"", seeds.join(", ")),
    )
}

/// Sliding sums of `width` bins: element `k` covers bins `k..k + width`.
pub fn windows(bins: &[u64], width: usize) -> Vec<u64> {
    if bins.len() < width {
        return Vec::new();
    }
    bins.windows(width).map(|w| w.iter().sum()).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Paces the test's timeline (not synchronization): returns at `at`.
    fn pace_until(at: Instant) {
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }

    /// Frames sent in bins 0 and 2 and read only in bin 4 or later (the
    /// sink's thread held until then, as a descheduled thread would be)
    /// are counted in the bins they were sent in, by their kernel receive
    /// time; binned at the read they would all be in bin 4.
    #[test]
    fn a_frame_is_binned_by_its_kernel_receive_time_not_when_it_was_read() {
        let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the sink");
        let to = socket.local_addr().expect("sink address");
        let sender = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the sender");
        let (release, hold) = mpsc::channel();
        let sink = Sink::counting(socket, Ipv4Addr::LOCALHOST, Some(hold));
        let start = sink.started();
        let bin_at = |at: Instant| (at.duration_since(start).as_nanos() / BIN.as_nanos()) as usize;
        // (when, frames): the middle of bins 0 and 2.
        let batches = [(BIN / 2, 3u64), (BIN * 5 / 2, 5u64)];
        let mut sent_in = Vec::new();
        for (at, frames) in batches {
            pace_until(start + at);
            let before = bin_at(Instant::now());
            for _ in 0..frames {
                sender.send_to(&[1u8; 8], to).expect("send");
            }
            sent_in.push((before..=bin_at(Instant::now()), frames));
        }
        let read_from = start + BIN * 9 / 2;
        pace_until(read_from);
        release.send(()).expect("the sink's thread waits");
        let total: u64 = batches.iter().map(|(_, n)| n).sum();
        let counted = crate::wait_until(Duration::from_secs(5), Duration::from_millis(5), || {
            (sink.bins.lock().unwrap().iter().sum::<u64>() == total).then_some(())
        });
        let bins = sink.finish();
        assert!(
            counted.is_some(),
            "the sink did not count {total} frames: {bins:?}"
        );
        // A stall of the sender past a bin edge widens its batch's range;
        // the ranges must still be apart and before the reads.
        let (first, second) = (&sent_in[0].0, &sent_in[1].0);
        assert!(
            first.end() < second.start() && *second.end() < bin_at(read_from),
            "the sender stalled across bins: sent in {sent_in:?}, read from bin {}",
            bin_at(read_from)
        );
        for (range, frames) in &sent_in {
            let in_range: u64 = bins
                .iter()
                .enumerate()
                .filter(|(b, _)| range.contains(b))
                .map(|(_, n)| n)
                .sum();
            assert_eq!(
                in_range,
                *frames,
                "{frames} frames sent in bins {range:?}: bins {bins:?} (read from bin {})",
                bin_at(read_from)
            );
        }
    }
}
