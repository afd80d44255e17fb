//! Lists and bans as the kernel reads them: judged before the rules.
//!
//! A list (`[[lists]]`) is a set of prefixes to `allow` (passed, never
//! limited) or `deny` (dropped). Every list's prefixes of one family sit in
//! one LPM trie (`LISTS_V4`, `LISTS_V6`), keyed like the rule tries by a
//! half byte then the address: userspace writes a new set of lists into
//! the half the kernel does not read, then flips `Config::list_half`, so
//! the old lists judge every frame until the new ones are complete. The
//! longest prefix of any list decides; at the same prefix in two lists,
//! the first list of the configuration (userspace merges them).
//!
//! A ban is a prefix dropped until a time of the kernel's monotonic clock
//! (`BANS_V4`, `BANS_V6`, no half: one ban is one write). It ends on its
//! own: the kernel compares its end with the frame's clock, and the
//! daemon only sweeps ended bans away. An allow list wins over a ban, so
//! no ban locks out a range the operator allowed.

/// Lists a configuration may hold (`LIST_HITS` has a counter per list).
pub const MAX_LISTS: usize = 64;
/// Default of `[daemon] max_list_prefixes`: prefixes of one family across
/// all lists. Its trie holds twice as many (the next lists are written
/// beside the live ones).
pub const DEFAULT_MAX_LIST_PREFIXES: u32 = 1 << 20;
/// Bans of one family the kernel holds (`BANS_V4`, `BANS_V6`). The tries
/// allocate per entry, so the capacity costs nothing until used.
pub const MAX_BANS: u32 = 1 << 18;
/// Words of `LISTED_24S`: a bit for each of the 2^24 IPv4 /24s (2 MiB).
pub const SPAN_WORDS: u32 = 1 << 18;

/// The `LISTED_24S` word and bit of the /24 of IPv4 address `addr`
/// (host order).
#[inline(always)]
pub const fn span_bit(addr: u32) -> (u32, u64) {
    (addr >> 14, 1 << ((addr >> 8) & 63))
}

/// A ban's end meaning "until unbanned".
pub const BAN_FOREVER: u64 = u64::MAX;

/// What a list does with a frame whose source it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListAction {
    /// Passed, judged by no rule and no ban.
    Allow,
    /// Dropped (counted, and passed, in dry-run).
    Deny,
}

/// A list trie's value: which list holds the prefix and what it does.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListRef {
    /// The list's index in the configuration (`LIST_HITS`).
    pub list: u8,
    /// 1: allow, 2: deny ([`ListRef::action`]).
    action: u8,
    _pad: [u8; 2],
}

impl ListRef {
    pub const fn new(list: u8, action: ListAction) -> Self {
        let action = match action {
            ListAction::Allow => 1,
            ListAction::Deny => 2,
        };
        Self {
            list,
            action,
            _pad: [0; 2],
        }
    }

    #[inline(always)]
    pub const fn action(&self) -> ListAction {
        if self.action == 1 {
            ListAction::Allow
        } else {
            ListAction::Deny
        }
    }
}

/// Bytes of a ban's reason (UTF-8, zero-padded, cut at a character).
pub const REASON_BYTES: usize = 47;

/// Where a ban came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BanOrigin {
    /// `xdp-limiter ban` (fail2ban's action calls it too).
    Cli,
    /// The CrowdSec bouncer (`[crowdsec]`): its decisions stream.
    Crowdsec,
}

/// A ban trie's value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ban {
    /// Until when the prefix is dropped (monotonic ns, as
    /// `bpf_ktime_get_coarse_ns`); [`BAN_FOREVER`]: until unbanned.
    pub expires_ns: u64,
    /// When it was banned (monotonic ns).
    pub banned_ns: u64,
    /// 0: CLI, 1: CrowdSec ([`Ban::origin`]).
    origin: u8,
    reason: [u8; REASON_BYTES],
}

impl Ban {
    /// A ban from `banned_ns` to `expires_ns`, with up to
    /// [`REASON_BYTES`] bytes of `reason` (cut at a character boundary).
    pub fn new(banned_ns: u64, expires_ns: u64, origin: BanOrigin, reason: &str) -> Self {
        let mut bytes = [0u8; REASON_BYTES];
        let mut end = reason.len().min(REASON_BYTES);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        bytes[..end].copy_from_slice(&reason.as_bytes()[..end]);
        Self {
            expires_ns,
            banned_ns,
            origin: match origin {
                BanOrigin::Cli => 0,
                BanOrigin::Crowdsec => 1,
            },
            reason: bytes,
        }
    }

    /// Whether the ban still holds at `now` (the kernel's clock).
    #[inline(always)]
    pub const fn active(&self, now: u64) -> bool {
        now < self.expires_ns
    }

    pub const fn origin(&self) -> BanOrigin {
        if self.origin == 1 {
            BanOrigin::Crowdsec
        } else {
            BanOrigin::Cli
        }
    }

    /// The reason as written (empty if none).
    pub fn reason(&self) -> &str {
        let end = self
            .reason
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(REASON_BYTES);
        core::str::from_utf8(&self.reason[..end]).unwrap_or("")
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: `#[repr(C)]`, plain integers and byte arrays, no padding
    // the compiler adds (explicit `_pad`; `Ban` is 8 + 8 + 1 + 47 bytes).
    unsafe impl aya::Pod for super::ListRef {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Ban {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_have_no_hidden_padding() {
        assert_eq!(core::mem::size_of::<ListRef>(), 4);
        assert_eq!(core::mem::size_of::<Ban>(), 64);
    }

    #[test]
    fn a_ban_holds_until_its_end_and_keeps_its_reason() {
        let ban = Ban::new(10, 20, BanOrigin::Crowdsec, "ssh-bf");
        assert!(ban.active(19));
        assert!(!ban.active(20));
        assert_eq!(ban.reason(), "ssh-bf");
        assert_eq!(ban.origin(), BanOrigin::Crowdsec);
        assert!(Ban::new(0, BAN_FOREVER, BanOrigin::Cli, "").active(u64::MAX - 1));
    }

    #[test]
    fn a_long_reason_is_cut_at_a_character() {
        let reason = "é".repeat(30);
        let ban = Ban::new(0, 1, BanOrigin::Cli, &reason);
        assert_eq!(ban.reason(), "é".repeat(23));
    }

    #[test]
    fn each_slash_24_has_its_own_bit() {
        assert_eq!(span_bit(0), (0, 1));
        assert_eq!(span_bit(0x0000_01ff), (0, 2));
        assert_eq!(span_bit(0x0000_3f00), (0, 1 << 63));
        assert_eq!(span_bit(0x0000_4000), (1, 1));
        assert_eq!(span_bit(u32::MAX), (SPAN_WORDS - 1, 1 << 63));
    }

    #[test]
    fn a_list_ref_reads_back_its_action() {
        assert_eq!(ListRef::new(3, ListAction::Deny).action(), ListAction::Deny);
        assert_eq!(
            ListRef::new(0, ListAction::Allow).action(),
            ListAction::Allow
        );
    }
}
