//! `xdp-limiter status`: the daemon, its interfaces and its cluster.

use std::path::Path;

use super::{client, Output};
use crate::proto::{ClusterStatus, GuardStatus, Reply, Request, Status};

pub fn run(socket: &Path, output: Output) -> anyhow::Result<()> {
    let Reply::Status(status) = client::request(socket, Request::Status)? else {
        anyhow::bail!("the daemon answered `status` with something else");
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&status)?),
        Output::Text => print!("{}", render(&status)),
    }
    Ok(())
}

/// The human form.
pub fn render(status: &Status) -> String {
    let mut text = format!(
        "xdp-limiter {}: {}, {} rules (generation {})\n",
        status.version,
        if status.dry_run { "dry-run" } else { "enforce" },
        status.rules,
        status.generation
    );
    text.push_str(&format!(
        "{:<12} {:<10} {:>8} {:>18} {:>8} {:>12} {:>12}\n",
        "interface", "mode", "program", "sources", "limited", "passed/s", "dropped/s"
    ));
    for i in &status.interfaces {
        text.push_str(&format!(
            "{:<12} {:<10} {:>8} {:>18} {:>8} {:>12.0} {:>12.0}\n",
            i.name,
            i.mode,
            i.program_id,
            format!("{}/{}", i.tracked_sources, i.capacity),
            i.limited_sources,
            i.passed_pps,
            i.dropped_pps
        ));
    }
    for i in &status.interfaces {
        text.push_str(&render_programs(i));
    }
    for rule in &status.rule_levels {
        text.push_str(&format!(
            "{} levels: {}\n",
            rule.rule,
            rule.levels.join(", ")
        ));
    }
    text.push_str(&render_cluster(&status.cluster));
    for guard in status.guard.iter().chain(&status.rule_guards) {
        text.push_str(&render_guard(guard));
    }
    text.push_str(&render_lists(status));
    text
}

/// The XDP programs on an interface when others run beside ours (in
/// libxdp's dispatcher, in the order they run).
fn render_programs(i: &crate::proto::InterfaceStatus) -> String {
    let Some(dispatcher) = i.dispatcher_id else {
        return String::new();
    };
    let programs: Vec<String> = i
        .programs
        .iter()
        .map(|p| match p.priority {
            Some(priority) => format!("{} {} (priority {priority})", p.name, p.id),
            None => format!("{} {}", p.name, p.id),
        })
        .collect();
    format!(
        "{} runs, in libxdp's dispatcher {dispatcher}: {}\n",
        i.name,
        programs.join(", ")
    )
}

/// The lists and the bans: a line per list, then the bans' count (none
/// of it without lists or bans).
fn render_lists(status: &Status) -> String {
    let mut text = String::new();
    if status.lists.is_empty() && status.bans == 0 {
        return text;
    }
    if !status.lists.is_empty() {
        text.push_str(&format!(
            "{:<20} {:<6} {:>10} {:>14}
",
            "list", "action", "prefixes", "frames"
        ));
    }
    for list in &status.lists {
        text.push_str(&format!(
            "{:<20} {:<6} {:>10} {:>14}
",
            list.name, list.action, list.prefixes, list.packets
        ));
    }
    text.push_str(&format!("bans: {} in force\n", status.bans));
    text
}

/// The `guard:` lines of the human form: the state, time left, each
/// guard's last value, and after a rollback which guard and when.
fn render_guard(guard: &GuardStatus) -> String {
    let mut text = format!(
        "guard ({}): {}, period {}",
        guard.scope,
        guard.state,
        humantime::format_duration(guard.period)
    );
    if guard.state == "watching" {
        text.push_str(&format!(", {}s left", guard.remaining_s));
    }
    text.push_str(&format!(
        ", judging {} known sources\n",
        guard.known_sources
    ));
    for g in &guard.guards {
        text.push_str(&format!(
            "  {:<32} last {}\n",
            g.guard,
            g.last
                .as_deref()
                .unwrap_or("- (too little traffic to judge)")
        ));
    }
    if let Some(r) = &guard.rollback {
        let what = match guard.state.as_str() {
            "withheld" => "breached, rollback withheld (too many within the hour),",
            _ => "rolled back to dry-run",
        };
        text.push_str(&format!(
            "  {what} {}s ago: {} measured {}\n",
            r.ago_s, r.guard, r.measured
        ));
    }
    text
}

/// The `cluster:` lines of the human form.
fn render_cluster(cluster: &ClusterStatus) -> String {
    let Some(c) = cluster.settings.as_ref().filter(|_| cluster.configured) else {
        return "cluster: not configured (every rule is node-scoped)\n".into();
    };
    let live = match &cluster.live {
        None => "sync: no live state reported\n".to_string(),
        Some(l) => format!(
            "sync: {} node{} alive, last sync {}, {}, {} synced source{}{}\n",
            l.nodes_alive,
            if l.nodes_alive == 1 { "" } else { "s" },
            l.last_sync_age_ms
                .map_or("never".into(), |ms| format!("{ms} ms ago")),
            if l.duplicate_node {
                "DUPLICATE NODE NAME (not syncing)"
            } else if l.degraded {
                "DEGRADED"
            } else {
                "healthy"
            },
            l.synced_sources,
            if l.synced_sources == 1 { "" } else { "s" },
            l.fallback_in_force.map_or(String::new(), |f| format!(
                ", fallback {} in force",
                f.name()
            )),
        ),
    };
    format!(
        "cluster: node {}, {} Redis {}, {} cluster-scoped rule{}\n  \
         sync every {}, timeout {}, threshold {}, fallback {} after {} of grace\n  \
         {live}",
        c.node,
        c.mode.name(),
        match &c.sentinel_master {
            Some(m) => format!("{} (primary {m})", c.redis.join(", ")),
            None => c.redis.join(", "),
        },
        cluster.cluster_rules,
        if cluster.cluster_rules == 1 { "" } else { "s" },
        humantime::format_duration(c.sync_interval),
        humantime::format_duration(c.timeout),
        c.threshold,
        c.fallback.name(),
        humantime::format_duration(c.grace),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_human_form_lists_each_rule_with_levels() {
        let status = Status {
            rule_levels: vec![crate::proto::RuleLevelsStatus {
                rule: "rules[1]".into(),
                levels: vec!["prefix/24/48:2000".into(), "source:20000@1m".into()],
            }],
            ..Status::default()
        };
        let text = render(&status);
        assert!(
            text.contains("\nrules[1] levels: prefix/24/48:2000, source:20000@1m\ncluster:"),
            "{text}"
        );
        assert!(!render(&Status::default()).contains("levels"));
    }

    #[test]
    fn the_human_form_shows_each_list_and_the_bans() {
        let status = Status {
            lists: vec![crate::proto::ListStatus {
                name: "spamhaus".into(),
                action: "deny".into(),
                prefixes: 1200,
                packets: 77,
                ..Default::default()
            }],
            bans: 3,
            ..Status::default()
        };
        let text = render(&status);
        let line = text.lines().find(|l| l.starts_with("spamhaus")).unwrap();
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            ["spamhaus", "deny", "1200", "77"]
        );
        assert!(text.ends_with("bans: 3 in force\n"), "{text}");
    }

    #[test]
    fn the_human_form_shows_the_cluster_or_says_there_is_none() {
        let none = render(&Status::default());
        assert!(
            none.ends_with("cluster: not configured (every rule is node-scoped)\n"),
            "{none}"
        );
        let config = Config::parse(
            "[cluster]\nredis = [\"redis://u:pw@h:7000\", \"redis://h2:7000\"]\nmode = \"cluster\"\n\
             node = \"n1\"\ngrace = \"1m\"\n",
            "t",
        )
        .unwrap();
        let status = Status {
            cluster: ClusterStatus::new(config.cluster.as_ref(), 2),
            ..Status::default()
        };
        let text = render(&status);
        assert!(
            text.contains(
                "cluster: node n1, cluster Redis redis://u:***@h:7000, redis://h2:7000, \
                 2 cluster-scoped rules\n  sync every 100ms, timeout 50ms, threshold 0.25, \
                 fallback split after 1m of grace\n  sync: no live state reported"
            ),
            "{text}"
        );
        let status = Status {
            cluster: ClusterStatus {
                live: Some(Box::new(crate::proto::ClusterLive {
                    nodes_alive: 3,
                    last_sync_age_ms: Some(42),
                    degraded: true,
                    synced_sources: 1,
                    fallback_in_force: Some(crate::config::Fallback::Split),
                    failed_ticks: 9,
                    ..Default::default()
                })),
                ..status.cluster
            },
            ..Status::default()
        };
        let text = render(&status);
        assert!(
            text.contains(
                "sync: 3 nodes alive, last sync 42 ms ago, DEGRADED, 1 synced source, \
                 fallback split in force\n"
            ),
            "{text}"
        );
        assert!(!text.contains("pw"), "{text}");
        // A node refused its name says so before anything else.
        let mut duplicate = status.cluster.clone();
        if let Some(live) = duplicate.live.as_mut() {
            live.duplicate_node = true;
        }
        let text = render(&Status {
            cluster: duplicate,
            ..Status::default()
        });
        assert!(
            text.contains("DUPLICATE NODE NAME (not syncing), 1 synced source"),
            "{text}"
        );
    }

    #[test]
    fn the_human_form_shows_each_guard_period() {
        use crate::proto::{GuardRollback, GuardStatus, GuardValue};
        assert!(!render(&Status::default()).contains("guard"));
        let watching = GuardStatus {
            scope: "global".into(),
            state: "watching".into(),
            period: std::time::Duration::from_secs(600),
            remaining_s: 420,
            known_sources: 120,
            guards: vec![
                GuardValue {
                    guard: "dropped_share <= 5%".into(),
                    last: Some("0.5%".into()),
                    last_value: Some(0.005),
                },
                GuardValue {
                    guard: "limited_sources <= 1%".into(),
                    last: None,
                    last_value: None,
                },
            ],
            rollback: None,
        };
        let rolled = GuardStatus {
            scope: "web".into(),
            state: "rolled-back".into(),
            remaining_s: 0,
            rollback: Some(GuardRollback {
                guard: "dropped_share <= 5%".into(),
                measured: "20.5%".into(),
                measured_value: 0.205,
                at_unix_s: 1_800_000_000,
                ago_s: 12,
            }),
            ..watching.clone()
        };
        let text = render(&Status {
            guard: Some(watching),
            rule_guards: vec![rolled],
            ..Status::default()
        });
        assert!(
            text.contains(
                "guard (global): watching, period 10m, 420s left, judging 120 known sources\n  dropped_share <= 5%              last 0.5%\n  \
                 limited_sources <= 1%            last - (too little traffic to judge)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("guard (web): rolled-back, period 10m, judging 120 known sources\n")
                && text.ends_with(
                    "  rolled back to dry-run 12s ago: dropped_share <= 5% measured 20.5%\n"
                ),
            "{text}"
        );
    }
}
