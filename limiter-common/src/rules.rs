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

use crate::{prefix_mask, Outcome};

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
    /// The limit holds per node (every rule before cluster limits).
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
    /// under this rule in one epoch of the cheap tier before it gets any
    /// per-source state (`sketch`); those frames are judged statelessly
    /// (a limit admits them). Userspace sizes it so that they can never
    /// add more than 1/100 of the rule's allowance to a window (0 for small
    /// allowances and for rules with a penalty, which must see every frame).
    pub cheap_frames: u8,
    /// A [`Scope`] value ([`Rule::scope`]); 0, node, in maps written
    /// before cluster limits.
    scope: u8,
    _pad: [u8; 3],
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
            _pad: [0; 3],
        }
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

/// The global configuration (entry 0 of the `CONFIG` array).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Bumped by userspace on every rule change; 0 = no rules loaded (the
    /// program only counts).
    pub generation: u32,
    /// Non-zero: global dry-run, nothing is dropped ([`Config::dry_run`]).
    dry_run: u8,
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
    tiered: u8,
    /// The largest `Rule::cheap_frames` of the live rules, or of the
    /// stateless allow/deny threshold: a frame whose cheap-tier count is
    /// above it resolves no rule before looking for state.
    pub cheap_max: u8,
    _pad: [u8; 2],
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
            _pad: [0; 2],
        }
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
mod tests {
    use super::*;

    fn class(protocol: u8, ports: (u16, u16), syn: bool) -> TrafficClass {
        TrafficClass::new(protocol, ports.0, ports.1, syn)
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

    fn config(classes: &[TrafficClass]) -> Config {
        let mut config = Config {
            class_count: classes.len() as u8,
            ..Config::default()
        };
        config.classes[..classes.len()].copy_from_slice(classes);
        config
    }

    #[test]
    fn a_frame_class_is_the_set_of_matches_it_satisfies() {
        let tcp = class(IPPROTO_TCP, (0, u16::MAX), false);
        let ssh = class(IPPROTO_TCP, (22, 22), false);
        let syn = class(IPPROTO_TCP, (0, u16::MAX), true);
        let config = config(&[tcp, ssh, syn]);
        let known = Transport::Known;
        assert_eq!(config.classify(IPPROTO_TCP, 80, 0, known), 0b001);
        assert_eq!(config.classify(IPPROTO_TCP, 22, 0, known), 0b011);
        assert_eq!(config.classify(IPPROTO_TCP, 22, TCP_FLAG_SYN, known), 0b111);
        assert_eq!(config.classify(IPPROTO_UDP, 22, 0, known), 0);
        // Ports unknown: tcp surely matches, ssh and syn might.
        assert_eq!(
            config.classify(IPPROTO_TCP, 0, 0, Transport::PortUnknown),
            UNRESOLVED_BASE + 0b111
        );
        // No match a UDP frame might satisfy depends on ports: resolved.
        assert_eq!(
            config.classify(IPPROTO_UDP, 0, 0, Transport::PortUnknown),
            0
        );
        assert_eq!(
            config.classify(0, 0, 0, Transport::ProtocolUnknown),
            UNKNOWN_PROTOCOL_CLASS
        );
        // Without matches every frame is class 0.
        let none = Config::default();
        assert_eq!(
            none.classify(IPPROTO_TCP, 0, 0, Transport::ProtocolUnknown),
            0
        );
        assert_eq!(none.classify(IPPROTO_TCP, 0, 0, Transport::PortUnknown), 0);
    }

    #[test]
    fn classes_beyond_the_count_are_ignored() {
        let mut config = config(&[class(IPPROTO_UDP, (53, 53), false)]);
        config.classes[1] = class(IPPROTO_UDP, (0, 1023), false);
        assert_eq!(config.classify(IPPROTO_UDP, 53, 0, Transport::Known), 1);
        assert_eq!(config.classify(IPPROTO_UDP, 123, 0, Transport::Known), 0);
    }

    #[test]
    fn prefix_keys_carry_the_generation_half() {
        assert_eq!(prefix_key_v4(3, [10, 0, 0, 1]), [1, 10, 0, 0, 1]);
        assert_eq!(prefix_key_v4(4, [10, 0, 0, 1])[0], 0);
        let v6 = prefix_key_v6(1, &[0xff; 16]);
        assert_eq!(v6[0], 1);
        assert_eq!(&v6[1..], &[0xff; 16]);
        assert_eq!(rules_base(1), MAX_RULES);
        assert_eq!(rules_base(2), 0);
        assert_eq!((half(0), half(1), half(u32::MAX)), (0, 1, 1));
    }

    #[cfg(feature = "user")]
    #[test]
    fn actions_go_by_their_lowercase_names() {
        use clap::ValueEnum;
        for action in [Action::Limit, Action::Allow, Action::Deny] {
            let json = serde_json::to_string(&action).expect("serialises");
            assert_eq!(json, std::format!("\"{}\"", action.name()));
            assert_eq!(serde_json::from_str::<Action>(&json).ok(), Some(action));
            assert_eq!(Action::from_str(action.name(), false), Ok(action));
            let value = action.to_possible_value().expect("a possible value");
            assert_eq!(value.get_name(), action.name());
        }
    }

    #[test]
    fn encoded_bytes_read_back_typed() {
        let mut rule = Rule::new(Action::Deny, true);
        assert_eq!(rule.action(), Some(Action::Deny));
        assert!(rule.dry_run() && rule.is_dry_run(false));
        rule.set_action(Action::Allow);
        rule.set_dry_run(false);
        assert_eq!(rule.action(), Some(Action::Allow));
        assert!(!rule.is_dry_run(false) && rule.is_dry_run(true));
        assert_eq!(Rule::default().action(), Some(Action::Limit));
        rule.action = 7;
        assert_eq!(rule.action(), None, "a corrupt byte is no action");
        assert!(class(IPPROTO_TCP, (0, u16::MAX), true).tcp_syn_only());
        assert!(!TrafficClass::default().tcp_syn_only());
        let mut config = Config::new(false, 24, 48);
        assert_eq!(config.v4_mask, prefix_mask(24));
        assert_eq!(config.v6_mask, prefix_mask(48));
        assert_eq!(
            config,
            Config {
                v4_prefix_len: 24,
                v6_prefix_len: 48,
                v4_mask: prefix_mask(24),
                v6_mask: prefix_mask(48),
                ..Config::default()
            }
        );
        assert!(!config.dry_run());
        config.set_dry_run(true);
        assert!(config.dry_run());
        for action in [Action::Limit, Action::Allow, Action::Deny] {
            assert_eq!(Action::from_u8(action as u8), Some(action));
        }
        assert_eq!(Action::Deny.name(), "deny");
    }

    #[test]
    fn without_state_a_limit_fails_closed_and_allow_and_deny_still_apply() {
        // (action, the rule's dry-run, global dry-run, outcome)
        for (action, dry_run, global_dry_run, outcome) in [
            (Action::Limit, false, false, Outcome::DroppedLimit),
            (Action::Limit, false, true, Outcome::DryRunWouldDrop),
            (Action::Limit, true, false, Outcome::DryRunWouldDrop),
            (Action::Deny, false, false, Outcome::DroppedDeny),
            (Action::Allow, false, false, Outcome::Allowed),
            (Action::Allow, true, true, Outcome::Allowed),
        ] {
            assert_eq!(
                Rule::new(action, dry_run).stateless_outcome(global_dry_run),
                outcome,
                "{action:?}, dry-run {dry_run}, global dry-run {global_dry_run}"
            );
        }
    }

    #[test]
    fn abi_sizes_have_no_implicit_padding() {
        use core::mem::size_of;
        assert_eq!(size_of::<Rule>(), 8 * 6 + 4 + 4 + 1 + 1 + 1 + 1 + 4);
        assert_eq!(size_of::<TrafficClass>(), 8);
        assert_eq!(
            size_of::<Config>(),
            4 + 4 + 16 + 16 + 8 * MAX_CLASSES + 4 + 1 + 1 + 2
        );
        assert_eq!(size_of::<RuleRefs>(), 4 * FRAME_CLASSES);
    }
}
