//! Configuration files: the shipped example mutated field by field and
//! at every range edge; validation never panics, names what it refuses,
//! and what it accepts compiles and saves.

use std::path::Path;

use limiter_common::rules::rules_base;
use limiter_user::{
    config::{Config, RuleSection},
    rules::compile,
};
use proptest::{collection::vec, prelude::*, sample::select};

use super::config;

/// A TOML file as tables of `key = value` lines (values as TOML text), so
/// mutations can break any one of them, duplicate keys included.
#[derive(Clone, Debug)]
pub(crate) struct Doc {
    tables: Vec<Table>,
}

#[derive(Clone, Debug)]
pub(crate) struct Table {
    /// `daemon`, `limits`, `default` or `rules`.
    section: &'static str,
    entries: Vec<(String, String)>,
}

pub(crate) const DAEMON_KEYS: &[&str] = &[
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
pub(crate) const LIMITS_KEYS: &[&str] = &[
    "dry_run",
    "ipv4_prefix",
    "ipv6_prefix",
    "buckets_per_window",
];

pub(crate) fn shipped_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/config.toml");
    std::fs::read_to_string(path).expect("dist/config.toml")
}

impl Doc {
    /// The shipped example, every section present.
    pub(crate) fn shipped() -> Self {
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

    pub(crate) fn render(&self) -> String {
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
    pub(crate) fn name(&self, t: usize) -> String {
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

    pub(crate) fn keys(&self, t: usize) -> &'static [&'static str] {
        match self.tables[t].section {
            "daemon" => DAEMON_KEYS,
            "limits" => LIMITS_KEYS,
            _ => RuleSection::KEYS,
        }
    }

    /// Sets key number `key` (of the table's known keys) of table `t` to
    /// `value`; returns the key and the value written.
    pub(crate) fn set(
        &mut self,
        t: usize,
        key: usize,
        value: &TomlValue,
    ) -> (&'static str, String) {
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
pub(crate) const TOML_VALUES: &[&str] = &[
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
pub(crate) const TOML_INTEGERS: &[&str] = &[
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
pub(crate) struct TomlValue {
    typed: bool,
    any: String,
    integer: String,
    text: String,
    boolean: bool,
}

impl TomlValue {
    pub(crate) fn for_key(&self, key: &str) -> String {
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

pub(crate) fn toml_value() -> BoxedStrategy<TomlValue> {
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
pub(crate) enum ConfigMutation {
    Set(usize, usize, TomlValue),
    Remove(usize, usize),
    DuplicateKey(usize, usize),
    UnknownKey(usize, String),
    AddRule(Vec<(usize, TomlValue)>),
    DuplicateTable(usize),
    RemoveTable(usize),
}

pub(crate) fn config_mutation() -> BoxedStrategy<ConfigMutation> {
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
    pub(crate) fn apply(&self, doc: &mut Doc) {
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
pub(crate) const BASES_AND_CPUS: &[(u32, u32)] = &[(0, 1), (1, 2), (0, 3), (1, 64), (0, 1024)];

/// What an accepted configuration must be: compilable for any generation
/// and machine, and what `--save` writes of it reads back the same.
pub(crate) fn check_valid(config: &Config) -> Result<(), TestCaseError> {
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
pub(crate) fn check_config(text: &str) -> Result<Result<Config, String>, TestCaseError> {
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
