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
