//! Rules as the kernel reads them: the global `Config`, the matches rules
//! use (protocol / destination ports / SYN), the frame classes they induce,
//! the compiled `Rule` table and the LPM trie value `RuleRefs`.
//!
//! Userspace compiles the operator's rules into these; the kernel only
//! classifies a frame (which matches it satisfies) and looks things up.
//! Rule resolution happens once per source state and is cached with
//! `Config::generation`; bumping it makes every source resolve again on
//! its next frame.
//!
//! A frame's class is the set of matches it satisfies (a bitmask of at
//! most [`MAX_CLASSES`] bits), so any combination of matches, nested,
//! disjoint or overlapping, has one rule per prefix, chosen in userspace.
//! A frame whose ports the parser could not read (a non-first fragment, a
//! truncated transport header) gets an *unresolved* class: the set of
//! matches it might satisfy; one whose protocol is unknown (an IPv6 header
//! chain too long or cut short) gets [`UNKNOWN_PROTOCOL_CLASS`]. Userspace
//! maps those to the strictest rule that could apply.
//!
//! The bytes that encode an [`Action`] or a flag (`Rule`'s action and
//! dry-run, `TrafficClass::tcp_syn_only`, `Config`'s dry-run) are private:
//! constructors and accessors take and give typed values. Which half of
//! `RULES` and of the tries a generation writes is [`half`]'s alone.

use crate::Outcome;

mod class;
mod config;
pub mod level;

pub use class::{TrafficClass, Transport};
pub use config::Config;
pub use level::{
    Level, LevelKey, LevelKind, LevelWindow, AGG_CELLS, CELLS_PER_LEVEL, CELL_FAMILY, MAX_LEVELS,
};

/// Distinct matches rules may use (each is one bit of a frame's class).
pub const MAX_CLASSES: usize = 4;
/// Classes of frames whose headers were read: the set of matches they
/// satisfy, `0 .. 2^MAX_CLASSES`.
pub const RESOLVED_CLASSES: u8 = 1 << MAX_CLASSES;
/// `UNRESOLVED_BASE + set`: a TCP/UDP frame whose ports (and flags) could
/// not be read, which might satisfy the matches in `set` (some of which
/// depend on the ports).
pub const UNRESOLVED_BASE: u8 = RESOLVED_CLASSES;
/// A frame whose transport protocol could not be found.
pub const UNKNOWN_PROTOCOL_CLASS: u8 = 2 * RESOLVED_CLASSES;
/// Every frame class: the length of `RuleRefs::rules`.
pub const FRAME_CLASSES: usize = UNKNOWN_PROTOCOL_CLASS as usize + 1;
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

/// Which half (0 or 1) of `RULES` and of the tries' keys generation
/// `generation` uses: consecutive generations alternate, so a push writes
/// the half that is not live.
#[inline(always)]
pub const fn half(generation: u32) -> u8 {
    (generation % 2) as u8
}

/// The `RULES` index where generation `generation`'s rules start: its
/// half of the array.
#[inline(always)]
pub const fn rules_base(generation: u32) -> u32 {
    half(generation) as u32 * MAX_RULES
}

/// Where a rule's budget is held: on this node alone, or shared by every
/// node of a cluster (docs/cluster.md). Userspace reads and writes it by
/// name (`node`, `cluster`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(serde::Serialize, serde::Deserialize, clap::ValueEnum),
    serde(rename_all = "lowercase")
)]
pub enum Scope {
    /// The limit holds per node (the default).
    #[default]
    Node = 0,
    /// The limit holds for the whole cluster: nodes share what they
    /// admitted through Redis and each admits its share.
    Cluster = 1,
}

impl Scope {
    /// The scope a byte encodes (`None` for any other byte).
    #[inline(always)]
    pub const fn from_u8(value: u8) -> Option<Scope> {
        match value {
            0 => Some(Scope::Node),
            1 => Some(Scope::Cluster),
            _ => None,
        }
    }

    /// The lowercase name, as configuration and output spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Scope::Node => "node",
            Scope::Cluster => "cluster",
        }
    }
}

/// What a rule does with matching traffic. Userspace reads and writes it
/// by name (`limit`, `allow`, `deny`) in files, on the command line and on
/// the control socket.
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(serde::Serialize, serde::Deserialize, clap::ValueEnum),
    serde(rename_all = "lowercase")
)]
pub enum Action {
    /// Admit up to the rule's limits, drop the rest.
    #[default]
    Limit = 0,
    /// Never limit (still counted).
    Allow = 1,
    /// Always drop.
    Deny = 2,
}

impl Action {
    /// The action a byte encodes (a map value may hold any byte).
    #[inline(always)]
    pub const fn from_u8(value: u8) -> Option<Action> {
        match value {
            0 => Some(Action::Limit),
            1 => Some(Action::Allow),
            2 => Some(Action::Deny),
            _ => None,
        }
    }

    /// The lowercase name, as configuration and output spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Action::Limit => "limit",
            Action::Allow => "allow",
            Action::Deny => "deny",
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
    /// Hold: once over its limit a source is dropped for this long (0: none).
    pub block_ns: u64,
    /// Names this rule's penalties: a source's penalty holds only while
    /// the rule in force for it carries the tag that armed it, so a rule
    /// that changes (or goes) lifts the penalties it set. Never 0 for a
    /// rule with a penalty.
    pub block_tag: u64,
    /// What this rule is (identity and everything that decides its
    /// verdicts, global dry-run included): a push keeps a rule's
    /// `block_tag` only while its fingerprint stays the same. 0: no rule.
    pub fingerprint: u64,
    /// Buckets per window (1 ..= `window::MAX_BUCKETS_PER_WINDOW`).
    pub buckets: u32,
    /// Frames a CPU may lease from the shared window at once (1: none).
    pub lease_packets: u32,
    /// An [`Action`] value ([`Rule::action`]).
    action: u8,
    /// Non-zero: count would-be drops, drop nothing ([`Rule::dry_run`]).
    dry_run: u8,
    /// The class byte of the window key this rule counts in: every frame
    /// class of a source that resolves to this rule shares one budget
    /// (`0` for a rule without a match, `1 + index` of its match).
    pub budget: u8,
    /// With the tiers on (`Config::tiered`): frames a source may send
    /// under this rule over an epoch of the cheap tier and the one before
    /// without any per-source state (`sketch`); those frames are judged
    /// statelessly (a limit admits them) and never counted in the
    /// source's window. Userspace sizes it so that they add at most 1/10
    /// of the rule's allowance to any window (0 for small allowances):
    /// the bound in docs/architecture.md, "The bounds".
    pub cheap_frames: u8,
    /// A [`Scope`] value ([`Rule::scope`]); 0, node, in maps written
    /// before cluster limits.
    scope: u8,
    /// Levels in use, `levels[..level_count]` ([`Rule::levels`]).
    level_count: u8,
    _pad: [u8; 2],
    /// A source whose own window holds more packets than this is heavy
    /// for the rule's aggregates (`level`); 0 without aggregates.
    pub fair_packets: u64,
    /// The rule's further limits, judged in order once the per-source
    /// limit admits a frame (`level`).
    pub levels: [Level; MAX_LEVELS],
}

impl Rule {
    /// A rule doing `action` (only counting when `dry_run`), with every
    /// number 0: the caller sets the limits.
    pub const fn new(action: Action, dry_run: bool) -> Self {
        Self {
            allowance_packets: 0,
            allowance_bytes: 0,
            bucket_ns: 0,
            block_ns: 0,
            block_tag: 0,
            fingerprint: 0,
            buckets: 0,
            lease_packets: 0,
            action: action as u8,
            dry_run: dry_run as u8,
            budget: 0,
            cheap_frames: 0,
            scope: Scope::Node as u8,
            level_count: 0,
            _pad: [0; 2],
            fair_packets: 0,
            levels: [Level::UNUSED; MAX_LEVELS],
        }
    }

    /// The rule's own window: its buckets and allowances (a cluster rule's
    /// packet allowance is replaced by its effective one where judged).
    #[inline(always)]
    pub const fn params(&self) -> crate::window::WindowParams {
        crate::window::WindowParams {
            bucket_ns: self.bucket_ns,
            buckets: self.buckets,
            allowance_packets: self.allowance_packets,
            allowance_bytes: self.allowance_bytes,
        }
    }

    /// The most frames the cheap tier may admit of one source, uncounted,
    /// within any one window of this rule: `cheap_frames` in each pair of
    /// epochs the window overlaps (`sketch::epoch_pairs`). What the
    /// tiers add to the window's own bound (docs/architecture.md, "The
    /// bounds"); 0 without the tiers.
    pub const fn cheap_bound(&self) -> u64 {
        self.cheap_frames as u64 * crate::sketch::epoch_pairs(self.bucket_ns * self.buckets as u64)
    }

    /// The rule's levels in use.
    #[inline(always)]
    pub fn levels(&self) -> &[Level] {
        &self.levels[..self.level_count()]
    }

    /// How many levels the rule uses (at most [`MAX_LEVELS`], whatever
    /// the byte holds).
    #[inline(always)]
    pub const fn level_count(&self) -> usize {
        let count = self.level_count as usize;
        if count > MAX_LEVELS {
            MAX_LEVELS
        } else {
            count
        }
    }

    /// Sets the rule's levels (at most [`MAX_LEVELS`]; the rest are
    /// ignored).
    pub fn set_levels(&mut self, levels: &[Level]) {
        let count = levels.len().min(MAX_LEVELS);
        self.levels[..count].copy_from_slice(&levels[..count]);
        self.level_count = count as u8;
    }

    /// What the rule's level windows are tagged with, so that no two
    /// rules share one (`LevelKey::tag`): its fingerprint, folded.
    #[inline(always)]
    pub const fn level_tag(&self) -> u32 {
        (self.fingerprint ^ (self.fingerprint >> 32)) as u32
    }

    /// Where the rule's budget is held; `None` for a byte no [`Scope`]
    /// encodes.
    #[inline(always)]
    pub const fn scope(&self) -> Option<Scope> {
        Scope::from_u8(self.scope)
    }

    pub fn set_scope(&mut self, scope: Scope) {
        self.scope = scope as u8;
    }

    /// What the rule does; `None` for a byte no [`Action`] encodes (a
    /// corrupt map value: the program passes such frames).
    #[inline(always)]
    pub const fn action(&self) -> Option<Action> {
        Action::from_u8(self.action)
    }

    pub fn set_action(&mut self, action: Action) {
        self.action = action as u8;
    }

    /// Whether the rule itself is in dry-run (see [`Rule::is_dry_run`]
    /// for what applies).
    #[inline(always)]
    pub const fn dry_run(&self) -> bool {
        self.dry_run != 0
    }

    pub fn set_dry_run(&mut self, dry_run: bool) {
        self.dry_run = dry_run as u8;
    }

    /// Whether the rule only counts what it would drop (its own dry-run
    /// or the global one).
    #[inline(always)]
    pub const fn is_dry_run(&self, global_dry_run: bool) -> bool {
        global_dry_run || self.dry_run != 0
    }

    /// The outcome of a frame whose source could get no state (a state
    /// map refused its insert): `allow` and `deny` apply as always, and a
    /// `limit` fails closed, since the source cannot be shown to be under
    /// it (would-drop in dry-run). Never a silent pass.
    #[inline(always)]
    pub const fn stateless_outcome(&self, global_dry_run: bool) -> Outcome {
        let refused = match self.action() {
            Some(Action::Allow) => return Outcome::Allowed,
            Some(Action::Deny) => Outcome::DroppedDeny,
            Some(Action::Limit) => Outcome::DroppedLimit,
            None => return Outcome::Passed,
        };
        if self.is_dry_run(global_dry_run) {
            Outcome::DryRunWouldDrop
        } else {
            refused
        }
    }
}

/// The LPM trie value: for each frame class, the `RULES` index that
/// applies to sources inside the prefix (`NO_RULE` for none).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleRefs {
    pub rules: [u32; FRAME_CLASSES],
}

impl Default for RuleRefs {
    fn default() -> Self {
        Self {
            rules: [NO_RULE; FRAME_CLASSES],
        }
    }
}

/// The key data of an IPv4 prefix in `PREFIXES_V4`: the half of the
/// generation it belongs to, then the address. The tries hold both
/// generations' prefixes (as `RULES` holds both halves), so a push writes
/// the next generation's entries without touching the live ones.
pub type PrefixKeyV4 = [u8; 5];
/// As [`PrefixKeyV4`], for `PREFIXES_V6`.
pub type PrefixKeyV6 = [u8; 17];
/// Bits of a trie key taken by the half byte.
pub const PREFIX_HALF_BITS: u32 = 8;

/// The trie key data of an IPv4 address in generation `generation`'s half.
#[inline(always)]
pub const fn prefix_key_v4(generation: u32, addr: [u8; 4]) -> PrefixKeyV4 {
    [half(generation), addr[0], addr[1], addr[2], addr[3]]
}

/// The trie key data of an IPv6 address in generation `generation`'s half.
#[inline(always)]
pub fn prefix_key_v6(generation: u32, addr: &[u8; 16]) -> PrefixKeyV6 {
    let mut key = [0u8; 17];
    key[0] = half(generation);
    let mut i = 0;
    while i < 16 {
        key[i + 1] = addr[i];
        i += 1;
    }
    key
}

#[cfg(feature = "user")]
mod user {
    // SAFETY (all): #[repr(C)] structs of integers and byte arrays with
    // explicit padding fields (the size tests below): every bit pattern is
    // valid and there are no uninitialised bytes.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::Rule {}
    unsafe impl aya::Pod for super::RuleRefs {}
}

#[cfg(test)]
mod tests;
