//! Answering control requests: the read-only views (`status`, `top`, the
//! rules; `top --level` in `top_levels.rs`) and the changes (mode, reload,
//! unblock, rule edits), each either applied to every interface or refused
//! with nothing changed.

use std::time::Duration;

use ipnet::IpNet;
use limiter_common::{Action, Scope};
use tracing::{info, warn};

use super::{edit, state::Daemon};
use crate::{
    config, guard,
    kernel::{self, penalty},
    proto::{
        ClusterStatus, InterfaceStatus, Reply, Request, ResponseLine, RuleEdit, RuleLevelsStatus,
        Status, TopSource,
    },
};

/// What the loop does with a request. One per control request, moved
/// once: boxing the answer to shrink the enum would only add an
/// allocation.
#[allow(clippy::large_enum_variant)]
pub enum Handled {
    /// Send this answer.
    Answer(ResponseLine),
    /// Stop the daemon, detaching, and answer once detached.
    Detach,
}

fn done(message: String) -> Reply {
    Reply::Done { message }
}

impl Daemon {
    /// Answers one control request.
    pub(super) fn handle(&mut self, request: Request) -> Handled {
        let answer = match request {
            Request::Detach => return Handled::Detach,
            Request::Status => Ok(Reply::Status(Box::new(self.status()))),
            Request::Top { limit, level: None } => Ok(Reply::Top {
                sources: self.top(limit),
            }),
            Request::Top {
                limit,
                level: Some(level),
            } => self
                .top_levels(&level, limit)
                .map(|aggregates| Reply::Aggregates { aggregates }),
            Request::RuleList => Ok(Reply::Rules {
                default: Box::new(self.config.file.default.clone()),
                rules: self.config.file.rules.clone(),
            }),
            Request::Reload => self
                .reload()
                .map(|g| done(format!("reloaded; rule generation {g}")))
                .ok_or_else(|| {
                    "reload failed; the running configuration stays in force (see the daemon's log)"
                        .to_string()
                }),
            Request::Unblock { cidr } => self.unblock(&cidr).map(done),
            Request::Ban {
                cidr,
                duration,
                reason,
            } => self
                .ban(
                    cidr,
                    duration,
                    &reason,
                    limiter_common::lists::BanOrigin::Cli,
                )
                .map(done),
            Request::Unban { cidr, missing_ok } => self
                .unban(cidr, missing_ok, limiter_common::lists::BanOrigin::Cli)
                .map(done),
            Request::Bans => self.bans().map(|bans| Reply::Bans { bans }),
            Request::ListEdit {
                list,
                op,
                prefixes,
                save,
            } => self.edit_list(&list, op, &prefixes, save).map(done),
            Request::Rules { edit, save } => self.edit_rules(edit, save).map(done),
            Request::Mode {
                dry_run,
                save,
                guards,
                guard_for,
            } => self.set_mode(dry_run, save, &guards, guard_for).map(done),
            Request::Suggest {
                rule,
                since,
                quantile,
                headroom,
                apply,
            } => self
                .suggest(super::suggest::Ask {
                    rule,
                    since,
                    quantile,
                    headroom,
                    apply,
                })
                .map(|s| Reply::Suggestions(Box::new(s))),
        };
        Handled::Answer(match answer {
            Ok(reply) => ResponseLine::ok(reply),
            Err(message) => ResponseLine::error(message),
        })
    }

    fn status(&self) -> Status {
        let (guard, rule_guards) = self.guard_status();
        Status {
            version: env!("CARGO_PKG_VERSION").to_string(),
            generation: self.generation,
            dry_run: self.config.rules.dry_run,
            rules: self.config.rules.rules.len() + 1,
            rule_levels: std::iter::once(&self.config.rules.default)
                .chain(&self.config.rules.rules)
                .enumerate()
                .filter(|(_, spec)| !spec.levels.is_empty())
                .map(|(_, spec)| RuleLevelsStatus {
                    rule: spec.name.clone(),
                    levels: spec.levels.iter().map(ToString::to_string).collect(),
                })
                .collect(),
            interfaces: self
                .ifaces
                .iter()
                .map(|iface| {
                    let snapshot = iface.observed.snapshot();
                    let (programs, dispatcher_id) = xdp_programs(&iface.instance.iface);
                    InterfaceStatus {
                        name: iface.instance.iface.clone(),
                        mode: iface.instance.attachment,
                        program_id: iface.instance.program.id(),
                        tracked_sources: snapshot.map_or(0, |s| s.tracked_sources),
                        capacity: self.config.daemon.max_hot_sources,
                        limited_sources: snapshot.map_or(0, |s| s.limited.len() as u64),
                        passed_pps: iface.observed.passed_pps,
                        dropped_pps: iface.observed.dropped_pps,
                        programs,
                        dispatcher_id,
                    }
                })
                .collect(),
            cluster: ClusterStatus {
                live: self
                    .cluster_live
                    .as_ref()
                    .and_then(|l| l.lock().ok().map(|l| Box::new(l.status()))),
                ..ClusterStatus::new(
                    self.config.cluster.as_ref(),
                    std::iter::once(&self.config.rules.default)
                        .chain(&self.config.rules.rules)
                        .filter(|r| r.scope == Scope::Cluster)
                        .count(),
                )
            },
            guard,
            rule_guards,
            lists: self.list_status(),
            bans: self.ban_book.in_force,
        }
    }

    /// The heaviest sources of every interface's last complete sweep, with
    /// the rule that judges each and its state under it.
    fn top(&self, limit: usize) -> Vec<TopSource> {
        let now_ns = kernel::now().as_nanos() as u64;
        let rules = &self.config.rules;
        let mut sources: Vec<TopSource> = Vec::new();
        for iface in &self.ifaces {
            let Some(snapshot) = iface.observed.snapshot() else {
                continue;
            };
            let maps = &iface.instance.program.maps;
            for rate in &snapshot.top {
                let position = self.rule_position(rate.rule);
                let spec = position.and_then(|p| match p {
                    0 => Some(&rules.default),
                    p => rules.rules.get(p - 1),
                });
                let state = match spec.map(|s| (s.action, s.dry_run || rules.dry_run)) {
                    Some((Action::Allow, _)) => "allowed",
                    Some((Action::Deny, _)) => "denied",
                    _ if !rate.limited => "ok",
                    Some((_, true)) => "would-drop",
                    _ if penalty::is_blocked(maps, &rate.key, rate.rule, now_ns) => "blocked",
                    _ => "limited",
                };
                sources.push(TopSource {
                    interface: iface.instance.iface.clone(),
                    source: rate.key.to_string(),
                    pps: rate.offered.packets,
                    bps: rate.offered.bytes * 8,
                    dropped: rate.dropped_total.packets,
                    rule: spec.map_or_else(|| "-".to_string(), |s| s.name.clone()),
                    limit_pps: spec.and_then(|s| s.limits.pps),
                    state: state.to_string(),
                });
            }
        }
        sources.sort_by_key(|s| std::cmp::Reverse(s.pps));
        sources.truncate(limit);
        sources
    }

    /// Lifts the penalty of every source inside `cidr` on every interface,
    /// then pushes the rules again (the same rules: their penalty tags stay)
    /// so that every CPU drops what it concluded from the penalty.
    fn unblock(&mut self, cidr: &IpNet) -> Result<String, String> {
        let now_ns = kernel::now().as_nanos() as u64;
        let mut lifted = 0;
        let mut cut_short = Vec::new();
        let mut failed = Vec::new();
        for iface in &mut self.ifaces {
            match penalty::lift(&mut iface.instance.program.maps, cidr, now_ns) {
                Ok(done) => {
                    lifted += done.lifted;
                    if !done.complete {
                        cut_short.push(iface.instance.iface.clone());
                    }
                }
                Err(e) => failed.push(format!("{}: {e}", iface.instance.iface)),
            }
        }
        // Push even after a failure: what was lifted must take effect.
        let rules = self.config.rules.clone();
        let generation = self
            .push(&rules)
            .map_err(|e| format!("lifting the penalties failed: {e}"))?;
        info!(%cidr, lifted, generation, "penalties lifted through the control socket");
        let noun = if lifted == 1 { "source" } else { "sources" };
        if !failed.is_empty() {
            return Err(format!(
                "unblocked {lifted} {noun} in {cidr}, but reading the penalties failed on {}",
                failed.join("; ")
            ));
        }
        let mut message =
            format!("unblocked {lifted} {noun} in {cidr}; rule generation {generation}");
        if !cut_short.is_empty() {
            warn!(%cidr, interfaces = ?cut_short, "unblock stopped at its cap of map entries (the maps are churning)");
            message.push_str(&format!(
                "; the walk of the penalties on {} stopped at its cap while the maps churned: run unblock again to reach the rest",
                cut_short.join(", ")
            ));
        }
        Ok(message)
    }

    /// Global dry-run on or off, on every interface; with `save` written to
    /// the file too. Enforce with `guards` starts a guard period of
    /// `guard_for`; any mode change ends the running one. Bad guards are
    /// refused with nothing changed.
    fn set_mode(
        &mut self,
        dry_run: bool,
        save: bool,
        guards: &[String],
        guard_for: Option<Duration>,
    ) -> Result<String, String> {
        let parsed = guard::parse_all(guards).map_err(|e| e.to_string())?;
        let period = guard::check_plan(dry_run, &parsed, guard_for).map_err(|e| e.to_string())?;
        let mut rules = self.config.rules.clone();
        rules.dry_run = dry_run;
        let generation = self
            .push(&rules)
            .map_err(|e| format!("mode change failed: {e}"))?;
        self.config.rules = rules;
        // The file form mirrors the mode, so that `--save` (now or with a
        // later edit) writes what is in force: enforce with the guards as
        // given (none: none); dry-run keeps the guards, which wait in the
        // file as after a rollback.
        let limits = &mut self.config.file.limits;
        limits.dry_run = dry_run;
        if !dry_run {
            limits.guards = parsed.iter().map(ToString::to_string).collect();
            limits.guard_for = period.filter(|_| guard_for.is_some());
        }
        let mode = if dry_run { "dry-run" } else { "enforce" };
        info!(mode, "mode changed through the control socket");
        let mut done = format!("mode {mode}; rule generation {generation}");
        let guarded = period.map(|period| {
            format!(
                "; guarded for {} by {}",
                humantime::format_duration(period),
                limits.guards.join(", ")
            )
        });
        self.start_guard(period.map(|p| (parsed, p)), save);
        if let (Some(guarded), Some(run)) = (guarded, &self.guard) {
            done.push_str(&format!(
                "{guarded}, judging {} known sources",
                run.known_sources()
            ));
        }
        if save {
            return self.save(&done);
        }
        Ok(done)
    }

    /// Applies one rule edit: validated as a whole file would be, pushed to
    /// every interface, and with `save` written to the configuration file.
    /// A rejected edit changes nothing. The edited rule's guard period
    /// ends, and the edit starts the one its `guards` ask for.
    fn edit_rules(&mut self, edit: RuleEdit, save: bool) -> Result<String, String> {
        let edited = match &edit {
            RuleEdit::Remove { .. } => None,
            RuleEdit::Add { rule } | RuleEdit::Set { rule } | RuleEdit::Default { rule } => {
                Some(rule.clone())
            }
        };
        let mut done = self.apply_edit(edit)?;
        self.end_gone_rule_guards();
        match edited {
            None => {}
            Some(rule) => {
                if let Some(position) = self.position(&rule) {
                    let section = match position {
                        0 => self.config.file.default.clone(),
                        p => self.config.file.rules[p - 1].clone(),
                    };
                    if let Some(guarded) = self.start_rule_guard(position, section, save) {
                        done.push_str(&format!("; {guarded}"));
                    }
                }
            }
        }
        if save {
            return self.save(&done);
        }
        Ok(done)
    }

    /// The kernel part of a rule edit (no guards, no saving): validated,
    /// pushed, made the configuration in force; what changed, with the
    /// generation.
    pub(super) fn apply_edit(&mut self, edit: RuleEdit) -> Result<String, String> {
        let (file, fresh, what) = edit::apply_rule_edit(&self.config.file, edit)?;
        let generation = self.push_edited(file, fresh)?;
        info!(change = %what, generation, "rules changed through the control socket");
        Ok(format!("{what}; rule generation {generation}"))
    }

    /// Checks the rules of an edited file form (`fresh`, validated from
    /// `file`) as start-up would, pushes them as one generation and makes
    /// them the configuration in force: the generation pushed.
    pub(super) fn push_edited(
        &mut self,
        file: config::FileConfig,
        mut fresh: config::Config,
    ) -> Result<u32, String> {
        super::startup::apply_overrides(&mut fresh, &self.options);
        config::check_frame_sizes(&fresh.rules, &fresh.daemon.interfaces)
            .map_err(|e| format!("rejected: {e}"))?;
        // The file may have gained a [cluster] since the daemon started
        // (reloaded, not yet restarted): the one in force decides.
        config::check_cluster_in_force(&fresh.rules, self.config.cluster.as_ref())
            .map_err(|e| format!("rejected: {e}"))?;
        let generation = self
            .push(&fresh.rules)
            .map_err(|e| format!("pushing the rules failed: {e}"))?;
        self.config.rules = fresh.rules;
        self.config.file = file;
        Ok(generation)
    }

    /// Writes the configuration in force to the file the daemon was started
    /// with (see [`edit::save`]); `done` says what was changed live.
    fn save(&mut self, done: &str) -> Result<String, String> {
        edit::save(self.options.config.as_deref(), &mut self.config, done)
    }
}

/// Every XDP program on `iface`, in the order they run, and the libxdp
/// dispatcher that runs them, if any.
fn xdp_programs(iface: &str) -> (Vec<crate::proto::XdpProgram>, Option<u32>) {
    use crate::{kernel::dispatcher::Programs, proto::XdpProgram};
    let Ok(ifindex) = nix::net::if_::if_nametoindex(iface) else {
        return (Vec::new(), None);
    };
    match crate::kernel::dispatcher::programs(ifindex) {
        Ok(Programs::Single { id, name }) => (
            vec![XdpProgram {
                id,
                name,
                priority: None,
            }],
            None,
        ),
        Ok(Programs::Dispatcher { id, components }) => (
            components
                .into_iter()
                .map(|c| XdpProgram {
                    id: c.id,
                    name: c.name,
                    priority: Some(c.priority),
                })
                .collect(),
            Some(id),
        ),
        Ok(Programs::None) | Err(_) => (Vec::new(), None),
    }
}
