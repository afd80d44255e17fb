//! Structure-aware mutation of JSON request lines: keys dropped,
//! duplicated, renamed or inserted; values of the wrong type, huge,
//! negative, NaN-like or nested past the recursion limit; junk appended.

use limiter_user::{config::RuleSection, proto::REQUEST_KEYS};
use proptest::{prelude::*, sample::select};
use serde_json::Value;

/// JSON text as a tree whose objects may hold a key twice (which
/// `serde_json::Value` cannot), so duplicated keys reach the parser.
#[derive(Clone, Debug)]
pub(crate) enum Json {
    /// A scalar, as text (not necessarily valid JSON: `NaN`, `1e400`).
    Raw(String),
    Object(Vec<(String, Json)>),
    Array(Vec<Json>),
}

impl Json {
    pub(crate) fn parse(text: &str) -> Self {
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

    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        self.render_into(&mut out);
        out
    }

    pub(crate) fn render_into(&self, out: &mut String) {
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
    pub(crate) fn entries(&self) -> usize {
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
    pub(crate) fn at_entry(&mut self, n: usize, f: impl FnOnce(&mut Vec<(String, Json)>, usize)) {
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

    pub(crate) fn visit<F: FnOnce(&mut Vec<(String, Json)>, usize)>(
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
    pub(crate) fn nested(self, depth: usize, arrays: bool) -> Self {
        (0..depth).fold(self, |inner, _| {
            if arrays {
                Json::Array(vec![inner])
            } else {
                Json::Object(vec![("a".into(), inner)])
            }
        })
    }
}

/// Near misses of the protocol's keys, and oddities.
const ODD_KEYS: &[&str] = &[
    "kind", "Version", "COMMAND", "dry-run", "", "version ", "\u{0}",
];

/// Keys of the protocol (`cidr` and `dry_run` twice: a request's and a
/// rule's), near misses and oddities.
pub(crate) fn keys() -> Vec<&'static str> {
    [REQUEST_KEYS, RuleSection::KEYS, ODD_KEYS].concat()
}

/// Values of every type, at the edges, NaN-like, and invalid JSON.
pub(crate) const VALUES: &[&str] = &[
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

pub(crate) fn json_value() -> BoxedStrategy<Json> {
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

pub(crate) fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(keys()).prop_map(String::from),
        1 => "\\PC{0,8}",
    ]
}

#[derive(Clone, Debug)]
pub(crate) enum Mutation {
    Drop(usize),
    Duplicate(usize),
    Rename(usize, String),
    Replace(usize, Json),
    Insert(usize, String, Json),
    /// The whole request nested in arrays (or objects).
    Nest(usize, bool),
}

pub(crate) fn mutation() -> BoxedStrategy<Mutation> {
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
    pub(crate) fn apply(&self, tree: &mut Json) {
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
pub(crate) const JUNK: &[&str] = &[
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
