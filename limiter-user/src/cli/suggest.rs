//! `xdp-limiter suggest`: a per-source limit per rule from the daemon's
//! history of per-source rates (the quantile's rate times the headroom),
//! beside the limit in force and what each would have done; `--apply`
//! sets the proposals live as dry-run rules.

use super::{args::SuggestArgs, client, Output};
use crate::proto::{LimitEffect, Reply, Request, Suggestions};

pub fn run(args: &SuggestArgs) -> anyhow::Result<()> {
    let request = Request::Suggest {
        rule: args.rule.clone(),
        since: args.since,
        quantile: args.quantile,
        headroom: args.headroom,
        apply: args.apply,
    };
    let Reply::Suggestions(suggestions) = client::request(&args.read.socket.path, request)? else {
        anyhow::bail!("the daemon answered `suggest` with something else");
    };
    match args.read.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&suggestions)?),
        Output::Text => print!("{}", render(&suggestions)),
    }
    Ok(())
}

fn percent(share: f64) -> String {
    format!("{:.2}%", share * 100.0)
}

/// "sources% / traffic%" limited, or `-`.
fn effect(e: Option<LimitEffect>) -> String {
    e.map_or("-".into(), |e| {
        format!(
            "{} / {}",
            percent(e.limited_sources_share),
            percent(e.limited_traffic_share)
        )
    })
}

fn pps(value: Option<u64>) -> String {
    value.map_or("-".into(), |v| v.to_string())
}

/// The human form: one line per rule.
pub fn render(s: &Suggestions) -> String {
    let mut text = format!(
        "over the last {} (history kept: {}), quantile {} x headroom {}\n",
        humantime::format_duration(s.since),
        humantime::format_duration(s.horizon),
        s.quantile,
        s.headroom
    );
    let width = s
        .rules
        .iter()
        .map(|r| r.rule.len())
        .max()
        .unwrap_or(0)
        .max(10);
    text.push_str(&format!(
        "{:<width$} {:>10} {:>8} {:>9} {:>12} {:>10} {:>21} {:>21}\n",
        "rule",
        "limit",
        "sources",
        "samples",
        "quantile",
        "proposed",
        "proposed limits*",
        "current limits*"
    ));
    for r in &s.rules {
        text.push_str(&format!(
            "{:<width$} {:>10} {:>8} {:>9} {:>12} {:>10} {:>21} {:>21}\n",
            r.rule,
            pps(r.current_pps),
            r.sources,
            r.samples,
            pps(r.quantile_pps),
            pps(r.proposed_pps),
            effect(r.proposed),
            effect(r.current)
        ));
    }
    text.push_str(
        "* share of samples (each source once a history slot) / share of packets over the limit (rates in packets per second)\n",
    );
    for r in s.rules.iter().filter(|r| r.refused_samples > 0) {
        text.push_str(&format!(
            "note: {}: {} samples of sources refused by the limit in force (at up to {} pps) are left out; if they are clients, that limit is too low for them\n",
            r.rule,
            r.refused_samples,
            pps(r.refused_max_pps)
        ));
    }
    if s.sampled_share < 1.0 {
        text.push_str(&format!(
            "note: the sources are a sample of 1 in {:.0} (chosen by a keyed hash)\n",
            1.0 / s.sampled_share
        ));
    }
    if let Some(active) = s.active_sources {
        text.push_str(&format!(
            "note: about {active} sources touched the cheap tier in its last second (sketch estimate); those that stay below a rule's cheap frames are in no distribution\n"
        ));
    }
    if let Some(applied) = &s.applied {
        text.push_str(applied);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::proto::RuleSuggestion;

    #[test]
    fn the_text_form_has_a_line_per_rule_and_says_when_applied_as_dry_run() {
        let mut s = Suggestions {
            horizon: Duration::from_secs(3600),
            since: Duration::from_secs(3600),
            quantile: 0.999,
            headroom: 2.0,
            rules: vec![
                RuleSuggestion {
                    rule: "default".into(),
                    current_pps: Some(1000),
                    sources: 3_540,
                    samples: 212_400,
                    refused_samples: 0,
                    refused_max_pps: None,
                    quantile_pps: Some(103),
                    proposed_pps: Some(210),
                    proposed: Some(LimitEffect {
                        limited_sources_share: 0.0002,
                        limited_traffic_share: 0.0001,
                    }),
                    current: Some(LimitEffect::default()),
                },
                RuleSuggestion {
                    rule: "dns".into(),
                    current_pps: Some(500),
                    sources: 2,
                    samples: 0,
                    refused_samples: 7,
                    refused_max_pps: Some(2_047),
                    quantile_pps: None,
                    proposed_pps: None,
                    proposed: None,
                    current: None,
                },
            ],
            sampled_share: 1.0,
            active_sources: None,
            applied: None,
        };
        let text = render(&s);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "over the last 1h (history kept: 1h), quantile 0.999 x headroom 2"
        );
        let words = |line: &str| {
            line.split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            words(lines[2]),
            [
                "default", "1000", "3540", "212400", "103", "210", "0.02%", "/", "0.01%", "0.00%",
                "/", "0.00%"
            ]
        );
        assert_eq!(
            words(lines[3]),
            ["dns", "500", "2", "0", "-", "-", "-", "-"]
        );
        assert!(
            text.contains("note: dns: 7 samples of sources refused by the limit in force (at up to 2047 pps) are left out"),
            "{text}"
        );
        assert!(
            !text.contains("sample of 1 in") && !text.contains("DRY-RUN"),
            "{text}"
        );
        s.sampled_share = 0.25;
        s.active_sources = Some(90_000);
        s.applied = Some("applied as DRY-RUN rules: default: 210 pps".into());
        let text = render(&s);
        assert!(text.contains("a sample of 1 in 4"), "{text}");
        assert!(
            text.contains("about 90000 sources touched the cheap tier"),
            "{text}"
        );
        assert!(
            text.ends_with("applied as DRY-RUN rules: default: 210 pps\n"),
            "{text}"
        );
    }
}
