//! Limits at several levels: besides its per-source limit, a `limit` rule
//! may carry up to [`MAX_LEVELS`] more, each a packet allowance over its
//! own window, keyed by the source itself (another window over the same
//! traffic), by a prefix containing the source (an aggregate: every
//! source of a /24 shares one budget), or by the rule as a whole.
//!
//! A frame the per-source limit admits is then admitted by each level in
//! turn, and refused by the first that has no room; the kernel keeps one
//! shared window per level and key ([`LevelKey`]) in `AGGREGATES`.
//!
//! Fairness inside an exhausted aggregate: a source whose own window
//! holds more than the rule's [`Rule::fair_packets`](super::Rule) (a
//! [`FAIR_SHARES`]th of its tightest aggregate) is *heavy*, and an
//! aggregate admits heavy sources only up to its
//! [`Level::heavy_allowance_packets`], which keeps the last
//! [`RESERVE_SHARES`]th of it for the light ones (docs/architecture.md,
//! "Limits at several levels").

use crate::{
    keys::{AddressFamily, SourceKey},
    state::WindowState,
    window::{WindowCache, WindowParams},
};

/// Levels a rule may carry besides its per-source limit.
pub const MAX_LEVELS: usize = 4;
/// A source is heavy once its own window holds more than this share
/// (1/`FAIR_SHARES`) of its rule's tightest aggregate. Sources become
/// heavy only past it, so `n` sources at the fair share fill `n / 32` of
/// the aggregate while all of them are light: the reserve
/// (1/[`RESERVE_SHARES`]) stays whole while `n / 32 <= 7 / 8`, that is
/// for up to 28 sources sharing it evenly (with 1/16, 14: sixteen senders
/// of a /24, each at its fair share, took the whole /24 before any was
/// heavy).
pub const FAIR_SHARES: u64 = 32;
/// The last 1/`RESERVE_SHARES` of an aggregate's allowance admits only
/// light sources.
pub const RESERVE_SHARES: u64 = 8;

/// What a level's windows are keyed by.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LevelKind {
    /// Each source (its key as the rule counts it): another window over
    /// the same traffic.
    Source = 1,
    /// The prefix of the level's length that contains the source.
    Prefix = 2,
    /// Every frame of the rule together.
    Rule = 3,
    /// The destination's prefix of the level's length (/32 and /128: each
    /// destination address): every source toward it together.
    Destination = 4,
    /// Each source toward each destination: a client's budget per service
    /// address (IPv6: each address folded to 64 bits, see [`Level::key`]).
    Pair = 5,
}

impl LevelKind {
    /// The kind a byte encodes (`None` for an unused slot, 0, and any
    /// byte no kind encodes).
    #[inline(always)]
    pub const fn from_u8(value: u8) -> Option<LevelKind> {
        match value {
            1 => Some(LevelKind::Source),
            2 => Some(LevelKind::Prefix),
            3 => Some(LevelKind::Rule),
            4 => Some(LevelKind::Destination),
            5 => Some(LevelKind::Pair),
            _ => None,
        }
    }

    /// Whether this kind is an aggregate (a budget several sources share).
    pub const fn is_aggregate(self) -> bool {
        !matches!(self, LevelKind::Source | LevelKind::Pair)
    }

    /// Whether this kind keys by the frame's destination.
    pub const fn needs_destination(self) -> bool {
        matches!(self, LevelKind::Destination | LevelKind::Pair)
    }
}

/// One level of a compiled rule (`Rule::levels`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Level {
    /// Packets per window (`pps * window + burst`).
    pub allowance_packets: u64,
    /// What a heavy source may fill the window to: the allowance less its
    /// reserve for light sources (the allowance itself for a `Source`
    /// level).
    pub heavy_allowance_packets: u64,
    /// Bucket width in ns (`window / buckets`).
    pub bucket_ns: u64,
    /// Buckets per window.
    pub buckets: u32,
    /// A [`LevelKind`] value; 0: unused.
    kind: u8,
    /// A `Prefix` level's length for IPv4 and IPv6 sources.
    pub v4_len: u8,
    pub v6_len: u8,
    _pad: u8,
    /// The byte masks of `v4_len` (first 4 bytes) and `v6_len`.
    pub masks: [[u8; 16]; 2],
}

impl Level {
    /// An unused slot.
    pub const UNUSED: Level = Level {
        allowance_packets: 0,
        heavy_allowance_packets: 0,
        bucket_ns: 0,
        buckets: 0,
        kind: 0,
        v4_len: 0,
        v6_len: 0,
        _pad: 0,
        masks: [[0; 16]; 2],
    };

    /// A level of `kind` keyed by prefixes of `v4_len` and `v6_len` bits
    /// (used by a `Prefix` level only), with its window empty: the caller
    /// sets it.
    pub fn new(kind: LevelKind, v4_len: u8, v6_len: u8) -> Self {
        let (v4_len, v6_len) = match kind {
            LevelKind::Source | LevelKind::Pair => (32, 128),
            LevelKind::Prefix | LevelKind::Destination => (v4_len.min(32), v6_len.min(128)),
            LevelKind::Rule => (0, 0),
        };
        Self {
            kind: kind as u8,
            v4_len,
            v6_len,
            masks: [crate::prefix_mask(v4_len), crate::prefix_mask(v6_len)],
            ..Self::UNUSED
        }
    }

    #[inline(always)]
    pub const fn kind(&self) -> Option<LevelKind> {
        LevelKind::from_u8(self.kind)
    }

    /// The window a frame is judged against: the whole allowance for a
    /// light source, the allowance less the reserve for a heavy one.
    #[inline(always)]
    pub const fn params(&self, heavy: bool) -> WindowParams {
        WindowParams {
            bucket_ns: self.bucket_ns,
            buckets: self.buckets,
            allowance_packets: if heavy {
                self.heavy_allowance_packets
            } else {
                self.allowance_packets
            },
            allowance_bytes: crate::window::UNLIMITED,
        }
    }

    /// The key of this level's window for a frame keyed `key` toward
    /// `destination` (the address as the frame carries it, IPv4 in its
    /// first 4 bytes; read only by the kinds that key by it), under the
    /// rule whose budget class is `budget` and whose levels are tagged
    /// `tag` (`Rule::level_tag`), this level being the rule's `index`th:
    /// the source's (or the destination's) address through the level's
    /// mask of its family (all ones for a `Source` level, the prefix's for
    /// a `Prefix` or `Destination` level, none for a `Rule` level;
    /// [`Level::new`] sets them). A `Pair` key holds both addresses: an
    /// IPv4 source then its destination, or an IPv6 source's and its
    /// destination's halves XORed into 64 bits each (a source keyed by at
    /// most a /64 keeps its prefix whole).
    #[inline(always)]
    pub fn key(
        &self,
        key: &SourceKey,
        destination: &[u8; 16],
        budget: u8,
        tag: u32,
        index: u8,
    ) -> LevelKey {
        let v4 = key.family() == AddressFamily::V4;
        let (mask, prefix_len) = if v4 {
            (&self.masks[0], self.v4_len)
        } else {
            (&self.masks[1], self.v6_len)
        };
        let kind = self.kind;
        let mut addr = if kind == LevelKind::Destination as u8 {
            *destination
        } else {
            key.addr
        };
        let mut i = 0;
        while i < 16 {
            addr[i] &= mask[i];
            i += 1;
        }
        if kind == LevelKind::Pair as u8 {
            let mut i = 0;
            while i < 8 {
                if v4 {
                    addr[4 + i] = if i < 4 { destination[i] } else { 0 };
                } else {
                    addr[i] = key.addr[i] ^ key.addr[8 + i];
                    addr[8 + i] = destination[i] ^ destination[8 + i];
                }
                i += 1;
            }
        }
        LevelKey {
            addr,
            family: key.family() as u8,
            // A source level keeps the key's own length.
            prefix_len: if kind == LevelKind::Source as u8 {
                key.prefix_len
            } else {
                prefix_len
            },
            class: budget,
            level: index + 1,
            tag,
        }
    }
}

/// The key of a level's window (`AGGREGATES`): the address the level
/// keys by (the source's, cut to the level's prefix, or none), the rule's
/// budget class, which of the rule's levels, and the rule's level tag, so
/// that two rules' levels never share a window.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LevelKey {
    pub addr: [u8; 16],
    /// An [`AddressFamily`] value.
    pub family: u8,
    pub prefix_len: u8,
    pub class: u8,
    /// 1 + the level's index in its rule.
    pub level: u8,
    /// The rule's `level_tag`.
    pub tag: u32,
}

impl LevelKey {
    /// The key's address (its prefix's first address).
    pub fn ip(&self) -> core::net::IpAddr {
        if self.family == AddressFamily::V4 as u8 {
            core::net::Ipv4Addr::new(self.addr[0], self.addr[1], self.addr[2], self.addr[3]).into()
        } else {
            core::net::Ipv6Addr::from(self.addr).into()
        }
    }
}

/// The `family` byte of an overflow cell's key (`AGG_CELLS`): no
/// address family.
pub const CELL_FAMILY: u8 = 0;
/// The longest window of a level (ns): a minute.
pub const MAX_LEVEL_WINDOW_NS: u64 = 60_000_000_000;
/// Overflow cells per level: the aggregates of one level that find
/// `AGGREGATES` full share these, by a keyed hash of their key.
pub const CELLS_PER_LEVEL: u32 = 64;
/// Capacity of `AGG_CELLS`: the cells of 64 levels at once.
pub const AGG_CELLS: u32 = 4096;

impl LevelKey {
    /// The key of the overflow cell this aggregate's frames are judged on
    /// while it has no window of its own and `AGGREGATES` is full: the same
    /// level of the same rule (its class, level and tag), the address
    /// replaced by one of [`CELLS_PER_LEVEL`] indices, a hash of the
    /// aggregate's address and prefix keyed by `seed` (random, chosen by
    /// the daemon: nobody outside can aim at a cell).
    #[inline(always)]
    pub fn cell(&self, seed: u32) -> LevelKey {
        let word = |i: usize| {
            u32::from_le_bytes([
                self.addr[i],
                self.addr[i + 1],
                self.addr[i + 2],
                self.addr[i + 3],
            ])
        };
        let mix = |hash: u32, word: u32| {
            let h = (hash ^ word).wrapping_mul(0x9e37_79b1);
            h ^ (h >> 15)
        };
        let mut hash = mix(seed, word(0));
        hash = mix(hash, word(4));
        hash = mix(hash, word(8));
        hash = mix(hash, word(12));
        hash = mix(
            hash,
            (u32::from(self.family) << 8) | u32::from(self.prefix_len),
        );
        let index = hash >> (32 - CELLS_PER_LEVEL.trailing_zeros());
        // One 128-bit value, not a zeroed array written into: the kernel
        // gets stores, not a `memset` call (a BPF function whose frame
        // 6.1 counts on top of `level`'s).
        LevelKey {
            addr: u128::from(index).to_le_bytes(),
            family: CELL_FAMILY,
            prefix_len: 0,
            ..*self
        }
    }
}

/// A level's shared window (an `AGGREGATES` value): the window, and a
/// view of its older buckets for the bucket it is in, shared by every CPU
/// (many sources, on every CPU, judge against one aggregate: a view per
/// CPU and source would be computed again by each). The older buckets of
/// a window no longer change once its current bucket has begun, so the
/// first frame of a bucket computes the view and every later one reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LevelWindow {
    pub window: WindowState,
    /// `view.bucket_ns` is written last and cleared first: 0 while a CPU
    /// writes the rest.
    pub view: WindowCache,
}

#[cfg(feature = "user")]
mod user {
    // SAFETY (all three): #[repr(C)] structs of integers and byte arrays with
    // explicit padding fields (the size test below): every bit pattern is
    // valid and there are no uninitialised bytes.
    unsafe impl aya::Pod for super::Level {}
    unsafe impl aya::Pod for super::LevelKey {}
    unsafe impl aya::Pod for super::LevelWindow {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;

    const NO_DST: [u8; 16] = [0; 16];

    fn prefix(v4: u8, v6: u8) -> Level {
        Level::new(LevelKind::Prefix, v4, v6)
    }

    #[test]
    fn sizes_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<Level>(), 8 * 3 + 4 + 4 + 32);
        assert_eq!(core::mem::size_of::<LevelKey>(), 16 + 4 + 4);
        assert_eq!(
            core::mem::size_of::<LevelWindow>(),
            core::mem::size_of::<WindowState>() + 9 * 8
        );
    }

    /// A cell keeps its level's identity (class, level, tag), drops the
    /// address for one of `CELLS_PER_LEVEL` indices, and the aggregates of
    /// a level spread over its cells, differently for another seed.
    #[test]
    fn the_aggregates_of_a_level_spread_over_its_cells() {
        let level = prefix(24, 48);
        let mut used = std::collections::BTreeMap::new();
        for i in 0..4096u32 {
            let [_, _, a, b] = i.to_be_bytes();
            let key = level.key(&SourceKey::v4([10, a, b, 1]), &NO_DST, 3, 7, 1);
            let cell = key.cell(99);
            assert_eq!((cell.class, cell.level, cell.tag), (3, 2, 7));
            assert_eq!((cell.family, cell.prefix_len), (CELL_FAMILY, 0));
            let index = u32::from_le_bytes(cell.addr[..4].try_into().unwrap());
            assert!(index < CELLS_PER_LEVEL && cell.addr[4..] == [0; 12]);
            assert_eq!(key.cell(99), cell, "deterministic");
            *used.entry(index).or_insert(0u32) += 1;
        }
        // 4096 aggregates over 64 cells: about 64 each.
        assert_eq!(used.len(), CELLS_PER_LEVEL as usize);
        assert!(used.values().all(|n| (32..=100).contains(n)), "{used:?}");
        let key = level.key(&SourceKey::v4([10, 9, 9, 1]), &NO_DST, 3, 7, 1);
        assert!((0..8).any(|seed| key.cell(seed) != key.cell(99)));
    }

    #[test]
    fn a_prefix_level_keys_every_source_of_its_prefix_alike() {
        let level = prefix(24, 48);
        let a = level.key(&SourceKey::v4([10, 1, 2, 3]), &NO_DST, 0, 7, 0);
        let b = level.key(&SourceKey::v4([10, 1, 2, 250]), &NO_DST, 0, 7, 0);
        let c = level.key(&SourceKey::v4([10, 1, 3, 3]), &NO_DST, 0, 7, 0);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.prefix_len, 24);
        assert_eq!(a.ip().to_string(), "10.1.2.0");
        let mut v6 = [0u8; 16];
        v6[..8].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0x12, 0x34, 0x56, 0x78]);
        let k = level.key(&SourceKey::v6(v6), &NO_DST, 0, 7, 0);
        assert_eq!(k.prefix_len, 48);
        assert_eq!(k.ip().to_string(), "2001:db8:1234::");
    }

    #[test]
    fn levels_rules_and_budgets_never_share_a_window() {
        let level = prefix(24, 48);
        let key = SourceKey::v4([10, 1, 2, 3]);
        let base = level.key(&key, &NO_DST, 0, 7, 0);
        assert_ne!(base, level.key(&key, &NO_DST, 1, 7, 0), "budget");
        assert_ne!(base, level.key(&key, &NO_DST, 0, 8, 0), "rule tag");
        assert_ne!(base, level.key(&key, &NO_DST, 0, 7, 1), "level");
        let whole = Level::new(LevelKind::Rule, 0, 0);
        assert_eq!(
            whole.key(&SourceKey::v4([1, 2, 3, 4]), &NO_DST, 0, 7, 2),
            whole.key(&SourceKey::v4([5, 6, 7, 8]), &NO_DST, 0, 7, 2)
        );
        let own = Level::new(LevelKind::Source, 0, 0);
        assert_ne!(
            own.key(&SourceKey::v4([1, 2, 3, 4]), &NO_DST, 0, 7, 2),
            own.key(&SourceKey::v4([1, 2, 3, 5]), &NO_DST, 0, 7, 2)
        );
    }

    #[test]
    fn destination_and_pair_levels_key_by_the_destination() {
        let to = |octets: [u8; 4]| {
            let mut addr = [0u8; 16];
            addr[..4].copy_from_slice(&octets);
            addr
        };
        let dst = Level::new(LevelKind::Destination, 32, 128);
        let a = SourceKey::v4([10, 0, 0, 1]);
        let b = SourceKey::v4([10, 0, 0, 2]);
        let server = to([192, 0, 2, 1]);
        let other = to([192, 0, 2, 2]);
        assert_eq!(dst.key(&a, &server, 0, 7, 0), dst.key(&b, &server, 0, 7, 0));
        assert_ne!(dst.key(&a, &server, 0, 7, 0), dst.key(&a, &other, 0, 7, 0));
        assert_eq!(dst.key(&a, &server, 0, 7, 0).ip().to_string(), "192.0.2.1");
        let pair = Level::new(LevelKind::Pair, 0, 0);
        let ab = [
            pair.key(&a, &server, 0, 7, 0),
            pair.key(&a, &other, 0, 7, 0),
            pair.key(&b, &server, 0, 7, 0),
            pair.key(&b, &other, 0, 7, 0),
        ];
        for i in 0..4 {
            for j in i + 1..4 {
                assert_ne!(ab[i], ab[j], "pairs {i} and {j}");
            }
        }
        assert_eq!(&ab[0].addr[..8], &[10, 0, 0, 1, 192, 0, 2, 1]);
        // IPv6: a /64 source keeps its prefix whole.
        let mut six = [0u8; 16];
        six[..8].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 9]);
        let key = SourceKey::v6(six).masked(64, &crate::prefix_mask(64));
        let mut d6 = [0u8; 16];
        d6[15] = 1;
        let k = pair.key(&key, &d6, 0, 7, 0);
        assert_eq!(&k.addr[..8], &six[..8]);
        assert_eq!(k.addr[15], 1);
    }

    #[test]
    fn a_heavy_source_is_judged_against_the_allowance_less_the_reserve() {
        let mut level = prefix(24, 48);
        level.allowance_packets = 800;
        level.heavy_allowance_packets = 700;
        assert_eq!(level.params(false).allowance_packets, 800);
        assert_eq!(level.params(true).allowance_packets, 700);
        assert_eq!(level.params(true).allowance_bytes, crate::window::UNLIMITED);
    }
}
