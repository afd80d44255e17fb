//! `cargo xtask demo`: a throwaway lab (two namespaces and a veth pair),
//! the real daemon guarding the receiver in enforce mode, and a mix of
//! traffic from 20 source addresses: 16 well under the limit, 4 far over
//! it. Every second it shows what each source sent and what got through,
//! and what the daemon's /metrics endpoint says; then it tears everything
//! down (also on Ctrl-C). It checks what it shows, and exits non-zero if
//! a light source lost a frame or a heavy one got more in a second than
//! its limit and the documented bound.

use std::{
    collections::BTreeMap,
    fs::File,
    net::{IpAddr, Ipv4Addr, SocketAddrV4, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{
    daemon::{parse_metric, Daemon, Files},
    lab::{Lab, RX_ADDR, RX_IF},
};
use nix::sched::{setns, CloneFlags};

const PORT: u16 = 9000;
const LIMIT_PPS: u64 = 100;
const LIGHT_PPS: u64 = 40;
const HEAVY_PPS: u64 = 1000;
const SECONDS: u64 = 8;
/// The buckets of the 1 s window (the daemon's default, 10).
const BUCKETS: u64 = 10;
/// What a heavy source may get in any one second beyond the limit, as
/// docs/architecture.md states it: the cheap tier's frames, never counted
/// in a window (a tenth of the limit, in the second a source starts), and
/// the sliding window's own error over a second that is not one of its
/// windows (the oldest bucket it half covers: a tenth of the limit for a
/// steady sender); and one frame either way across the edge of a second
/// here (the receiver counts what arrived by then).
const HEAVY_BOUND: u64 = LIMIT_PPS / 10 + LIMIT_PPS / BUCKETS + 1;

static STOP: AtomicBool = AtomicBool::new(false);
static STOPPED_EARLY: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: i32) {
    STOP.store(true, Ordering::Relaxed);
    STOPPED_EARLY.store(true, Ordering::Relaxed);
}

fn enter(ns: &str) {
    let file = File::open(format!("/run/netns/{ns}")).expect("open netns");
    setns(file, CloneFlags::CLONE_NEWNET).expect("setns");
}

struct Source {
    addr: Ipv4Addr,
    pps: u64,
    sent: AtomicU64,
}

fn main() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGINT,
            nix::sys::signal::SigHandler::Handler(on_interrupt),
        )
        .expect("install SIGINT handler");
    }
    let sources: Vec<Arc<Source>> = (0..20u8)
        .map(|i| {
            Arc::new(Source {
                addr: Ipv4Addr::new(192, 0, 2, 10 + i),
                pps: if i < 16 { LIGHT_PPS } else { HEAVY_PPS },
                sent: AtomicU64::new(0),
            })
        })
        .collect();
    let addrs: Vec<Ipv4Addr> = sources.iter().map(|s| s.addr).collect();
    println!("== lab: namespaces tx/rx, veth pair, 20 sources in 192.0.2.0/24 -> {RX_ADDR}");
    let lab = Lab::new(&addrs);
    let files = Files::new();
    files.write_config(&format!(
        "# demo: every source may send {LIMIT_PPS} packets per second\n\
         [daemon]\ntick = \"500ms\"\n\n[default]\npps = {LIMIT_PPS}\nwindow = \"1s\"\ndry_run = false\n"
    ));
    println!(
        "== config:\n{}",
        std::fs::read_to_string(files.config()).unwrap_or_default()
    );
    let config = files.config();
    let daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().expect("utf-8")],
    );
    println!(
        "== daemon: {}",
        daemon
            .log()
            .lines()
            .find(|l| l.contains("protecting"))
            .unwrap_or("started")
    );

    let received: Arc<Mutex<BTreeMap<Ipv4Addr, u64>>> = Arc::default();
    // The senders start once the receiver's socket is bound: a frame
    // before that would be refused by the stack, not by the limiter.
    let (bound, ready) = std::sync::mpsc::channel();
    let receiver = {
        let received = Arc::clone(&received);
        let ns = lab.rx.name().to_string();
        thread::spawn(move || {
            enter(&ns);
            let socket = UdpSocket::bind(SocketAddrV4::new(RX_ADDR, PORT)).expect("bind");
            let _ = bound.send(());
            socket
                .set_read_timeout(Some(Duration::from_millis(100)))
                .expect("timeout");
            let mut buf = [0u8; 2048];
            // After the senders stop, what is still on its way arrives: the
            // receiver stops at the first 100 ms without a frame.
            loop {
                match socket.recv_from(&mut buf) {
                    Ok((_, from)) => {
                        if let IpAddr::V4(from) = from.ip() {
                            *received.lock().expect("lock").entry(from).or_default() += 1;
                        }
                    }
                    Err(_) if STOP.load(Ordering::Relaxed) => break,
                    Err(_) => {}
                }
            }
        })
    };
    ready.recv().expect("the receiver binds its socket");
    let start = Instant::now();
    let senders: Vec<_> = sources
        .iter()
        .map(|source| {
            let source = Arc::clone(source);
            let ns = lab.tx.name().to_string();
            thread::spawn(move || {
                enter(&ns);
                let socket = UdpSocket::bind(SocketAddrV4::new(source.addr, 0)).expect("bind");
                let interval = Duration::from_nanos(1_000_000_000 / source.pps);
                let mut next = start;
                while !STOP.load(Ordering::Relaxed)
                    && start.elapsed() < Duration::from_secs(SECONDS)
                {
                    if socket
                        .send_to(&[0u8; 64], SocketAddrV4::new(RX_ADDR, PORT))
                        .is_ok()
                    {
                        source.sent.fetch_add(1, Ordering::Relaxed);
                    }
                    next += interval;
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        thread::sleep(wait);
                    }
                }
            })
        })
        .collect();

    let mut last_sent: BTreeMap<Ipv4Addr, u64> = BTreeMap::new();
    let mut last_received: BTreeMap<Ipv4Addr, u64> = BTreeMap::new();
    // What broke a promise, for the verdict at the end.
    let mut broken: Vec<String> = Vec::new();
    for second in 1..=SECONDS {
        let tick = start + Duration::from_secs(second);
        while Instant::now() < tick && !STOP.load(Ordering::Relaxed) {
            thread::sleep(Duration::from_millis(20));
        }
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        println!("\n== second {second}: per source (limit {LIMIT_PPS} pps)");
        println!(
            "{:<14} {:>9} {:>9} {:>8}  state",
            "source", "sent/s", "passed/s", "dropped"
        );
        let now_received = received.lock().expect("lock").clone();
        for source in &sources {
            let sent = source.sent.load(Ordering::Relaxed);
            let got = now_received.get(&source.addr).copied().unwrap_or(0);
            let d_sent = sent - last_sent.insert(source.addr, sent).unwrap_or(0);
            let d_got = got - last_received.insert(source.addr, got).unwrap_or(0);
            let dropped = if d_sent == 0 {
                0.0
            } else {
                100.0 * (1.0 - d_got as f64 / d_sent as f64)
            };
            // Refused frames, not a frame still on its way at the sample:
            // more gone than a couple since the start.
            let behind = sent.saturating_sub(got);
            let state = if behind > 2 { "LIMITED" } else { "ok" };
            if source.pps == HEAVY_PPS && d_got > LIMIT_PPS + HEAVY_BOUND {
                broken.push(format!(
                    "{} got {d_got} in second {second}: over {LIMIT_PPS} and the bound of {HEAVY_BOUND}",
                    source.addr
                ));
            }
            println!(
                "{:<14} {:>9} {:>9} {:>7.1}%  {state}",
                source.addr.to_string(),
                d_sent,
                d_got,
                dropped.max(0.0)
            );
        }
        let metrics = daemon.metrics();
        let get = |series: &str| parse_metric(&metrics, series).unwrap_or(0.0);
        let outcome = |o: &str| {
            get(&format!(
                "xdp_limiter_packets_total{{interface=\"{RX_IF}\",outcome=\"{o}\"}}"
            ))
        };
        println!(
            "/metrics: passed {} dropped_limit {} tracked_sources {} limited_sources {}",
            outcome("passed"),
            outcome("dropped_limit"),
            get(&format!(
                "xdp_limiter_tracked_sources{{interface=\"{RX_IF}\"}}"
            )),
            get(&format!(
                "xdp_limiter_limited_sources{{interface=\"{RX_IF}\"}}"
            )),
        );
    }
    for sender in senders {
        let _ = sender.join();
    }
    STOP.store(true, Ordering::Relaxed);
    let _ = receiver.join();
    let received = received.lock().expect("lock").clone();
    let (mut light_sent, mut light_got) = (0, 0);
    for source in sources.iter().filter(|s| s.pps == LIGHT_PPS) {
        let sent = source.sent.load(Ordering::Relaxed);
        let got = received.get(&source.addr).copied().unwrap_or(0);
        light_sent += sent;
        light_got += got;
        if got != sent {
            broken.push(format!(
                "{}, well under its limit, lost {} of {sent} frames",
                source.addr,
                sent - got
            ));
        }
    }

    println!("\n== a scrape of http://127.0.0.1:9470/metrics (xdp_limiter_* series):");
    for line in daemon
        .metrics()
        .lines()
        .filter(|l| l.starts_with("xdp_limiter_"))
    {
        println!("  {line}");
    }
    println!("\n== the daemon's log:");
    for line in daemon.log().lines() {
        println!("  {line}");
    }
    let status = daemon.stop();
    println!("\n== daemon stopped ({status}); removing the lab");
    drop(files);
    drop(lab);
    println!("== done: namespaces, veth pair and pins are gone");
    println!("\n== the two promises");
    println!("light sources: {light_got} of {light_sent} frames got through (none may be lost)");
    println!(
        "heavy sources: at most {LIMIT_PPS} a window, and in any second at most {HEAVY_BOUND} \
         more: their first {} frames (a tenth of the limit) are judged without state and not \
         counted, and a second that is not one of the window's sees part of its oldest bucket \
         (docs/architecture.md, \"The bounds\")",
        LIMIT_PPS / 10
    );
    if broken.is_empty() && !STOPPED_EARLY.load(Ordering::Relaxed) {
        println!("both kept");
    } else {
        for line in &broken {
            println!("BROKEN: {line}");
        }
        if STOPPED_EARLY.load(Ordering::Relaxed) {
            println!("interrupted: nothing checked");
        }
        std::process::exit(1);
    }
}
