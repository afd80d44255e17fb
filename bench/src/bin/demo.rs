//! `cargo xtask demo`: a throwaway lab (two namespaces and a veth pair),
//! the real daemon guarding the receiver in enforce mode, and a mix of
//! traffic from 20 source addresses: 16 well under the limit, 4 far over
//! it. Every second it shows what each source sent and what got through,
//! and what the daemon's /metrics endpoint says; then it tears everything
//! down (also on Ctrl-C).

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

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: i32) {
    STOP.store(true, Ordering::Relaxed);
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
    let receiver = {
        let received = Arc::clone(&received);
        let ns = lab.rx.name().to_string();
        thread::spawn(move || {
            enter(&ns);
            let socket = UdpSocket::bind(SocketAddrV4::new(RX_ADDR, PORT)).expect("bind");
            socket
                .set_read_timeout(Some(Duration::from_millis(100)))
                .expect("timeout");
            let mut buf = [0u8; 2048];
            while !STOP.load(Ordering::Relaxed) {
                if let Ok((_, from)) = socket.recv_from(&mut buf) {
                    if let IpAddr::V4(from) = from.ip() {
                        *received.lock().expect("lock").entry(from).or_default() += 1;
                    }
                }
            }
        })
    };
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
                    let _ = socket.send_to(&[0u8; 64], SocketAddrV4::new(RX_ADDR, PORT));
                    source.sent.fetch_add(1, Ordering::Relaxed);
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
            let state = if dropped > 5.0 { "LIMITED" } else { "ok" };
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
    STOP.store(true, Ordering::Relaxed);
    for sender in senders {
        let _ = sender.join();
    }
    let _ = receiver.join();

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
}
