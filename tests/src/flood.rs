//! Spoofed floods for the kernel tests: distinct sources by index, one
//! frame from each of a range of them through BPF_PROG_TEST_RUN, and bursts
//! placed inside one epoch of the cheap tier.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    ops::Range,
    thread,
    time::Duration,
};

use aya::programs::Xdp;
use limiter_common::{sketch, Counter};

use crate::{
    packets::{self, DST4, DST6},
    testrun::{coarse_now, verdict, XDP_DROP, XDP_PASS},
};

/// A UDP frame from `src` (18 bytes of payload).
pub fn udp4(src: Ipv4Addr) -> Vec<u8> {
    packets::udp_v4(src, DST4, 9999, 18)
}

/// A UDP frame from `src` (18 bytes of payload).
pub fn udp6(src: Ipv6Addr) -> Vec<u8> {
    packets::udp_v6(src, DST6, 9999, 18)
}

/// A UDP frame from `src`, of its family.
pub fn udp(src: IpAddr) -> Vec<u8> {
    match src {
        IpAddr::V4(v4) => udp4(v4),
        IpAddr::V6(v6) => udp6(v6),
    }
}

/// Spoofed source `i`: even `i` from 10.0.0.0/8, odd `i` from
/// 2001:db8::/32 (a /64 of its own: IPv6 sources are keyed by /64; and a
/// /48 of its own for the first 131,072 `i`, as random addresses would
/// be: a /48 shares one room of tickets), its /64 numbered 0x8000 and up
/// within the /48 (the tests' clients use the first). Distinct for `i`
/// below 2^25.
pub fn spoofed(i: u32) -> IpAddr {
    let j = i / 2;
    if i.is_multiple_of(2) {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | j))
    } else {
        IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            j as u16,
            0x8000 | (j >> 16) as u16,
            0,
            0,
            0,
            1,
        ))
    }
}

/// One frame from each source `source(i)` for `i` in `sources`, on the
/// calling thread's CPU, as fast as BPF_PROG_TEST_RUN goes; what passed.
/// The frames are one buffer per family with their source rewritten
/// (millions of frames never exist at once).
pub fn spray_from(program: &Xdp, sources: Range<u32>, source: impl Fn(u32) -> IpAddr) -> Counter {
    let mut v4 = udp4(Ipv4Addr::UNSPECIFIED);
    let mut v6 = udp6(Ipv6Addr::UNSPECIFIED);
    let mut passed = Counter::default();
    for i in sources {
        let source = source(i);
        let frame = if source.is_ipv4() { &mut v4 } else { &mut v6 };
        packets::set_source(frame, source);
        match verdict(program, frame) {
            XDP_PASS => passed.add(frame.len() as u64),
            XDP_DROP => {}
            other => panic!("spoofed source {source}: unexpected verdict {other}"),
        }
    }
    passed
}

/// [`spray_from`] the [`spoofed`] sources of `sources`.
pub fn spray(program: &Xdp, sources: Range<u32>) -> Counter {
    spray_from(program, sources, spoofed)
}

/// The cheap tier's epoch the kernel's clock is in.
pub fn epoch_now() -> u64 {
    coarse_now().as_nanos() as u64 / sketch::EPOCH_NS
}

/// Waits for the first 50 ms of an epoch of the cheap tier (its counts
/// restart every second), so that a burst of a few milliseconds stays in
/// one epoch; returns the epoch. Polls the kernel's clock.
pub fn at_epoch_start() -> u64 {
    let within = Duration::from_millis(50).as_nanos() as u64;
    loop {
        let now = coarse_now().as_nanos() as u64;
        if now % sketch::EPOCH_NS < within {
            return now / sketch::EPOCH_NS;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Asserts that the kernel's clock is still in `epoch`: what ran since
/// [`at_epoch_start`] counted in one epoch (a machine stalled for most of
/// a second would void the test, and says so).
#[track_caller]
pub fn assert_same_epoch(epoch: u64) {
    assert_eq!(
        epoch_now(),
        epoch,
        "the burst crossed an epoch boundary: the machine stalled for most of a second"
    );
}
