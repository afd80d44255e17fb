//! How a cluster source is named: a typed [`ReportKey`] (its window key and
//! its rule's name) inside the daemon, and the Redis wire string it becomes
//! at the Redis boundary ([`ReportKey::wire`], [`ReportKey::parse`]): what
//! the sync's reports carry and what the hot listing returns.

use std::{fmt, net::IpAddr};

use limiter_common::SourceKey;

/// A source under a cluster rule: its window key (address, prefix, budget
/// class) and the rule's name. Nodes running the same rules name a source
/// the same way, which is what lets one node sync a source another node
/// reported hot.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReportKey {
    pub key: SourceKey,
    pub rule: String,
}

impl ReportKey {
    pub fn new(key: SourceKey, rule: impl Into<String>) -> Self {
        Self {
            key,
            rule: rule.into(),
        }
    }

    /// The Redis name of the source, e.g. `192.0.2.3/32#0|default`: part
    /// of every key of the source, so its layout is the key layout.
    pub fn wire(&self) -> String {
        self.to_string()
    }

    /// The key a [`ReportKey::wire`] string names; `None` for a key this
    /// build does not form (another version, another deployment).
    pub fn parse(text: &str) -> Option<Self> {
        let (source, rule) = text.split_once('|')?;
        let (prefix, class) = source.rsplit_once('#')?;
        let (addr, len) = prefix.rsplit_once('/')?;
        let class: u8 = class.parse().ok()?;
        let len: u8 = len.parse().ok()?;
        let mut key = match addr.parse::<IpAddr>().ok()? {
            IpAddr::V4(v4) if len <= 32 => SourceKey::v4(v4.octets()),
            IpAddr::V6(v6) if len <= 128 => SourceKey::v6(v6.octets()),
            _ => return None,
        };
        key.prefix_len = len;
        if rule.is_empty() {
            return None;
        }
        Some(Self::new(key.with_class(class), rule))
    }
}

impl fmt::Display for ReportKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}#{}|{}",
            self.key.ip(),
            self.key.prefix_len,
            self.key.class,
            self.rule
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_keys_round_trip_and_refuse_garbage() {
        let key = SourceKey::v4([192, 0, 2, 3]).with_class(2);
        let text = ReportKey::new(key, "0.0.0.0/0+udp:53").wire();
        assert_eq!(text, "192.0.2.3/32#2|0.0.0.0/0+udp:53");
        assert_eq!(
            ReportKey::parse(&text),
            Some(ReportKey::new(key, "0.0.0.0/0+udp:53"))
        );
        let mut v6 = SourceKey::v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        v6.prefix_len = 64;
        let text = ReportKey::new(v6, "default").wire();
        assert_eq!(ReportKey::parse(&text), Some(ReportKey::new(v6, "default")));
        for bad in [
            "",
            "192.0.2.3/32|default",
            "192.0.2.3/33#0|default",
            "nonsense/32#0|default",
            "192.0.2.3/32#0|",
            "192.0.2.3/32#300|default",
        ] {
            assert_eq!(ReportKey::parse(bad), None, "{bad}");
        }
    }
}
