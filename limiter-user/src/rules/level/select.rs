//! What `top --level` chooses levels by, and how it names an aggregate.
//!
//! A selector is any leading part of a level's label
//! ([`LevelSpec::label`](super::LevelSpec::label),
//! `KIND[/V4[/V6]]@WINDOW`) taken field by field, so that what an
//! operator remembers of a level finds it: `/24` (any level keyed by
//! /24 prefixes, whatever its IPv6 length and window), `prefix/24`,
//! `rule`, `destination`, `source@1m` (windows compared as durations:
//! `@60s` is `@1m`), or the whole label. Matching by fields, not by
//! text, keeps `prefix/2` from choosing `prefix/24/48`.

use std::{fmt, str::FromStr, time::Duration};

use limiter_common::{AddressFamily, LevelKey, LevelKind};

use super::LevelPer;

/// The kinds a selector may name, as the grammar spells them.
const KINDS: [&str; 5] = ["source", "prefix", "rule", "destination", "pair"];

/// Which levels `top --level` shows (see the module's doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LevelSelector {
    /// The kind (one of [`KINDS`]); `None`: any.
    kind: Option<&'static str>,
    /// The leading prefix lengths (IPv4, then IPv6) the level must have.
    lens: Vec<u8>,
    /// The window the level must have; `None`: any.
    window: Option<Duration>,
}

impl LevelSelector {
    /// Whether the level keyed `per` over `window` (the rule's window when
    /// the level has none of its own) is chosen.
    pub fn matches(&self, per: &LevelPer, window: Duration) -> bool {
        let (kind, lens): (&str, &[u8]) = match per {
            LevelPer::Source => ("source", &[]),
            LevelPer::Rule => ("rule", &[]),
            LevelPer::Pair => ("pair", &[]),
            LevelPer::Prefix { v4, v6 } => ("prefix", &[*v4, *v6]),
            LevelPer::Destination { v4, v6 } => ("destination", &[*v4, *v6]),
        };
        self.kind.is_none_or(|k| k == kind)
            && lens.starts_with(&self.lens)
            && self.window.is_none_or(|w| w == window)
    }
}

impl FromStr for LevelSelector {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let usage = || {
            format!(
                "{text:?} is not a level selector: the start of a level's label, \
                 KIND[/V4[/V6]][@WINDOW] (e.g. /24, prefix/24, rule, destination, source@1m, \
                 prefix/24/48@1s)"
            )
        };
        let (per, window) = match text.split_once('@') {
            Some((per, window)) => {
                let window = humantime::parse_duration(window.trim())
                    .map_err(|e| format!("{text:?}: window {window:?}: {e}"))?;
                (per.trim(), Some(window))
            }
            None => (text, None),
        };
        let mut parts = per.split('/');
        let kind = match parts.next().unwrap_or_default().trim() {
            "" => None,
            name => Some(*KINDS.iter().find(|k| **k == name).ok_or_else(usage)?),
        };
        let lens = parts
            .map(|len| len.trim().parse::<u8>().map_err(|_| usage()))
            .collect::<Result<Vec<_>, _>>()?;
        let keyed_by_lengths = matches!(kind, None | Some("prefix" | "destination"));
        if lens.len() > 2 || (!lens.is_empty() && !keyed_by_lengths) {
            return Err(usage());
        }
        if kind.is_none() && lens.is_empty() && window.is_none() {
            return Err(usage());
        }
        Ok(Self { kind, lens, window })
    }
}

impl fmt::Display for LevelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.unwrap_or_default())?;
        for len in &self.lens {
            write!(f, "/{len}")?;
        }
        if let Some(window) = self.window {
            write!(f, "@{}", humantime::format_duration(window))?;
        }
        Ok(())
    }
}

/// An aggregate's key as `top --level` shows it: a prefix
/// (`10.1.2.0/24`, `2001:db8::/48`), `rule` (`rule (IPv6)`: the kernel
/// keeps a window per family), a source (`192.0.2.7`, or its prefix when
/// sources are keyed by one), a destination (`-> 192.0.2.1`,
/// `-> 192.0.2.0/24`), or a pair (`10.0.0.1 -> 192.0.2.1`; IPv6 as the
/// kernel keys it, each address folded to 64 bits, its two halves XORed:
/// `2001:db8:0:9 -> 0:0:0:1 (folded)`).
pub fn aggregate_key(kind: LevelKind, key: &LevelKey) -> String {
    let v4 = key.family == AddressFamily::V4 as u8;
    let full = if v4 { 32 } else { 128 };
    let address = || {
        if key.prefix_len == full {
            key.ip().to_string()
        } else {
            format!("{}/{}", key.ip(), key.prefix_len)
        }
    };
    match kind {
        LevelKind::Prefix => format!("{}/{}", key.ip(), key.prefix_len),
        LevelKind::Rule if v4 => "rule".to_string(),
        LevelKind::Rule => "rule (IPv6)".to_string(),
        LevelKind::Source => address(),
        LevelKind::Destination => format!("-> {}", address()),
        LevelKind::Pair if v4 => {
            let [a, b, c, d, e, f, g, h, ..] = key.addr;
            format!(
                "{} -> {}",
                std::net::Ipv4Addr::new(a, b, c, d),
                std::net::Ipv4Addr::new(e, f, g, h)
            )
        }
        LevelKind::Pair => {
            let groups = |half: &[u8]| {
                half.chunks(2)
                    .map(|g| format!("{:x}", u16::from_be_bytes([g[0], g[1]])))
                    .collect::<Vec<_>>()
                    .join(":")
            };
            format!(
                "{} -> {} (folded)",
                groups(&key.addr[..8]),
                groups(&key.addr[8..])
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use limiter_common::{Level, SourceKey};

    fn selector(text: &str) -> LevelSelector {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    const S: Duration = Duration::from_secs(1);
    const M: Duration = Duration::from_secs(60);

    /// The levels of the examples, each with its window.
    fn levels() -> Vec<(&'static str, LevelPer, Duration)> {
        vec![
            ("prefix/24/48@1s", LevelPer::Prefix { v4: 24, v6: 48 }, S),
            ("prefix/16/32@1s", LevelPer::Prefix { v4: 16, v6: 32 }, S),
            ("rule@1s", LevelPer::Rule, S),
            ("source@1m", LevelPer::Source, M),
            (
                "destination@1s",
                LevelPer::Destination { v4: 32, v6: 128 },
                S,
            ),
            (
                "destination/24/128@1s",
                LevelPer::Destination { v4: 24, v6: 128 },
                S,
            ),
            ("pair@1s", LevelPer::Pair, S),
        ]
    }

    fn chosen(text: &str) -> Vec<&'static str> {
        let selector = selector(text);
        levels()
            .into_iter()
            .filter(|(_, per, window)| selector.matches(per, *window))
            .map(|(label, ..)| label)
            .collect()
    }

    #[test]
    fn a_selector_chooses_the_levels_whose_label_it_starts() {
        assert_eq!(chosen("/24"), ["prefix/24/48@1s", "destination/24/128@1s"]);
        assert_eq!(chosen("prefix/24"), ["prefix/24/48@1s"]);
        assert_eq!(chosen("prefix/24/48"), ["prefix/24/48@1s"]);
        assert_eq!(chosen("prefix/24/48@1s"), ["prefix/24/48@1s"]);
        assert_eq!(chosen("prefix"), ["prefix/24/48@1s", "prefix/16/32@1s"]);
        assert_eq!(chosen("rule"), ["rule@1s"]);
        assert_eq!(chosen("rule@1s"), ["rule@1s"]);
        assert_eq!(chosen("source@1m"), ["source@1m"]);
        assert_eq!(chosen("source@60s"), ["source@1m"], "windows as durations");
        assert_eq!(
            chosen("destination"),
            ["destination@1s", "destination/24/128@1s"]
        );
        assert_eq!(chosen("destination/32"), ["destination@1s"]);
        assert_eq!(chosen("pair"), ["pair@1s"]);
        assert_eq!(chosen("@1m"), ["source@1m"]);
        // Fields, not text: a length is whole.
        assert!(chosen("prefix/2").is_empty());
        assert!(chosen("/24/64").is_empty());
        assert!(chosen("rule@10s").is_empty());
        // Every label chooses its own level.
        for (label, ..) in levels() {
            assert!(chosen(label).contains(&label), "{label}");
        }
    }

    #[test]
    fn a_malformed_selector_is_refused_with_the_grammar() {
        for text in [
            "",
            " ",
            "/",
            "prefix/",
            "prefix/x",
            "/24/48/64",
            "/300",
            "rule/24",
            "source/32",
            "aggregate",
            "pre",
            "@",
            "prefix@soon",
        ] {
            let err = text.parse::<LevelSelector>().unwrap_err();
            assert!(
                err.contains("is not a level selector") || err.contains("window"),
                "{text:?}: {err}"
            );
        }
        assert_eq!(selector(" prefix/24 @ 1m ").to_string(), "prefix/24@1m");
        assert_eq!(selector("/24").to_string(), "/24");
    }

    fn key(kind: LevelKind, v4: u8, v6: u8, source: SourceKey, destination: [u8; 16]) -> String {
        let level = Level::new(kind, v4, v6);
        aggregate_key(kind, &level.key(&source, &destination, 0, 7, 0))
    }

    fn v4(octets: [u8; 4]) -> [u8; 16] {
        let mut addr = [0; 16];
        addr[..4].copy_from_slice(&octets);
        addr
    }

    fn v6(text: &str) -> [u8; 16] {
        text.parse::<std::net::Ipv6Addr>().expect("IPv6").octets()
    }

    #[test]
    fn an_aggregate_is_named_by_its_address_or_prefix() {
        let a = SourceKey::v4([10, 1, 2, 3]);
        let six = SourceKey::v6(v6("2001:db8:1234:5678::9"));
        let server = v4([192, 0, 2, 1]);
        let none = [0; 16];
        assert_eq!(key(LevelKind::Prefix, 24, 48, a, none), "10.1.2.0/24");
        assert_eq!(
            key(LevelKind::Prefix, 24, 48, six, none),
            "2001:db8:1234::/48"
        );
        assert_eq!(key(LevelKind::Rule, 0, 0, a, none), "rule");
        assert_eq!(key(LevelKind::Rule, 0, 0, six, none), "rule (IPv6)");
        assert_eq!(key(LevelKind::Source, 0, 0, a, none), "10.1.2.3");
        let keyed = SourceKey::v6(v6("2001:db8::9")).masked(64, &limiter_common::prefix_mask(64));
        assert_eq!(key(LevelKind::Source, 0, 0, keyed, none), "2001:db8::/64");
        assert_eq!(
            key(LevelKind::Destination, 32, 128, a, server),
            "-> 192.0.2.1"
        );
        assert_eq!(
            key(LevelKind::Destination, 24, 128, a, server),
            "-> 192.0.2.0/24"
        );
        assert_eq!(
            key(LevelKind::Destination, 32, 128, six, v6("2001:db8::1")),
            "-> 2001:db8::1"
        );
        assert_eq!(
            key(LevelKind::Pair, 0, 0, a, server),
            "10.1.2.3 -> 192.0.2.1"
        );
        assert_eq!(
            key(LevelKind::Pair, 0, 0, keyed, v6("::1")),
            "2001:db8:0:0 -> 0:0:0:1 (folded)"
        );
    }
}
