//! The CrowdSec local API's decision stream as read
//! (`GET /v1/decisions/stream`), and what becomes of it: bans to set and
//! lift. Pure, tested on the host.

use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;

/// One poll's answer: decisions new since the last poll, and deleted or
/// ended ones (`null` when none).
#[derive(Debug, Default, Deserialize)]
pub struct Stream {
    #[serde(default)]
    pub new: Option<Vec<Decision>>,
    #[serde(default)]
    pub deleted: Option<Vec<Decision>>,
}

/// A decision as the stream carries it.
#[derive(Debug, Deserialize)]
pub struct Decision {
    /// Time left, as Go prints a duration (`3h59m59.5s`; negative once
    /// ended).
    pub duration: String,
    /// `Ip` or `Range` (other scopes, as `Country`, are not prefixes).
    pub scope: String,
    /// `ban` (other remediations, as `captcha`, are not bans).
    #[serde(rename = "type")]
    pub kind: String,
    pub value: String,
    #[serde(default)]
    pub scenario: String,
}

/// What a poll asks of the daemon.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Prefixes to ban, for how long, why.
    pub ban: Vec<(IpNet, Duration, String)>,
    /// Prefixes whose CrowdSec ban ends.
    pub unban: Vec<IpNet>,
    /// The answer to a `startup` poll: `ban` holds every decision in
    /// force, so a CrowdSec ban not in it ended while nobody listened.
    pub complete: bool,
    /// Decisions left out (not a ban, not a prefix, no time left).
    pub skipped: usize,
}

impl Stream {
    /// The bans and unbans of this answer (`startup`: the first poll's).
    pub fn batch(self, startup: bool) -> Batch {
        let mut batch = Batch {
            complete: startup,
            ..Batch::default()
        };
        for decision in self.deleted.into_iter().flatten() {
            match decision.prefix() {
                Some(net) if decision.is_ban() => batch.unban.push(net),
                _ => batch.skipped += 1,
            }
        }
        for decision in self.new.into_iter().flatten() {
            let left = go_duration(&decision.duration).filter(|d| !d.is_zero());
            match (decision.prefix(), left) {
                (Some(net), Some(left)) if decision.is_ban() => {
                    // A prefix both deleted and new in one answer is new.
                    batch.unban.retain(|n| *n != net);
                    batch.ban.push((net, left, decision.scenario.clone()));
                }
                _ => batch.skipped += 1,
            }
        }
        batch
    }
}

impl Decision {
    fn is_ban(&self) -> bool {
        self.kind.eq_ignore_ascii_case("ban")
    }

    /// The decision's prefix, for the `Ip` and `Range` scopes.
    fn prefix(&self) -> Option<IpNet> {
        let value = self.value.trim();
        match self.scope.to_ascii_lowercase().as_str() {
            "ip" => value
                .parse::<std::net::IpAddr>()
                .ok()
                .map(IpNet::from)
                .or_else(|| value.parse().ok()),
            "range" => value.parse::<IpNet>().ok().map(|n| n.trunc()),
            _ => None,
        }
    }
}

/// A Go duration (`1h2m3.5s`, `250ms`, `-15.2ms`); `None` for a negative
/// or unreadable one.
fn go_duration(text: &str) -> Option<Duration> {
    if text.starts_with('-') {
        return None;
    }
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * seconds;
        rest = &rest[unit..];
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_read_as_go_prints_them() {
        assert_eq!(
            go_duration("3h59m59.5s"),
            Some(Duration::from_millis(14_399_500))
        );
        assert_eq!(go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(
            go_duration("1m0.000001s"),
            Some(Duration::from_secs_f64(60.000001))
        );
        assert_eq!(go_duration("-15.298059ms"), None);
        assert_eq!(go_duration("4 hours"), None);
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
    }

    #[test]
    fn a_stream_becomes_bans_and_unbans() {
        // As Debian's crowdsec 1.4.6 answers (null for an empty list).
        let text = r#"{"deleted":[{"duration":"-15.2ms","id":1,"origin":"cscli","scenario":"x","scope":"Ip","type":"ban","value":"192.0.2.7"}],
            "new":[{"duration":"59m59.5s","id":2,"origin":"cscli","scenario":"ssh-bf","scope":"Range","type":"ban","value":"198.51.100.9/24"},
                   {"duration":"1h","id":3,"origin":"cscli","scenario":"x","scope":"Ip","type":"captcha","value":"192.0.2.8"},
                   {"duration":"1h","id":4,"origin":"cscli","scenario":"x","scope":"Country","type":"ban","value":"FR"},
                   {"duration":"1h","id":5,"origin":"cscli","scenario":"x","scope":"Ip","type":"ban","value":"2001:db8::7"}]}"#;
        let stream: Stream = serde_json::from_str(text).unwrap();
        let batch = stream.batch(false);
        assert_eq!(batch.unban, vec!["192.0.2.7/32".parse::<IpNet>().unwrap()]);
        assert_eq!(
            batch.ban,
            vec![
                (
                    "198.51.100.0/24".parse().unwrap(),
                    Duration::from_millis(3_599_500),
                    "ssh-bf".to_string()
                ),
                (
                    "2001:db8::7/128".parse().unwrap(),
                    Duration::from_secs(3600),
                    "x".to_string()
                ),
            ]
        );
        assert_eq!(batch.skipped, 2);
        assert!(!batch.complete);
        let empty: Stream = serde_json::from_str(r#"{"deleted":null,"new":null}"#).unwrap();
        assert_eq!(
            empty.batch(true),
            Batch {
                complete: true,
                ..Batch::default()
            }
        );
    }
}
