//! Real traffic through a veth pair between two network namespaces, with
//! the program attached in native (driver) mode on the receiving side and
//! no rules loaded: every frame is counted exactly per source.

use std::net::Ipv4Addr;

use aya::programs::XdpMode;
use limiter_common::{Counter, Outcome, SourceKey};
use limiter_tests::{
    lab::{Lab, RX_ADDR, RX_IF},
    testrun::{frames, Harness},
};
use limiter_user::kernel::read;

const TX_A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
const TX_B: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);
const PORT: u16 = 5300;
/// Ethernet + IPv4 + ICMP header + ping's default 56 bytes.
const PING_FRAME: usize = 14 + 20 + 8 + 56;
const UDP_PAYLOAD: usize = 100;
const UDP_FRAME: usize = 14 + 20 + 8 + UDP_PAYLOAD;

/// `count` pings from `source`; asserts every one was answered.
fn ping(lab: &Lab, source: Ipv4Addr, count: u32) {
    let out = lab.tx.run(
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

/// Sends `count` datagrams from `source` and receives them all in `rx`:
/// their arrival proves the program passed them.
fn udp_exchange(lab: &Lab, source: Ipv4Addr, count: usize) {
    let receiver = lab.receiver(PORT);
    lab.send(source, PORT, count, UDP_PAYLOAD);
    let mut buf = [0u8; 2048];
    let mut got = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while got < count {
        assert!(
            std::time::Instant::now() < deadline,
            "{got}/{count} datagrams from {source}"
        );
        if let Ok((len, from)) = receiver.recv_from(&mut buf) {
            assert_eq!(len, UDP_PAYLOAD);
            assert_eq!(from.ip(), std::net::IpAddr::V4(source));
            got += 1;
        }
    }
}

#[test]
fn real_pings_and_datagrams_are_counted_exactly_per_source() {
    let lab = Lab::new(&[TX_A, TX_B]);
    let mut harness = Harness::load();
    let program = harness.program_mut();
    let _link = lab.rx.enter(|| {
        program
            .attach(RX_IF, XdpMode::Driver)
            .expect("attach in native (driver) mode on veth-rx")
    });
    let link_info = lab.rx.ip(&["-details", "link", "show", RX_IF]);
    let link_info = String::from_utf8_lossy(&link_info.stdout);
    assert!(
        link_info.contains("prog/xdp") && !link_info.contains("xdpgeneric"),
        "program must be attached in driver mode: {link_info}"
    );

    ping(&lab, TX_A, 5);
    udp_exchange(&lab, TX_A, 7);
    ping(&lab, TX_B, 3);
    udp_exchange(&lab, TX_B, 11);

    let sources = read::sources(harness.maps()).expect("read SOURCES");
    let total = |addr: Ipv4Addr| {
        sources
            .get(&SourceKey::v4(addr.octets()))
            .map(|per_cpu| read::offered(per_cpu))
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
    assert_eq!(
        harness.outcome_total(Outcome::Passed),
        expect(8, 18),
        "every IP frame passed and was counted"
    );
    assert_ne!(
        harness.outcome_total(Outcome::NonIp),
        Counter::default(),
        "ARP replies arrive as non-IP"
    );
}
