//! The service scenario of the end-to-end benchmark: a real web
//! server (Debian's nginx) in the lab's receiving namespace, polite clients
//! in the sending namespace, and a spoofed SYN flood from the live-frames
//! generator at the server's port, with each filter in turn in front of
//! the server. What it measures is what the server's clients see: the
//! share of their requests answered, and the latency of each (connect,
//! request, whole response), beside the receiver's CPU, the kernel's
//! listen-queue and veth counters, and for xdp-limiter its outcome
//! counters.
//!
//! The lab is [`Lab`]'s (threaded NAPI on the receiving veth, pinned to
//! [`lab::RX_CPU`]; GRO on, which the generator's `XDP_TX` into the veth
//! needs). On top of it the sending side gets an address of its own and
//! one per client, and the receiver a route back to the flood's spoofed
//! sources through the sending side: its SYN-ACKs leave as they would on
//! a real network, and vanish there (the sending namespace does not
//! forward), so the spoofed connections stay half open as in a real
//! flood.

use std::{
    collections::BTreeMap,
    fs,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpStream},
    os::{fd::AsRawFd, unix::process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use limiter_tests::{
    daemon::{clock_ticks, process_cpu, Daemon, Files},
    netns::{NetNs, Veth},
    redis::{RedisServer, PORT as REDIS_PORT},
    wait_until,
};
use nix::{
    errno::Errno,
    sys::{
        signal::Signal,
        socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn},
        time::{TimeVal, TimeValLike as _},
    },
};
use serde::Serialize;
use serde_json::{json, Value};

use super::{
    lab::{self, Lab, RX_IF, RX_V4, TX_IF},
    measure::{pause, wait_idle},
    report::{rate, Stat},
    scenario::{self, Limit},
    traffic::{Mix, Priority, Programs, Rate},
};
use limiter_bench_common::traffic::{names, PREFIX16_BITS};

/// The server's port.
pub const HTTP_PORT: u16 = 80;
/// The sending side's own address (the receiver's next hop back to the
/// flood's spoofed sources).
pub const TX_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// The first client address; client `i` is this plus `i`.
const FIRST_CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
/// The clients' /24 (the sending side's own address too) and the name of
/// its rule in the `apart` variant.
const CLIENTS_NET: &str = "198.18.0.0/24";
pub const CLIENTS_RULE: &str = "clients";
/// The generator's random sources (`limiter_bench_common::traffic::source_v4`),
/// spread or from one /16 ([`FloodSource`]).
const SPOOFED: &str = "10.128.0.0/9";
const SPOOFED_16: &str = "10.128.0.0/16";
const SPOOFED_AIMED: &str = "10.128.0.0/14";
/// The aimed flood's addresses: `2^AIMED_BITS` = 262,144, four times
/// the limiter's default 65,536 windows.
pub const AIMED_BITS: u8 = 18;
/// The aimed flood runs this long before the clients start: its sources
/// take every window they can first, so the clients arrive as new
/// sources to a full table.
pub const AIMED_LEAD: Duration = Duration::from_secs(2);
/// The Redis link of the cluster cells: the receiver's end and Redis's.
const REDIS_LINK_RX: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const REDIS_LINK_DB: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

/// The page the clients fetch: a small static page.
const PAGE: &str = "<!doctype html>\n<title>xdp-limiter e2e</title>\n<p>A small static page served to the benchmark's clients.</p>\n";

/// Where xdp-limiter is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attach {
    Native,
    Generic,
}

impl Attach {
    pub fn name(self) -> &'static str {
        match self {
            Attach::Native => "native",
            Attach::Generic => "generic",
        }
    }
}

/// xdp-limiter's rule: node scope, node scope with a penalty, cluster
/// scope (which allows no penalty), node scope with a /16 aggregate,
/// node scope with the clients' /24 under a rule of its own at the same
/// limit (`apart`: the flood under the default rule; what the limiter
/// drops of the clients is that rule's drop count), or `apart` with the
/// aimed flood's UDP port under a per-minute rule of its own (`minute`:
/// [`MINUTE_PPS`] over a minute, no cheap frames, the rule whose new
/// sources take tickets fastest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    Node,
    Block,
    Cluster,
    Agg16,
    Apart,
    Minute,
}

impl Variant {
    pub const ALL: [Variant; 6] = [
        Variant::Node,
        Variant::Block,
        Variant::Cluster,
        Variant::Agg16,
        Variant::Apart,
        Variant::Minute,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Node => "node",
            Variant::Block => "block",
            Variant::Cluster => "cluster",
            Variant::Agg16 => "agg16",
            Variant::Apart => "apart",
            Variant::Minute => "minute",
        }
    }
}

/// The penalty of the `block` variant.
pub const BLOCK: &str = "10s";
/// The `agg16` variant's level: every /16 (IPv6 /48) together at this
/// many frames a second, whatever the per-source limit. The clients share
/// one /16 and send about 27 frames a second each (SYN, ACK, request,
/// ACKs, FIN at 5 requests a second): 200 of them about 5,400, so the
/// aggregate holds the flood's /16 and leaves theirs alone.
pub const AGG16_PPS: u64 = 10_000;
/// The `minute` variant's rule of the aimed flood's UDP port: this many
/// frames a second over a 60 s window (120 a minute; its cheap frames,
/// a tenth of two seconds' worth, round to none). The aimed flood's
/// addresses send 1.5 frames a second each on average: 90 a minute,
/// under it.
pub const MINUTE_PPS: u64 = 2;
/// The `minute` variant's rule's name.
pub const MINUTE_RULE: &str = "flood-port";

/// What stands in front of the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    NoFilter,
    /// A native XDP program that passes everything.
    XdpPass,
    /// nftables, a per-source meter (dynamic set) in the inet input hook.
    NftMeter,
    /// iptables `hashlimit --hashlimit-mode srcip` in INPUT.
    Hashlimit,
    /// The xdp-limiter daemon in enforce mode, default rule `pps`.
    Limiter {
        attach: Attach,
        pps: u64,
        variant: Variant,
    },
}

impl Filter {
    /// The kind's name, as `--service-filters` selects it.
    pub fn kind(self) -> &'static str {
        match self {
            Filter::NoFilter => "no-filter",
            Filter::XdpPass => "xdp-pass",
            Filter::NftMeter => "nft-meter",
            Filter::Hashlimit => "iptables-hashlimit",
            Filter::Limiter {
                attach: Attach::Native,
                ..
            } => "xdp-limiter-native",
            Filter::Limiter {
                attach: Attach::Generic,
                ..
            } => "xdp-limiter-generic",
        }
    }

    pub const KINDS: [&'static str; 6] = [
        "no-filter",
        "xdp-pass",
        "nft-meter",
        "iptables-hashlimit",
        "xdp-limiter-native",
        "xdp-limiter-generic",
    ];

    /// A one-line label: the kind, and for xdp-limiter its limit and rule.
    pub fn label(self, reference: u64) -> String {
        match self {
            Filter::NoFilter | Filter::XdpPass => self.kind().to_string(),
            Filter::NftMeter | Filter::Hashlimit => format!("{} {reference} pps", self.kind()),
            Filter::Limiter {
                attach,
                pps,
                variant,
            } => format!("xdp-limiter {} {pps} pps {}", attach.name(), variant.name()),
        }
    }

    /// The matrix: the four references, then xdp-limiter native and
    /// generic at each limit with each variant.
    pub fn matrix(kinds: &[String], limits: &[u64], variants: &[Variant]) -> Vec<Filter> {
        let wanted = |kind: &str| kinds.is_empty() || kinds.iter().any(|k| k == kind);
        let mut all = vec![
            Filter::NoFilter,
            Filter::XdpPass,
            Filter::NftMeter,
            Filter::Hashlimit,
        ];
        for attach in [Attach::Native, Attach::Generic] {
            for &pps in limits {
                for &variant in variants {
                    all.push(Filter::Limiter {
                        attach,
                        pps,
                        variant,
                    });
                }
            }
        }
        all.retain(|f| wanted(f.kind()));
        all
    }
}

/// The traffic of a run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Plan {
    /// Polite clients, one address each.
    pub clients: usize,
    /// Requests per second of each client, each on a new connection.
    pub client_rate: f64,
    /// How long the clients and the flood run.
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
    /// A request not answered in full within this counts as failed.
    #[serde(serialize_with = "secs")]
    pub timeout: Duration,
    /// The spoofed SYN flood's rate (frames per second; 0: none), for the
    /// generator (hping3 floods as fast as it goes).
    pub flood_pps: u64,
    /// What sends the flood.
    pub flood_tool: FloodTool,
    /// The per-source limit of nftables and iptables (burst the same).
    pub reference_pps: u64,
    /// Where the generator's spoofed sources come from.
    pub flood_source: FloodSource,
}

/// The addresses of the generator's spoofed SYNs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FloodSource {
    /// Random addresses in 10.128.0.0/9: no prefix shorter than /9 holds
    /// many of them.
    Random,
    /// Random addresses in 10.128.0.0/16: a limit on the /16 as a whole
    /// holds the flood; one per source does not.
    Prefix16,
    /// Not SYNs: UDP datagrams to the sink from random addresses of
    /// 10.128.0.0/14 (`2^AIMED_BITS`, four times the default windows),
    /// each address under the limit at the rates used (about 1.5 frames
    /// a second at 400k), but past a 10 pps rule's cheap frames, so each
    /// needs a window (issue 50's flood). The clients start
    /// [`AIMED_LEAD`] after the flood, from addresses new to the run.
    Aimed,
}

impl FloodSource {
    pub fn name(self) -> &'static str {
        match self {
            FloodSource::Random => "random",
            FloodSource::Prefix16 => "prefix16",
            FloodSource::Aimed => "aimed",
        }
    }

    fn addresses(self) -> &'static str {
        match self {
            FloodSource::Random => SPOOFED,
            FloodSource::Prefix16 => SPOOFED_16,
            FloodSource::Aimed => SPOOFED_AIMED,
        }
    }

    /// The generator's `random_bits` for these sources.
    fn random_bits(self) -> u8 {
        match self {
            FloodSource::Random => 0,
            FloodSource::Prefix16 => PREFIX16_BITS,
            FloodSource::Aimed => AIMED_BITS,
        }
    }

    /// Whether each run's clients are new sources (their own addresses),
    /// arriving this long after the flood started.
    fn newcomers_after(self) -> Option<Duration> {
        (self == FloodSource::Aimed).then_some(AIMED_LEAD)
    }
}

/// What sends the spoofed SYN flood.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FloodTool {
    /// The live-frames generator, paced at `flood_pps`: its frames enter
    /// the receiving veth's ring through `XDP_TX` (`ndo_xdp_xmit`), never
    /// through the sending namespace's stack.
    Generator,
    /// Debian's `hping3 -S --flood --rand-source`, unpaced, pinned to the
    /// generator's CPU: its SYNs leave through the sending namespace's
    /// stack and the veth's transmit path, as the clients' do; its random sources cover all of IPv4.
    Hping3,
}

impl FloodTool {
    pub fn name(self) -> &'static str {
        match self {
            FloodTool::Generator => "generator",
            FloodTool::Hping3 => "hping3",
        }
    }
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Client `i`'s address.
pub fn client_addr(i: usize) -> Ipv4Addr {
    let base = u32::from(FIRST_CLIENT);
    Ipv4Addr::from(base + i as u32)
}

/// Adds the sending side's address and the clients' addresses, and the
/// receiver's route back to the spoofed sources through the sending side.
pub fn prepare_lab(lab: &Lab, clients: usize) -> Result<()> {
    if clients == 0 || clients > 240 {
        bail!(
            "{clients} client addresses: 1 to 240 (198.18.0.10 and up; an aimed flood's \
             runs take new ones each)"
        );
    }
    lab.tx
        .ip(&["addr", "add", &format!("{TX_V4}/24"), "dev", TX_IF]);
    for i in 0..clients {
        lab.tx.ip(&[
            "addr",
            "add",
            &format!("{}/24", client_addr(i)),
            "dev",
            TX_IF,
        ]);
    }
    // Every spoofed source (the generator's 10.128.0.0/9, hping3's any
    // address) is reached through the sending side: one neighbour, not
    // one per source.
    lab.rx.ip(&[
        "route",
        "add",
        "default",
        "via",
        &TX_V4.to_string(),
        "dev",
        RX_IF,
    ]);
    Ok(())
}

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// nginx serving [`PAGE`] on [`RX_V4`]:[`HTTP_PORT`] in the lab's
/// receiving namespace, from its own configuration, pid and log files in
/// a scratch directory; stopped (and the directory removed) on drop.
pub struct Nginx {
    child: Option<Child>,
    dir: PathBuf,
}

impl Nginx {
    /// Starts nginx and waits until a client in the sending namespace gets
    /// the page (at most 10 s).
    pub fn start(lab: &Lab) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "xlt-nginx-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(dir.join("www")).with_context(|| dir.display().to_string())?;
        fs::create_dir_all(dir.join("tmp"))?;
        fs::write(dir.join("www/index.html"), PAGE)?;
        let conf = dir.join("nginx.conf");
        fs::write(&conf, nginx_config(&dir))?;
        let log = fs::File::create(dir.join("stderr.log"))?;
        let mut cmd = lab.rx.command("nginx");
        cmd.arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(&dir)
            .arg("-e")
            .arg(dir.join("error.log"));
        // SAFETY: the hook runs between fork and exec and only calls
        // prctl(2), which is async-signal-safe.
        unsafe {
            // nginx dies with the benchmark, even one killed by SIGKILL
            // (`ip netns exec` execs nginx, so the setting reaches it).
            cmd.pre_exec(|| Ok(nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start nginx (is it installed? `cargo xtask setup`)")?;
        let mut nginx = Self {
            child: Some(child),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = nginx
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("nginx exited ({status}) during start-up:\n{}", nginx.logs());
            }
            // From the sending side's own address: no client's source
            // is seen before its run.
            let from = TX_V4;
            let answered = lab.tx.enter(|| {
                request(
                    from,
                    SocketAddrV4::new(RX_V4, HTTP_PORT),
                    Duration::from_secs(1),
                )
            });
            if answered.is_ok() {
                return Ok(nginx);
            }
            if Instant::now() > deadline {
                bail!(
                    "nginx never served the page ({answered:?}):\n{}",
                    nginx.logs()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn logs(&self) -> String {
        let read = |name: &str| fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        format!("{}{}", read("stderr.log"), read("error.log"))
    }

    /// CPU time nginx has used so far (user + system, its one process).
    pub fn cpu(&self) -> Duration {
        self.child
            .as_ref()
            .map_or(Duration::ZERO, |c| process_cpu(c.id()))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGTERM: nginx's fast shutdown.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(5);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// nginx's configuration: one process (no master: its CPU is one
/// process's, and nothing outlives it), no access log, every path in
/// `dir`, Debian's default listen backlog (511).
fn nginx_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nmaster_process off;\nworker_rlimit_nofile 16384;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n\
         \x20 access_log off;\n\
         \x20 default_type text/html;\n\
         \x20 client_body_temp_path {d}/tmp/body;\n\
         \x20 proxy_temp_path {d}/tmp/proxy;\n\
         \x20 fastcgi_temp_path {d}/tmp/fastcgi;\n\
         \x20 uwsgi_temp_path {d}/tmp/uwsgi;\n\
         \x20 scgi_temp_path {d}/tmp/scgi;\n\
         \x20 server {{\n\
         \x20   listen {RX_V4}:{HTTP_PORT};\n\
         \x20   root {d}/www;\n\
         \x20   location / {{ index index.html; }}\n\
         \x20 }}\n\
         }}\n"
    )
}

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No connection within the timeout (SYNs lost or unanswered).
    ConnectTimeout,
    /// Refused or reset.
    Refused,
    /// Connected, but the whole response did not come within the timeout.
    ResponseTimeout,
    /// Anything else (a short or wrong response, an unexpected error).
    Other,
}

/// One request on a new connection from `from`: connect, `GET /`, read
/// the whole response (the server closes: HTTP/1.0); all within `timeout`.
pub fn request(
    from: Ipv4Addr,
    to: SocketAddrV4,
    timeout: Duration,
) -> std::result::Result<(), Failure> {
    let started = Instant::now();
    let fd = socket::socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|_| Failure::Other)?;
    socket::bind(
        fd.as_raw_fd(),
        &SockaddrIn::from(SocketAddrV4::new(from, 0)),
    )
    .map_err(|_| Failure::Other)?;
    // A blocking connect waits at most the send timeout (then EINPROGRESS).
    let millis = timeout.as_millis() as i64;
    socket::setsockopt(&fd, sockopt::SendTimeout, &TimeVal::milliseconds(millis))
        .map_err(|_| Failure::Other)?;
    match socket::connect(fd.as_raw_fd(), &SockaddrIn::from(to)) {
        Ok(()) => {}
        Err(Errno::EINPROGRESS | Errno::ETIMEDOUT | Errno::EAGAIN) => {
            return Err(Failure::ConnectTimeout)
        }
        Err(Errno::ECONNREFUSED | Errno::ECONNRESET) => return Err(Failure::Refused),
        Err(_) => return Err(Failure::Other),
    }
    let mut stream = TcpStream::from(fd);
    let left = |failure| {
        timeout
            .checked_sub(started.elapsed())
            .filter(|d| !d.is_zero())
            .ok_or(failure)
    };
    stream
        .set_write_timeout(Some(left(Failure::ResponseTimeout)?))
        .map_err(|_| Failure::Other)?;
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: e2e\r\n\r\n")
        .map_err(|_| Failure::ResponseTimeout)?;
    let mut response = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    loop {
        stream
            .set_read_timeout(Some(left(Failure::ResponseTimeout)?))
            .map_err(|_| Failure::Other)?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Failure::ResponseTimeout)
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Err(Failure::Refused)
            }
            Err(_) => return Err(Failure::Other),
        }
    }
    let ok = response.starts_with(b"HTTP/1.1 200") && response.ends_with(PAGE.as_bytes());
    if ok {
        Ok(())
    } else {
        Err(Failure::Other)
    }
}

/// What the clients saw in one run.
#[derive(Clone, Debug, Default)]
pub struct ClientOutcome {
    /// Requests the schedule called for (clients x rate x duration).
    pub scheduled: u64,
    /// Requests started (a client is sequential: slow answers delay its
    /// next requests, and those due too late are never sent).
    pub sent: u64,
    /// Latencies of the requests answered in full, µs.
    pub latencies_us: Vec<u64>,
    pub connect_timeouts: u64,
    pub refused: u64,
    pub response_timeouts: u64,
    pub other_failures: u64,
}

impl ClientOutcome {
    fn add(&mut self, other: ClientOutcome) {
        self.scheduled += other.scheduled;
        self.sent += other.sent;
        self.latencies_us.extend(other.latencies_us);
        self.connect_timeouts += other.connect_timeouts;
        self.refused += other.refused;
        self.response_timeouts += other.response_timeouts;
        self.other_failures += other.other_failures;
    }

    fn failed(&self) -> u64 {
        self.connect_timeouts + self.refused + self.response_timeouts + self.other_failures
    }
}

/// The clients, each on a thread in the sending namespace, from `start`
/// for `plan.duration`: client `i` sends request `k` at `start + (k + i /
/// clients) / rate` or, when its previous request ends later, right then.
pub fn run_clients(lab: &Lab, plan: &Plan, first: usize, start: Instant) -> ClientOutcome {
    let interval = Duration::from_secs_f64(1.0 / plan.client_rate);
    let end = start + plan.duration;
    let to = SocketAddrV4::new(RX_V4, HTTP_PORT);
    let ns_path = format!("/run/netns/{}", lab.tx.name());
    thread::scope(|scope| {
        let clients: Vec<_> = (0..plan.clients)
            .map(|i| {
                let ns_path = &ns_path;
                scope.spawn(move || {
                    let mut outcome = ClientOutcome::default();
                    let entered = fs::File::open(ns_path).and_then(|ns| {
                        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
                            .map_err(std::io::Error::from)
                    });
                    if let Err(e) = entered {
                        eprintln!("client {i}: entering {ns_path}: {e}");
                        return outcome;
                    }
                    let from = client_addr(first + i);
                    let offset = interval.mul_f64(i as f64 / plan.clients as f64);
                    let mut due = start + offset;
                    while due < end {
                        outcome.scheduled += 1;
                        let now = Instant::now();
                        if now < due {
                            // The schedule, not a synchronisation.
                            thread::sleep(due - now);
                        }
                        due += interval;
                        if Instant::now() >= end {
                            continue;
                        }
                        outcome.sent += 1;
                        let began = Instant::now();
                        match request(from, to, plan.timeout) {
                            Ok(()) => outcome
                                .latencies_us
                                .push(began.elapsed().as_micros() as u64),
                            Err(Failure::ConnectTimeout) => outcome.connect_timeouts += 1,
                            Err(Failure::Refused) => outcome.refused += 1,
                            Err(Failure::ResponseTimeout) => outcome.response_timeouts += 1,
                            Err(Failure::Other) => outcome.other_failures += 1,
                        }
                    }
                    outcome
                })
            })
            .collect();
        let mut all = ClientOutcome::default();
        for client in clients {
            match client.join() {
                Ok(outcome) => all.add(outcome),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        all
    })
}

/// The `q` quantile (0..1) of sorted values (nearest rank).
fn quantile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

/// `/proc/stat`'s first line: (softirq, busy) clock ticks over all CPUs.
fn cpu_ticks() -> (u64, u64) {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let get = |i: usize| fields.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    let busy = (0..8).map(get).sum::<u64>() - get(3) - get(4);
    (get(6), busy)
}

/// `TcpExt` counters of the namespace the calling thread is in.
fn tcp_ext() -> BTreeMap<String, u64> {
    let text = fs::read_to_string("/proc/thread-self/net/netstat").unwrap_or_default();
    let mut lines = text.lines();
    let mut out = BTreeMap::new();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let (Some(("TcpExt", names)), Some(("TcpExt", values))) =
            (names.split_once(": "), values.split_once(": "))
        else {
            continue;
        };
        for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = value.parse() {
                out.insert(name.to_string(), v);
            }
        }
    }
    out
}

/// `ethtool -S dev` in `ns`: every numeric statistic.
fn ethtool_stats(ns: &NetNs, dev: &str) -> BTreeMap<String, u64> {
    let Ok(out) = ns.command("ethtool").args(["-S", dev]).output() else {
        return BTreeMap::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(": ")?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// A `/proc/net/dev` field of `dev` in the calling thread's namespace
/// (0 rx_bytes, 1 rx_packets, 3 rx_drop, 9 tx_packets, 11 tx_drop).
fn net_dev(dev: &str, field: usize) -> u64 {
    let text = fs::read_to_string("/proc/thread-self/net/dev").unwrap_or_default();
    text.lines()
        .find_map(|line| {
            let (name, fields) = line.trim_start().split_once(':')?;
            (name == dev).then(|| fields.split_whitespace().nth(field)?.parse().ok())?
        })
        .unwrap_or(0)
}

/// Counters at one instant.
struct Snapshot {
    at: Instant,
    napi_ns: u64,
    softirq_ticks: u64,
    busy_ticks: u64,
    nginx: Duration,
    flood_sent: u64,
    stalled_ns: u64,
    rx_packets: u64,
    tx_dropped: u64,
    tcp: BTreeMap<String, u64>,
    tcp_tx: BTreeMap<String, u64>,
    ethtool_rx: BTreeMap<String, u64>,
    ethtool_tx: BTreeMap<String, u64>,
}

impl Snapshot {
    fn take(lab: &Lab, programs: &Programs, nginx: &Nginx) -> Self {
        let (sent, stalled_ns) = programs.sent();
        let (softirq_ticks, busy_ticks) = cpu_ticks();
        let (rx_packets, tcp) = lab.rx.enter(|| (net_dev(RX_IF, 1), tcp_ext()));
        let (tx_dropped, tcp_tx) = lab.tx.enter(|| (net_dev(TX_IF, 11), tcp_ext()));
        let at = Instant::now();
        Self {
            at,
            napi_ns: lab.receiver_cpu_ns(),
            softirq_ticks,
            busy_ticks,
            nginx: nginx.cpu(),
            flood_sent: sent.iter().sum(),
            stalled_ns,
            rx_packets,
            tx_dropped,
            tcp,
            tcp_tx,
            ethtool_rx: ethtool_stats(&lab.rx, RX_IF),
            ethtool_tx: ethtool_stats(&lab.tx, TX_IF),
        }
    }
}

/// The generator's frames a veth could not hand to its peer's ring.
fn xmit_errors(stats: &BTreeMap<String, u64>) -> u64 {
    stats
        .iter()
        .filter(|(k, _)| k.ends_with("_xdp_xmit_errors"))
        .map(|(_, v)| v)
        .sum()
}

/// Nonzero differences of two counter maps.
fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// The figures of one run.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceRun {
    pub scheduled: u64,
    pub sent: u64,
    pub ok: u64,
    /// Requests answered in full over those scheduled.
    pub success: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Requests sent and not answered in full, by why.
    pub failed: u64,
    pub connect_timeouts: u64,
    pub refused: u64,
    pub response_timeouts: u64,
    pub other_failures: u64,
    /// The flood as sent (and the share of the time its generator was
    /// stalled), and what the receiving veth took in (flood and clients).
    pub flood_pps: f64,
    pub flood_stalled: f64,
    pub rx_pps: f64,
    /// Busy shares of one CPU: the receiving veth's NAPI thread, softirq
    /// work on every CPU (the clients' and the receiver's backlog), nginx,
    /// and every CPU together.
    pub napi_cpu: f64,
    pub softirq_cpu: f64,
    pub nginx_cpu: f64,
    pub machine_cpu: f64,
    /// Frames the sending veth dropped on transmit per second because the
    /// peer's receive ring was full, less the generator's (counted apart,
    /// as `xdp_xmit_errors`): with the generator the clients' frames,
    /// with hping3 its frames and the clients' alike.
    pub veth_drops_per_s: f64,
    /// The clients' SYNs sent again per second (TcpExt TCPSynRetrans of
    /// the sending namespace, where only the clients speak TCP): each is a
    /// connection attempt that went unanswered for a second or more.
    pub client_syn_retrans_per_s: f64,
    /// The receiver's and the clients' TcpExt counters (nonzero
    /// differences).
    pub tcp: BTreeMap<String, u64>,
    pub tcp_clients: BTreeMap<String, u64>,
    /// `ethtool -S` of both veth ends (nonzero differences).
    pub ethtool_rx: BTreeMap<String, u64>,
    pub ethtool_tx: BTreeMap<String, u64>,
}

impl ServiceRun {
    /// A TcpExt counter per second.
    pub fn tcp_per_s(&self, name: &str, duration: f64) -> f64 {
        self.tcp.get(name).copied().unwrap_or(0) as f64 / duration
    }
}

/// One run: a quiet second and an idle machine, then the clients and the
/// flood together for `plan.duration`. `None` when interrupted.
pub fn run_once(
    lab: &Lab,
    programs: &Programs,
    nginx: &Nginx,
    plan: &Plan,
    run: usize,
    interrupted: &AtomicBool,
) -> Option<ServiceRun> {
    let first = if plan.flood_source.newcomers_after().is_some() {
        run * plan.clients
    } else {
        0
    };
    // Longer than the limits' 1 s window: each run starts with the
    // clients' windows empty.
    let quiet_until = Instant::now() + Duration::from_millis(1_200);
    wait_idle(Duration::from_secs(3), interrupted);
    pause(
        quiet_until.saturating_duration_since(Instant::now()),
        interrupted,
    )?;
    if interrupted.load(Ordering::Relaxed) {
        return None;
    }
    let before = Snapshot::take(lab, programs, nginx);
    let stop = AtomicBool::new(false);
    let clients = thread::scope(|scope| -> Result<ClientOutcome> {
        let hping = match plan.flood_tool {
            _ if plan.flood_pps == 0 => None,
            FloodTool::Generator => {
                // Nice 19: a paced generator spins between due frames, and
                // the clients share its CPU.
                scope.spawn(|| programs.generate_at(lab, &stop, Priority::Lowest));
                None
            }
            FloodTool::Hping3 => Some(Hping3::start(lab)?),
        };
        if let Some(lead) = plan
            .flood_source
            .newcomers_after()
            .filter(|_| plan.flood_pps > 0)
        {
            // The flood alone first (a schedule): its sources take the
            // windows.
            thread::sleep(lead);
        }
        let outcome = run_clients(lab, plan, first, Instant::now());
        stop.store(true, Ordering::Relaxed);
        drop(hping);
        Ok(outcome)
    });
    let clients = match clients {
        Ok(clients) => clients,
        Err(e) => {
            eprintln!("flood: {e:#}");
            return None;
        }
    };
    let after = Snapshot::take(lab, programs, nginx);
    let flood_sent = match plan.flood_tool {
        FloodTool::Generator => after.flood_sent - before.flood_sent,
        // What reached the receiving veth or was dropped at its full ring
        // (the clients' few frames too). Not the sending veth's
        // tx_packets: veth counts a frame it hands to its peer's NAPI ring
        // on the peer's side only.
        FloodTool::Hping3 => {
            (after.rx_packets - before.rx_packets) + (after.tx_dropped - before.tx_dropped)
        }
    };
    let dt = (after.at - before.at).as_secs_f64();
    let hz = clock_ticks();
    let mut latencies = clients.latencies_us.clone();
    latencies.sort_unstable();
    let ok = latencies.len() as u64;
    Some(ServiceRun {
        scheduled: clients.scheduled,
        sent: clients.sent,
        ok,
        success: ok as f64 / clients.scheduled.max(1) as f64,
        p50_ms: quantile(&latencies, 0.50) / 1e3,
        p99_ms: quantile(&latencies, 0.99) / 1e3,
        max_ms: latencies.last().map_or(f64::NAN, |&v| v as f64 / 1e3),
        failed: clients.failed(),
        connect_timeouts: clients.connect_timeouts,
        refused: clients.refused,
        response_timeouts: clients.response_timeouts,
        other_failures: clients.other_failures,
        flood_pps: flood_sent as f64 / dt,
        flood_stalled: (after.stalled_ns - before.stalled_ns) as f64 / (dt * 1e9),
        rx_pps: (after.rx_packets - before.rx_packets) as f64 / dt,
        napi_cpu: (after.napi_ns - before.napi_ns) as f64 / (dt * 1e9),
        softirq_cpu: (after.softirq_ticks - before.softirq_ticks) as f64 / hz / dt,
        nginx_cpu: (after.nginx - before.nginx).as_secs_f64() / dt,
        machine_cpu: (after.busy_ticks - before.busy_ticks) as f64 / hz / dt,
        // The veth counts the generator's frames refused by a full ring
        // (`xdp_xmit_errors`) among its transmit drops too: the rest were
        // the clients' (and ARP's).
        client_syn_retrans_per_s: after
            .tcp_tx
            .get("TCPSynRetrans")
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.tcp_tx.get("TCPSynRetrans").copied().unwrap_or(0))
            as f64
            / dt,
        veth_drops_per_s: (after.tx_dropped - before.tx_dropped).saturating_sub(
            xmit_errors(&after.ethtool_tx).saturating_sub(xmit_errors(&before.ethtool_tx)),
        ) as f64
            / dt,
        tcp: diff(&after.tcp, &before.tcp),
        tcp_clients: diff(&after.tcp_tx, &before.tcp_tx),
        ethtool_rx: diff(&after.ethtool_rx, &before.ethtool_rx),
        ethtool_tx: diff(&after.ethtool_tx, &before.ethtool_tx),
    })
}

/// `hping3 -S -p 80 --flood --rand-source` at the server from the sending
/// namespace, pinned to the generator's CPU; stopped on drop.
struct Hping3(Child);

impl Hping3 {
    fn start(lab: &Lab) -> Result<Self> {
        let mut cmd = lab.tx.command("hping3");
        cmd.args(["-q", "-S", "-p", &HTTP_PORT.to_string()]).args([
            "--flood",
            "--rand-source",
            &RX_V4.to_string(),
        ]);
        // SAFETY: the hook runs between fork and exec and only calls
        // prctl(2), which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| Ok(nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start hping3 (is it installed? `cargo xtask setup`)")?;
        lab::pin(child.id() as i32, lab::GEN_CPU);
        Ok(Self(child))
    }
}

impl Drop for Hping3 {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Keeps a filter installed (and the cluster cells' Redis running).
pub struct Installed {
    /// The daemon and its files; dropped (stopped, detached) first.
    pub daemon: Option<(Daemon, Files)>,
    _redis: Option<RedisServer>,
}

impl Installed {
    /// The daemon's outcome counters so far (`xdp_limiter_packets_total`
    /// by outcome), after a complete aggregation pass.
    pub fn outcomes(&self) -> Option<BTreeMap<String, f64>> {
        let (daemon, _) = self.daemon.as_ref()?;
        daemon.next_pass();
        Some(outcomes(&daemon.metrics()))
    }
}

/// `xdp_limiter_packets_total{...,outcome="X"} V` summed by outcome, and
/// the `apart` variant's clients' rule's drops as `clients_dropped`
/// (`xdp_limiter_rule_dropped_packets_total{...,rule="clients"}`).
pub fn outcomes(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix("xdp_limiter_rule_dropped_packets_total{") {
            if let Some((labels, value)) = rest.rsplit_once("} ") {
                if labels.contains(&format!("rule=\"{CLIENTS_RULE}\"")) {
                    if let Ok(value) = value.trim().parse::<f64>() {
                        *out.entry(CLIENTS_DROPPED.to_string()).or_insert(0.0) += value;
                    }
                }
            }
            continue;
        }
        let Some(rest) = line.strip_prefix("xdp_limiter_packets_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let outcome = labels
            .split(',')
            .find_map(|l| l.strip_prefix("outcome=\""))
            .map(|o| o.trim_end_matches('"'));
        if let (Some(outcome), Ok(value)) = (outcome, value.trim().parse::<f64>()) {
            *out.entry(outcome.to_string()).or_insert(0.0) += value;
        }
    }
    out
}

/// The daemon's configuration of an xdp-limiter cell: the product's
/// defaults but for the default rule, enforced.
pub fn limiter_config(attach: Attach, pps: u64, variant: Variant, redis: Option<&str>) -> String {
    let mut config = format!(
        "[daemon]\ninterfaces = [\"{RX_IF}\"]\nmode = \"{}\"\n\n\
         [default]\npps = {pps}\nwindow = \"1s\"\ndry_run = false\n",
        attach.name()
    );
    match variant {
        Variant::Node => {}
        Variant::Block => config.push_str(&format!("block = \"{BLOCK}\"\n")),
        Variant::Cluster => config.push_str("scope = \"cluster\"\n"),
        Variant::Agg16 => config.push_str(&format!("levels = [\"prefix/16:{AGG16_PPS}\"]\n")),
        Variant::Apart => config.push_str(&clients_rule(pps)),
        Variant::Minute => {
            config.push_str(&clients_rule(pps));
            config.push_str(&format!(
                "\n[[rules]]\nname = \"{MINUTE_RULE}\"\ncidr = \"0.0.0.0/0\"\nprotocol = \"udp\"\n\
                 ports = {}\npps = {MINUTE_PPS}\nwindow = \"60s\"\n",
                lab::SINK_PORT
            ));
        }
    }
    if let Some(url) = redis {
        config.push_str(&format!(
            "\n[cluster]\nredis = [\"{url}\"]\nnode = \"e2e-rx\"\n"
        ));
    }
    config
}

/// The rule of the clients' /24 at `pps` (the `apart` and `minute`
/// variants).
fn clients_rule(pps: u64) -> String {
    format!(
        "\n[[rules]]\nname = \"{CLIENTS_RULE}\"\ncidr = \"{CLIENTS_NET}\"\npps = {pps}\nwindow = \"1s\"\n"
    )
}

/// Installs `filter` in front of the server.
pub fn install(
    lab: &Lab,
    programs: &mut Programs,
    filter: Filter,
    plan: &Plan,
) -> Result<Installed> {
    let reference = Limit {
        pps: plan.reference_pps,
        burst: plan.reference_pps,
    };
    let mut installed = Installed {
        daemon: None,
        _redis: None,
    };
    match filter {
        Filter::NoFilter => {}
        Filter::XdpPass => programs.attach_floor(lab, names::PASS),
        Filter::NftMeter => scenario::nft(
            lab,
            &scenario::nft_ruleset("inet", "type filter hook input priority filter", reference),
        ),
        Filter::Hashlimit => {
            for (tool, name) in [("iptables", "xlt4"), ("ip6tables", "xlt6")] {
                let rule = scenario::hashlimit_rule(name, reference);
                lab.rx
                    .run(tool, &rule.iter().map(String::as_str).collect::<Vec<_>>());
            }
        }
        Filter::Limiter {
            attach,
            pps,
            variant,
        } => {
            let url = if variant == Variant::Cluster {
                let redis = RedisServer::start_on_all_addresses();
                Veth::connect(&lab.rx, "e2e-rdb", redis.ns(), "e2e-rds");
                lab.rx.ip(&[
                    "addr",
                    "add",
                    &format!("{REDIS_LINK_RX}/30"),
                    "dev",
                    "e2e-rdb",
                ]);
                redis.ns().ip(&[
                    "addr",
                    "add",
                    &format!("{REDIS_LINK_DB}/30"),
                    "dev",
                    "e2e-rds",
                ]);
                installed._redis = Some(redis);
                Some(format!("redis://{REDIS_LINK_DB}:{REDIS_PORT}"))
            } else {
                None
            };
            let config = limiter_config(attach, pps, variant, url.as_deref());
            let (daemon, files) = scenario::start_limiter(lab, &config);
            if variant == Variant::Cluster {
                // The node syncs with Redis before it is measured.
                let synced =
                    wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
                        daemon
                            .metric("xdp_limiter_cluster_nodes_alive")
                            .filter(|&alive| alive >= 1.0)
                    });
                if synced.is_none() {
                    bail!("the cluster node never saw itself alive:\n{}", daemon.log());
                }
            }
            installed.daemon = Some((daemon, files));
        }
    }
    Ok(installed)
}

/// A filter's runs and, for xdp-limiter, its outcome counters over them.
pub struct ServiceCell {
    pub filter: Filter,
    pub plan: Plan,
    pub runs: Vec<ServiceRun>,
    /// Outcome counters per second of flood (the cell's whole life,
    /// divided by the runs' total duration).
    pub outcomes: Option<BTreeMap<String, f64>>,
}

/// The `apart` variant's clients' frames the limiter dropped, among the
/// outcomes.
pub const CLIENTS_DROPPED: &str = "clients_dropped";

/// The outcomes a row shows, in order.
pub const OUTCOMES: [&str; 8] = [
    "passed",
    "dropped_limit",
    "cheap",
    "new_window",
    "new_source",
    "window_full",
    "proven",
    CLIENTS_DROPPED,
];

impl ServiceCell {
    pub fn stat(&self, f: impl Fn(&ServiceRun) -> f64) -> Stat {
        Stat::of(self.runs.iter().map(f))
    }

    fn outcome(&self, name: &str) -> Option<f64> {
        self.outcomes
            .as_ref()
            .map(|o| o.get(name).copied().unwrap_or(0.0))
    }

    pub fn json(&self) -> Value {
        let (kind, attach, pps, variant) = match self.filter {
            Filter::Limiter {
                attach,
                pps,
                variant,
            } => (
                self.filter.kind(),
                Some(attach.name()),
                Some(pps),
                Some(variant.name()),
            ),
            f @ (Filter::NftMeter | Filter::Hashlimit) => {
                (f.kind(), None, Some(self.plan.reference_pps), None)
            }
            f => (f.kind(), None, None, None),
        };
        let med = |f: &dyn Fn(&ServiceRun) -> f64| self.stat(f).median;
        let d = self.plan.duration.as_secs_f64();
        json!({
            "bench": "e2e",
            "mode": "service",
            "filter": kind,
            "attach": attach,
            "pps": pps,
            "variant": variant,
            "plan": self.plan,
            "flood_tool": self.plan.flood_tool,
            "success": med(&|r| r.success),
            "answered": self.answered().0,
            "requests": self.answered().1,
            "p50_ms": med(&|r| r.p50_ms),
            "p99_ms": med(&|r| r.p99_ms),
            "flood_pps": med(&|r| r.flood_pps),
            "napi_cpu": med(&|r| r.napi_cpu),
            "softirq_cpu": med(&|r| r.softirq_cpu),
            "nginx_cpu": med(&|r| r.nginx_cpu),
            "machine_cpu": med(&|r| r.machine_cpu),
            "veth_drops_per_s": med(&|r| r.veth_drops_per_s),
            "client_syn_retrans_per_s": med(&|r| r.client_syn_retrans_per_s),
            "syncookies_sent_per_s": med(&|r| r.tcp_per_s("SyncookiesSent", d)),
            "listen_drops_per_s": med(&|r| r.tcp_per_s("ListenDrops", d)),
            "daemon_outcomes_per_s": self.outcomes,
            "runs": self.runs,
        })
    }

    /// The clients' requests answered over all runs, and those made: a
    /// cell's success is judged by the whole, not by its median run.
    pub fn answered(&self) -> (u64, u64) {
        self.runs
            .iter()
            .fold((0, 0), |(ok, all), r| (ok + r.ok, all + r.scheduled))
    }

    /// One table row (the requests answered over all runs; medians over
    /// the runs for the rest).
    pub fn row(&self) -> String {
        let (ok, all) = self.answered();
        let d = self.plan.duration.as_secs_f64();
        let per_s = |name: &str| match self.outcome(name) {
            Some(v) => rate(v),
            None => "-".to_string(),
        };
        format!(
            "| {} | {} | {:.1} | {:.0} | {} | {:.0}% | {:.0}% | {:.0}% | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            self.filter.label(self.plan.reference_pps),
            answered_share(ok, all),
            self.stat(|r| r.p50_ms).median,
            self.stat(|r| r.p99_ms).median,
            rate(self.stat(|r| r.flood_pps).median),
            self.stat(|r| r.napi_cpu).median * 100.0,
            self.stat(|r| r.softirq_cpu).median * 100.0,
            self.stat(|r| r.nginx_cpu).median * 100.0,
            rate(self.stat(|r| r.veth_drops_per_s).median),
            rate(self.stat(|r| r.client_syn_retrans_per_s).median),
            rate(self.stat(|r| r.tcp_per_s("SyncookiesSent", d)).median),
            rate(self.stat(|r| r.tcp_per_s("ListenDrops", d)).median),
            per_s(OUTCOMES[0]),
            per_s(OUTCOMES[1]),
            per_s(OUTCOMES[2]),
            per_s(OUTCOMES[3]),
            per_s(OUTCOMES[4]),
            per_s(OUTCOMES[5]),
            per_s(OUTCOMES[6]),
            match self.filter {
                Filter::Limiter {
                    variant: Variant::Apart | Variant::Minute,
                    ..
                } => per_s(OUTCOMES[7]),
                _ => "-".to_string(),
            },
        )
    }
}

/// `ok` of `all` requests as a share and the counts: `99.7% (598 of 600)`.
pub fn answered_share(ok: u64, all: u64) -> String {
    let share = ok as f64 * 100.0 / all.max(1) as f64;
    // Rounded down, so a cell that lost a request never reads 100.0%.
    let share = (share * 10.0).floor() / 10.0;
    format!("{share:.1}% ({ok} of {all})")
}

/// The table's header (matching [`ServiceCell::row`]).
pub const TABLE_HEADER: &str = "| filter | clients' requests answered (all runs) | p50 ms | p99 ms | flood sent | NAPI thread CPU | softirq CPU (all CPUs) | nginx CPU | frames dropped at the veth /s | clients' SYN retransmits /s | SYN cookies sent /s | listen drops /s | passed /s | dropped_limit /s | cheap /s | new_window /s | new_source /s | window_full /s | proven /s | clients' frames dropped /s (`apart`, `minute`) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

/// Runs `filter`'s cell: a lab of its own with nginx, the filter, and
/// `runs` runs at `plan`. `None` when interrupted.
pub fn run_cell(
    filter: Filter,
    plan: &Plan,
    runs: usize,
    interrupted: &AtomicBool,
) -> Result<Option<ServiceCell>> {
    let lab = Lab::new();
    let addresses = if plan.flood_source.newcomers_after().is_some() {
        plan.clients * runs
    } else {
        plan.clients
    };
    prepare_lab(&lab, addresses)?;
    let mut programs = Programs::load(&lab, &Mix::random_only(plan.flood_source.random_bits()));
    // The aimed flood is the mix itself (stamped UDP to the sink); the
    // others are SYNs at the server's port.
    if plan.flood_source != FloodSource::Aimed {
        programs.set_syn_flood(&lab, HTTP_PORT, plan.flood_source.random_bits());
    }
    programs.set_rate(Rate::Fixed(plan.flood_pps.max(1)));
    let nginx = Nginx::start(&lab)?;
    let installed = install(&lab, &mut programs, filter, plan)?;
    let before = installed.outcomes();
    let mut done = Vec::new();
    for i in 0..runs {
        let Some(run) = run_once(&lab, &programs, &nginx, plan, i, interrupted) else {
            return Ok(None);
        };
        done.push(run);
    }
    let after = installed.outcomes();
    let flood_secs = plan.duration.as_secs_f64() * runs as f64;
    let outcomes = match (before, after) {
        (Some(before), Some(after)) => Some(
            after
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        (v - before.get(k).copied().unwrap_or(0.0)) / flood_secs,
                    )
                })
                .collect(),
        ),
        _ => None,
    };
    // The daemon goes before the lab (it detaches from the veth).
    drop(installed);
    Ok(Some(ServiceCell {
        filter,
        plan: *plan,
        runs: done,
        outcomes,
    }))
}

/// The name of `plan`'s section of docs/benchmarks.md (and of its saved
/// figures): `generator`, `hping3` or `aimed`.
pub fn section(plan: &Plan) -> &'static str {
    match (plan.flood_source, plan.flood_tool) {
        (FloodSource::Aimed, _) => "aimed",
        (_, tool) => tool.name(),
    }
}

/// What the service section of docs/benchmarks.md says about its set-up.
pub fn describe(plan: &Plan, runs: usize) -> String {
    let flood = match plan.flood_tool {
        FloodTool::Generator if plan.flood_source == FloodSource::Aimed => format!(
            "an aimed flood of spoofed UDP datagrams paced at {} frames a second from random addresses in {} \
             ({} addresses, four times the default windows; {:.1} frames a second each on average: under the limit, \
             past a 10 pps rule's cheap frames) to a UDP port of the server's address (the live-frames generator, \
             nice 19 on CPU {}), starting {:.0} s before the clients, which are new addresses each run",
            rate(plan.flood_pps as f64),
            SPOOFED_AIMED,
            1u64 << AIMED_BITS,
            plan.flood_pps as f64 / f64::from(1u32 << AIMED_BITS),
            lab::GEN_CPU,
            AIMED_LEAD.as_secs_f64(),
        ),
        FloodTool::Generator => format!(
            "a spoofed SYN flood paced at {} frames a second from random addresses in {} \
             (the live-frames generator, nice 19 on CPU {}: its frames enter the receiving veth's ring directly)",
            rate(plan.flood_pps as f64),
            plan.flood_source.addresses(),
            lab::GEN_CPU
        ),
        FloodTool::Hping3 => format!(
            "a spoofed SYN flood from `hping3 -S --flood --rand-source` (unpaced, on CPU {}, through the sending \
             namespace's stack like the clients' frames; \"flood sent\" is what reached the receiving veth or was \
             dropped at its ring)",
            lab::GEN_CPU
        ),
    };
    format!(
        "nginx (Debian's `nginx-light`, one process, listen backlog 511, a {}-byte static page) in the receiving namespace; \
         {} clients in the sending namespace, one address each, {} requests a second each, a new TCP connection per request \
         (HTTP/1.0 `GET /`, the whole response within {:.0} s or failed); {flood}; the SYN-ACKs \
         are routed back to the sending namespace and dropped there; clients (and flood) for {:.0} s, \
         {runs} runs per cell after 1.2 s of quiet and an idle machine, medians shown; nftables and hashlimit at {} pps \
         per source (burst the same), xdp-limiter with the product's defaults (65,536 windows, 16,384 hot sources) and \
         its default rule at the limit shown, enforced (`block` = {BLOCK}; cluster: one Redis in the lab; `agg16`: \
         `levels = [\"prefix/16:{AGG16_PPS}\"]`; \
         `apart`: the clients' /24 under a rule of its own at the same limit; `minute`: `apart`, and the flood's UDP \
         port under a rule of {MINUTE_PPS} pps over 60 s, no cheap frames); the \
         daemon's outcomes are per second of flood",
        PAGE.len(),
        plan.clients,
        plan.client_rate,
        plan.timeout.as_secs_f64(),
        plan.duration.as_secs_f64(),
        plan.reference_pps,
    )
}

/// Replaces the generated service section of `doc` for `plan`'s flood
/// (one section per tool, and one for the aimed flood; appended the
/// first time).
pub fn write_docs(
    doc: &Path,
    plan: &Plan,
    when: &str,
    machine: &str,
    setup: &str,
    cells: &[ServiceCell],
) -> Result<()> {
    let name = section(plan);
    let command = match plan.flood_source {
        FloodSource::Aimed => "--flood-source aimed".to_string(),
        _ => format!("--flood-tool {}", plan.flood_tool.name()),
    };
    let begin = format!(
        "<!-- e2e-service-{name}:begin (generated by `cargo xtask bench e2e -- --modes service {command}`; edits here are overwritten) -->"
    );
    let end = format!("<!-- e2e-service-{name}:end -->");
    let (begin, end) = (begin.as_str(), end.as_str());
    let mut md =
        format!("{begin}\n\nMeasured {when} on {machine}.\n\n- {setup}.\n\n{TABLE_HEADER}\n");
    for cell in cells {
        md.push_str(&cell.row());
        md.push('\n');
    }
    md.push('\n');
    md.push_str(end);
    let old = fs::read_to_string(doc).unwrap_or_default();
    let new = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if e > b => format!("{}{}{}", &old[..b], md, &old[e + end.len()..]),
        _ => format!("{old}\n{md}\n"),
    };
    fs::write(doc, new).with_context(|| doc.display().to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_summed_by_outcome_label() {
        let text =
            "# HELP x\nxdp_limiter_packets_total{interface=\"e2e-rx\",outcome=\"cheap\"} 10\n\
                    xdp_limiter_packets_total{interface=\"other\",outcome=\"cheap\"} 5\n\
                    xdp_limiter_packets_total{interface=\"e2e-rx\",outcome=\"new_window\"} 3\n\
                    xdp_limiter_bytes_total{interface=\"e2e-rx\",outcome=\"cheap\"} 999\n";
        let o = outcomes(text);
        assert_eq!(o.get("cheap"), Some(&15.0));
        assert_eq!(o.get("new_window"), Some(&3.0));
        assert_eq!(o.len(), 2);
        let apart = "xdp_limiter_rule_dropped_packets_total{interface=\"e2e-rx\",rule=\"clients\"} 7\n\
                     xdp_limiter_rule_dropped_packets_total{interface=\"e2e-rx\",rule=\"default\"} 900\n";
        assert_eq!(outcomes(apart).get(CLIENTS_DROPPED), Some(&7.0));
        assert_eq!(outcomes(apart).len(), 1);
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v[..1], 0.99), 1.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn the_matrix_selects_kinds_limits_and_variants() {
        let all = Filter::matrix(&[], &[10, 100, 1000], &Variant::ALL);
        assert_eq!(all.len(), 4 + 2 * 3 * Variant::ALL.len());
        let some = Filter::matrix(
            &["xdp-limiter-generic".into(), "no-filter".into()],
            &[100],
            &[Variant::Node],
        );
        assert_eq!(
            some,
            vec![
                Filter::NoFilter,
                Filter::Limiter {
                    attach: Attach::Generic,
                    pps: 100,
                    variant: Variant::Node
                }
            ]
        );
    }

    #[test]
    fn cluster_configs_have_a_cluster_section_and_no_block() {
        let c = limiter_config(
            Attach::Native,
            100,
            Variant::Cluster,
            Some("redis://10.99.0.2:6379"),
        );
        assert!(c.contains("scope = \"cluster\"") && c.contains("[cluster]"));
        assert!(!c.contains("block"));
        let b = limiter_config(Attach::Generic, 10, Variant::Block, None);
        assert!(b.contains("mode = \"generic\"") && b.contains("block = \"10s\""));
        let a = limiter_config(Attach::Native, 100, Variant::Agg16, None);
        assert!(a.contains("levels = [\"prefix/16:10000\"]") && !a.contains("block"));
        let m = limiter_config(Attach::Native, 10, Variant::Minute, None);
        assert!(m.contains("name = \"flood-port\""));
        assert!(m.contains("name = \"clients\"") && m.contains("ports = 9000"));
        assert!(m.contains("pps = 2\nwindow = \"60s\""));
    }

    #[test]
    fn a_cell_that_lost_a_request_never_reads_100_percent() {
        assert_eq!(answered_share(600, 600), "100.0% (600 of 600)");
        assert_eq!(answered_share(599, 600), "99.8% (599 of 600)");
        assert_eq!(answered_share(5999, 6000), "99.9% (5999 of 6000)");
        assert_eq!(answered_share(0, 0), "0.0% (0 of 0)");
    }
}
