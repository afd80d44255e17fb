//! Frame parsing: Ethernet (with up to two 802.1Q / 802.1ad tags), IPv4,
//! IPv6 (with its extension headers), and the TCP/UDP ports.
//!
//! Every frame whose IP header (and so its source address) can be read is
//! a [`Packet`], to be keyed and judged by its source: a transport header
//! the parser cannot read (a non-first fragment, a header cut short, an
//! IPv6 chain longer than the walk) only makes its ports, or its protocol,
//! unknown ([`Transport`]), and userspace judges such frames by the
//! strictest rule that could apply. Only frames too short for their IP
//! header, or of the wrong IP version, are malformed.
//!
//! All packet access goes through [`ptr_at`], which checks the bounds the
//! verifier insists on. Parsing never writes to the packet.

use core::mem::size_of;

use aya_ebpf::programs::XdpContext;
use limiter_common::{
    rules::{Transport, IPPROTO_TCP, IPPROTO_UDP, TCP_FLAG_ACK, TCP_FLAG_SYN},
    AddressFamily, SourceKey,
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
const IPPROTO_AH: u8 = 51;
const IPPROTO_DSTOPTS: u8 = 60;
const IPPROTO_MOBILITY: u8 = 135;
const IPPROTO_HIP: u8 = 139;
const IPPROTO_SHIM6: u8 = 140;

/// How many VLAN tags are unwrapped (802.1ad QinQ is two).
const MAX_VLAN_TAGS: usize = 2;
/// How many IPv6 extension headers are walked to find the transport header
/// (real traffic carries two or three; a longer chain is judged as one
/// whose protocol is unknown).
pub const MAX_IPV6_EXT_HEADERS: usize = 8;

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
    /// Transport protocol (IPv4 protocol / final IPv6 next header, behind
    /// any AH); meaningless when `transport` is `ProtocolUnknown`.
    pub protocol: u8,
    /// TCP/UDP destination port; 0 for other protocols and unknown ports.
    pub dst_port: u16,
    /// TCP SYN/ACK flag bits (`rules::TCP_FLAG_*`); 0 for other protocols.
    pub tcp_flags: u8,
    /// How much of the above could be read.
    pub transport: Transport,
    /// Where the destination address starts in the frame (bytes from its
    /// start; 4 bytes for IPv4, 16 for IPv6): read only when a rule keys a
    /// level by it (`judge::key::destination`).
    pub dst_at: u16,
    /// Where the TCP header starts in the frame (bytes from its start): 0
    /// unless the frame is TCP with its whole fixed header in the frame.
    /// Read only to check a SYN cookie (`judge::proof`).
    pub tcp_at: u16,
}

impl Packet {
    /// Where the IP header starts in the frame.
    #[inline(always)]
    pub fn ip_at(&self) -> usize {
        let dst_at = usize::from(self.dst_at);
        if self.source.family() == AddressFamily::V4 {
            dst_at - IPV4_DST_AT
        } else {
            dst_at - IPV6_DST_AT
        }
    }
}

/// The transport fields rules match on.
#[derive(Clone, Copy)]
struct Fields {
    protocol: u8,
    dst_port: u16,
    tcp_flags: u8,
    transport: Transport,
    tcp_at: u16,
}

impl Fields {
    /// A protocol without ports or flags.
    const fn known(protocol: u8) -> Self {
        Self {
            protocol,
            dst_port: 0,
            tcp_flags: 0,
            transport: Transport::Known,
            tcp_at: 0,
        }
    }

    /// A frame of `protocol` whose transport header cannot be read.
    const fn unreadable(protocol: u8) -> Self {
        let transport = match protocol {
            IPPROTO_TCP | IPPROTO_UDP => Transport::PortUnknown,
            // Behind AH (or another extension header) might be anything.
            p if is_ipv6_extension(p) => Transport::ProtocolUnknown,
            _ => Transport::Known,
        };
        Self {
            protocol,
            dst_port: 0,
            tcp_flags: 0,
            transport,
            tcp_at: 0,
        }
    }

    const fn protocol_unknown() -> Self {
        Self {
            protocol: 0,
            dst_port: 0,
            tcp_flags: 0,
            transport: Transport::ProtocolUnknown,
            tcp_at: 0,
        }
    }

    #[inline(always)]
    fn packet(self, source: SourceKey, dst_at: usize) -> Packet {
        Packet {
            source,
            protocol: self.protocol,
            dst_port: self.dst_port,
            tcp_flags: self.tcp_flags,
            transport: self.transport,
            dst_at: dst_at as u16,
            tcp_at: self.tcp_at,
        }
    }
}

/// Whether `next` names an IPv6 extension header (AH included).
const fn is_ipv6_extension(next: u8) -> bool {
    matches!(
        next,
        IPPROTO_HOPOPTS
            | IPPROTO_ROUTING
            | IPPROTO_FRAGMENT
            | IPPROTO_AH
            | IPPROTO_DSTOPTS
            | IPPROTO_MOBILITY
            | IPPROTO_HIP
            | IPPROTO_SHIM6
    )
}

/// Where the destination address starts in an IPv4 and an IPv6 header.
const IPV4_DST_AT: usize = 16;
const IPV6_DST_AT: usize = 24;

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

/// Copies the destination address of `packet` (parsed from `ctx`) into
/// `out`, IPv4 into its first 4 bytes and the rest zero, word by word (an
/// array store would be a `memset` call, a function the verifier walks
/// again at every call); `out` is left as it was if the frame no longer
/// holds the address.
#[inline(always)]
pub fn read_destination(ctx: &XdpContext, packet: &Packet, out: &mut [u32; 4]) {
    // Bounded for the verifier: an address in the fixed IP header, behind
    // at most two VLAN tags, is always within the first 64 bytes.
    let at = usize::from(packet.dst_at) & 0x3f;
    if packet.source.family() == AddressFamily::V4 {
        if let Ok(v4) = read_at::<[u8; 4]>(ctx, at) {
            out[0] = u32::from_ne_bytes(v4);
            out[1] = 0;
            out[2] = 0;
            out[3] = 0;
        }
    } else if let Ok(v6) = read_at::<[[u8; 4]; 4]>(ctx, at) {
        out[0] = u32::from_ne_bytes(v6[0]);
        out[1] = u32::from_ne_bytes(v6[1]);
        out[2] = u32::from_ne_bytes(v6[2]);
        out[3] = u32::from_ne_bytes(v6[3]);
    }
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
    if ip.vihl >> 4 != 4 {
        return Err(ParseError::Malformed);
    }
    let source = SourceKey::v4(ip.src_addr);
    let dst_at = offset + IPV4_DST_AT;
    let header_len = usize::from(ip.vihl & 0x0f) * 4;
    let valid =
        header_len >= Ipv4Hdr::LEN && usize::from(u16::from_be_bytes(ip.tot_len)) >= header_len;
    let first_fragment = u16::from_be_bytes(ip.frags) & 0x1fff == 0;
    if !valid || !first_fragment {
        // No transport header here (or none to trust): judged by protocol.
        return Ok(Fields::unreadable(ip.proto).packet(source, dst_at));
    }
    let mut offset = offset + header_len;
    let mut protocol = ip.proto;
    if protocol == IPPROTO_AH {
        // Next header, then the length in 4-byte units minus 2.
        let Ok(ah) = read_at::<[u8; 2]>(ctx, offset) else {
            return Ok(Fields::protocol_unknown().packet(source, dst_at));
        };
        protocol = ah[0];
        offset += (usize::from(ah[1]) + 2) * 4;
    }
    Ok(transport(ctx, offset, protocol).packet(source, dst_at))
}

#[inline(always)]
fn parse_ipv6(ctx: &XdpContext, offset: usize) -> Result<Packet, ParseError> {
    let ip: Ipv6Hdr = read_at(ctx, offset)?;
    if ip.vcf[0] >> 4 != 6 {
        return Err(ParseError::Malformed);
    }
    let source = SourceKey::v6(ip.src_addr);
    let dst_at = offset + IPV6_DST_AT;
    let mut next = ip.next_hdr;
    let mut offset = offset + Ipv6Hdr::LEN;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        if !is_ipv6_extension(next) {
            break;
        }
        // Every extension header starts with its next header and a length.
        let Ok(ext) = read_at::<[u8; 4]>(ctx, offset) else {
            return Ok(Fields::protocol_unknown().packet(source, dst_at));
        };
        let header = next;
        next = ext[0];
        offset += match header {
            IPPROTO_FRAGMENT => 8,
            IPPROTO_AH => (usize::from(ext[1]) + 2) * 4,
            _ => (usize::from(ext[1]) + 1) * 8,
        };
        if header == IPPROTO_FRAGMENT && u16::from_be_bytes([ext[2], ext[3]]) >> 3 != 0 {
            // A non-first fragment: the rest is payload.
            return Ok(Fields::unreadable(next).packet(source, dst_at));
        }
    }
    if is_ipv6_extension(next) {
        // A chain longer than the walk.
        return Ok(Fields::protocol_unknown().packet(source, dst_at));
    }
    Ok(transport(ctx, offset, next).packet(source, dst_at))
}

/// The destination port (and TCP flags) of a TCP or UDP header at
/// `offset`; nothing for other protocols. A TCP or UDP header cut short
/// leaves its ports unknown.
#[inline(always)]
fn transport(ctx: &XdpContext, offset: usize, protocol: u8) -> Fields {
    match protocol {
        IPPROTO_TCP => match read_at::<TcpHdr>(ctx, offset) {
            Ok(tcp) => {
                let mut tcp_flags = 0;
                if tcp.syn() != 0 {
                    tcp_flags |= TCP_FLAG_SYN;
                }
                if tcp.ack() != 0 {
                    tcp_flags |= TCP_FLAG_ACK;
                }
                Fields {
                    protocol,
                    dst_port: u16::from_be_bytes(tcp.dest),
                    tcp_flags,
                    transport: Transport::Known,
                    tcp_at: offset as u16,
                }
            }
            Err(_) => Fields::unreadable(protocol),
        },
        IPPROTO_UDP => match read_at::<UdpHdr>(ctx, offset) {
            Ok(udp) => Fields {
                protocol,
                dst_port: u16::from_be_bytes(udp.dst),
                tcp_flags: 0,
                transport: Transport::Known,
                tcp_at: 0,
            },
            Err(_) => Fields::unreadable(protocol),
        },
        _ if is_ipv6_extension(protocol) => Fields::unreadable(protocol),
        _ => Fields::known(protocol),
    }
}
