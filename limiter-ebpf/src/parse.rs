//! Frame parsing: Ethernet (with up to two 802.1Q / 802.1ad tags), IPv4,
//! IPv6 (with its common extension headers), and the TCP/UDP ports.
//!
//! All packet access goes through [`ptr_at`], which checks the bounds the
//! verifier insists on. Parsing never writes to the packet.

use core::mem::size_of;

use aya_ebpf::programs::XdpContext;
use limiter_common::{
    rules::{IPPROTO_TCP, IPPROTO_UDP, TCP_FLAG_ACK, TCP_FLAG_SYN},
    SourceKey,
};
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
    tcp::TcpHdr,
    udp::UdpHdr,
    vlan::VlanHdr,
};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;
/// Pre-standard QinQ outer tag still seen on some switches.
const ETH_P_QINQ_LEGACY: u16 = 0x9100;

const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_DSTOPTS: u8 = 60;

/// How many VLAN tags are unwrapped (802.1ad QinQ is two).
const MAX_VLAN_TAGS: usize = 2;
/// How many IPv6 extension headers are walked to find the transport header.
const MAX_IPV6_EXT_HEADERS: usize = 4;

/// Why a frame is not parsed into a [`Packet`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Not IPv4 or IPv6 (ARP, LLDP, more than two VLAN tags, ...).
    NonIp,
    /// Too short for a header it announces, or an invalid header field.
    Malformed,
}

/// What the limiter needs to know about an IP frame.
pub struct Packet {
    /// Source address, at full length (/32 or /128).
    pub source: SourceKey,
    /// Transport protocol (IPv4 protocol / final IPv6 next header).
    pub protocol: u8,
    /// TCP/UDP destination port; 0 for other protocols and non-first fragments.
    pub dst_port: u16,
    /// TCP SYN/ACK flag bits (`rules::TCP_FLAG_*`); 0 for other protocols.
    pub tcp_flags: u8,
}

/// The transport fields rules match on.
#[derive(Clone, Copy, Default)]
struct Transport {
    dst_port: u16,
    tcp_flags: u8,
}

/// A bounds-checked pointer to a `T` at `offset` bytes into the frame.
#[inline(always)]
fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Result<*const T, ParseError> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + size_of::<T>() > end {
        return Err(ParseError::Malformed);
    }
    Ok((start + offset) as *const T)
}

/// Reads a `T` (an unaligned-safe header struct of byte fields) at `offset`.
#[inline(always)]
fn read_at<T: Copy>(ctx: &XdpContext, offset: usize) -> Result<T, ParseError> {
    let ptr = ptr_at::<T>(ctx, offset)?;
    // SAFETY: ptr_at checked that size_of::<T>() bytes at ptr lie inside the
    // frame; read_unaligned has no alignment requirement.
    Ok(unsafe { ptr.read_unaligned() })
}

/// Parses the frame in `ctx` down to the transport ports.
#[inline(always)]
pub fn parse(ctx: &XdpContext) -> Result<Packet, ParseError> {
    let eth: EthHdr = read_at(ctx, 0)?;
    let mut ether_type = u16::from_be(eth.ether_type);
    let mut offset = EthHdr::LEN;
    for _ in 0..MAX_VLAN_TAGS {
        if !matches!(ether_type, ETH_P_8021Q | ETH_P_8021AD | ETH_P_QINQ_LEGACY) {
            break;
        }
        let tag: VlanHdr = read_at(ctx, offset)?;
        ether_type = u16::from_be(tag.ether_type);
        offset += VlanHdr::LEN;
    }
    match ether_type {
        ETH_P_IP => parse_ipv4(ctx, offset),
        ETH_P_IPV6 => parse_ipv6(ctx, offset),
        _ => Err(ParseError::NonIp),
    }
}

#[inline(always)]
fn parse_ipv4(ctx: &XdpContext, offset: usize) -> Result<Packet, ParseError> {
    let ip: Ipv4Hdr = read_at(ctx, offset)?;
    let header_len = usize::from(ip.vihl & 0x0f) * 4;
    if ip.vihl >> 4 != 4 || header_len < Ipv4Hdr::LEN {
        return Err(ParseError::Malformed);
    }
    if usize::from(u16::from_be_bytes(ip.tot_len)) < header_len {
        return Err(ParseError::Malformed);
    }
    let fragment_offset = u16::from_be_bytes(ip.frags) & 0x1fff;
    let transport = if fragment_offset == 0 {
        transport(ctx, offset + header_len, ip.proto)?
    } else {
        Transport::default()
    };
    Ok(Packet {
        source: SourceKey::v4(ip.src_addr),
        protocol: ip.proto,
        dst_port: transport.dst_port,
        tcp_flags: transport.tcp_flags,
    })
}

#[inline(always)]
fn parse_ipv6(ctx: &XdpContext, offset: usize) -> Result<Packet, ParseError> {
    let ip: Ipv6Hdr = read_at(ctx, offset)?;
    if ip.vcf[0] >> 4 != 6 {
        return Err(ParseError::Malformed);
    }
    let mut next = ip.next_hdr;
    let mut offset = offset + Ipv6Hdr::LEN;
    let mut first_fragment = true;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                // next header, length in 8-byte units not counting the first 8.
                let ext: [u8; 2] = read_at(ctx, offset)?;
                next = ext[0];
                offset += (usize::from(ext[1]) + 1) * 8;
            }
            IPPROTO_FRAGMENT => {
                let frag: [u8; 8] = read_at(ctx, offset)?;
                next = frag[0];
                first_fragment = u16::from_be_bytes([frag[2], frag[3]]) >> 3 == 0;
                offset += 8;
            }
            _ => break,
        }
    }
    let transport = if first_fragment {
        transport(ctx, offset, next)?
    } else {
        Transport::default()
    };
    Ok(Packet {
        source: SourceKey::v6(ip.src_addr),
        protocol: next,
        dst_port: transport.dst_port,
        tcp_flags: transport.tcp_flags,
    })
}

/// The destination port (and TCP flags) of a TCP or UDP header at
/// `offset`; nothing for other protocols. The whole fixed header must be
/// present, or the frame is malformed.
#[inline(always)]
fn transport(ctx: &XdpContext, offset: usize, protocol: u8) -> Result<Transport, ParseError> {
    match protocol {
        IPPROTO_TCP => {
            let tcp: TcpHdr = read_at(ctx, offset)?;
            let mut tcp_flags = 0;
            if tcp.syn() != 0 {
                tcp_flags |= TCP_FLAG_SYN;
            }
            if tcp.ack() != 0 {
                tcp_flags |= TCP_FLAG_ACK;
            }
            Ok(Transport {
                dst_port: u16::from_be_bytes(tcp.dest),
                tcp_flags,
            })
        }
        IPPROTO_UDP => {
            let udp: UdpHdr = read_at(ctx, offset)?;
            Ok(Transport {
                dst_port: u16::from_be_bytes(udp.dst),
                tcp_flags: 0,
            })
        }
        _ => Ok(Transport::default()),
    }
}
