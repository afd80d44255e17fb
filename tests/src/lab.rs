//! A two-host lab: namespace `tx` sends from several source addresses over
//! a veth pair to namespace `rx`, where the program (or the daemon) guards
//! `veth-rx`. IPv6 is off in both, so only the test's own traffic flows.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddrV4, UdpSocket},
    time::{Duration, Instant},
};

use crate::netns::{NetNs, Veth};

/// The receiver's address.
pub const RX_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// The guarded interface in `rx`.
pub const RX_IF: &str = "veth-rx";
/// The sender's interface in `tx`.
pub const TX_IF: &str = "veth-tx";
/// A second link (see [`Lab::add_second_link`]): the receiver's address,
/// its interface in `rx`, the sender's interface in `tx`.
pub const RX2_ADDR: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
pub const RX2_IF: &str = "veth-rx2";
pub const TX2_IF: &str = "veth-tx2";
/// Senders on the second link: a marker (allow it) and a heavy source.
pub const MARKER2: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
pub const HEAVY2: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 3);

pub struct Lab {
    pub tx: NetNs,
    pub rx: NetNs,
    pub sources: Vec<Ipv4Addr>,
}

impl Lab {
    /// A lab whose sender owns `sources` (addresses in 192.0.2.0/24).
    pub fn new(sources: &[Ipv4Addr]) -> Self {
        let tx = NetNs::new("tx");
        let rx = NetNs::new("rx");
        for ns in [&tx, &rx] {
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
            ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1");
        }
        Veth::connect(&tx, TX_IF, &rx, RX_IF);
        for source in sources {
            tx.ip(&["addr", "add", &format!("{source}/24"), "dev", TX_IF]);
        }
        rx.ip(&["addr", "add", &format!("{RX_ADDR}/24"), "dev", RX_IF]);
        Self {
            tx,
            rx,
            sources: sources.to_vec(),
        }
    }

    /// Deletes the veth pair and creates it again with the same names and
    /// addresses (as a driver reload or a re-created veth/VLAN/bond does):
    /// a new interface with a new index, and no XDP program on it.
    pub fn recreate_link(&self) {
        self.tx.ip(&["link", "del", TX_IF]);
        Veth::connect(&self.tx, TX_IF, &self.rx, RX_IF);
        for source in &self.sources {
            self.tx
                .ip(&["addr", "add", &format!("{source}/24"), "dev", TX_IF]);
        }
        self.rx
            .ip(&["addr", "add", &format!("{RX_ADDR}/24"), "dev", RX_IF]);
    }

    /// The id of the XDP program on the guarded interface (`RX_IF`), as
    /// `ip -details link` reports it; `None` when there is none.
    pub fn attached_program(&self) -> Option<u32> {
        let out = self.rx.ip(&["-details", "link", "show", RX_IF]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let at = text.find("prog/xdp id ")?;
        text[at + "prog/xdp id ".len()..]
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// A second veth pair between the namespaces, `TX2_IF` (with
    /// `MARKER2` and `HEAVY2`) to `RX2_IF` (`RX2_ADDR`), for a daemon
    /// protecting two interfaces.
    pub fn add_second_link(&self) {
        Veth::connect(&self.tx, TX2_IF, &self.rx, RX2_IF);
        for source in [MARKER2, HEAVY2] {
            self.tx
                .ip(&["addr", "add", &format!("{source}/24"), "dev", TX2_IF]);
        }
        self.rx
            .ip(&["addr", "add", &format!("{RX2_ADDR}/24"), "dev", RX2_IF]);
    }

    /// A UDP socket in `rx` on `port`.
    pub fn receiver(&self, port: u16) -> UdpSocket {
        self.receiver_at(RX_ADDR, port)
    }

    /// A UDP socket in `rx` on `addr`:`port`.
    pub fn receiver_at(&self, addr: Ipv4Addr, port: u16) -> UdpSocket {
        let socket = self
            .rx
            .enter(|| UdpSocket::bind(SocketAddrV4::new(addr, port)).expect("bind receiver in rx"));
        // Room for a few thousand datagrams: a test that sends them all
        // before reading must not lose any to a full socket buffer (root
        // may exceed net.core.rmem_max).
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBufForce, &(8 << 20))
            .expect("receive buffer");
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("set timeout");
        socket
    }

    /// Sends `count` datagrams of `payload` bytes from `source` to `port`.
    pub fn send(&self, source: Ipv4Addr, port: u16, count: usize, payload: usize) {
        self.send_to(source, RX_ADDR, port, count, payload);
    }

    /// Sends `count` datagrams of `payload` bytes from `source` to
    /// `dst`:`port`.
    pub fn send_to(
        &self,
        source: Ipv4Addr,
        dst: Ipv4Addr,
        port: u16,
        count: usize,
        payload: usize,
    ) {
        self.tx.enter(|| {
            let socket = UdpSocket::bind(SocketAddrV4::new(source, 0)).expect("bind sender in tx");
            let data = vec![7u8; payload];
            for _ in 0..count {
                socket
                    .send_to(&data, SocketAddrV4::new(dst, port))
                    .expect("send");
            }
        });
    }

    /// Sends `count` datagrams from `source`, then one "marker" datagram
    /// from `marker` (a source under its limit); returns once the marker
    /// arrives, with what arrived per source. Frames on one veth are
    /// handled in order, so everything sent before the marker has been
    /// judged by then.
    pub fn exchange(
        &self,
        receiver: &UdpSocket,
        port: u16,
        sends: &[(Ipv4Addr, usize)],
        marker: Ipv4Addr,
    ) -> BTreeMap<Ipv4Addr, usize> {
        self.exchange_with(receiver, RX_ADDR, port, sends, marker)
    }

    /// [`Lab::exchange`] with a receiver on `dst`.
    pub fn exchange_with(
        &self,
        receiver: &UdpSocket,
        dst: Ipv4Addr,
        port: u16,
        sends: &[(Ipv4Addr, usize)],
        marker: Ipv4Addr,
    ) -> BTreeMap<Ipv4Addr, usize> {
        for (source, count) in sends {
            self.send_to(*source, dst, port, *count, 64);
        }
        self.send_to(marker, dst, port, 1, 1);
        let mut got = BTreeMap::new();
        let mut buf = [0u8; 2048];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(
                Instant::now() < deadline,
                "the marker from {marker} never arrived: {got:?}"
            );
            let Ok((len, from)) = receiver.recv_from(&mut buf) else {
                continue;
            };
            let IpAddr::V4(from) = from.ip() else {
                continue;
            };
            if from == marker && len == 1 {
                return got;
            }
            *got.entry(from).or_insert(0) += 1;
        }
    }
}

/// The daemon tests' three senders. `MARKER` is always allowed: its
/// datagram ends an [`Lab::exchange`].
pub const MARKER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
pub const HEAVY: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);
pub const MEDIUM: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 4);

impl Lab {
    /// A lab with `MARKER`, `HEAVY` and `MEDIUM` as senders.
    pub fn three_senders() -> Self {
        Self::new(&[MARKER, HEAVY, MEDIUM])
    }
}

/// A daemon configuration: every source `pps` over a 10 s window (at 2 pps
/// an allowance of 20 frames, long enough that a test's exchanges all fall
/// in one window), `MARKER` allowed, a 100 ms tick.
pub fn limit_config(pps: u64) -> String {
    format!(
        "[daemon]\ntick = \"100ms\"\n\n[default]\npps = {pps}\nwindow = \"10s\"\ndry_run = false\n\n\
         [[rules]]\ncidr = \"{MARKER}/32\"\naction = \"allow\"\n"
    )
}
