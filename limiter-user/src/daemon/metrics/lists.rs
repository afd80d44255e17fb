//! The lists' and bans' metrics: frames each list judged, its prefixes,
//! the bans in force and every ban, unban and end.

use std::collections::HashMap;

use limiter_common::{lists::ListAction, Counter};
use prometheus::{Gauge, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::registry::{counter, gauge, registered};

/// A ban's change, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BanChange {
    Ban,
    Unban,
    Expired,
}

impl BanChange {
    pub fn as_str(self) -> &'static str {
        match self {
            BanChange::Ban => "ban",
            BanChange::Unban => "unban",
            BanChange::Expired => "expired",
        }
    }
}

pub fn action_name(action: ListAction) -> &'static str {
    match action {
        ListAction::Allow => "allow",
        ListAction::Deny => "deny",
    }
}

pub struct ListMetrics {
    packets: IntCounterVec,
    bytes: IntCounterVec,
    prefixes: IntGaugeVec,
    load_seconds: Gauge,
    bans: IntGauge,
    ban_changes: IntCounterVec,
    /// The CrowdSec bouncer's polls of the local API, by result.
    pub crowdsec_polls: IntCounterVec,
    /// The kernel's last totals per interface and list index.
    last: HashMap<(String, usize), Counter>,
}

impl ListMetrics {
    pub(super) fn new(registry: &Registry) -> Self {
        Self {
            packets: counter(
                registry,
                "xdp_limiter_list_packets_total",
                "Frames a list judged (allowed or denied), by interface and list.",
                &["interface", "list", "action"],
            ),
            bytes: counter(
                registry,
                "xdp_limiter_list_bytes_total",
                "Bytes of the frames a list judged, by interface and list.",
                &["interface", "list", "action"],
            ),
            prefixes: gauge(
                registry,
                "xdp_limiter_list_prefixes",
                "Distinct prefixes a list holds in the kernel (a prefix an earlier list holds counts there).",
                &["list", "action"],
            ),
            load_seconds: registered(
                registry,
                Gauge::with_opts(Opts::new(
                    "xdp_limiter_list_load_seconds",
                    "How long the last load of the lists took (read, merge, write, switch).",
                ))
                .expect("valid metric"),
            ),
            bans: registered(
                registry,
                IntGauge::with_opts(Opts::new(
                    "xdp_limiter_bans",
                    "Bans in force (both families).",
                ))
                .expect("valid metric"),
            ),
            ban_changes: counter(
                registry,
                "xdp_limiter_ban_changes_total",
                "Bans added, lifted and ended, by change and origin.",
                &["change", "origin"],
            ),
            crowdsec_polls: counter(
                registry,
                "xdp_limiter_crowdsec_polls_total",
                "Polls of the CrowdSec local API's decision stream, by result (ok, error).",
                &["result"],
            ),
            last: HashMap::new(),
        }
    }

    /// The lists now loaded: their names, actions and prefix counts; the
    /// load's duration. Series of lists no longer loaded are removed.
    pub fn loaded(&mut self, lists: &[(String, ListAction, usize)], seconds: f64) {
        self.prefixes.reset();
        for (name, action, count) in lists {
            self.prefixes
                .with_label_values(&[name, action_name(*action)])
                .set(*count as i64);
        }
        self.load_seconds.set(seconds);
    }

    /// Advances each list's counters of `iface` to the kernel's totals
    /// (`hits[index]`), under the names the lists have by index. After a
    /// reset of the kernel's counters, `forget` starts them afresh.
    pub fn record_hits(&mut self, iface: &str, hits: &[Counter], lists: &[(String, ListAction)]) {
        for (index, ((name, action), total)) in lists.iter().zip(hits).enumerate() {
            let last = self
                .last
                .insert((iface.to_string(), index), *total)
                .unwrap_or_default();
            let labels = [iface, name.as_str(), action_name(*action)];
            self.packets
                .with_label_values(&labels)
                .inc_by(total.packets.saturating_sub(last.packets));
            self.bytes
                .with_label_values(&labels)
                .inc_by(total.bytes.saturating_sub(last.bytes));
        }
    }

    /// The kernel's list counters were zeroed.
    pub fn forget_hits(&mut self) {
        self.last.clear();
    }

    pub fn set_bans(&self, count: usize) {
        self.bans.set(count as i64);
    }

    pub fn ban_changed(&self, change: BanChange, origin: &str) {
        self.ban_changes
            .with_label_values(&[change.as_str(), origin])
            .inc();
    }
}
