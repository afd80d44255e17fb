//! `xdp-limiter rule add|set|rm|ls` and `xdp-limiter default set`: rules
//! changed live in the daemon (every source re-resolves on its next frame,
//! counters stay), and with `--save` written back to its configuration
//! file so they survive a restart.

use std::path::Path;

use ipnet::IpNet;

use super::{
    args::{DefaultCommand, EditArgs, LimitArgs, MatchArgs, RuleArgs, RuleCommand},
    client, Output,
};
use crate::{
    config::{PortsSpec, ProtocolSpec, RuleSection},
    proto::{Reply, Request, RuleEdit},
    rules::DEFAULT_RULE_NAME,
};

/// The file form of a rule from the command line.
pub fn section(cidr: Option<IpNet>, m: &MatchArgs, l: &LimitArgs) -> RuleSection {
    RuleSection {
        name: None,
        cidr,
        action: l.action,
        protocol: m.protocol.clone(),
        ports: m.ports.clone(),
        tcp_syn: m.syn,
        pps: l.pps,
        bytes_per_second: l.bps,
        burst_packets: l.burst,
        burst_bytes: l.burst_bytes,
        window: l.window,
        block: l.block,
        dry_run: Some(l.dry_run),
        scope: l.scope,
        levels: l.levels.iter().copied().map(Into::into).collect(),
        guards: l.guards.iter().map(ToString::to_string).collect(),
        guard_for: l.guard_for,
    }
}

/// `rule add|set|rm|ls`.
pub fn run(command: RuleCommand) -> anyhow::Result<()> {
    let send = |args: RuleArgs, make: fn(RuleSection) -> RuleEdit| {
        let rule = RuleSection {
            name: args.name,
            ..section(Some(args.cidr), &args.matches, &args.limits)
        };
        edit(&args.common, make(rule))
    };
    match command {
        RuleCommand::Add(args) => send(args, |rule| RuleEdit::Add { rule }),
        RuleCommand::Set(args) => send(args, |rule| RuleEdit::Set { rule }),
        RuleCommand::Rm {
            cidr,
            name,
            matches,
            common,
        } => {
            let rule = RuleSection {
                name,
                ..section(cidr, &matches, &LimitArgs::none())
            };
            edit(&common, RuleEdit::Remove { rule })
        }
        RuleCommand::Ls(args) => list(&args.socket.path, args.output),
    }
}

/// `default set`: the default rule matches every frame, so it has no
/// prefix and no match.
pub fn default(command: DefaultCommand) -> anyhow::Result<()> {
    let DefaultCommand::Set { limits, common } = command;
    let rule = section(None, &MatchArgs::default(), &limits);
    edit(&common, RuleEdit::Default { rule })
}

/// Sends an edit and prints the daemon's answer.
fn edit(common: &EditArgs, edit: RuleEdit) -> anyhow::Result<()> {
    client::done(
        &common.socket.path,
        Request::Rules {
            edit,
            save: common.save,
        },
    )
}

/// `rule ls`.
pub fn list(socket: &Path, output: Output) -> anyhow::Result<()> {
    let Reply::Rules { default, rules } = client::request(socket, Request::RuleList)? else {
        anyhow::bail!("the daemon answered `rule ls` with something else");
    };
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "default": with_scope(&default)?,
                "rules": rules.iter().map(with_scope).collect::<Result<Vec<_>, _>>()?,
            }))?
        ),
        Output::Text => {
            println!(
                "{:<10} {:<20} {:<18} {:<7} {:<7} limits",
                "rule", "cidr", "match", "action", "scope"
            );
            println!("{}", line(DEFAULT_RULE_NAME, &default));
            for rule in &rules {
                println!("{}", line(&rule.effective_name(), rule));
            }
        }
    }
    Ok(())
}

/// A rule as JSON with its scope and levels always spelled out: the file
/// form leaves `node` and no levels implicit, but a script reading `rule
/// ls` should not have to know those defaults.
fn with_scope(rule: &RuleSection) -> serde_json::Result<serde_json::Value> {
    let mut value = serde_json::to_value(rule)?;
    if let Some(object) = value.as_object_mut() {
        let name = match rule.cidr {
            None => DEFAULT_RULE_NAME.to_string(),
            Some(_) => rule.effective_name(),
        };
        object.insert("name".into(), name.into());
        object.insert("scope".into(), rule.scope.name().into());
        object.insert("levels".into(), level_strings(rule).into());
    }
    Ok(value)
}

/// The rule's levels in the grammar they are written in.
fn level_strings(rule: &RuleSection) -> Vec<String> {
    rule.levels.iter().map(ToString::to_string).collect()
}

/// One rule of the human form.
fn line(name: &str, r: &RuleSection) -> String {
    let cidr = r.cidr.map_or("*".to_string(), |c| c.to_string());
    let mut matches = Vec::new();
    if let Some(p) = &r.protocol {
        matches.push(match p {
            ProtocolSpec::Name(n) => n.clone(),
            ProtocolSpec::Number(n) => format!("proto {n}"),
        });
    }
    if let Some(p) = &r.ports {
        matches.push(match p {
            PortsSpec::Port(p) => format!("port {p}"),
            PortsSpec::Text(t) => format!("port {t}"),
        });
    }
    if r.tcp_syn {
        matches.push("syn".into());
    }
    let action = r.action.name();
    let mut limits = Vec::new();
    if let Some(pps) = r.pps {
        limits.push(format!("{pps} pps"));
    }
    if let Some(bytes) = r.bytes_per_second {
        limits.push(format!("{} bit/s", bytes * 8));
    }
    if r.burst_packets > 0 {
        limits.push(format!("burst {}", r.burst_packets));
    }
    if r.burst_bytes > 0 {
        limits.push(format!("burst {} B", r.burst_bytes));
    }
    limits.push(format!("window {}", humantime::format_duration(r.window)));
    if let Some(block) = r.block {
        limits.push(format!("block {}", humantime::format_duration(block)));
    }
    if r.dry_run == Some(true) {
        limits.push("dry-run".into());
    }
    if !r.guards.is_empty() {
        let period = r.guard_for.unwrap_or(crate::guard::DEFAULT_GUARD_FOR);
        limits.push(format!(
            "guarded {} by {}",
            humantime::format_duration(period),
            r.guards.join(" and ")
        ));
    }
    // Last, so that everything after `levels:` is a level.
    if !r.levels.is_empty() {
        limits.push(format!("levels: {}", level_strings(r).join(", ")));
    }
    let matches = if matches.is_empty() {
        "-".to_string()
    } else {
        matches.join(" ")
    };
    let scope = r.scope.name();
    format!(
        "{name:<10} {cidr:<20} {matches:<18} {action:<7} {scope:<7} {}",
        limits.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ls_shows_each_rules_levels_last_and_always_in_json() {
        let mut rule = RuleSection {
            cidr: Some("10.0.0.0/8".parse().unwrap()),
            pps: Some(100),
            levels: vec!["prefix/24:2000".into(), "source:20000@1m".into()],
            ..RuleSection::default()
        };
        let text = line("rules[0]", &rule);
        assert!(
            text.ends_with("100 pps, window 1s, levels: prefix/24/48:2000, source:20000@1m"),
            "{text}"
        );
        let json = with_scope(&rule).unwrap();
        assert_eq!(
            json["levels"],
            serde_json::json!(["prefix/24/48:2000", "source:20000@1m"])
        );
        rule.levels.clear();
        assert!(!line("rules[0]", &rule).contains("levels"));
        assert_eq!(with_scope(&rule).unwrap()["levels"], serde_json::json!([]));
    }
}
