//! `suggest`: a per-source limit per `limit` rule from the history of
//! per-source rates (`history`), with what it and the limit in force would
//! have done; with `apply`, each proposal set live as a dry-run rule
//! through the same path as `rule set` (the rule keeps its window, match
//! and everything else). Bad input is refused before anything changes.

use std::time::Duration;

use limiter_common::Action;
use tracing::info;

use super::{
    edit,
    history::{propose, Distribution, SeriesKey},
    state::Daemon,
};
use crate::{
    kernel,
    proto::{LimitEffect, RuleEdit, RuleSuggestion, Suggestions},
    rules::{RuleSet, RuleSpec},
};

/// What `suggest` asks for.
pub struct Ask {
    pub rule: Option<String>,
    /// `None`: the whole history.
    pub since: Option<Duration>,
    pub quantile: f64,
    pub headroom: f64,
    pub apply: bool,
}

fn effect(dist: &Distribution, limit: u64) -> LimitEffect {
    let e = dist.effect(limit);
    LimitEffect {
        limited_sources_share: e.limited_share,
        limited_traffic_share: e.traffic_share,
    }
}

impl Daemon {
    /// Answers `suggest`, or says what is wrong with the request.
    pub(super) fn suggest(&mut self, ask: Ask) -> Result<Suggestions, String> {
        let horizon = self.history.horizon();
        let since = asked_since(&ask, horizon)?;
        let chosen = chosen(&self.config.rules, ask.rule.as_deref())?;
        let now = kernel::now();
        let read_since = (now.saturating_sub(since)).as_nanos() as u64;
        let mut suggestions = Vec::with_capacity(chosen.len());
        for spec in chosen {
            let name = &spec.name;
            let dist = self
                .history
                .distribution(&SeriesKey::rule(name), since, now);
            let quantile_pps = dist.quantile(ask.quantile);
            let proposed_pps = quantile_pps.map(|q| propose(q, ask.headroom));
            let has = dist.samples() > 0;
            let sources = self
                .known
                .iter()
                .filter(|(_, s)| s.last_ns >= read_since && &*s.rule == name.as_str())
                .count() as u64;
            suggestions.push(RuleSuggestion {
                rule: name.clone(),
                current_pps: spec.limits.pps,
                sources,
                samples: dist.samples(),
                refused_samples: dist.refused_samples(),
                refused_max_pps: dist.refused_max(),
                quantile_pps,
                proposed_pps,
                proposed: proposed_pps.map(|p| effect(&dist, p)),
                current: spec.limits.pps.filter(|_| has).map(|p| effect(&dist, p)),
            });
        }
        if suggestions
            .iter()
            .all(|s| s.samples == 0 && s.refused_samples == 0)
        {
            let which = ask.rule.as_deref().unwrap_or("any `limit` rule");
            return Err(format!(
                "no history yet: no source with traffic was seen under {which} in the last {}; wait for traffic (a sweep of the sources each tick adds to it) and ask again",
                humantime::format_duration(since)
            ));
        }
        let applied = if ask.apply {
            Some(self.apply_suggestions(&suggestions)?)
        } else {
            None
        };
        Ok(Suggestions {
            horizon,
            since,
            quantile: ask.quantile,
            headroom: ask.headroom,
            rules: suggestions,
            sampled_share: self.known.sampled_share(),
            active_sources: self.config.rules.tiered.then(|| {
                self.ifaces
                    .iter()
                    .filter_map(|i| i.observed.snapshot()?.active_sources)
                    .map(|a| a.estimate)
                    .sum()
            }),
            applied,
        })
    }

    /// Sets every proposal live as a dry-run rule, as `rule set` (or
    /// `default set`) would: each rule in file form with only its `pps`
    /// (and `dry_run`) changed, validated as a whole file, then pushed as
    /// one rule generation: all of them or, refused, none. Rules without a
    /// proposal are left alone.
    ///
    /// Under the global dry-run every rule is dry-run already, and a rule
    /// keeps its own flag: the operator's loop (dry-run, look, suggest,
    /// `mode enforce --guard`) then enforces the proposals under the
    /// guards. Under global enforcement the rule itself is set dry-run, so
    /// a proposal never drops before it has been watched.
    fn apply_suggestions(&mut self, suggestions: &[RuleSuggestion]) -> Result<String, String> {
        let mut file = self.config.file.clone();
        let mode_is_dry_run = self.config.rules.dry_run;
        let mut fresh = None;
        let mut done = Vec::new();
        for s in suggestions {
            let Some(pps) = s.proposed_pps else {
                continue;
            };
            let position = self
                .config
                .rules
                .position(&s.rule)
                .ok_or_else(|| format!("{} is no longer in force", s.rule))?;
            let edit = if position == 0 {
                let mut rule = file.default.clone();
                rule.pps = Some(pps);
                if !mode_is_dry_run {
                    rule.dry_run = Some(true);
                }
                RuleEdit::Default { rule }
            } else {
                let mut rule = file
                    .rules
                    .get(position - 1)
                    .cloned()
                    .ok_or_else(|| format!("{} is no longer in force", s.rule))?;
                rule.pps = Some(pps);
                if !mode_is_dry_run {
                    rule.dry_run = Some(true);
                }
                RuleEdit::Set { rule }
            };
            let (edited, config, _) = edit::apply_rule_edit(&file, edit)?;
            file = edited;
            fresh = Some(config);
            done.push(format!("{}: {pps} pps", s.rule));
        }
        let Some(fresh) = fresh else {
            return Ok("nothing applied: no rule has a proposal".into());
        };
        let generation = self.push_edited(file, fresh)?;
        info!(rules = %done.join(", "), generation, "suggested limits applied as dry-run rules");
        let how = if mode_is_dry_run {
            "applied, DRY-RUN as the whole daemon is (counted as would-drop, nothing dropped; `mode enforce --guard ...` to enforce)"
        } else {
            "applied as DRY-RUN rules (counted as would-drop, nothing dropped; `rule set` without --dry-run to enforce)"
        };
        Ok(format!(
            "{how}: {}; rule generation {generation}",
            done.join("; ")
        ))
    }
}

/// The question's bounds checked (`since` within the history kept, the
/// quantile in (0, 1], the headroom at least 1); the span asked about.
fn asked_since(ask: &Ask, horizon: Duration) -> Result<Duration, String> {
    let since = ask.since.unwrap_or(horizon);
    if since.is_zero() || since > horizon {
        return Err(format!(
            "--since {} is outside the history the daemon keeps: above zero and at most {} (`[daemon] history`)",
            humantime::format_duration(since),
            humantime::format_duration(horizon)
        ));
    }
    if !(ask.quantile > 0.0 && ask.quantile <= 1.0) {
        return Err(format!(
            "--quantile {} is outside (0, 1] (0.999: the rate 99.9 % of source-seconds stay at or below)",
            ask.quantile
        ));
    }
    if !(ask.headroom >= 1.0 && ask.headroom.is_finite()) {
        return Err(format!(
            "--headroom {} is below 1 (the proposal is the quantile's rate times it)",
            ask.headroom
        ));
    }
    Ok(since)
}

/// The rules a question is about: the one it names, which must be a
/// `limit` rule with a packet limit, or every such rule in force.
fn chosen<'a>(rules: &'a RuleSet, only: Option<&str>) -> Result<Vec<&'a RuleSpec>, String> {
    let is_limit = |spec: &RuleSpec| spec.action == Action::Limit && spec.limits.pps.is_some();
    let chosen: Vec<&RuleSpec> = match only {
        Some(name) => {
            let Some(found) = rules.specs().find(|spec| spec.name == name) else {
                let names: Vec<&str> = rules.specs().map(|spec| spec.name.as_str()).collect();
                return Err(format!(
                    "no rule {name}: the rules in force are {}",
                    names.join(", ")
                ));
            };
            if !is_limit(found) {
                return Err(format!(
                    "{name} is not a `limit` rule with a packet limit (action {}): suggest proposes packet limits",
                    found.action.name()
                ));
            }
            vec![found]
        }
        None => rules.specs().filter(|spec| is_limit(spec)).collect(),
    };
    if chosen.is_empty() {
        return Err(
            "no rule in force is a `limit` rule with a packet limit: nothing to suggest".into(),
        );
    }
    Ok(chosen)
}
