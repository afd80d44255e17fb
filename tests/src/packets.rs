//! Frame builders for tests: whole, valid frames from etherparse, plus the
//! few edits (VLAN tags, truncation, header corruption) tests need.

use std::net::{Ipv4Addr, Ipv6Addr};

use etherparse::{EtherType, Ethernet2Header, PacketBuilder};

pub const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// Length of the Ethernet header without tags.
pub const ETH_LEN: usize = 14;
/// 802.1Q customer tag.
pub const TPID_8021Q: u16 = 0x8100;
/// 802.1ad service (outer QinQ) tag.
pub const TPID_8021AD: u16 = 0x88A8;
/// Where the kernel tests' frames go (no rule looks at it).
pub const DST4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
pub const DST6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);

fn v4(src: Ipv4Addr, dst: Ipv4Addr) -> etherparse::PacketBuilderStep<etherparse::IpHeaders> {
    PacketBuilder::ethernet2(SRC_MAC, DST_MAC).ipv4(src.octets(), dst.octets(), 64)
}

fn v6(src: Ipv6Addr, dst: Ipv6Addr) -> etherparse::PacketBuilderStep<etherparse::IpHeaders> {
    PacketBuilder::ethernet2(SRC_MAC, DST_MAC).ipv6(src.octets(), dst.octets(), 64)
}

/// Ethernet + IPv4 + UDP with `payload_len` zero bytes of payload.
pub fn udp_v4(src: Ipv4Addr, dst: Ipv4Addr, dst_port: u16, payload_len: usize) -> Vec<u8> {
    let builder = v4(src, dst).udp(40000, dst_port);
    write(builder, payload_len)
}

/// Ethernet + IPv6 + UDP.
pub fn udp_v6(src: Ipv6Addr, dst: Ipv6Addr, dst_port: u16, payload_len: usize) -> Vec<u8> {
    let builder = v6(src, dst).udp(40000, dst_port);
    write(builder, payload_len)
}

/// Ethernet + IPv4 + TCP SYN.
pub fn tcp_v4(src: Ipv4Addr, dst: Ipv4Addr, dst_port: u16, payload_len: usize) -> Vec<u8> {
    let builder = v4(src, dst).tcp(40000, dst_port, 1, 65535).syn();
    write(builder, payload_len)
}

/// Ethernet + IPv6 + TCP SYN.
pub fn tcp_v6(src: Ipv6Addr, dst: Ipv6Addr, dst_port: u16, payload_len: usize) -> Vec<u8> {
    let builder = v6(src, dst).tcp(40000, dst_port, 1, 65535).syn();
    write(builder, payload_len)
}

/// Ethernet + IPv4 + ICMP echo request.
pub fn icmp_v4(src: Ipv4Addr, dst: Ipv4Addr, payload_len: usize) -> Vec<u8> {
    let builder = v4(src, dst).icmpv4_echo_request(1, 1);
    write(builder, payload_len)
}

/// Ethernet + IPv6 + ICMPv6 echo request.
pub fn icmp_v6(src: Ipv6Addr, dst: Ipv6Addr, payload_len: usize) -> Vec<u8> {
    let builder = v6(src, dst).icmpv6_echo_request(1, 1);
    write(builder, payload_len)
}

fn write<H>(builder: etherparse::PacketBuilderStep<H>, payload_len: usize) -> Vec<u8>
where
    etherparse::PacketBuilderStep<H>: Writable,
{
    builder.write_frame(payload_len)
}

/// The last step of an etherparse builder: size and write the frame.
pub trait Writable {
    fn write_frame(self, payload_len: usize) -> Vec<u8>;
}

macro_rules! writable {
    ($($header:ty),*) => {$(
        impl Writable for etherparse::PacketBuilderStep<$header> {
            fn write_frame(self, payload_len: usize) -> Vec<u8> {
                let payload = vec![0u8; payload_len];
                let mut frame = Vec::with_capacity(self.size(payload_len));
                self.write(&mut frame, &payload).expect("writing to a Vec cannot fail");
                frame
            }
        }
    )*};
}
writable!(
    etherparse::UdpHeader,
    etherparse::TcpHeader,
    etherparse::Icmpv4Header,
    etherparse::Icmpv6Header
);

/// An ARP request (a non-IP frame).
pub fn arp() -> Vec<u8> {
    let eth = Ethernet2Header {
        source: SRC_MAC,
        destination: [0xff; 6],
        ether_type: EtherType::ARP,
    };
    let mut frame = eth.to_bytes().to_vec();
    // htype 1, ptype IPv4, hlen 6, plen 4, op request, then addresses.
    frame.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    frame.extend_from_slice(&[0u8; 20]);
    frame
}

/// Inserts a VLAN tag (`tpid`, `vid`) right after the MAC addresses, as the
/// outermost tag. Call twice (inner tag first) for QinQ.
pub fn tagged(frame: &[u8], tpid: u16, vid: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(frame.len() + 4);
    out.extend_from_slice(&frame[..12]);
    out.extend_from_slice(&tpid.to_be_bytes());
    out.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
    out.extend_from_slice(&frame[12..]);
    out
}

/// The offset of the IP header in `frame`, after any VLAN tags.
pub fn ip_offset(frame: &[u8]) -> usize {
    let mut offset = ETH_LEN;
    let mut ether_type = u16::from_be_bytes([frame[12], frame[13]]);
    while matches!(ether_type, TPID_8021Q | TPID_8021AD) {
        ether_type = u16::from_be_bytes([frame[offset + 2], frame[offset + 3]]);
        offset += 4;
    }
    offset
}

/// Rewrites the source address of an IPv4 or IPv6 frame in place, so a
/// flood of millions of sources reuses one buffer instead of building a
/// frame each. Checksums are left as they were: the program checks none,
/// and nothing else sees these frames.
pub fn set_source(frame: &mut [u8], source: std::net::IpAddr) {
    let ip = ip_offset(frame);
    match source {
        std::net::IpAddr::V4(addr) => frame[ip + 12..ip + 16].copy_from_slice(&addr.octets()),
        std::net::IpAddr::V6(addr) => frame[ip + 8..ip + 24].copy_from_slice(&addr.octets()),
    }
}

/// IPv6 extension headers for [`ipv6_chain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext {
    HopByHop,
    Routing,
    DestOptions,
    /// A fragment header: offset in 8-byte units, more-fragments flag.
    Fragment {
        offset: u16,
        more: bool,
    },
    /// An authentication header (12 bytes of fixed part, 4 of ICV).
    Auth,
}

impl Ext {
    /// The next-header number that announces this header.
    pub const fn number(self) -> u8 {
        match self {
            Ext::HopByHop => 0,
            Ext::Routing => 43,
            Ext::Fragment { .. } => 44,
            Ext::Auth => 51,
            Ext::DestOptions => 60,
        }
    }

    fn bytes(self, next: u8) -> Vec<u8> {
        match self {
            // 8 bytes: next header, length 0, a PadN option of 4 bytes.
            Ext::HopByHop | Ext::DestOptions => vec![next, 0, 1, 4, 0, 0, 0, 0],
            // 8 bytes: next, length 0, type 0, segments left 0, reserved.
            Ext::Routing => vec![next, 0, 0, 0, 0, 0, 0, 0],
            Ext::Fragment { offset, more } => {
                let field = (offset << 3) | u16::from(more);
                let [a, b] = field.to_be_bytes();
                vec![next, 0, a, b, 0, 0, 0, 1]
            }
            // Payload length in 4-byte units minus 2: 16 bytes -> 2.
            Ext::Auth => {
                let mut ah = vec![next, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1];
                ah.extend_from_slice(&[0; 4]);
                ah
            }
        }
    }
}

/// A UDP header to `dst_port` (length and checksum left as the tests need
/// them: the program reads only the ports).
pub fn udp_header(dst_port: u16) -> Vec<u8> {
    let mut h = vec![0x9c, 0x40];
    h.extend_from_slice(&dst_port.to_be_bytes());
    h.extend_from_slice(&[0, 8, 0, 0]);
    h
}

/// A TCP header to `dst_port` with `flags` (byte 13).
pub fn tcp_header(dst_port: u16, flags: u8) -> Vec<u8> {
    let mut h = vec![0x9c, 0x40];
    h.extend_from_slice(&dst_port.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    h
}

/// Ethernet + an IPv4 header with `protocol`, the fragment fields
/// (`offset` in 8-byte units, more-fragments), then `payload` as it is.
pub fn ipv4_raw(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    protocol: u8,
    offset: u16,
    more: bool,
    payload: &[u8],
) -> Vec<u8> {
    let mut frame = ethernet(0x0800);
    let total = (20 + payload.len()) as u16;
    let frag = (offset & 0x1fff) | if more { 0x2000 } else { 0 };
    frame.extend_from_slice(&[0x45, 0]);
    frame.extend_from_slice(&total.to_be_bytes());
    frame.extend_from_slice(&[0, 1]);
    frame.extend_from_slice(&frag.to_be_bytes());
    frame.extend_from_slice(&[64, protocol, 0, 0]);
    frame.extend_from_slice(&src.octets());
    frame.extend_from_slice(&dst.octets());
    frame.extend_from_slice(payload);
    frame
}

/// Ethernet + IPv6 + the extension headers of `chain` in order, then
/// `payload` announced as `protocol`.
pub fn ipv6_chain(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    chain: &[Ext],
    protocol: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut body = Vec::new();
    for (i, ext) in chain.iter().enumerate() {
        let next = chain.get(i + 1).map_or(protocol, |e| e.number());
        body.extend(ext.bytes(next));
    }
    body.extend_from_slice(payload);
    let first = chain.first().map_or(protocol, |e| e.number());
    let mut frame = ethernet(0x86dd);
    frame.extend_from_slice(&[0x60, 0, 0, 0]);
    frame.extend_from_slice(&(body.len() as u16).to_be_bytes());
    frame.extend_from_slice(&[first, 64]);
    frame.extend_from_slice(&src.octets());
    frame.extend_from_slice(&dst.octets());
    frame.extend(body);
    frame
}

fn ethernet(ether_type: u16) -> Vec<u8> {
    let mut frame = DST_MAC.to_vec();
    frame.extend_from_slice(&SRC_MAC);
    frame.extend_from_slice(&ether_type.to_be_bytes());
    frame
}
