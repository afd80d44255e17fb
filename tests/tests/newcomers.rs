//! Issue 50: new TCP clients are served while a spoofed flood, every
//! address of it under its limit, fills the kept windows.
//!
//! The kernel keeps one shared window per source in `WINDOWS`, a hash of
//! `daemon.max_sources` entries that never evicts. A flood from more
//! addresses than that, each sending a few frames a second (under its
//! limit, past its cheap frames), fills it; from then on a source that
//! needs a new window is refused past its cheap frames (`window_full`, one
//! frame per two seconds under a 10 pps rule). A real client arriving
//! after the flood began gets its SYN through and little else, so it
//! cannot complete a request: in the trial with nginx, 0 of 400.
//!
//! This test builds that situation for real: the daemon guards the
//! receiver's veth of a two-namespace lab (10 pps per source, a 1 s
//! window, `max_sources = 1024`, enforcing), a TCP server answers in the
//! receiver's namespace, and the sender's namespace floods from 4,096
//! spoofed addresses at 3 frames a second each (raw IPv4, kept up for the
//! whole test). Once the daemon reports the windows full, 50 clients from
//! 50 addresses of the sender make 8 requests each, one connection per
//! request, one request a second (about 5 frames from the client each:
//! half its limit), and every request must be answered.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::{AsRawFd, OwnedFd},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{
    daemon::{Daemon, Files},
    lab::{Lab, RX_ADDR, RX_IF},
    netns::NetNs,
    packets::{self, ETH_LEN},
    SetOnDrop,
};
use limiter_user::{
    daemon::{PROVEN_ROOM, SHARED_ROOM},
    rules::DEFAULT_RULE_NAME,
};
use nix::{
    errno::Errno,
    sys::{
        socket::{
            bind, connect, sendto, setsockopt, socket, sockopt, AddressFamily, MsgFlags, SockFlag,
            SockProtocol, SockType, SockaddrIn,
        },
        time::{TimeVal, TimeValLike},
    },
};

/// `daemon.max_sources`: the kept windows the flood fills.
const MAX_SOURCES: u32 = 1024;
/// The default rule's rate (1 s window, the default): its cheap frames are
/// 1, so a source sending 2 frames in two seconds needs a window.
const PPS: u32 = 10;
/// Spoofed flood sources (10.50.0.0 + i), 4 times the windows there are.
const FLOOD_SOURCES: u32 = 4 * MAX_SOURCES;
/// Frames a second from each flood source: under `PPS`, past the cheap
/// frames, and often enough that no window it holds ever goes idle
/// (1.6 s without a frame).
const FLOOD_RATE: u32 = 3;
/// Frames the flood sends at once: far under the veth ring's 256 slots,
/// so the flood never crowds the clients' frames out of it.
const FLOOD_CHUNK: u32 = 32;
/// The flood stops after this long whatever happens.
const FLOOD_LIMIT: Duration = Duration::from_secs(40);
/// Where the flood's datagrams go (no one listens).
const FLOOD_PORT: u16 = 9;

/// The new clients: 192.0.2.100 to .149, on the sender's veth.
const CLIENTS: u8 = 50;
const REQUESTS: u32 = 8;
/// One request a second per client: about 5 frames of the client each
/// (SYN, ACK, request, ACK, FIN), half its 10 a second.
const EVERY: Duration = Duration::from_secs(1);
/// Connect and read timeouts of a client (the server's too).
const TIMEOUT: Duration = Duration::from_secs(3);
const PORT: u16 = 8080;

fn client(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, 100 + i)
}

fn flood_source(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 50, 0, 0)) + i)
}

fn series(name: &str, outcome: &str) -> String {
    format!("{name}{{interface=\"{RX_IF}\",outcome=\"{outcome}\"}}")
}

/// The daemon's configuration: the default rule (the flood's, and the
/// clients' unless `rules` gives them one of their own).
fn config(rules: &str) -> String {
    format!(
        "[daemon]\ntick = \"100ms\"\nmax_sources = {MAX_SOURCES}\n\n\
         [default]\npps = {PPS}\ndry_run = false\n\n{rules}"
    )
}

/// What the clients do: `requests` each, one every `every`.
#[derive(Clone, Copy)]
struct Schedule {
    requests: u32,
    every: Duration,
}

/// The clients: 8 requests each, one a second (5 frames a
/// request: half the 10 pps limit).
const STEADY: Schedule = Schedule {
    requests: REQUESTS,
    every: EVERY,
};

/// What the flood sent.
#[derive(Default)]
struct FloodStats {
    sent: AtomicU64,
    errors: AtomicU64,
}

/// A raw IPv4 socket in `ns` (`IPPROTO_RAW`: the frames carry their own
/// header, so any source address goes).
fn raw_socket(ns: &NetNs) -> OwnedFd {
    ns.enter(|| {
        socket(
            AddressFamily::Inet,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::Raw,
        )
        .expect("a raw IPv4 socket in the sender's namespace")
    })
}

/// Sends UDP datagrams from every flood source at `FLOOD_RATE` a second,
/// `FLOOD_CHUNK` at a time evenly paced, until `stop` (or `FLOOD_LIMIT`).
fn flood(socket: &OwnedFd, stop: &AtomicBool, stats: &FloodStats) {
    let frame = packets::udp_v4(flood_source(0), RX_ADDR, FLOOD_PORT, 18);
    // IPv4 header and UDP from the Ethernet frame; the kernel fills in
    // the header checksum, and a zero UDP checksum is none.
    let mut datagram = frame[ETH_LEN..].to_vec();
    datagram[26..28].copy_from_slice(&[0, 0]);
    let to = SockaddrIn::from(SocketAddrV4::new(RX_ADDR, 0));
    let chunk_every = Duration::from_secs(1) / (FLOOD_SOURCES * FLOOD_RATE / FLOOD_CHUNK);
    let started = Instant::now();
    let mut next = started;
    let mut i = 0u32;
    while !stop.load(Ordering::Relaxed) && started.elapsed() < FLOOD_LIMIT {
        for _ in 0..FLOOD_CHUNK {
            datagram[12..16].copy_from_slice(&flood_source(i).octets());
            match sendto(socket.as_raw_fd(), &datagram, &to, MsgFlags::empty()) {
                Ok(_) => stats.sent.fetch_add(1, Ordering::Relaxed),
                Err(_) => stats.errors.fetch_add(1, Ordering::Relaxed),
            };
            i = (i + 1) % FLOOD_SOURCES;
        }
        // Pacing: the flood's rate, not a wait for anything.
        next += chunk_every;
        if let Some(ahead) = next.checked_duration_since(Instant::now()) {
            thread::sleep(ahead);
        }
    }
}

/// Answers each connection: reads one request line, writes `ok <line>`,
/// closes. Returns once `stop` is set and a connection wakes it.
fn serve<'scope>(
    scope: &'scope thread::Scope<'scope, '_>,
    listener: &TcpListener,
    stop: &AtomicBool,
) {
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::Relaxed) {
            return;
        }
        // A connection that failed before it was accepted: the next one.
        let Ok((conn, _)) = accepted else {
            continue;
        };
        scope.spawn(move || {
            conn.set_read_timeout(Some(TIMEOUT)).expect("read timeout");
            conn.set_write_timeout(Some(TIMEOUT))
                .expect("write timeout");
            let mut line = String::new();
            let mut reader = BufReader::new(&conn);
            if reader.read_line(&mut line).is_ok() && line.ends_with('\n') {
                let _ = (&conn).write_all(format!("ok {line}").as_bytes());
            }
        });
    }
}

/// Stops the server on the way out of the test's scope, a failed assertion
/// included: sets its flag and wakes its `accept` with a connection of
/// the receiver's own (over loopback, not the guarded veth).
struct StopServer<'a> {
    stop: &'a AtomicBool,
    rx: &'a NetNs,
}

impl Drop for StopServer<'_> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let woken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.rx.enter(|| {
                TcpStream::connect_timeout(&SocketAddrV4::new(RX_ADDR, PORT).into(), TIMEOUT)
            })
        }));
        if !matches!(woken, Ok(Ok(_))) {
            eprintln!("could not wake the server to stop it");
        }
    }
}

/// How one request ended.
enum Outcome {
    Answered(Duration),
    /// `connect` failed (EINPROGRESS: it timed out).
    Connect(Errno),
    /// Connected, but the answer did not come (or not whole).
    NoAnswer(std::io::ErrorKind),
}

impl Outcome {
    /// A failure's kind, for the report; `None` when answered.
    fn failure(&self) -> Option<String> {
        match self {
            Outcome::Answered(_) => None,
            Outcome::Connect(e) => Some(format!("connect: {e}")),
            Outcome::NoAnswer(kind) => Some(format!("no answer: {kind}")),
        }
    }
}

/// One request from `from` on a new connection: `GET <tag>`, expecting
/// `ok GET <tag>` and the server's close. Runs in the sender's namespace.
fn request(from: Ipv4Addr, tag: &str) -> Outcome {
    let started = Instant::now();
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("a TCP socket");
    bind(
        fd.as_raw_fd(),
        &SockaddrIn::from(SocketAddrV4::new(from, 0)),
    )
    .unwrap_or_else(|e| panic!("bind {from}: {e}"));
    // A blocking connect gives up after SO_SNDTIMEO (with EINPROGRESS).
    let timeout = TimeVal::milliseconds(TIMEOUT.as_millis() as i64);
    setsockopt(&fd, sockopt::SendTimeout, &timeout).expect("SO_SNDTIMEO");
    if let Err(e) = connect(
        fd.as_raw_fd(),
        &SockaddrIn::from(SocketAddrV4::new(RX_ADDR, PORT)),
    ) {
        return Outcome::Connect(e);
    }
    let mut stream = TcpStream::from(fd);
    stream
        .set_read_timeout(Some(TIMEOUT))
        .expect("read timeout");
    let request = format!("GET {tag}\n");
    if let Err(e) = stream.write_all(request.as_bytes()) {
        return Outcome::NoAnswer(e.kind());
    }
    let mut answer = String::new();
    match stream.read_to_string(&mut answer) {
        Ok(_) if answer == format!("ok {request}") => Outcome::Answered(started.elapsed()),
        Ok(_) => Outcome::NoAnswer(std::io::ErrorKind::UnexpectedEof),
        Err(e) => Outcome::NoAnswer(e.kind()),
    }
}

/// Every client's requests on their schedule, each on a thread of its own
/// so an unanswered one does not delay the next: request `r` of client
/// `c` starts at `r * EVERY`, clients spread over one `EVERY`. Runs in
/// the sender's namespace (threads inherit it).
fn run_clients(schedule: Schedule) -> Vec<(Ipv4Addr, Outcome)> {
    let Schedule { requests, every } = schedule;
    let outcomes = Mutex::new(Vec::new());
    let start = Instant::now();
    thread::scope(|scope| {
        for c in 0..CLIENTS {
            for r in 0..requests {
                let at = start + r * every + every * u32::from(c) / u32::from(CLIENTS);
                let outcomes = &outcomes;
                scope.spawn(move || {
                    // Pacing: the request's slot in the schedule.
                    if let Some(ahead) = at.checked_duration_since(Instant::now()) {
                        thread::sleep(ahead);
                    }
                    let from = client(c);
                    let outcome = request(from, &format!("{from}/{r}"));
                    outcomes.lock().expect("not poisoned").push((from, outcome));
                });
            }
        }
    });
    outcomes.into_inner().expect("not poisoned")
}

#[test]
fn new_tcp_clients_are_served_while_a_flood_under_the_limit_fills_the_windows() {
    newcomers_under_the_flood("", STEADY, Expect::Proof);
}

/// The clients under a rule of their own on the server's port, without
/// cheap frames (1 pps over a minute: 60 frames a minute, 2 requests
/// each), the flood under the default rule: the flood takes the default
/// rule's reserve of tickets and the shared room, and the clients' rule
/// keeps its own reserve, where they get their windows (issue 50: a new
/// source under another rule got 10 of 60).
#[test]
fn new_tcp_clients_of_a_per_minute_rule_keep_their_rules_room_while_another_rules_flood_fills_its_own(
) {
    let rule = format!(
        "[[rules]]\nname = \"web\"\ncidr = \"0.0.0.0/0\"\nprotocol = \"tcp\"\n\
         ports = {PORT}\npps = 1\nwindow = \"60s\"\n"
    );
    let schedule = Schedule {
        requests: 2,
        every: Duration::from_secs(2),
    };
    newcomers_under_the_flood(&rule, schedule, Expect::OwnRoom("web"));
}

/// How the new clients get their windows while the flood holds every
/// ticket it can.
#[derive(Clone, Copy)]
enum Expect {
    /// Under the flood's rule: by proving themselves (cookies).
    Proof,
    /// Under a rule of their own: from its reserve of tickets.
    OwnRoom(&'static str),
}

/// The flood fills its rooms of tickets (the default rule's reserve and
/// the shared room); then the clients run `schedule` under the rules of
/// `rules` (with the default's); every request must be answered, the
/// way `expect` says.
fn newcomers_under_the_flood(rules: &str, schedule: Schedule, expect: Expect) {
    let clients: Vec<Ipv4Addr> = (0..CLIENTS).map(client).collect();
    let lab = Lab::new(&clients);
    let files = Files::new();
    files.write_config(&config(rules));
    let config = files.config();
    let daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().expect("utf-8 path")],
    );
    let listener = lab.rx.enter(|| {
        TcpListener::bind(SocketAddrV4::new(RX_ADDR, PORT)).expect("listen in the receiver")
    });
    let raw = raw_socket(&lab.tx);
    let syncookies = || {
        let out = lab.rx.run("sysctl", &["-n", "net.ipv4.tcp_syncookies"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let syncookies_before = syncookies();

    let kept = format!("xdp_limiter_windows_kept{{interface=\"{RX_IF}\"}}");
    let room =
        |metric: &str, room: &str| format!("{metric}{{interface=\"{RX_IF}\",room=\"{room}\"}}");
    let capacity = format!("xdp_limiter_window_capacity{{interface=\"{RX_IF}\"}}");
    let window_full = series("xdp_limiter_packets_total", "window_full");

    let stop_flood = AtomicBool::new(false);
    let stop_server = AtomicBool::new(false);
    let stats = FloodStats::default();
    thread::scope(|scope| {
        scope.spawn(|| serve(scope, &listener, &stop_server));
        let _server = StopServer {
            stop: &stop_server,
            rx: &lab.rx,
        };
        scope.spawn(|| flood(&raw, &stop_flood, &stats));
        let _flood = SetOnDrop(&stop_flood);

        // The flood has filled its rooms of tickets (the default rule's
        // reserve and the shared room), and sources are being refused a
        // window.
        let capacity_seen = daemon.wait_metric(&capacity, |v| v > 0.0);
        assert_eq!(capacity_seen, f64::from(MAX_SOURCES));
        for name in [DEFAULT_RULE_NAME, SHARED_ROOM] {
            let size = daemon.wait_metric(&room("xdp_limiter_ticket_room", name), |v| v > 0.0);
            daemon.wait_metric(&room("xdp_limiter_tickets", name), |v| v >= size);
        }
        let full_before = daemon.wait_metric(&window_full, |v| v > 0.0);
        // One complete aggregation pass with the windows full, as any
        // new source arriving in the middle of such a flood would meet.
        daemon.next_pass();
        let syncookies_during = syncookies();

        let began = Instant::now();
        let outcomes = lab.tx.enter(|| run_clients(schedule));
        let took = began.elapsed();

        daemon.next_pass();
        let metrics = daemon.metrics();
        let value = |s: &str| limiter_tests::daemon::parse_metric(&metrics, s);
        let full_after = value(&window_full).unwrap_or(0.0);
        let kept_after = value(&kept).unwrap_or(0.0);
        let outcome = |name: &str| {
            value(&series("xdp_limiter_packets_total", name))
                .map_or_else(|| "absent".to_string(), |v| v.to_string())
        };

        let mut latencies: Vec<Duration> = Vec::new();
        let mut failures: BTreeMap<String, usize> = BTreeMap::new();
        let mut per_client: BTreeMap<Ipv4Addr, u32> = clients.iter().map(|c| (*c, 0)).collect();
        for (from, outcome) in &outcomes {
            match outcome {
                Outcome::Answered(latency) => {
                    latencies.push(*latency);
                    *per_client.get_mut(from).expect("a client") += 1;
                }
                other => {
                    let kind = other.failure().expect("a failure");
                    *failures.entry(kind).or_insert(0) += 1;
                }
            }
        }
        latencies.sort();
        let total = usize::from(CLIENTS) * schedule.requests as usize;
        let answered = latencies.len();
        let p99 = latencies
            .get((answered * 99).div_ceil(100).saturating_sub(1))
            .copied();
        let served_clients = per_client.values().filter(|n| **n > 0).count();
        let fully_served = per_client
            .values()
            .filter(|n| **n == schedule.requests)
            .count();
        println!(
            "newcomers: answered {answered}/{total} requests in {took:.1?}; \
             clients with any answer {served_clients}/{CLIENTS}, with all {fully_served}/{CLIENTS}; \
             p99 latency {p99:?}; failures {failures:?}"
        );
        println!(
            "newcomers: window_full {full_before} before the clients, {full_after} after; \
             windows_kept {kept_after}/{capacity_seen}; proven {}; unproven_syn {}; \
             passed {}; dropped_limit {}; tcp_syncookies {syncookies_before} before the flood, \
             {syncookies_during} during it; flood {} datagrams from {FLOOD_SOURCES} sources \
             ({} send errors)",
            outcome("proven"),
            outcome("unproven_syn"),
            outcome("passed"),
            outcome("dropped_limit"),
            stats.sent.load(Ordering::Relaxed),
            stats.errors.load(Ordering::Relaxed),
        );

        assert_eq!(
            stats.errors.load(Ordering::Relaxed),
            0,
            "the flood's datagrams all left"
        );
        assert!(
            full_after > full_before,
            "the flood kept the windows full while the clients ran \
             (window_full {full_before} -> {full_after})"
        );
        assert_eq!(
            answered, total,
            "every new client's request answered while the flood fills the windows \
             (per client: {per_client:?})"
        );
        match expect {
            Expect::Proof => {
                let proven = value(&series("xdp_limiter_packets_total", "proven"));
                assert!(
                    proven.unwrap_or(0.0) > 0.0,
                    "the clients proved themselves to get their windows"
                );
                // Their windows hold tickets of the proven room, a quarter
                // of the tickets, at most one a client.
                let held = value(&room("xdp_limiter_tickets", PROVEN_ROOM));
                let size = value(&room("xdp_limiter_ticket_room", PROVEN_ROOM));
                assert_eq!(size, Some(f64::from(MAX_SOURCES / 4)));
                assert!(
                    held.is_some_and(|n| n <= f64::from(CLIENTS)),
                    "proven tickets {held:?}"
                );
            }
            Expect::OwnRoom(name) => {
                let own = value(&room("xdp_limiter_tickets", name)).unwrap_or(0.0);
                assert!(
                    own >= f64::from(CLIENTS),
                    "the clients' windows took their rule's reserve: {own} tickets"
                );
            }
        }
    });
}
