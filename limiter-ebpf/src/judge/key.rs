//! The first step of a frame's path: its key (the source cut to the
//! configured prefix, and its traffic class) and the rule that judges it.

use aya_ebpf::maps::lpm_trie::Key;
use limiter_common::{
    rules::{prefix_key_v4, prefix_key_v6, NO_RULE, PREFIX_HALF_BITS},
    AddressFamily, Config, SourceKey,
};
use limiter_ebpf::parse::Packet;

use crate::maps::{PREFIXES_V4, PREFIXES_V6};

/// The key of a frame's state: its source cut to the configured prefix,
/// and its traffic class.
#[inline(always)]
pub(super) fn source_key(config: &Config, packet: &Packet, key: &mut SourceKey) {
    let (prefix_len, mask) = if packet.source.family() == AddressFamily::V4 {
        (config.v4_prefix_len, &config.v4_mask)
    } else {
        (config.v6_prefix_len, &config.v6_mask)
    };
    let class = config.classify(
        packet.protocol,
        packet.dst_port,
        packet.tcp_flags,
        packet.transport,
    );
    *key = packet.source.masked(prefix_len, mask).with_class(class);
}

/// Longest-prefix match of the key's address among generation
/// `generation`'s prefixes, then its class's rule.
#[inline(always)]
pub(super) fn resolve(key: &SourceKey, generation: u32) -> u32 {
    let bits = PREFIX_HALF_BITS + u32::from(key.prefix_len);
    let refs = if key.family() == AddressFamily::V4 {
        let addr = [key.addr[0], key.addr[1], key.addr[2], key.addr[3]];
        PREFIXES_V4.get(Key::new(bits, prefix_key_v4(generation, addr)))
    } else {
        PREFIXES_V6.get(Key::new(bits, prefix_key_v6(generation, &key.addr)))
    };
    refs.and_then(|refs| refs.rules.get(usize::from(key.class)).copied())
        .unwrap_or(NO_RULE)
}
