//! Random sequences of rule edits from the shipped file: refused edits
//! change nothing, accepted ones give a file that validates and saves.

use ipnet::{IpNet, Ipv4Net};
use limiter_user::{
    config::{Config, FileConfig, PortsSpec, ProtocolSpec, RuleSection},
    daemon::apply_rule_edit,
    proto::RuleEdit,
};
use proptest::{collection::vec, prelude::*};

use super::{
    config,
    config::{check_valid, shipped_text},
    strategies::{rule, rule_edit},
};

/// An edit as planned: either aimed at a rule that exists when it is
/// applied (its match spelled another way), or any rule at all.
#[derive(Clone, Debug)]
pub(crate) enum Plan {
    Any(RuleEdit),
    /// Replace existing rule `n` (modulo) with these limits.
    SetExisting(usize, RuleSection, bool),
    /// Remove existing rule `n` (modulo).
    RemoveExisting(usize, bool),
}

pub(crate) fn plan() -> BoxedStrategy<Plan> {
    prop_oneof![
        4 => rule_edit().prop_map(Plan::Any),
        2 => (any::<usize>(), rule(), any::<bool>())
            .prop_map(|(n, rule, respell)| Plan::SetExisting(n, rule, respell)),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(n, respell)| Plan::RemoveExisting(n, respell)),
    ].boxed()
}

/// `rule`'s match spelled another way: the protocol by number or by name
/// in capitals, the port as text or number, the prefix with host bits.
pub(crate) fn respelled(rule: &RuleSection) -> RuleSection {
    let mut rule = rule.clone();
    rule.protocol = rule.protocol.as_ref().map(|p| match (p, p.number()) {
        (ProtocolSpec::Name(_), Some(n)) => ProtocolSpec::Number(n),
        (ProtocolSpec::Number(6), _) => ProtocolSpec::Name("TCP".into()),
        (ProtocolSpec::Number(17), _) => ProtocolSpec::Name("Udp".into()),
        (p, _) => p.clone(),
    });
    rule.ports = rule.ports.as_ref().map(|p| match p {
        PortsSpec::Port(n) => PortsSpec::Text(format!(" {n} ")),
        PortsSpec::Text(t) => match limiter_user::config::parse_ports(t) {
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
    pub(crate) fn edit(&self, file: &FileConfig) -> RuleEdit {
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
pub(crate) fn check_refusal(edit: &RuleEdit, message: &str) -> Result<(), TestCaseError> {
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
                            // As sent, but for the name: the rule keeps its
                            // own unless the edit gives one.
                            let old = before.rules.iter().find(|r| r.same_rule(rule)).expect("set an existing rule");
                            let name = rule.name.clone().or_else(|| old.name.clone());
                            let want = RuleSection { name, ..rule.clone() };
                            prop_assert!(edited.rules.contains(&want));
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
