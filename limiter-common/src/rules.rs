//! Rules as the kernel reads them: the global `Config`, traffic classes
//! (protocol / destination-port / SYN matches), the compiled `Rule` table
//! and the LPM trie value `RuleRefs`.
//!
//! Userspace compiles the operator's rules into these; the kernel only
//! looks things up. Rule resolution happens once per source state and is
//! cached with `Config::generation`; bumping it makes every source resolve
//! again on its next packet.

/// Traffic classes besides class 0 ("no class matched").
pub const MAX_CLASSES: usize = 4;
/// Rules in one generation's half of the `RULES` array.
pub const MAX_RULES: u32 = 256;
/// `RULES` holds two halves: the live generation's rules and the next's.
pub const RULE_SLOTS: u32 = 2 * MAX_RULES;
/// A rule reference that means "no rule": count and pass.
pub const NO_RULE: u32 = u32::MAX;

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
/// TCP flag bits in the 14th byte of the TCP header.
pub const TCP_FLAG_SYN: u8 = 0x02;
pub const TCP_FLAG_ACK: u8 = 0x10;

/// What a rule does with matching traffic.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Admit up to the rule's limits, drop the rest.
    Limit = 0,
    /// Never limit (still counted).
    Allow = 1,
    /// Always drop.
    Deny = 2,
}

impl Action {
    pub const fn from_u8(value: u8) -> Option<Action> {
        match value {
            0 => Some(Action::Limit),
            1 => Some(Action::Allow),
            2 => Some(Action::Deny),
            _ => None,
        }
    }
}

/// A compiled rule (an entry of the `RULES` array).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    /// Packets per window (`pps * W + burst`), or `window::UNLIMITED`.
    pub allowance_packets: u64,
    /// Bytes per window (`Bps * W + burst`), or `window::UNLIMITED`.
    pub allowance_bytes: u64,
    /// Bucket width in ns (`W / buckets`).
    pub bucket_ns: u64,
    /// Penalty: once over its limit a source is dropped for this long (0: none).
    pub block_ns: u64,
    /// Buckets per window (1 ..= `window::MAX_BUCKETS_PER_WINDOW`).
    pub buckets: u32,
    /// Frames a CPU may lease from the shared window at once (1: none).
    pub lease_packets: u32,
    /// An [`Action`] value.
    pub action: u8,
    /// Non-zero: count would-be drops, drop nothing.
    pub dry_run: u8,
    pub _pad: [u8; 6],
}

/// A traffic class: packets matching it get their own budget per source.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficClass {
    /// IP protocol number; 0 matches any.
    pub protocol: u8,
    /// Non-zero: only TCP segments with SYN set and ACK clear.
    pub tcp_syn_only: u8,
    pub _pad: [u8; 2],
    /// Destination port range (inclusive). `0 ..= 65535` matches any
    /// packet; a narrower range matches only TCP and UDP.
    pub port_min: u16,
    pub port_max: u16,
}

impl TrafficClass {
    /// Whether a packet matches this class.
    #[inline(always)]
    pub const fn matches(&self, protocol: u8, dst_port: u16, tcp_flags: u8) -> bool {
        if self.protocol != 0 && self.protocol != protocol {
            return false;
        }
        if self.tcp_syn_only != 0
            && (protocol != IPPROTO_TCP
                || tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK) != TCP_FLAG_SYN)
        {
            return false;
        }
        let any_port = self.port_min == 0 && self.port_max == u16::MAX;
        if !any_port {
            if protocol != IPPROTO_TCP && protocol != IPPROTO_UDP {
                return false;
            }
            if dst_port < self.port_min || dst_port > self.port_max {
                return false;
            }
        }
        true
    }
}

/// The global configuration (entry 0 of the `CONFIG` array).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Bumped by userspace on every rule change; 0 = no rules loaded (the
    /// program only counts).
    pub generation: u32,
    /// Non-zero: global dry-run, nothing is dropped.
    pub dry_run: u8,
    /// Number of valid entries in `classes`.
    pub class_count: u8,
    /// IPv4 sources are keyed by this prefix length (default 32).
    pub v4_prefix_len: u8,
    /// IPv6 sources are keyed by this prefix length (default 64).
    pub v6_prefix_len: u8,
    /// Byte masks of the two prefix lengths (`keys::prefix_mask`).
    pub v4_mask: [u8; 16],
    pub v6_mask: [u8; 16],
    /// Traffic classes; a packet belongs to the first that matches
    /// (class index = position + 1), or to class 0.
    pub classes: [TrafficClass; MAX_CLASSES],
}

impl Config {
    /// The traffic class index (0 ..= `MAX_CLASSES`) of a packet.
    #[inline(always)]
    pub fn classify(&self, protocol: u8, dst_port: u16, tcp_flags: u8) -> u8 {
        let mut i = 0;
        while i < MAX_CLASSES {
            if i >= self.class_count as usize {
                break;
            }
            if self.classes[i].matches(protocol, dst_port, tcp_flags) {
                return i as u8 + 1;
            }
            i += 1;
        }
        0
    }
}

/// The LPM trie value: for each traffic class, the `RULES` index that
/// applies to sources inside the prefix (`NO_RULE` for none).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleRefs {
    pub rules: [u32; MAX_CLASSES + 1],
}

impl Default for RuleRefs {
    fn default() -> Self {
        Self {
            rules: [NO_RULE; MAX_CLASSES + 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(protocol: u8, ports: (u16, u16), syn: bool) -> TrafficClass {
        TrafficClass {
            protocol,
            tcp_syn_only: syn as u8,
            _pad: [0; 2],
            port_min: ports.0,
            port_max: ports.1,
        }
    }

    #[test]
    fn classes_match_protocol_ports_and_syn() {
        let dns = class(IPPROTO_UDP, (53, 53), false);
        assert!(dns.matches(IPPROTO_UDP, 53, 0));
        assert!(!dns.matches(IPPROTO_UDP, 54, 0));
        assert!(!dns.matches(IPPROTO_TCP, 53, 0));

        let syn = class(IPPROTO_TCP, (0, u16::MAX), true);
        assert!(syn.matches(IPPROTO_TCP, 80, TCP_FLAG_SYN));
        assert!(!syn.matches(IPPROTO_TCP, 80, TCP_FLAG_SYN | TCP_FLAG_ACK));
        assert!(!syn.matches(IPPROTO_UDP, 80, TCP_FLAG_SYN));

        let web = class(0, (80, 443), false);
        assert!(web.matches(IPPROTO_TCP, 443, 0));
        assert!(web.matches(IPPROTO_UDP, 80, 0));
        assert!(!web.matches(1, 0, 0), "ICMP has no ports");

        let icmp = class(1, (0, u16::MAX), false);
        assert!(icmp.matches(1, 0, 0));
    }

    #[test]
    fn the_first_matching_class_wins() {
        let mut config = Config {
            class_count: 2,
            ..Config::default()
        };
        config.classes[0] = class(IPPROTO_UDP, (53, 53), false);
        config.classes[1] = class(IPPROTO_UDP, (0, 1023), false);
        config.classes[2] = class(IPPROTO_TCP, (0, u16::MAX), false); // beyond class_count
        assert_eq!(config.classify(IPPROTO_UDP, 53, 0), 1);
        assert_eq!(config.classify(IPPROTO_UDP, 123, 0), 2);
        assert_eq!(config.classify(IPPROTO_UDP, 5353, 0), 0);
        assert_eq!(config.classify(IPPROTO_TCP, 80, 0), 0);
    }

    #[test]
    fn abi_sizes_have_no_implicit_padding() {
        use core::mem::size_of;
        assert_eq!(size_of::<Rule>(), 8 * 4 + 4 + 4 + 1 + 1 + 6);
        assert_eq!(size_of::<TrafficClass>(), 8);
        assert_eq!(size_of::<Config>(), 4 + 4 + 16 + 16 + 8 * MAX_CLASSES);
        assert_eq!(size_of::<RuleRefs>(), 4 * (MAX_CLASSES + 1));
    }
}
