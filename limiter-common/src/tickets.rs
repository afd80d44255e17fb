//! The rooms of the windows' tickets (`UNPROVEN`): each rule keeps a
//! reserve of its own, the rest is shared, so a flood of unproven
//! sources under one rule takes its reserve and the shared room, never
//! another rule's reserve. A ticket's value is the account it was taken
//! from (a rule's slot in `RULES`, [`SHARED`], or [`PROVEN`]: a window
//! made for a source that proved its address while the tickets were
//! taken, in the room `WINDOWS` keeps beyond them); `TICKET_COUNTS` keeps
//! per account what the kernel took net of what it gave back, and,
//! apart, what the daemon's reclaim gave back (the kernel adds
//! atomically, the daemon writes whole words: one writer per word).
//! A ticket of an IPv6 source, proven or not, also counts on its /48
//! ([`Ticket`], `PREFIX_TICKETS`): a prefix holds at most
//! [`Rooms::prefix`] tickets, so one holder's /64s take that and no more
//! of their rule's rooms or of the proven room. docs/architecture.md,
//! "Room per rule" and "Room per prefix", has the bounds.

use crate::{keys::AddressFamily, maps::PROVEN_SHARE, rules::RULE_SLOTS, SourceKey};

/// The account of the shared room (the rules' are their slots).
pub const SHARED: u16 = RULE_SLOTS as u16;
/// The account of the proven room: the windows of sources that proved
/// their address while the tickets were taken (bounded by `WINDOWS`'
/// room beyond the tickets, [`Rooms::proven`], and per prefix by
/// [`Rooms::prefix`]).
pub const PROVEN: u16 = RULE_SLOTS as u16 + 1;
/// Accounts: one per rule slot, the shared room and the proven room.
pub const ACCOUNTS: u32 = RULE_SLOTS + 2;
/// `TICKET_COUNTS` entries: the kernel's counts, then the daemon's.
pub const COUNTS: u32 = 2 * ACCOUNTS;

/// `TICKET_COUNTS` index of the kernel's count of `account`: tickets
/// taken, less those the program gave back.
pub const fn taken_index(account: u16) -> u32 {
    account as u32
}

/// `TICKET_COUNTS` index of the tickets of `account` the daemon gave back
/// (written by the daemon alone).
pub const fn returned_index(account: u16) -> u32 {
    ACCOUNTS + account as u32
}

/// `TICKET_CLOCK` indices: the ring's two counters, the tickets there
/// are (`max_sources`), the rooms ([`Rooms`]; written by userspace),
/// until when the ring rests ([`LOOK_REST_NS`]), and the ring's length
/// (`WINDOWS`' capacity: every window made under a ticket, proven ones
/// too, is appended).
pub const CLOCK_APPENDED: u32 = 0;
pub const CLOCK_LOOKED: u32 = 1;
pub const CLOCK_CAPACITY: u32 = 2;
pub const CLOCK_RESERVE: u32 = 3;
pub const CLOCK_SHARED: u32 = 4;
pub const CLOCK_RESTING: u32 = 5;
pub const CLOCK_PREFIX: u32 = 6;
pub const CLOCK_RING: u32 = 7;
/// `TICKET_CLOCK` entries.
pub const CLOCK_WORDS: u32 = 8;

/// A /48 may hold a 64th of the tickets ([`Rooms::prefix`]), and at
/// least [`PREFIX_MIN`]: at the default 65,536, 1,024 windows of its /64s,
/// so that one holder of a /48 (65,536 /64s, real addresses, no spoofing
/// needed) takes 1.6% of its rule's rooms, not all of them.
pub const PREFIX_SHARE: u32 = 64;
/// The least room of a prefix, whatever the capacity.
pub const PREFIX_MIN: u64 = 64;
/// The prefix of an IPv6 source that shares one room: a /48, an end
/// site's usual allocation (IPv4 sources have none: a holder of a /24 has
/// 256 addresses, fewer than any prefix's room).
pub const PREFIX_BITS: u32 = 48;
/// `PREFIX_TICKETS` cells per row, and rows: a prefix counts on one cell
/// of each row (chosen by a keyed hash nobody outside can aim at) and
/// holds the least of the two, so that it reads another's tickets only if
/// both its cells are shared with prefixes that hold many (a count-min
/// sketch: it reads more than it holds, never less). 64 prefixes at
/// their room (every ticket of a rule of 65,536) fill at most 128 cells of
/// each row: a new prefix finds both its cells among them with a chance
/// of (128 / 4,096)^2, 1 in 1,024.
pub const PREFIX_CELLS: u32 = 4_096;
pub const PREFIX_ROWS: u32 = 2;
/// `PREFIX_TICKETS` entries: the kernel's counts of every cell, then the
/// daemon's.
pub const PREFIX_WORDS: u32 = 2 * PREFIX_ROWS * PREFIX_CELLS;

/// `PREFIX_TICKETS` index of the kernel's count of `cell` (an index over
/// both rows): tickets taken, less those the program gave back.
pub const fn prefix_taken_index(cell: u16) -> u32 {
    cell as u32
}

/// `PREFIX_TICKETS` index of the tickets of `cell` the daemon gave back
/// (written by the daemon alone).
pub const fn prefix_returned_index(cell: u16) -> u32 {
    PREFIX_ROWS * PREFIX_CELLS + cell as u32
}

/// A ticket, as `UNPROVEN` keeps it: the account it was taken from and,
/// for an IPv6 source, the cells of its prefix it counts on, so that
/// whoever gives it back (the program or the daemon) takes it off the
/// same cells without hashing again.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ticket {
    account: u16,
    /// One cell of each row, or both [`NO_CELL`]: no prefix room.
    cells: [u16; 2],
    _pad: u16,
}

/// [`Ticket`]'s cells of a source without a prefix room.
const NO_CELL: u16 = u16::MAX;

impl Ticket {
    /// A ticket of `account` counting on `cells` (`None`: no prefix).
    pub const fn new(account: u16, cells: Option<[u16; 2]>) -> Self {
        Self {
            account,
            cells: match cells {
                Some(cells) => cells,
                None => [NO_CELL; 2],
            },
            _pad: 0,
        }
    }

    /// The account it was taken from.
    pub const fn account(&self) -> u16 {
        self.account
    }

    /// The prefix cells it counts on, if any.
    pub const fn cells(&self) -> Option<[u16; 2]> {
        if self.cells[0] == NO_CELL {
            None
        } else {
            Some(self.cells)
        }
    }
}

/// The `PREFIX_TICKETS` cells (one per row, as indices over both rows) of
/// the prefix of `key` under the hash key `seed`: IPv6 keys only (their
/// first [`PREFIX_BITS`] bits, whatever the rule's own prefix length), and
/// only keys at least that long (a shorter one is a prefix of its own).
#[inline(always)]
pub fn prefix_cells(key: &SourceKey, seed: u32) -> Option<[u16; 2]> {
    if key.family() != AddressFamily::V6 || u32::from(key.prefix_len) < PREFIX_BITS {
        return None;
    }
    let a = &key.addr;
    let mix = |hash: u32, word: u32| {
        let h = (hash ^ word).wrapping_mul(0x9e37_79b1);
        h ^ (h >> 15)
    };
    let first = u32::from_le_bytes([a[0], a[1], a[2], a[3]]);
    let second = u32::from_le_bytes([a[4], a[5], 0, 0]);
    let hash = mix(mix(seed, first), second);
    let other = mix(hash, 0x85eb_ca6b);
    let bits = 32 - PREFIX_CELLS.trailing_zeros();
    Some([
        (hash >> bits) as u16,
        (PREFIX_CELLS + (other >> bits)) as u16,
    ])
}

/// How long the ring rests (is not looked at, on any CPU) after a look
/// that freed nothing: every entry it looked at was busy, or gone with
/// its ticket already given back. Timed by the kernel's fine clock (the
/// coarse one moves 1 to 4 ms at a time). A look at a busy window costs
/// a `WINDOWS` lookup (a cache miss) and an append, and under a flood
/// that holds the tickets nearly every look is that: an aimed flood of
/// 400,000 frames a second, each refused for want of a ticket and each
/// looking at two entries, spent a quarter of the receiving CPU in the
/// looks (issue 50, docs/benchmarks.md). Resting 200 us bounds the looks
/// that find nothing to 5,000 a second on the whole machine (10,000
/// entries: the whole ring of 65,536 in 6.6 s), while a look that frees
/// a window lets the next frame look at once, so a run of idle windows is
/// freed as fast as new sources ask for them. (A rest of 20 us, 50,000
/// looks a second, still cost the flood's receiving CPU 81% against 70%
/// for one tick of the coarse clock.)
pub const LOOK_REST_NS: u64 = 200_000;

/// How `capacity` tickets are shared by `rules` rules: half of them split
/// evenly into reserves, the rest (with what the split leaves) shared.
/// With one rule, its reserve and the shared room make the whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rooms {
    /// Tickets each rule may hold that no other rule can take.
    pub reserve: u64,
    /// Tickets any rule may hold once its reserve is taken.
    pub shared: u64,
    /// Tickets the sources of one prefix may hold, in all rules and the
    /// proven room ([`PREFIX_SHARE`]).
    pub prefix: u64,
    /// Windows `WINDOWS` keeps beyond the tickets for proven sources
    /// (`maps::PROVEN_SHARE`): what the [`PROVEN`] account can hold,
    /// bounded by the map itself, not counted against (read by
    /// userspace; the kernel's copy is 0).
    pub proven: u64,
}

impl Rooms {
    /// The rooms of `capacity` tickets (`max_sources`) for `rules` rules
    /// (0: every ticket shared).
    pub const fn new(capacity: u32, rules: u32) -> Self {
        let prefix = capacity / PREFIX_SHARE;
        let prefix = if (prefix as u64) < PREFIX_MIN {
            PREFIX_MIN
        } else {
            prefix as u64
        };
        let proven = (capacity / PROVEN_SHARE) as u64;
        let capacity = capacity as u64;
        if rules == 0 {
            return Self {
                reserve: 0,
                shared: capacity,
                prefix,
                proven,
            };
        }
        let reserve = capacity / (2 * rules as u64);
        Self {
            reserve,
            shared: capacity - reserve * rules as u64,
            prefix,
            proven,
        }
    }

    /// Whether a prefix reading `held` tickets (the least of its cells)
    /// has room for one more.
    pub const fn prefix_has_room(&self, held: u64) -> bool {
        held < self.prefix
    }

    /// Whether a rule's reserve holding `own` tickets has room for one
    /// more.
    pub const fn reserve_has_room(&self, own: u64) -> bool {
        own < self.reserve
    }

    /// Whether the shared room holding `shared` tickets has room for one
    /// more.
    pub const fn shared_has_room(&self, shared: u64) -> bool {
        shared < self.shared
    }

    /// The account a new ticket of the rule in `slot` takes, holding
    /// `own` tickets while the shared room holds `shared`: its reserve
    /// first, then the shared room, else none. (The kernel counts the
    /// ticket on an account before it asks, and takes it off again if
    /// there was no room: two CPUs never both take an account's last.)
    pub const fn account(&self, slot: u32, own: u64, shared: u64) -> Option<u16> {
        if slot < RULE_SLOTS && self.reserve_has_room(own) {
            Some(slot as u16)
        } else if self.shared_has_room(shared) {
            Some(SHARED)
        } else {
            None
        }
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: #[repr(C)], three u16 and explicit padding (the size test
    // below): every bit pattern is valid, no uninitialised bytes.
    unsafe impl aya::Pod for super::Ticket {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rooms_add_up_to_the_capacity() {
        for capacity in [0, 1, 7, 1000, 65_536, u32::MAX] {
            for rules in [0, 1, 2, 3, 255, 256] {
                let rooms = Rooms::new(capacity, rules);
                assert_eq!(
                    rooms.reserve * u64::from(rules) + rooms.shared,
                    u64::from(capacity),
                    "{capacity} tickets, {rules} rules"
                );
                assert!(rooms.shared >= u64::from(capacity) / 2);
            }
        }
        assert_eq!(
            Rooms::new(65_536, 3),
            Rooms {
                reserve: 10_922,
                shared: 32_770,
                prefix: 1_024,
                proven: 16_384,
            }
        );
        assert_eq!(Rooms::new(1_000, 3).prefix, PREFIX_MIN);
    }

    fn v6(text: &str) -> SourceKey {
        let addr: core::net::Ipv6Addr = text.parse().expect("an address");
        SourceKey::v6(addr.octets()).masked(64, &crate::keys::prefix_mask(64))
    }

    /// Every /64 of a /48 counts on the same two cells, one per row,
    /// whatever its class; IPv4 keys and keys shorter than a /48 on none.
    #[test]
    fn a_48s_sources_share_its_cells() {
        let seed = 0x1234_5678;
        let cells = prefix_cells(&v6("2001:db8:1:0::1"), seed).expect("cells");
        assert!(u32::from(cells[0]) < PREFIX_CELLS);
        assert!((PREFIX_CELLS..2 * PREFIX_CELLS).contains(&u32::from(cells[1])));
        for subnet in [1u16, 0xff, 0xffff] {
            let key = v6(&std::format!("2001:db8:1:{subnet:x}::9")).with_class(3);
            assert_eq!(prefix_cells(&key, seed), Some(cells));
        }
        assert_ne!(prefix_cells(&v6("2001:db8:1::1"), seed + 1), Some(cells));
        assert_eq!(prefix_cells(&SourceKey::v4([198, 51, 100, 7]), seed), None);
        let short = v6("2001:db8::").masked(32, &crate::keys::prefix_mask(32));
        assert_eq!(prefix_cells(&short, seed), None);
    }

    /// The /48s of 2001:db8::/32 spread over the cells of each row:
    /// 65,536 prefixes, no cell of either row with more than three times
    /// its share (16).
    #[test]
    fn the_48s_spread_over_the_cells() {
        let mut counts = [0u32; 2 * PREFIX_CELLS as usize];
        for site in 0..=u16::MAX {
            let key = v6(&std::format!("2001:db8:{site:x}::1"));
            for cell in prefix_cells(&key, 0xdead_beef).expect("cells") {
                counts[usize::from(cell)] += 1;
            }
        }
        let share = 65_536 / PREFIX_CELLS;
        assert!(
            counts.iter().all(|n| *n <= 3 * share),
            "{:?}",
            counts.iter().max()
        );
    }

    #[test]
    fn a_ticket_keeps_its_account_and_cells() {
        let ticket = Ticket::new(7, Some([3, 4_100]));
        assert_eq!((ticket.account(), ticket.cells()), (7, Some([3, 4_100])));
        assert_eq!(Ticket::new(SHARED, None).cells(), None);
        assert_eq!(Ticket::new(PROVEN, Some([1, 2])).account(), PROVEN);
        assert_eq!(core::mem::size_of::<Ticket>(), 8);
        assert_eq!(prefix_returned_index(0), PREFIX_WORDS / 2);
    }

    /// A flood under one rule takes every ticket it can; each other rule
    /// still gets its whole reserve, and nothing is held past capacity.
    #[test]
    fn a_flood_under_one_rule_leaves_every_other_rule_its_reserve() {
        let (capacity, rules) = (1000, 4);
        let rooms = Rooms::new(capacity, rules);
        let mut held = [0u64; 4];
        let mut shared = 0;
        let take = |slot: usize, held: &mut [u64; 4], shared: &mut u64| {
            match rooms.account(slot as u32, held[slot], *shared) {
                Some(SHARED) => *shared += 1,
                Some(account) => {
                    assert_eq!(account as usize, slot);
                    held[slot] += 1;
                }
                None => return false,
            }
            true
        };
        while take(0, &mut held, &mut shared) {}
        assert_eq!(held[0] + shared, rooms.reserve + rooms.shared);
        for slot in 1..4 {
            let mut got = 0;
            while take(slot, &mut held, &mut shared) {
                got += 1;
            }
            assert_eq!(got, rooms.reserve, "rule {slot}");
        }
        assert_eq!(held.iter().sum::<u64>() + shared, u64::from(capacity));
    }

    #[test]
    fn the_accounts_have_their_own_words() {
        assert_eq!(taken_index(PROVEN) + 1, returned_index(0));
        assert_eq!(returned_index(PROVEN) + 1, COUNTS);
        assert_eq!(SHARED + 1, PROVEN);
    }
}
