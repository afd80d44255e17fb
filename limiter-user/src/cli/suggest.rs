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
    text.push_str(&format!(
        "{:<10} {:>10} {:>9} {:>12} {:>10} {:>21} {:>21}\n",
        "rule",
        "limit",
        "samples",
        "quantile",
        "proposed",
        "proposed limits*",
        "current limits*"
    ));
    for r in &s.rules {
        text.push_str(&format!(
            "{:<10} {:>10} {:>9} {:>12} {:>10} {:>21} {:>21}\n",
            r.rule,
            pps(r.current_pps),
            r.samples,
            pps(r.quantile_pps),
            pps(r.proposed_pps),
            effect(r.proposed),
            effect(r.current)
        ));
    }
    text.push_str(
        "* share of source-seconds / share of packets over the limit (rates in packets per second)\n",
    );
    if s.hot_sources_only {
        text.push_str(
            "note: the tiers are on ([limits] tiers): only sources with per-CPU state (busy, refused or near their limit) are observed, so the distribution leans to the heavier sources; light sources below the cheap tier's threshold are not in it\n",
        );
    }
    if let Some(applied) = &s.applied {
        text.push_str(applied);
        text.push('\n');
    }
    text
}
