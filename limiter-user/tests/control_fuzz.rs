//! Property tests of the control plane, without a kernel: the control
//! protocol's parser (`proto::parse_request`), configuration validation
//! (`Config::parse`) and rule edits (`daemon::apply_rule_edit`, the pure
//! part of what the daemon does with a `rules` request) never panic, answer
//! every bad input with a clear error, and a rejected edit leaves the
//! configuration in force exactly as it was.
//!
//! Inputs are random text and bytes, and structure-aware mutations of
//! valid requests (keys dropped, duplicated, renamed, inserted; values of
//! the wrong type, huge, negative, NaN-like, deeply nested; other versions;
//! every truncation) and of the shipped example configuration. The seed is
//! fixed so a failure reproduces; `PROPTEST_RNG_SEED` and `PROPTEST_CASES`
//! explore further.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
    time::Duration,
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use limiter_common::rules::rules_base;
use limiter_user::{
    daemon::{
        apply_rule_edit,
        config::{ActionName, Config, FileConfig, PortsSpec, ProtocolSpec, RuleSection},
    },
    proto::{parse_request, Request, RequestLine, RuleEdit, PROTOCOL_VERSION},
    rules::compile,
};
use proptest::{
    collection::vec,
    option,
    prelude::*,
    sample::select,
    test_runner::{Config as ProptestConfig, RngSeed},
};
use serde_json::Value;

/// The fixed seed of every property below (see the module comment).
const SEED: u64 = 0xc04e_f022;

/// `cases` cases from the fixed seed, unless the environment asks for
/// other ones; no regression files (the seed replays a failure).
fn config(cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(SEED);
    }
    config
}

// ---------------------------------------------------------------------
// Valid requests and rules.

/// Prefixes that collide often (so edits hit existing rules, duplicates
/// and overlaps), of both families, some with host bits set.
const PREFIXES: &[&str] = &[
    "0.0.0.0/0",
    "10.0.0.0/8",
    "10.10.0.0/16",
    "10.10.1.0/24",
    "10.10.1.7/24",
    "10.10.1.7/32",
    "192.0.2.0/24",
    "::/0",
    "2001:db8::/32",
    "2001:db8:1::/48",
    "2001:db8::/64",
    "2001:db8::1/64",
    "2001:db8::/96",
];

fn cidr() -> BoxedStrategy<IpNet> {
    prop_oneof![
        4 => select(PREFIXES).prop_map(|p| p.parse::<IpNet>().expect("a valid prefix")),
        1 => (any::<u32>(), 0u8..=32)
            .prop_map(|(a, len)| IpNet::V4(Ipv4Net::new(Ipv4Addr::from(a), len).expect("len <= 32"))),
        1 => (any::<u128>(), 0u8..=128)
            .prop_map(|(a, len)| IpNet::V6(Ipv6Net::new(Ipv6Addr::from(a), len).expect("len <= 128"))),
    ].boxed()
}

fn protocol() -> impl Strategy<Value = ProtocolSpec> {
    prop_oneof![
        select(vec![0u8, 1, 6, 17, 58, 132, 255]).prop_map(ProtocolSpec::Number),
        any::<u8>().prop_map(ProtocolSpec::Number),
        select(vec![
            "tcp",
            "udp",
            "UDP",
            "Tcp",
            "icmp",
            "icmpv6",
            "ipv6-icmp",
            "sctp",
            "",
            "17"
        ])
        .prop_map(|s| ProtocolSpec::Name(s.into())),
        "\\PC{0,6}".prop_map(ProtocolSpec::Name),
    ]
}

fn ports() -> impl Strategy<Value = PortsSpec> {
    prop_oneof![
        select(vec![0u16, 53, 80, 65535]).prop_map(PortsSpec::Port),
        any::<u16>().prop_map(PortsSpec::Port),
        select(vec![
            "53",
            " 53 ",
            "1000-2000",
            "5-1",
            "0-65535",
            "0",
            "65536",
            "1-",
            "-",
            "",
            "http",
            "-5",
            "53-53"
        ])
        .prop_map(|s| PortsSpec::Text(s.into())),
        "[0-9 -]{0,12}".prop_map(PortsSpec::Text),
    ]
}

/// Rates and bursts: zero, ordinary, at the edges of the integer types.
fn count() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        1u64..=100_000,
        select(vec![
            1_000_000u64,
            1 << 32,
            i64::MAX as u64,
            i64::MAX as u64 + 1,
            u64::MAX
        ]),
        any::<u64>(),
    ]
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        select(vec![0u64, 1, 10, 60, 61, 86_400, 86_401]).prop_map(Duration::from_secs),
        (0u64..=120, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

fn action() -> impl Strategy<Value = ActionName> {
    select(vec![ActionName::Limit, ActionName::Allow, ActionName::Deny])
}

/// Any rule at all: mostly invalid.
fn wild_rule() -> BoxedStrategy<RuleSection> {
    (
        (
            option::weighted(0.9, cidr()),
            action(),
            option::of(protocol()),
            option::of(ports()),
            any::<bool>(),
        ),
        (option::of(count()), option::of(count()), count(), count()),
        (
            duration(),
            option::of(duration()),
            option::of(any::<bool>()),
        ),
    )
        .prop_map(section)
        .boxed()
}

/// A rule with ordinary values: often valid, so edits get through.
fn plausible_rule() -> BoxedStrategy<RuleSection> {
    let protocol = prop_oneof![
        Just(None),
        Just(Some(ProtocolSpec::Name("udp".into()))),
        Just(Some(ProtocolSpec::Number(17))),
        Just(Some(ProtocolSpec::Name("TCP".into()))),
        Just(Some(ProtocolSpec::Number(6))),
        Just(Some(ProtocolSpec::Name("icmp".into()))),
    ];
    let ports = prop_oneof![
        Just(None),
        Just(Some(PortsSpec::Port(53))),
        Just(Some(PortsSpec::Text("53".into()))),
        Just(Some(PortsSpec::Text("1000-2000".into()))),
    ];
    (
        (
            select(PREFIXES).prop_map(|p| Some(p.parse::<IpNet>().expect("a valid prefix"))),
            action(),
            protocol,
            ports,
            prop::bool::weighted(0.2),
        ),
        (
            option::of(1u64..10_000),
            option::weighted(0.2, 2_000u64..10_000_000),
            0u64..1000,
            0u64..100_000,
        ),
        (
            (1u64..=60).prop_map(Duration::from_secs),
            option::of((1u64..=3600).prop_map(Duration::from_secs)),
            option::of(any::<bool>()),
        ),
    )
        .prop_map(section)
        .boxed()
}

/// A rule's fields as the strategies above draw them (grouped in tuples:
/// proptest implements `Strategy` for tuples of at most 12).
type Fields = (
    (
        Option<IpNet>,
        ActionName,
        Option<ProtocolSpec>,
        Option<PortsSpec>,
        bool,
    ),
    (Option<u64>, Option<u64>, u64, u64),
    (Duration, Option<Duration>, Option<bool>),
);

fn section(
    (
        (cidr, action, protocol, ports, tcp_syn),
        (pps, bytes_per_second, burst_packets, burst_bytes),
        (window, block, dry_run),
    ): Fields,
) -> RuleSection {
    RuleSection {
        cidr,
        action,
        protocol,
        ports,
        tcp_syn,
        pps,
        bytes_per_second,
        burst_packets,
        burst_bytes,
        window,
        block,
        dry_run,
    }
}

fn rule() -> BoxedStrategy<RuleSection> {
    prop_oneof![plausible_rule(), wild_rule()].boxed()
}

fn rule_edit() -> BoxedStrategy<RuleEdit> {
    (0u8..4, rule(), prop::bool::weighted(0.2))
        .prop_map(|(op, mut rule, keep_cidr)| match op {
            0 => RuleEdit::Add { rule },
            1 => RuleEdit::Set { rule },
            2 => RuleEdit::Remove { rule },
            _ => {
                // Mostly as the CLI sends it: the default rule has no cidr.
                if !keep_cidr {
                    rule.cidr = None;
                }
                RuleEdit::Default { rule }
            }
        })
        .boxed()
}

/// Every variant of `Request`.
fn request() -> BoxedStrategy<Request> {
    prop_oneof![
        Just(Request::Status),
        any::<usize>().prop_map(|limit| Request::Top { limit }),
        (any::<bool>(), any::<bool>()).prop_map(|(dry_run, save)| Request::Mode { dry_run, save }),
        Just(Request::Reload),
        Just(Request::RuleList),
        Just(Request::Detach),
        (rule_edit(), any::<bool>()).prop_map(|(edit, save)| Request::Rules { edit, save }),
        cidr().prop_map(|cidr| Request::Unblock { cidr }),
    ]
    .boxed()
}

/// The line the CLI sends for `request`.
fn line(request: &Request) -> String {
    serde_json::to_string(&RequestLine {
        version: PROTOCOL_VERSION,
        request: request.clone(),
    })
    .expect("requests serialise")
}

// ---------------------------------------------------------------------
// Structure-aware mutation of JSON.

/// JSON text as a tree whose objects may hold a key twice (which
/// `serde_json::Value` cannot), so duplicated keys reach the parser.
#[derive(Clone, Debug)]
enum Json {
    /// A scalar, as text (not necessarily valid JSON: `NaN`, `1e400`).
    Raw(String),
    Object(Vec<(String, Json)>),
    Array(Vec<Json>),
}

impl Json {
    fn parse(text: &str) -> Self {
        fn from(value: &Value) -> Json {
            match value {
                Value::Object(map) => {
                    Json::Object(map.iter().map(|(k, v)| (k.clone(), from(v))).collect())
                }
                Value::Array(items) => Json::Array(items.iter().map(from).collect()),
                leaf => Json::Raw(leaf.to_string()),
            }
        }
        from(&serde_json::from_str(text).expect("valid JSON"))
    }

    fn render(&self) -> String {
        let mut out = String::new();
        self.render_into(&mut out);
        out
    }

    fn render_into(&self, out: &mut String) {
        match self {
            Json::Raw(text) => out.push_str(text),
            Json::Object(entries) => {
                out.push('{');
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(key.clone()).to_string());
                    out.push(':');
                    value.render_into(out);
                }
                out.push('}');
            }
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.render_into(out);
                }
                out.push(']');
            }
        }
    }

    /// Object entries in the whole tree.
    fn entries(&self) -> usize {
        match self {
            Json::Raw(_) => 0,
            Json::Object(entries) => {
                entries.len() + entries.iter().map(|(_, v)| v.entries()).sum::<usize>()
            }
            Json::Array(items) => items.iter().map(Json::entries).sum(),
        }
    }

    /// Calls `f` with the object holding entry `n` (pre-order, modulo the
    /// number of entries) and the entry's index there; for a tree without
    /// entries, with the top-level object (if it is one) and index 0.
    fn at_entry(&mut self, n: usize, f: impl FnOnce(&mut Vec<(String, Json)>, usize)) {
        let count = self.entries();
        if count == 0 {
            if let Json::Object(entries) = self {
                f(entries, 0);
            }
            return;
        }
        let mut n = n % count;
        self.visit(&mut n, &mut Some(f));
    }

    fn visit<F: FnOnce(&mut Vec<(String, Json)>, usize)>(
        &mut self,
        n: &mut usize,
        f: &mut Option<F>,
    ) -> bool {
        match self {
            Json::Raw(_) => false,
            Json::Array(items) => items.iter_mut().any(|item| item.visit(n, f)),
            Json::Object(entries) => {
                for i in 0..entries.len() {
                    if *n == 0 {
                        if let Some(f) = f.take() {
                            f(entries, i);
                        }
                        return true;
                    }
                    *n -= 1;
                    if entries[i].1.visit(n, f) {
                        return true;
                    }
                }
                false
            }
        }
    }

    /// `depth` levels of arrays (or objects) around `self`.
    fn nested(self, depth: usize, arrays: bool) -> Self {
        (0..depth).fold(self, |inner, _| {
            if arrays {
                Json::Array(vec![inner])
            } else {
                Json::Object(vec![("a".into(), inner)])
            }
        })
    }
}

/// Keys of the protocol, near misses and oddities.
const KEYS: &[&str] = &[
    "version",
    "command",
    "limit",
    "dry_run",
    "save",
    "edit",
    "op",
    "rule",
    "cidr",
    "action",
    "protocol",
    "ports",
    "tcp_syn",
    "pps",
    "bytes_per_second",
    "burst_packets",
    "burst_bytes",
    "window",
    "block",
    "kind",
    "Version",
    "COMMAND",
    "dry-run",
    "",
    "version ",
    "\u{0}",
];

/// Values of every type, at the edges, NaN-like, and invalid JSON.
const VALUES: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "-0",
    "1",
    "2",
    "-1",
    "1.0",
    "1.5",
    "1e3",
    "1e308",
    "-1e308",
    "1e400",
    "4294967295",
    "4294967296",
    "4294967297",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "NaN",
    "Infinity",
    "-Infinity",
    "\"NaN\"",
    "\"Infinity\"",
    "\"\"",
    "\"1\"",
    "\"x\"",
    "\"status\"",
    "\"top\"",
    "\"rules\"",
    "\"add\"",
    "\"set\"",
    "\"remove\"",
    "\"rm\"",
    "\"default\"",
    "\"detach\"",
    "\"limit\"",
    "\"allow\"",
    "\"deny\"",
    "\"udp\"",
    "\"tcpp\"",
    "\"10.0.0.0/33\"",
    "\"10.0.0.1/8\"",
    "\"0.0.0.0/0\"",
    "\"::/0\"",
    "\"2001:db8::/129\"",
    "\"5-1\"",
    "\"0-65535\"",
    "\"65536\"",
    "\"0s\"",
    "\"100y\"",
    "\"1ns\"",
    "\"61s\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"\\\"",
    "[]",
    "{}",
    "[1,2]",
    "{\"version\":1}",
    "tru",
    "01",
    "+1",
    ".5",
];

fn json_value() -> BoxedStrategy<Json> {
    prop_oneof![
        6 => select(VALUES).prop_map(|v| Json::Raw(v.to_string())),
        1 => any::<i64>().prop_map(|n| Json::Raw(n.to_string())),
        1 => any::<u64>().prop_map(|n| Json::Raw(n.to_string())),
        // Rust's own float text: `NaN` and `inf` are not JSON.
        1 => any::<f64>().prop_map(|f| Json::Raw(f.to_string())),
        1 => "\\PC{0,12}".prop_map(|s| Json::Raw(Value::String(s).to_string())),
        // Past serde_json's recursion limit of 128 (the tree itself stays
        // shallow enough for the test's own recursion).
        1 => (1usize..140, any::<bool>())
            .prop_map(|(depth, arrays)| Json::Raw("1".into()).nested(depth, arrays)),
    ]
    .boxed()
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(KEYS).prop_map(String::from),
        1 => "\\PC{0,8}",
    ]
}

#[derive(Clone, Debug)]
enum Mutation {
    Drop(usize),
    Duplicate(usize),
    Rename(usize, String),
    Replace(usize, Json),
    Insert(usize, String, Json),
    /// The whole request nested in arrays (or objects).
    Nest(usize, bool),
}

fn mutation() -> BoxedStrategy<Mutation> {
    prop_oneof![
        2 => any::<usize>().prop_map(Mutation::Drop),
        2 => any::<usize>().prop_map(Mutation::Duplicate),
        2 => (any::<usize>(), key()).prop_map(|(n, k)| Mutation::Rename(n, k)),
        4 => (any::<usize>(), json_value()).prop_map(|(n, v)| Mutation::Replace(n, v)),
        2 => (any::<usize>(), key(), json_value()).prop_map(|(n, k, v)| Mutation::Insert(n, k, v)),
        1 => (1usize..140, any::<bool>()).prop_map(|(depth, arrays)| Mutation::Nest(depth, arrays)),
    ]
    .boxed()
}

impl Mutation {
    fn apply(&self, tree: &mut Json) {
        match self {
            Mutation::Drop(n) => tree.at_entry(*n, |e, i| {
                if i < e.len() {
                    e.remove(i);
                }
            }),
            Mutation::Duplicate(n) => tree.at_entry(*n, |e, i| {
                if let Some(entry) = e.get(i).cloned() {
                    e.insert(i + 1, entry);
                }
            }),
            Mutation::Rename(n, key) => tree.at_entry(*n, |e, i| {
                if let Some(entry) = e.get_mut(i) {
                    entry.0.clone_from(key);
                }
            }),
            Mutation::Replace(n, value) => tree.at_entry(*n, |e, i| {
                if let Some(entry) = e.get_mut(i) {
                    entry.1 = value.clone();
                }
            }),
            Mutation::Insert(n, key, value) => {
                tree.at_entry(*n, |e, i| e.insert(i, (key.clone(), value.clone())))
            }
            Mutation::Nest(depth, arrays) => {
                let inner = std::mem::replace(tree, Json::Raw(String::new()));
                *tree = inner.nested(*depth, *arrays);
            }
        }
    }
}

/// Text glued after a request.
const JUNK: &[&str] = &[
    "x",
    "}",
    "{}",
    " garbage",
    "\u{0}",
    "\\",
    "\"",
    ",",
    "{\"version\":1,\"command\":\"status\"}",
    "\u{feff}",
];

// ---------------------------------------------------------------------
// What every answer must be.

/// An error is a non-empty sentence that says what was wrong with the
/// request; an accepted request means the same once sent again.
fn check_answer(text: &str, answer: &Result<Request, String>) -> Result<(), TestCaseError> {
    match answer {
        Err(message) => {
            prop_assert!(!message.trim().is_empty(), "empty error for {:?}", text);
            prop_assert!(
                message.starts_with("malformed request: ")
                    || message.starts_with("protocol version "),
                "unclear error {:?} for {:?}",
                message,
                text
            );
        }
        Ok(request) => {
            let again = parse_request(&line(request));
            prop_assert_eq!(
                again.as_ref(),
                Ok(request),
                "{:?} does not survive a round trip",
                text
            );
        }
    }
    Ok(())
}

/// What a well-formed JSON object with top-level `entries` must be
/// answered with, as far as its version decides: a missing, mistyped or
/// duplicated version is named, another version number is named with it.
fn check_version(
    entries: &[(String, Json)],
    text: &str,
    answer: &Result<Request, String>,
) -> Result<(), TestCaseError> {
    let versions: Vec<&Json> = entries
        .iter()
        .filter(|(k, _)| k == "version")
        .map(|(_, v)| v)
        .collect();
    let value = match versions.as_slice() {
        [Json::Raw(raw)] => serde_json::from_str::<Value>(raw).ok(),
        [_] => Some(Value::Array(Vec::new())),
        _ => None,
    };
    match value {
        Some(Value::Number(n)) if n.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => {}
        Some(Value::Number(n)) => {
            let expect = format!("protocol version {n} is not supported");
            let message = answer.as_ref().err();
            prop_assert!(
                message.is_some_and(|m| m.starts_with(&expect)),
                "{:?} answered {:?}, not {:?}",
                text,
                answer,
                expect
            );
        }
        // Missing, null, mistyped or twice.
        _ => {
            let message = answer.as_ref().err();
            prop_assert!(
                message.is_some_and(|m| m.contains("`version`")),
                "{:?} answered {:?}, which does not name the version",
                text,
                answer
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_text_is_refused_clearly(text in any::<String>()) {
        let answer = parse_request(&text);
        check_answer(&text, &answer)?;
    }

    #[test]
    fn json_like_text_is_refused_clearly(text in "[{}\\[\\]\":,0-9a-z._ -]{0,80}") {
        let answer = parse_request(&text);
        check_answer(&text, &answer)?;
    }

    #[test]
    fn arbitrary_bytes_are_refused_clearly(bytes in vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        let answer = parse_request(&text);
        check_answer(&text, &answer)?;
    }

    #[test]
    fn every_request_round_trips(request in request()) {
        prop_assert_eq!(parse_request(&line(&request)), Ok(request));
    }

    #[test]
    fn every_truncation_of_a_request_is_refused(request in request()) {
        let line = line(&request);
        let bytes = line.as_bytes();
        for cut in 0..bytes.len() {
            let text = String::from_utf8_lossy(&bytes[..cut]);
            let answer = parse_request(&text);
            prop_assert!(answer.is_err(), "{:?} was accepted", text);
            check_answer(&text, &answer)?;
        }
    }

    #[test]
    fn mutated_requests_are_refused_clearly_or_mean_what_they_say(
        request in request(),
        mutations in vec(mutation(), 1..6),
        junk in option::weighted(0.1, select(JUNK)),
    ) {
        let mut tree = Json::parse(&line(&request));
        for m in &mutations {
            m.apply(&mut tree);
        }
        let mut text = tree.render();
        if let Some(junk) = junk {
            text.push_str(junk);
        }
        let answer = parse_request(&text);
        check_answer(&text, &answer)?;
        // Well-formed JSON objects are judged on their version first.
        let well_formed = serde_json::from_str::<Value>(&text).is_ok();
        if let (true, Json::Object(entries)) = (well_formed, &tree) {
            check_version(entries, &text, &answer)?;
        }
    }

    #[test]
    fn other_versions_are_named(
        request in request(),
        version in prop_oneof![
            any::<u32>().prop_filter("another version", |v| *v != PROTOCOL_VERSION).prop_map(|v| v.to_string()),
            select(VALUES).prop_map(String::from),
        ],
    ) {
        let mut tree = Json::parse(&line(&request));
        let Json::Object(entries) = &mut tree else {
            unreachable!("a request is an object");
        };
        let slot = entries.iter_mut().find(|(k, _)| k == "version").expect("a version");
        slot.1 = Json::Raw(version);
        let text = tree.render();
        let answer = parse_request(&text);
        check_answer(&text, &answer)?;
        if serde_json::from_str::<Value>(&text).is_ok() {
            if let Json::Object(entries) = &tree {
                check_version(entries, &text, &answer)?;
            }
        }
    }
}

// ---------------------------------------------------------------------
// Configuration files.

/// A TOML file as tables of `key = value` lines (values as TOML text), so
/// mutations can break any one of them, duplicate keys included.
#[derive(Clone, Debug)]
struct Doc {
    tables: Vec<Table>,
}

#[derive(Clone, Debug)]
struct Table {
    /// `daemon`, `limits`, `default` or `rules`.
    section: &'static str,
    entries: Vec<(String, String)>,
}

const DAEMON_KEYS: &[&str] = &[
    "interfaces",
    "mode",
    "pin_dir",
    "metrics_addr",
    "max_sources",
    "tick",
    "top_k",
    "sources_per_tick",
    "keep_attached",
    "control_socket",
];
const LIMITS_KEYS: &[&str] = &[
    "dry_run",
    "ipv4_prefix",
    "ipv6_prefix",
    "buckets_per_window",
];
const RULE_KEYS: &[&str] = &[
    "cidr",
    "action",
    "protocol",
    "ports",
    "tcp_syn",
    "pps",
    "bytes_per_second",
    "burst_packets",
    "burst_bytes",
    "window",
    "block",
    "dry_run",
];

fn shipped_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/config.toml");
    std::fs::read_to_string(path).expect("dist/config.toml")
}

impl Doc {
    /// The shipped example, every section present.
    fn shipped() -> Self {
        let table: toml::Table = toml::from_str(&shipped_text()).expect("valid TOML");
        let entries = |t: &toml::Table| -> Vec<(String, String)> {
            t.iter().map(|(k, v)| (k.clone(), v.to_string())).collect()
        };
        let mut tables = Vec::new();
        for section in ["daemon", "limits", "default"] {
            let t = table
                .get(section)
                .and_then(toml::Value::as_table)
                .map(entries)
                .unwrap_or_default();
            tables.push(Table {
                section,
                entries: t,
            });
        }
        for rule in table
            .get("rules")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
        {
            tables.push(Table {
                section: "rules",
                entries: entries(rule.as_table().expect("a rule table")),
            });
        }
        Self { tables }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for table in &self.tables {
            if table.section == "rules" {
                out.push_str("[[rules]]\n");
            } else {
                out.push_str(&format!("[{}]\n", table.section));
            }
            for (key, value) in &table.entries {
                out.push_str(&format!("{key} = {value}\n"));
            }
            out.push('\n');
        }
        out
    }

    /// How errors name table `t`: `daemon`, `default`, `rules[N]`.
    fn name(&self, t: usize) -> String {
        match self.tables[t].section {
            "rules" => {
                let n = self.tables[..t]
                    .iter()
                    .filter(|t| t.section == "rules")
                    .count();
                format!("rules[{n}]")
            }
            section => section.to_string(),
        }
    }

    fn keys(&self, t: usize) -> &'static [&'static str] {
        match self.tables[t].section {
            "daemon" => DAEMON_KEYS,
            "limits" => LIMITS_KEYS,
            _ => RULE_KEYS,
        }
    }

    /// Sets key number `key` (of the table's known keys) of table `t` to
    /// `value`; returns the key and the value written.
    fn set(&mut self, t: usize, key: usize, value: &TomlValue) -> (&'static str, String) {
        let keys = self.keys(t);
        let key = keys[key % keys.len()];
        let value = value.for_key(key);
        let entries = &mut self.tables[t].entries;
        match entries.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1.clone_from(&value),
            None => entries.push((key.to_string(), value.clone())),
        }
        (key, value)
    }
}

/// Values for any key: of the right type and of the wrong one, at the
/// edges of every range, and not TOML at all.
const TOML_VALUES: &[&str] = &[
    "0",
    "-1",
    "1",
    "31",
    "33",
    "128",
    "129",
    "255",
    "256",
    "4095",
    "65535",
    "65536",
    "16777217",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "1.5",
    "nan",
    "inf",
    "-inf",
    "1e30",
    "true",
    "false",
    "\"\"",
    "\"0\"",
    "\"0s\"",
    "\"99ms\"",
    "\"100ms\"",
    "\"1s\"",
    "\"60s\"",
    "\"61s\"",
    "\"24h\"",
    "\"25h\"",
    "\"100y\"",
    "\"1ns\"",
    "\"5-1\"",
    "\"0-65535\"",
    "\"53\"",
    "\"65536\"",
    "\"1-\"",
    "\"-\"",
    "\"http\"",
    "\"10.0.0.1/8\"",
    "\"10.0.0.0/33\"",
    "\"10.10.0.0/16\"",
    "\"0.0.0.0/0\"",
    "\"::/0\"",
    "\"2001:db8::/96\"",
    "\"2001:db8::/32\"",
    "\"not-a-cidr\"",
    "\"tcp\"",
    "\"TCP\"",
    "\"udp\"",
    "\"icmp\"",
    "\"icmpv6\"",
    "\"ipv6-icmp\"",
    "\"sctp\"",
    "\"limit\"",
    "\"allow\"",
    "\"deny\"",
    "\"drop\"",
    "\"native\"",
    "\"generic\"",
    "\"auto\"",
    "\"relative/path\"",
    "\"/abs/path\"",
    "\"127.0.0.1:9470\"",
    "\"[::1]:0\"",
    "\"nowhere\"",
    "\"eth0\"",
    "[]",
    "[\"eth0\"]",
    "[\"\"]",
    "[\"a/b\"]",
    "[\"sixteen-chars-xx\"]",
    "[1]",
    "{}",
    "{ a = 1 }",
    "1979-05-27T07:32:00Z",
    "'single'",
    "\"unterminated",
    "= 1",
    "",
];

/// Integers at the edges of every field's range.
const TOML_INTEGERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "6",
    "17",
    "31",
    "32",
    "33",
    "58",
    "64",
    "128",
    "129",
    "255",
    "256",
    "1000",
    "4095",
    "4096",
    "65535",
    "65536",
    "16777216",
    "16777217",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
];

/// A value for a key, chosen once the key is known: any value at all, or
/// one of the key's own type (so validation, not only the TOML parser, is
/// reached).
#[derive(Clone, Debug)]
struct TomlValue {
    typed: bool,
    any: String,
    integer: String,
    text: String,
    boolean: bool,
}

impl TomlValue {
    fn for_key(&self, key: &str) -> String {
        if !self.typed {
            return self.any.clone();
        }
        match key {
            "keep_attached" | "dry_run" | "tcp_syn" => self.boolean.to_string(),
            "interfaces" => format!("[{}]", self.text),
            "max_sources" | "top_k" | "sources_per_tick" | "ipv4_prefix" | "ipv6_prefix"
            | "buckets_per_window" | "pps" | "bytes_per_second" | "burst_packets"
            | "burst_bytes" => self.integer.clone(),
            "protocol" | "ports" if self.boolean => self.integer.clone(),
            _ => self.text.clone(),
        }
    }
}

fn toml_value() -> BoxedStrategy<TomlValue> {
    let whatever = prop_oneof![
        8 => select(TOML_VALUES).prop_map(String::from),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => "\\PC{0,12}".prop_map(|s| toml::Value::String(s).to_string()),
    ];
    let integer = prop_oneof![
        4 => select(TOML_INTEGERS).prop_map(String::from),
        1 => any::<i64>().prop_map(|n| n.to_string()),
    ];
    let text = prop_oneof![
        6 => select(TOML_VALUES)
            .prop_filter("a string", |v| v.starts_with('"') && v.len() > 1 && v.ends_with('"'))
            .prop_map(String::from),
        1 => "\\PC{0,12}".prop_map(|s| toml::Value::String(s).to_string()),
    ];
    (
        prop::bool::weighted(0.8),
        whatever,
        integer,
        text,
        any::<bool>(),
    )
        .prop_map(|(typed, any, integer, text, boolean)| TomlValue {
            typed,
            any,
            integer,
            text,
            boolean,
        })
        .boxed()
}

#[derive(Clone, Debug)]
enum ConfigMutation {
    Set(usize, usize, TomlValue),
    Remove(usize, usize),
    DuplicateKey(usize, usize),
    UnknownKey(usize, String),
    AddRule(Vec<(usize, TomlValue)>),
    DuplicateTable(usize),
    RemoveTable(usize),
}

fn config_mutation() -> BoxedStrategy<ConfigMutation> {
    prop_oneof![
        12 => (any::<usize>(), any::<usize>(), toml_value())
            .prop_map(|(t, k, v)| ConfigMutation::Set(t, k, v)),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(t, k)| ConfigMutation::Remove(t, k)),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(t, k)| ConfigMutation::DuplicateKey(t, k)),
        1 => (any::<usize>(), "[a-z_]{1,10}").prop_map(|(t, k)| ConfigMutation::UnknownKey(t, k)),
        1 => vec((any::<usize>(), toml_value()), 0..5).prop_map(ConfigMutation::AddRule),
        1 => any::<usize>().prop_map(ConfigMutation::DuplicateTable),
        1 => any::<usize>().prop_map(ConfigMutation::RemoveTable),
    ]
    .boxed()
}

impl ConfigMutation {
    fn apply(&self, doc: &mut Doc) {
        let tables = doc.tables.len();
        match self {
            ConfigMutation::Set(t, k, v) if tables > 0 => {
                doc.set(t % tables, *k, v);
            }
            ConfigMutation::Remove(t, k) if tables > 0 => {
                let entries = &mut doc.tables[t % tables].entries;
                if !entries.is_empty() {
                    entries.remove(k % entries.len());
                }
            }
            ConfigMutation::DuplicateKey(t, k) if tables > 0 => {
                let entries = &mut doc.tables[t % tables].entries;
                if !entries.is_empty() {
                    let entry = entries[k % entries.len()].clone();
                    entries.push(entry);
                }
            }
            ConfigMutation::UnknownKey(t, key) if tables > 0 => {
                doc.tables[t % tables]
                    .entries
                    .push((key.clone(), "1".into()));
            }
            ConfigMutation::AddRule(sets) => {
                doc.tables.push(Table {
                    section: "rules",
                    entries: Vec::new(),
                });
                let t = doc.tables.len() - 1;
                for (k, v) in sets {
                    doc.set(t, *k, v);
                }
            }
            ConfigMutation::DuplicateTable(t) if tables > 0 => {
                let table = doc.tables[t % tables].clone();
                doc.tables.push(table);
            }
            ConfigMutation::RemoveTable(t) if tables > 0 => {
                doc.tables.remove(t % tables);
            }
            _ => {}
        }
    }
}

/// Rule bases of both generations and CPU counts from one to many.
const BASES_AND_CPUS: &[(u32, u32)] = &[(0, 1), (1, 2), (0, 3), (1, 64), (0, 1024)];

/// What an accepted configuration must be: compilable for any generation
/// and machine, and what `--save` writes of it reads back the same.
fn check_valid(config: &Config) -> Result<(), TestCaseError> {
    for &(generation, cpus) in BASES_AND_CPUS {
        let compiled = compile(&config.rules, rules_base(generation), cpus);
        prop_assert!(
            compiled.is_ok(),
            "validated but does not compile for generation {} on {} CPUs: {:?}",
            generation,
            cpus,
            compiled.err()
        );
    }
    let text = config.file.to_toml();
    let again = Config::parse(&text, "saved.toml").map_err(|e| {
        TestCaseError::fail(format!("what --save writes does not load: {e}\n{text}"))
    })?;
    prop_assert_eq!(&again.file, &config.file);
    prop_assert_eq!(&again.rules, &config.rules);
    prop_assert_eq!(&again.daemon, &config.daemon);
    Ok(())
}

/// Parses `text` twice: the same answer both times, a non-empty error or
/// a configuration that [`check_valid`].
fn check_config(text: &str) -> Result<Result<Config, String>, TestCaseError> {
    let first = Config::parse(text, "mutated.toml").map_err(|e| e.to_string());
    let second = Config::parse(text, "mutated.toml").map_err(|e| e.to_string());
    prop_assert_eq!(&first, &second, "validation is not deterministic");
    match &first {
        Ok(config) => check_valid(config)?,
        Err(message) => prop_assert!(!message.trim().is_empty(), "empty error for {:?}", text),
    }
    Ok(first)
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_configuration_text_never_panics(text in any::<String>()) {
        let _ = check_config(&text)?;
    }

    #[test]
    fn toml_like_configuration_text_never_panics(
        text in "(\\[(daemon|limits|default|\\[rules\\])\\]\n|(pps|cidr|window|ports|protocol|tick|interfaces) = (1|-1|\"[a-z0-9./:-]{0,8}\"|\\[\\]|true)\n){0,12}",
    ) {
        let _ = check_config(&text)?;
    }

    #[test]
    fn one_bad_value_is_refused_naming_its_field(
        table in any::<usize>(),
        key in any::<usize>(),
        value in toml_value(),
    ) {
        let mut doc = Doc::shipped();
        let table = table % doc.tables.len();
        let (key, value) = doc.set(table, key, &value);
        let text = doc.render();
        if let Err(message) = check_config(&text)? {
            let name = doc.name(table);
            let names_it = message.contains(key)
                || (doc.tables[table].section != "daemon"
                    && doc.tables[table].section != "limits"
                    && [":", ".", " ("].iter().any(|end| message.contains(&format!("{name}{end}"))));
            prop_assert!(
                names_it,
                "setting {}.{} = {} was refused without naming {} or {}: {}",
                name, key, value, key, name, message
            );
        }
    }

    #[test]
    fn mutated_configurations_are_refused_or_valid(
        mutations in vec(config_mutation(), 1..6),
    ) {
        let mut doc = Doc::shipped();
        for m in &mutations {
            m.apply(&mut doc);
        }
        let _ = check_config(&doc.render())?;
    }
}

// ---------------------------------------------------------------------
// Rule edits.

/// An edit as planned: either aimed at a rule that exists when it is
/// applied (its match spelled another way), or any rule at all.
#[derive(Clone, Debug)]
enum Plan {
    Any(RuleEdit),
    /// Replace existing rule `n` (modulo) with these limits.
    SetExisting(usize, RuleSection, bool),
    /// Remove existing rule `n` (modulo).
    RemoveExisting(usize, bool),
}

fn plan() -> BoxedStrategy<Plan> {
    prop_oneof![
        4 => rule_edit().prop_map(Plan::Any),
        2 => (any::<usize>(), rule(), any::<bool>())
            .prop_map(|(n, rule, respell)| Plan::SetExisting(n, rule, respell)),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(n, respell)| Plan::RemoveExisting(n, respell)),
    ].boxed()
}

/// `rule`'s match spelled another way: the protocol by number or by name
/// in capitals, the port as text or number, the prefix with host bits.
fn respelled(rule: &RuleSection) -> RuleSection {
    let mut rule = rule.clone();
    rule.protocol = rule.protocol.as_ref().map(|p| match (p, p.number()) {
        (ProtocolSpec::Name(_), Some(n)) => ProtocolSpec::Number(n),
        (ProtocolSpec::Number(6), _) => ProtocolSpec::Name("TCP".into()),
        (ProtocolSpec::Number(17), _) => ProtocolSpec::Name("Udp".into()),
        (p, _) => p.clone(),
    });
    rule.ports = rule.ports.as_ref().map(|p| match p {
        PortsSpec::Port(n) => PortsSpec::Text(format!(" {n} ")),
        PortsSpec::Text(t) => match limiter_user::daemon::config::parse_ports(t) {
            Some((a, b)) if a == b => PortsSpec::Port(a),
            _ => p.clone(),
        },
    });
    rule.cidr = rule.cidr.map(|c| match c {
        IpNet::V4(n) if n.prefix_len() < 32 => {
            let host = u32::from(n.network()) | 1;
            IpNet::V4(Ipv4Net::new(host.into(), n.prefix_len()).expect("same length"))
        }
        c => c,
    });
    rule
}

impl Plan {
    fn edit(&self, file: &FileConfig) -> RuleEdit {
        let existing = |n: &usize, respell: &bool| {
            let rule = file.rules.get(n % file.rules.len().max(1)).cloned();
            rule.map(|r| if *respell { respelled(&r) } else { r })
        };
        match self {
            Plan::Any(edit) => edit.clone(),
            Plan::SetExisting(n, limits, respell) => match existing(n, respell) {
                Some(target) => RuleEdit::Set {
                    rule: RuleSection {
                        cidr: target.cidr,
                        protocol: target.protocol,
                        ports: target.ports,
                        tcp_syn: target.tcp_syn,
                        ..limits.clone()
                    },
                },
                None => RuleEdit::Set {
                    rule: limits.clone(),
                },
            },
            Plan::RemoveExisting(n, respell) => match existing(n, respell) {
                Some(rule) => RuleEdit::Remove { rule },
                None => RuleEdit::Remove {
                    rule: RuleSection::default(),
                },
            },
        }
    }
}

/// A refused edit says why: which rule and field, or what to do instead.
fn check_refusal(edit: &RuleEdit, message: &str) -> Result<(), TestCaseError> {
    prop_assert!(!message.trim().is_empty(), "empty error for {:?}", edit);
    let rule = match edit {
        RuleEdit::Add { rule }
        | RuleEdit::Set { rule }
        | RuleEdit::Remove { rule }
        | RuleEdit::Default { rule } => rule,
    };
    if rule.cidr.is_none() && !matches!(edit, RuleEdit::Default { .. }) {
        prop_assert!(
            message.contains("needs a cidr"),
            "{:?} refused with {:?}, not for its missing cidr",
            edit,
            message
        );
    }
    match message.strip_prefix("rejected: ") {
        Some(why) => prop_assert!(
            why.contains("rules[") || why.contains("default") || why.starts_with("more than"),
            "{:?} rejected without naming a rule: {:?}",
            edit,
            message
        ),
        None => prop_assert!(
            (message.contains("rule") && message.contains("cidr")) || message.contains("match"),
            "{:?} refused unclearly: {:?}",
            edit,
            message
        ),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn rule_edits_leave_a_valid_configuration_or_change_nothing(
        plans in vec(plan(), 1..24),
    ) {
        let mut file = Config::parse(&shipped_text(), "config.toml")
            .expect("the shipped example is valid")
            .file;
        for plan in &plans {
            let edit = plan.edit(&file);
            let before = file.clone();
            match apply_rule_edit(&file, edit.clone()) {
                Err(message) => {
                    prop_assert_eq!(&file, &before, "a refused edit changed the rules");
                    check_refusal(&edit, &message)?;
                }
                Ok((edited, config, what)) => {
                    prop_assert!(!what.is_empty());
                    match &edit {
                        RuleEdit::Add { rule } => {
                            prop_assert_eq!(edited.rules.len(), before.rules.len() + 1);
                            prop_assert_eq!(edited.rules.last(), Some(rule));
                        }
                        RuleEdit::Set { rule } => {
                            prop_assert_eq!(edited.rules.len(), before.rules.len());
                            prop_assert_eq!(edited.rules.iter().filter(|r| r.same_rule(rule)).count(), 1);
                            prop_assert!(edited.rules.contains(rule));
                        }
                        RuleEdit::Remove { rule } => {
                            prop_assert_eq!(edited.rules.len() + 1, before.rules.len());
                            prop_assert!(!edited.rules.iter().any(|r| r.same_rule(rule)));
                        }
                        RuleEdit::Default { rule } => {
                            prop_assert_eq!(&edited.default, rule);
                            prop_assert_eq!(&edited.rules, &before.rules);
                        }
                    }
                    prop_assert_eq!(&edited.daemon, &before.daemon);
                    prop_assert_eq!(&edited.limits, &before.limits);
                    let again = edited.clone().validate().map_err(|e| e.to_string());
                    prop_assert_eq!(again.as_ref(), Ok(&config), "the edited file validates differently");
                    check_valid(&config)?;
                    file = edited;
                }
            }
        }
    }
}

/// The parser's answers that the daemon's tests and docs quote.
#[test]
fn known_answers() {
    for (line, expect) in [
        ("", "malformed request: EOF while parsing a value"),
        (
            r#"{"version":"1","command":"status"}"#,
            "malformed request: `version` must be a number",
        ),
        (
            r#"{"version":2,"command":"status"}"#,
            "protocol version 2 is not supported (this daemon speaks 1)",
        ),
        (
            r#"{"version":-1,"command":"status"}"#,
            "protocol version -1 is not supported",
        ),
        (
            r#"{"version":1,"version":1,"command":"status"}"#,
            "malformed request: duplicate field `version`",
        ),
        (
            r#"{"version":null,"command":"status"}"#,
            "malformed request: missing field `version`",
        ),
    ] {
        let answer = parse_request(line);
        assert!(
            answer.as_ref().is_err_and(|m| m.starts_with(expect)),
            "{line:?}: {answer:?}"
        );
    }
}

/// What the properties above found, pinned.
#[test]
fn regressions() {
    let file = Config::parse(&shipped_text(), "config.toml")
        .expect("the shipped example is valid")
        .file;
    let edit = |edit: RuleEdit| apply_rule_edit(&file, edit).map(|(_, _, what)| what);
    // An allow rule ignores its rates, so one beyond TOML's integers was
    // accepted, and `--save` (or `to_toml`) then panicked the daemon.
    let huge = RuleSection {
        cidr: Some("203.0.113.0/24".parse().expect("a prefix")),
        action: ActionName::Allow,
        pps: Some(1 << 63),
        ..RuleSection::default()
    };
    let refused = edit(RuleEdit::Add { rule: huge }).expect_err("too large to save");
    assert!(
        refused.starts_with("rejected: rules[2].pps: 9223372036854775808 is larger than"),
        "{refused}"
    );
    // A limit rule with a byte rate only ignores burst_packets just as well.
    let bursty = RuleSection {
        action: ActionName::Limit,
        bytes_per_second: Some(1_000_000),
        burst_packets: u64::MAX,
        ..file.rules[0].clone()
    };
    let refused = edit(RuleEdit::Set { rule: bursty }).expect_err("too large to save");
    assert!(refused.contains("rules[0].burst_packets"), "{refused}");
    // A rule without a cidr to set or remove: said so, not "no the
    // default rule with that match".
    for edit_without_cidr in [
        RuleEdit::Set {
            rule: RuleSection::default(),
        },
        RuleEdit::Remove {
            rule: RuleSection::default(),
        },
    ] {
        let refused = edit(edit_without_cidr).expect_err("no cidr");
        assert!(refused.starts_with("a rule needs a cidr"), "{refused}");
    }
    let missing = RuleSection {
        cidr: Some("10.9.9.0/24".parse().expect("a prefix")),
        pps: Some(5),
        ..RuleSection::default()
    };
    assert_eq!(
        edit(RuleEdit::Set { rule: missing }),
        Err("the rule for 10.9.9.0/24 with that match does not exist; use `rule add`".into())
    );
    // Key prefix lengths are named as the file spells them, also when a
    // rule's prefix is what they conflict with.
    for (text, expect) in [
        (
            "[limits]\nipv4_prefix = 40\n",
            "limits.ipv4_prefix: IPv4 key prefix length 40",
        ),
        (
            "[limits]\nipv6_prefix = 129\n",
            "limits.ipv6_prefix: IPv6 key prefix length 129",
        ),
        (
            "[limits]\nipv4_prefix = 8\n[[rules]]\ncidr = \"10.10.0.0/16\"\naction = \"allow\"\n",
            "rules[0].cidr: prefix 10.10.0.0/16 is longer than the /8 sources are keyed by \
             (limits.ipv4_prefix)",
        ),
    ] {
        let refused = Config::parse(text, "bad.toml").expect_err(text).to_string();
        assert!(refused.starts_with(expect), "{refused}");
    }
}
