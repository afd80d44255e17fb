//! Real traffic through a veth pair between two network namespaces, with
//! the program attached in native (driver) mode on the receiving side.

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    time::Duration,
};

use aya::programs::XdpMode;
use limiter_common::{Counter, SourceKey};
use limiter_tests::{
    netns::{NetNs, Veth},
    testrun::{frames, Harness},
};
use limiter_user::{counters, object::xdp_program};

const RX_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const TX_A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
const TX_B: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);
const UDP_PORT: u16 = 5300;
/// Ethernet + IPv4 + ICMP header + ping's default 56 bytes.
const PING_FRAME: usize = 14 + 20 + 8 + 56;
const UDP_PAYLOAD: usize = 100;
const UDP_FRAME: usize = 14 + 20 + 8 + UDP_PAYLOAD;

/// The lab: `tx` sends from two addresses to `rx` over one veth pair.
struct Lab {
    tx: NetNs,
    rx: NetNs,
}

impl Lab {
    fn new() -> Self {
        let tx = NetNs::new("tx");
        let rx = NetNs::new("rx");
        for ns in [&tx, &rx] {
            // No IPv6 chatter (router solicitations, MLD): only our traffic.
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
            ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1");
        }
        Veth::connect(&tx, "veth-tx", &rx, "veth-rx");
        tx.ip(&["addr", "add", &format!("{TX_A}/24"), "dev", "veth-tx"]);
        tx.ip(&["addr", "add", &format!("{TX_B}/24"), "dev", "veth-tx"]);
        rx.ip(&["addr", "add", &format!("{RX_ADDR}/24"), "dev", "veth-rx"]);
        Self { tx, rx }
    }

    /// `count` pings from `source`; asserts every one was answered.
    fn ping(&self, source: Ipv4Addr, count: u32) {
        let out = self.tx.run(
            "ping",
            &[
                "-n",
                "-q",
                "-c",
                &count.to_string(),
                "-i",
                "0.01",
                "-W",
                "2",
                "-I",
                &source.to_string(),
                &RX_ADDR.to_string(),
            ],
        );
        let summary = String::from_utf8_lossy(&out.stdout);
        assert!(
            summary.contains(&format!("{count} packets transmitted, {count} received")),
            "ping from {source}: {summary}"
        );
    }
}

/// Sends `count` datagrams from `source` while a socket in `rx` receives
/// them all: their arrival proves the program passed them.
fn udp_exchange(lab: &Lab, source: Ipv4Addr, count: usize) {
    let receiver = lab.rx.enter(|| {
        UdpSocket::bind(SocketAddrV4::new(RX_ADDR, UDP_PORT)).expect("bind receiver in rx")
    });
    receiver
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("set timeout");
    lab.tx.enter(|| {
        let sender = UdpSocket::bind(SocketAddrV4::new(source, 0)).expect("bind sender in tx");
        for _ in 0..count {
            sender
                .send_to(&[7u8; UDP_PAYLOAD], SocketAddrV4::new(RX_ADDR, UDP_PORT))
                .expect("send");
        }
    });
    let mut buf = [0u8; 2048];
    for i in 0..count {
        let (len, from) = receiver
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("datagram {i} from {source} never arrived: {e}"));
        assert_eq!(len, UDP_PAYLOAD);
        assert_eq!(from.ip(), std::net::IpAddr::V4(source));
    }
}

#[test]
fn real_pings_and_datagrams_are_counted_exactly_per_source() {
    let lab = Lab::new();
    let mut harness = Harness::load();
    let program = xdp_program_of(&mut harness);
    let _link = lab.rx.enter(|| {
        program
            .attach("veth-rx", XdpMode::Driver)
            .expect("attach in native (driver) mode on veth-rx")
    });
    let link_info = lab.rx.ip(&["-details", "link", "show", "veth-rx"]);
    let link_info = String::from_utf8_lossy(&link_info.stdout);
    assert!(
        link_info.contains("prog/xdp") && !link_info.contains("xdpgeneric"),
        "program must be attached in driver mode: {link_info}"
    );

    lab.ping(TX_A, 5);
    udp_exchange(&lab, TX_A, 7);
    lab.ping(TX_B, 3);
    udp_exchange(&lab, TX_B, 11);

    let sources = counters::sources(harness.ebpf()).expect("read SOURCES");
    let total = |addr: Ipv4Addr| {
        sources
            .get(&SourceKey::v4(addr.octets()))
            .map(|per_cpu| counters::offered(per_cpu))
            .unwrap_or_else(|| panic!("{addr} is not tracked: {:?}", sources.keys()))
    };
    let expect = |pings, datagrams| frames(pings, PING_FRAME).merged(frames(datagrams, UDP_FRAME));
    assert_eq!(total(TX_A), expect(5, 7), "source {TX_A}");
    assert_eq!(total(TX_B), expect(3, 11), "source {TX_B}");
    assert_eq!(
        sources.len(),
        2,
        "only the two senders reach veth-rx: {:?}",
        sources.keys()
    );
    let passed = harness.outcome_total(limiter_common::Outcome::Passed);
    assert_eq!(
        passed,
        expect(8, 18),
        "every IP frame passed and was counted"
    );
    assert_ne!(
        harness.outcome_total(limiter_common::Outcome::NonIp),
        Counter::default(),
        "ARP replies arrive as non-IP"
    );
}

fn xdp_program_of(harness: &mut Harness) -> &mut aya::programs::Xdp {
    xdp_program(harness.ebpf_mut()).expect("program present")
}
