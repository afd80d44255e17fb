//! The end-to-end lab: namespace `tx` (the generator) and namespace `rx`
//! (the receiver under test) joined by a veth pair. The receiving veth has
//! GRO on (so veth runs NAPI) and threaded NAPI, and its receive kthread is
//! pinned to [`RX_CPU`]: all receive work (XDP, the stack, netfilter, the
//! socket) runs in that one thread, so its CPU time is the receiver's cost.
//! The generator runs on [`GEN_CPU`].
//!
//! Everything lives in the two namespaces, which go (with every rule, link
//! and program in them) when the lab is dropped.

use std::{
    collections::BTreeSet,
    fs::{self, File},
    io::{Read, Seek, SeekFrom},
    net::{Ipv4Addr, Ipv6Addr, UdpSocket},
    sync::Mutex,
};

use limiter_tests::netns::{NetNs, Veth};
use nix::{sched::CpuSet, unistd::Pid};

/// The generator's CPU and the receive kthread's CPU.
pub const GEN_CPU: usize = 0;
pub const RX_CPU: usize = 1;

/// Interface names (distinct from the other labs', so the receive kthread
/// is found by name).
pub const TX_IF: &str = "e2e-tx";
pub const RX_IF: &str = "e2e-rx";

/// The receiver's addresses and the sink's UDP port.
pub const RX_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const RX_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xe2e, 0, 0, 0, 0, 0, 1);
pub const SINK_PORT: u16 = 9000;

/// Prefix of the receive kthread's name (`napi/<dev>-<napi id>`, cut to
/// 15 characters by the kernel).
const NAPI_PREFIX: &str = "napi/e2e-rx";

pub struct Lab {
    pub tx: NetNs,
    pub rx: NetNs,
    /// The receive kthread.
    pub napi_pid: i32,
    pub tx_ifindex: u32,
    pub tx_mac: [u8; 6],
    pub rx_mac: [u8; 6],
    /// `/proc/net/dev` of `rx`, opened from inside it.
    rx_dev: File,
}

impl Lab {
    pub fn new() -> Self {
        // The receive kthread is found as the one that appears while the
        // lab is made: one lab at a time in this process.
        static CREATING: Mutex<()> = Mutex::new(());
        let _creating = CREATING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let before = napi_threads();
        let tx = NetNs::new("e2e-tx");
        let rx = NetNs::new("e2e-rx");
        // The sender speaks no IPv6 of its own (no router solicitations in
        // the measurements); the receiver needs it for the IPv6 share.
        tx.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
        tx.sysctl("net.ipv6.conf.default.disable_ipv6", "1");
        rx.sysctl("net.ipv6.conf.default.accept_ra", "0");
        Veth::connect(&tx, TX_IF, &rx, RX_IF);
        rx.ip(&["addr", "add", &format!("{RX_V4}/24"), "dev", RX_IF]);
        rx.ip(&["addr", "add", &format!("{RX_V6}/64"), "dev", RX_IF, "nodad"]);
        rx.run("ethtool", &["-K", RX_IF, "gro", "on"]);
        rx.run(
            "sh",
            &["-c", &format!("echo 1 > /sys/class/net/{RX_IF}/threaded")],
        );
        let new: Vec<i32> = napi_threads().difference(&before).copied().collect();
        let [napi_pid] = new[..] else {
            panic!("expected one new {NAPI_PREFIX}* kthread after enabling threaded NAPI, found {new:?}");
        };
        pin(napi_pid, RX_CPU);
        let (tx_ifindex, tx_mac) = tx.enter(|| interface(TX_IF));
        let (_, rx_mac) = rx.enter(|| interface(RX_IF));
        let rx_dev =
            rx.enter(|| File::open("/proc/thread-self/net/dev").expect("open net/dev in rx"));
        Self {
            tx,
            rx,
            napi_pid,
            tx_ifindex,
            tx_mac,
            rx_mac,
            rx_dev,
        }
    }

    /// Nanoseconds the receive kthread has run so far.
    pub fn receiver_cpu_ns(&self) -> u64 {
        let path = format!("/proc/{}/schedstat", self.napi_pid);
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        text.split_whitespace()
            .next()
            .and_then(|ns| ns.parse().ok())
            .unwrap_or_else(|| panic!("{path}: unexpected {text:?}"))
    }

    /// Frames the receiving veth has taken in (its rx_packets).
    pub fn received_frames(&self) -> u64 {
        let mut file = &self.rx_dev;
        let mut text = String::new();
        file.seek(SeekFrom::Start(0)).expect("rewind net/dev");
        file.read_to_string(&mut text).expect("read net/dev");
        text.lines()
            .find_map(|line| {
                let (name, fields) = line.trim_start().split_once(':')?;
                (name == RX_IF).then(|| fields.split_whitespace().nth(1)?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("{RX_IF} missing from net/dev:\n{text}"))
    }

    /// A UDP socket in `rx` on [`SINK_PORT`], both address families.
    pub fn sink_socket(&self) -> UdpSocket {
        // Dual-stack (bindv6only is 0), so IPv4 datagrams arrive too.
        self.rx
            .enter(|| UdpSocket::bind(("::", SINK_PORT)).expect("bind the sink socket in rx"))
    }
}

impl Default for Lab {
    fn default() -> Self {
        Self::new()
    }
}

/// Pids of the threads named `napi/e2e-rx*`.
fn napi_threads() -> BTreeSet<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.starts_with(NAPI_PREFIX))
        })
        .collect()
}

/// Pins task `pid` (0: the calling thread) to `cpu`.
pub fn pin(pid: i32, cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu).unwrap_or_else(|e| panic!("CPU {cpu}: {e}"));
    nix::sched::sched_setaffinity(Pid::from_raw(pid), &set)
        .unwrap_or_else(|e| panic!("pinning {pid} to CPU {cpu}: {e}"));
}

/// Index and MAC address of `name` in the calling thread's namespace.
fn interface(name: &str) -> (u32, [u8; 6]) {
    let index = nix::net::if_::if_nametoindex(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    // /sys shows the namespace it was mounted in, not this thread's: ask
    // `ip`, which inherits the thread's namespace.
    let out = std::process::Command::new("ip")
        .args(["-o", "link", "show", "dev", name])
        .output()
        .expect("run ip");
    let text = String::from_utf8_lossy(&out.stdout);
    let mac = text
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC for {name} in {text:?}"));
    let mut bytes = [0u8; 6];
    for (byte, hex) in bytes.iter_mut().zip(mac.split(':')) {
        *byte = u8::from_str_radix(hex, 16).unwrap_or_else(|e| panic!("MAC {mac}: {e}"));
    }
    (index, bytes)
}
