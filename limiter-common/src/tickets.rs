//! The rooms of the windows' tickets (`UNPROVEN`): each rule keeps a
//! reserve of its own, the rest is shared, so a flood of unproven
//! sources under one rule takes its reserve and the shared room, never
//! another rule's reserve. A ticket's value is the account it was taken
//! from (a rule's slot in `RULES`, or [`SHARED`]); `TICKET_COUNTS` keeps
//! per account what the kernel took net of what it gave back, and,
//! apart, what the daemon's reclaim gave back (the kernel adds
//! atomically, the daemon writes whole words: one writer per word).
//! docs/architecture.md, "Room per rule", has the bounds.

use crate::rules::RULE_SLOTS;

/// The account of the shared room (the rules' are their slots).
pub const SHARED: u16 = RULE_SLOTS as u16;
/// Accounts: one per rule slot and the shared room.
pub const ACCOUNTS: u32 = RULE_SLOTS + 1;
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

/// `TICKET_CLOCK` indices: the ring's two counters, its length, the
/// rooms ([`Rooms`]; written by userspace), and until when the ring
/// rests ([`LOOK_REST_NS`]).
pub const CLOCK_APPENDED: u32 = 0;
pub const CLOCK_LOOKED: u32 = 1;
pub const CLOCK_CAPACITY: u32 = 2;
pub const CLOCK_RESERVE: u32 = 3;
pub const CLOCK_SHARED: u32 = 4;
pub const CLOCK_RESTING: u32 = 5;
/// `TICKET_CLOCK` entries.
pub const CLOCK_WORDS: u32 = 6;

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
}

impl Rooms {
    /// The rooms of `capacity` tickets (`max_sources`) for `rules` rules
    /// (0: every ticket shared).
    pub const fn new(capacity: u32, rules: u32) -> Self {
        let capacity = capacity as u64;
        if rules == 0 {
            return Self {
                reserve: 0,
                shared: capacity,
            };
        }
        let reserve = capacity / (2 * rules as u64);
        Self {
            reserve,
            shared: capacity - reserve * rules as u64,
        }
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
                shared: 32_770
            }
        );
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
        assert_eq!(taken_index(SHARED) + 1, returned_index(0));
        assert_eq!(returned_index(SHARED) + 1, COUNTS);
    }
}
