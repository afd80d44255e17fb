//! The matches rules use (protocol, destination ports, SYN) and how much
//! of a frame's transport layer the parser could read.

use super::{IPPROTO_TCP, IPPROTO_UDP, TCP_FLAG_ACK, TCP_FLAG_SYN};

/// A traffic class: the match of one or more rules.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficClass {
    /// IP protocol number; 0 matches any.
    pub protocol: u8,
    /// Non-zero: only TCP segments with SYN set and ACK clear
    /// ([`TrafficClass::tcp_syn_only`]).
    tcp_syn_only: u8,
    _pad: [u8; 2],
    /// Destination port range (inclusive). `0 ..= 65535` matches any
    /// packet; a narrower range matches only TCP and UDP.
    pub port_min: u16,
    pub port_max: u16,
}

impl TrafficClass {
    /// Frames of `protocol` (0: any) to a destination port in
    /// `port_min ..= port_max`, only TCP SYN segments if `tcp_syn_only`.
    pub const fn new(protocol: u8, port_min: u16, port_max: u16, tcp_syn_only: bool) -> Self {
        Self {
            protocol,
            tcp_syn_only: tcp_syn_only as u8,
            _pad: [0; 2],
            port_min,
            port_max,
        }
    }

    /// Whether only TCP segments with SYN set and ACK clear match.
    #[inline(always)]
    pub const fn tcp_syn_only(&self) -> bool {
        self.tcp_syn_only != 0
    }

    #[inline(always)]
    const fn any_port(&self) -> bool {
        self.port_min == 0 && self.port_max == u16::MAX
    }

    /// Whether a packet matches this class.
    #[inline(always)]
    pub const fn matches(&self, protocol: u8, dst_port: u16, tcp_flags: u8) -> bool {
        if !self.could_match(protocol) {
            return false;
        }
        if self.tcp_syn_only != 0 && tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK) != TCP_FLAG_SYN {
            return false;
        }
        self.any_port() || (dst_port >= self.port_min && dst_port <= self.port_max)
    }

    /// Whether some packet of `protocol` matches this class, whatever its
    /// ports and flags.
    #[inline(always)]
    pub const fn could_match(&self, protocol: u8) -> bool {
        if self.protocol != 0 && self.protocol != protocol {
            return false;
        }
        if self.tcp_syn_only != 0 && protocol != IPPROTO_TCP {
            return false;
        }
        self.any_port() || protocol == IPPROTO_TCP || protocol == IPPROTO_UDP
    }

    /// Whether matching needs the transport header (ports or flags).
    #[inline(always)]
    pub const fn needs_transport(&self) -> bool {
        self.tcp_syn_only != 0 || !self.any_port()
    }
}

/// How much of a frame's transport layer the parser could read.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Protocol, ports and flags are known (ports and flags are 0 for
    /// protocols without them).
    Known = 0,
    /// The protocol is known (TCP or UDP), its ports and flags are not: a
    /// non-first fragment, or a header cut short.
    PortUnknown = 1,
    /// Not even the protocol: an IPv6 header chain too long to walk, or
    /// cut short.
    ProtocolUnknown = 2,
}
