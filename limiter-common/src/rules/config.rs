//! The global configuration the kernel reads (entry 0 of `CONFIG`): the
//! rule generation, source prefix lengths, the matches and how a frame is
//! classified by them.

use super::{TrafficClass, Transport, MAX_CLASSES, UNKNOWN_PROTOCOL_CLASS, UNRESOLVED_BASE};
use crate::prefix_mask;

/// The global configuration (entry 0 of the `CONFIG` array).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Bumped by userspace on every rule change; 0 = no rules loaded (the
    /// program only counts).
    pub generation: u32,
    /// Non-zero: global dry-run, nothing is dropped ([`Config::dry_run`]).
    pub(super) dry_run: u8,
    /// Number of valid entries in `classes`.
    pub class_count: u8,
    /// IPv4 sources are keyed by this prefix length (default 32).
    pub v4_prefix_len: u8,
    /// IPv6 sources are keyed by this prefix length (default 64).
    pub v6_prefix_len: u8,
    /// Byte masks of the two prefix lengths (`keys::prefix_mask`).
    pub v4_mask: [u8; 16],
    pub v6_mask: [u8; 16],
    /// The distinct matches rules use; bit `i` of a frame's class says
    /// whether it matches `classes[i]`.
    pub classes: [TrafficClass; MAX_CLASSES],
    /// Keys the cheap tier's hash (`sketch::place`); chosen at random by
    /// userspace.
    pub sketch_seed: u32,
    /// Non-zero: sources are tiered (cheap, exact, hot; [`Config::tiered`]).
    pub(super) tiered: u8,
    /// The largest `Rule::cheap_frames` of the live rules, or of the
    /// stateless allow/deny threshold: a frame whose cheap-tier count is
    /// above it resolves no rule before looking for state.
    pub cheap_max: u8,
    /// Non-zero: a rule has a level keyed by the destination, so the
    /// kernel keeps each frame's destination address ([`Config::destinations`]).
    pub(super) destinations: u8,
    /// Bit 0: the live lists hold IPv4 prefixes; bit 1: IPv6 ones
    /// ([`Config::lists`]). Kept across rule pushes.
    pub(super) lists: u8,
    /// The half of the list tries the kernel reads ([`Config::list_half`]).
    pub(super) list_half: u8,
    /// Non-zero: the ban tries may hold bans ([`Config::bans`]).
    pub(super) bans: u8,
    pub(super) _pad: [u8; 2],
}

impl Config {
    /// Generation 0 (no rules loaded) without matches, in global dry-run
    /// if `dry_run`, keying sources by these prefix lengths (and their
    /// masks).
    pub const fn new(dry_run: bool, v4_prefix_len: u8, v6_prefix_len: u8) -> Self {
        Self {
            generation: 0,
            dry_run: dry_run as u8,
            class_count: 0,
            v4_prefix_len,
            v6_prefix_len,
            v4_mask: prefix_mask(v4_prefix_len),
            v6_mask: prefix_mask(v6_prefix_len),
            classes: [TrafficClass::new(0, 0, 0, false); MAX_CLASSES],
            sketch_seed: 0,
            tiered: 0,
            cheap_max: 0,
            destinations: 0,
            lists: 0,
            list_half: 0,
            bans: 0,
            _pad: [0; 2],
        }
    }

    /// Whether the live lists hold prefixes of IPv4 (`v4`) or IPv6
    /// sources: only then does a frame look its source up in them.
    #[inline(always)]
    pub const fn lists(&self, v4: bool) -> bool {
        self.lists & if v4 { 1 } else { 2 } != 0
    }

    /// The half (0 or 1) of the list tries the kernel reads: the live
    /// lists' (`lists`).
    #[inline(always)]
    pub const fn list_half(&self) -> u8 {
        self.list_half % 2
    }

    /// Which families the live lists hold prefixes of, in half `half`.
    pub fn set_lists(&mut self, v4: bool, v6: bool, half: u8) {
        self.lists = u8::from(v4) | (u8::from(v6) << 1);
        self.list_half = half % 2;
    }

    /// Whether a ban may exist: only then does a frame look its source up
    /// in the ban tries.
    #[inline(always)]
    pub const fn bans(&self) -> bool {
        self.bans != 0
    }

    pub fn set_bans(&mut self, bans: bool) {
        self.bans = u8::from(bans);
    }

    /// This configuration with `live`'s lists and bans: a rule push
    /// changes neither.
    pub fn keep_lists_of(mut self, live: &Config) -> Self {
        self.lists = live.lists;
        self.list_half = live.list_half;
        self.bans = live.bans;
        self
    }

    /// Whether a live rule has a level keyed by the destination: only then
    /// does a frame's destination address reach the judge (`FRAME_DST`).
    #[inline(always)]
    pub const fn destinations(&self) -> bool {
        self.destinations != 0
    }

    pub fn set_destinations(&mut self, destinations: bool) {
        self.destinations = u8::from(destinations);
    }

    /// Whether sources are tiered: a source gets no state until the cheap
    /// tier sees it send more than its rule's `cheap_frames` in an epoch,
    /// then a shared window, and per-CPU state only once it is busy or
    /// refused. Off: every source gets per-CPU state on its first frame.
    #[inline(always)]
    pub const fn tiered(&self) -> bool {
        self.tiered != 0
    }

    pub fn set_tiered(&mut self, tiered: bool) {
        self.tiered = tiered as u8;
    }

    /// Whether dry-run is on globally: nothing is dropped.
    #[inline(always)]
    pub const fn dry_run(&self) -> bool {
        self.dry_run != 0
    }

    pub fn set_dry_run(&mut self, dry_run: bool) {
        self.dry_run = dry_run as u8;
    }

    /// The class (`0 .. FRAME_CLASSES`) of a frame: the set of matches it
    /// satisfies, or for a frame not fully read, the set it might satisfy.
    #[inline(always)]
    pub fn classify(&self, protocol: u8, dst_port: u16, tcp_flags: u8, transport: Transport) -> u8 {
        if self.class_count == 0 {
            return 0;
        }
        if let Transport::ProtocolUnknown = transport {
            return UNKNOWN_PROTOCOL_CLASS;
        }
        let unresolved = matches!(transport, Transport::PortUnknown);
        let mut set = 0u8;
        let mut depends_on_ports = false;
        let mut i = 0;
        while i < MAX_CLASSES {
            if i >= self.class_count as usize {
                break;
            }
            let class = &self.classes[i];
            if unresolved {
                if class.could_match(protocol) {
                    set |= 1 << i;
                    depends_on_ports |= class.needs_transport();
                }
            } else if class.matches(protocol, dst_port, tcp_flags) {
                set |= 1 << i;
            }
            i += 1;
        }
        if depends_on_ports {
            UNRESOLVED_BASE + set
        } else {
            // Every match it might satisfy, it does: resolved after all.
            set
        }
    }
}
