//! `xdp-limiter run`: protect interfaces until told to stop.
//!
//! Start-up loads (or adopts) the program per interface and pushes the
//! rules; then one loop aggregates on a fixed tick, reloads the
//! configuration on SIGHUP, and stops on SIGINT/SIGTERM, detaching unless
//! asked to keep protection in place.

pub mod aggregate;
pub mod config;
pub mod conns;
pub mod control;
pub mod events;
pub mod fault;
pub mod load;
pub mod lock;
pub mod metrics;

use std::{collections::BTreeSet, net::SocketAddr, path::PathBuf, time::Instant};

use anyhow::Context as _;
use limiter_common::{
    rules::{rules_base, MAX_RULES},
    Outcome, Rule, SourceKey,
};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use self::{
    config::{AttachMode, Config},
    load::{Instance, LinkCheck},
    metrics::Metrics,
};
use crate::{
    proto::{InterfaceStatus, Reply, Request, ResponseLine, RuleEdit, Status, TopSource},
    push,
    rules::RuleSet,
};

/// Options of `xdp-limiter run` that override the file.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub config: Option<PathBuf>,
    pub interfaces: Vec<String>,
    pub mode: Option<AttachMode>,
    pub keep_attached: bool,
    pub metrics_addr: Option<SocketAddr>,
    pub pin_dir: Option<PathBuf>,
    pub control_socket: Option<PathBuf>,
}

/// The configuration `options` ask for: the file (or the built-in one)
/// with the command line's overrides.
pub fn effective_config(options: &RunOptions) -> anyhow::Result<Config> {
    let mut config = match &options.config {
        Some(path) => Config::load(path)?,
        None => Config::builtin(),
    };
    apply_overrides(&mut config, options);
    if config.daemon.interfaces.is_empty() {
        anyhow::bail!("no interface to protect: pass --iface or set daemon.interfaces");
    }
    config::check_frame_sizes(&config.rules, &config.daemon.interfaces)?;
    Ok(config)
}

fn apply_overrides(config: &mut Config, options: &RunOptions) {
    for iface in &options.interfaces {
        if !config.daemon.interfaces.contains(iface) {
            config.daemon.interfaces.push(iface.clone());
        }
    }
    if let Some(mode) = options.mode {
        config.daemon.mode = mode;
    }
    if options.keep_attached {
        config.daemon.keep_attached = true;
    }
    if let Some(addr) = options.metrics_addr {
        config.daemon.metrics_addr = addr;
    }
    if let Some(dir) = &options.pin_dir {
        config.daemon.pin_dir = dir.clone();
    }
    if let Some(socket) = &options.control_socket {
        config.daemon.control_socket = socket.clone();
    }
}

/// Human names of the rule indices of a rule set in generation
/// `generation`'s half of `RULES`.
fn rule_names(rules: &RuleSet, generation: u32) -> Vec<(u32, String)> {
    let base = rules_base(generation);
    (0..=rules.rules.len())
        .map(|i| (base + i as u32, crate::rules::rule_name(i)))
        .collect()
}

/// The protected interfaces' program instances, the rule generation they
/// all run, and the names of its rule indices. Every rule change goes
/// through [`Interfaces::push`].
struct Interfaces {
    list: Vec<Instance>,
    generation: u32,
    /// `RULES` index -> rule name, for the live generation and the one
    /// before it (each in its own half), shared with the event watchers:
    /// counters and events of either resolve to a name.
    names: events::RuleNames,
}

impl Interfaces {
    /// Lifts the penalty of every source inside `cidr` on every interface,
    /// then pushes `rules` again (the same rules: their penalty tags stay)
    /// so that every CPU drops what it concluded from the penalty.
    fn unblock(
        &mut self,
        cidr: &ipnet::IpNet,
        rules: &RuleSet,
        metrics: &mut Metrics,
    ) -> Result<String, String> {
        let now = aggregate::kernel_now().as_nanos() as u64;
        let mut lifted = 0usize;
        for instance in &mut self.list {
            let map = instance
                .ebpf
                .map_mut(limiter_common::names::WINDOWS)
                .ok_or("the WINDOWS map is missing")?;
            let mut windows =
                aya::maps::HashMap::<_, SourceKey, limiter_common::WindowState>::try_from(map)
                    .map_err(|e| e.to_string())?;
            let keys: Vec<SourceKey> = windows
                .keys()
                .filter_map(Result::ok)
                .filter(|key| cidr.contains(&key.ip()) && key.prefix_len >= cidr.prefix_len())
                .collect();
            for key in keys {
                let Ok(mut window) = windows.get(&key, 0) else {
                    continue;
                };
                if window.blocked_until_ns <= now {
                    continue;
                }
                window.blocked_until_ns = 0;
                window.blocked_tag = 0;
                // BPF_EXIST: only while the source still has its window.
                if windows.insert(key, window, 2).is_ok() {
                    lifted += 1;
                }
            }
        }
        let generation = self
            .push(rules, metrics)
            .map_err(|e| format!("lifting the penalties failed: {e}"))?;
        info!(%cidr, lifted, generation, "penalties lifted through the control socket");
        let noun = if lifted == 1 { "source" } else { "sources" };
        Ok(format!(
            "unblocked {lifted} {noun} in {cidr}; rule generation {generation}"
        ))
    }

    fn new(list: Vec<Instance>) -> Self {
        Self {
            list,
            generation: 0,
            names: Default::default(),
        }
    }

    fn names(&self) -> Vec<(u32, String)> {
        self.names.read().map(|n| n.clone()).unwrap_or_default()
    }

    /// Pushes `rules` to every interface as one generation, or to none.
    /// The drops counted so far are first recorded under the names they
    /// were counted under: the push zeroes the half it writes.
    fn push(&mut self, rules: &RuleSet, metrics: &mut Metrics) -> Result<u32, push::PushError> {
        let names = self.names();
        for instance in &self.list {
            if let Ok(drops) = aggregate::rule_drops(&instance.ebpf) {
                metrics.record_rule_drops(&instance.iface, &drops, &names);
            }
        }
        let mut programs: Vec<&mut aya::Ebpf> = self.list.iter_mut().map(|i| &mut i.ebpf).collect();
        let generation = push::push_all(&mut programs, rules)?;
        metrics.rules_pushed(rules_base(generation));
        self.generation = generation;
        if let Ok(mut shared) = self.names.write() {
            let base = rules_base(generation);
            shared.retain(|(index, _)| !(base..base + MAX_RULES).contains(index));
            shared.extend(rule_names(rules, generation));
        }
        Ok(generation)
    }
}

/// Runs the daemon until SIGINT or SIGTERM.
pub async fn run(options: RunOptions) -> anyhow::Result<()> {
    // Signals first: a SIGTERM during start-up must still mean a clean stop.
    let mut hangup = signal(SignalKind::hangup())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut config = effective_config(&options)?;
    let daemon = config.daemon.clone();
    // Before anything is touched: one daemon per pin directory and
    // interface, and every address and socket bound, so a start that
    // cannot run fails here and leaves whatever protects the interfaces
    // (another daemon, or the pins a killed one left) alone.
    if !nix::unistd::geteuid().is_root() {
        return Err(load::AttachError::NotRoot.into());
    }
    raise_open_files_limit();
    let _locks = lock::acquire(&daemon.pin_dir, &daemon.interfaces)?;
    let listener = metrics::bind(daemon.metrics_addr).await?;
    let (control_tx, mut control_rx) = tokio::sync::mpsc::channel::<control::Command>(16);
    let control_server = control::serve(&daemon.control_socket, control_tx).await?;

    let mut metrics = Metrics::new();
    let mut interfaces = match protect_all(&daemon, &config, &mut metrics) {
        Ok(started) => started,
        Err(e) => {
            drop(control_rx);
            control_server.stop().await;
            control::remove(&daemon.control_socket);
            return Err(e);
        }
    };
    for instance in &interfaces.list {
        info!(iface = %instance.iface, mode = instance.mode, generation = interfaces.generation, "protecting");
    }

    let mut watchers = Vec::new();
    for instance in &mut interfaces.list {
        match instance
            .ebpf
            .take_map(limiter_common::names::EVENTS)
            .map(aya::maps::RingBuf::try_from)
        {
            Some(Ok(ring)) => watchers.push(events::watch(
                instance.iface.clone(),
                ring,
                interfaces.names.clone(),
            )),
            _ => {
                warn!(iface = %instance.iface, "no event ring buffer; limit events are not logged")
            }
        }
    }

    let server = metrics::serve(listener, metrics.registry.clone());
    info!(addr = %daemon.metrics_addr, "serving metrics on /metrics");
    info!(socket = %daemon.control_socket.display(), "control socket ready");

    let mut tick = tokio::time::interval(daemon.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut limited: Vec<BTreeSet<SourceKey>> = vec![BTreeSet::new(); interfaces.list.len()];
    let mut observed: Vec<Observed> = interfaces
        .list
        .iter()
        .map(|_| Observed::default())
        .collect();
    let mut sweeps: Vec<aggregate::Sweep> = interfaces
        .list
        .iter()
        .map(|_| aggregate::Sweep::default())
        .collect();
    // Answered once the interfaces really are detached.
    let mut detach_reply = None;

    loop {
        tokio::select! {
            _ = tick.tick() => {
                let started = Instant::now();
                for instance in interfaces.list.iter_mut() {
                    check_link(instance, daemon.mode);
                }
                let names = interfaces.names();
                for (((instance, limited), seen), sweep) in interfaces.list.iter().zip(limited.iter_mut()).zip(observed.iter_mut()).zip(sweeps.iter_mut()) {
                    if let Some(snapshot) = aggregate_one(instance, &mut metrics, &names, &daemon, limited, sweep) {
                        seen.update(snapshot);
                    }
                }
                metrics.aggregation.observe(started.elapsed().as_secs_f64());
            }
            _ = hangup.recv() => {
                reload(&options, &mut config, &mut interfaces, &mut metrics);
            }
            Some(command) = control_rx.recv() => {
                let response = match command.request {
                    Request::Status => ResponseLine::ok(Reply::Status(status(&config, &interfaces, &observed, daemon.max_sources))),
                    Request::Top { limit } => ResponseLine::ok(Reply::Top { sources: top(&config, &interfaces, &observed, limit) }),
                    Request::Reload => match reload(&options, &mut config, &mut interfaces, &mut metrics) {
                        Some(g) => ResponseLine::ok(Reply::Done { message: format!("reloaded; rule generation {g}") }),
                        None => ResponseLine::error("reload failed; the running configuration stays in force (see the daemon's log)"),
                    },
                    Request::Detach => {
                        info!("detach requested through the control socket: stopping");
                        detach_reply = Some(command.reply);
                        break;
                    }
                    Request::RuleList => ResponseLine::ok(Reply::Rules {
                        default: config.file.default.clone(),
                        rules: config.file.rules.clone(),
                    }),
                    Request::Unblock { cidr } => match interfaces.unblock(&cidr, &config.rules, &mut metrics) {
                        Ok(message) => ResponseLine::ok(Reply::Done { message }),
                        Err(message) => ResponseLine::error(message),
                    },
                    Request::Rules { edit, save } => match edit_rules(&options, &mut config, &mut interfaces, &mut metrics, edit, save) {
                        Ok(message) => ResponseLine::ok(Reply::Done { message }),
                        Err(message) => ResponseLine::error(message),
                    },
                    Request::Mode { dry_run, save } => {
                        let mut rules = config.rules.clone();
                        rules.dry_run = dry_run;
                        match interfaces.push(&rules, &mut metrics) {
                            Ok(g) => {
                                config.rules = rules;
                                config.file.limits.dry_run = dry_run;
                                let mode = if dry_run { "dry-run" } else { "enforce" };
                                info!(mode, "mode changed through the control socket");
                                let done = format!("mode {mode}; rule generation {g}");
                                match save.then(|| save_file(&options, &mut config, &done)) {
                                    Some(Err(message)) => ResponseLine::error(message),
                                    Some(Ok(saved)) => ResponseLine::ok(Reply::Done { message: saved }),
                                    None => ResponseLine::ok(Reply::Done { message: done }),
                                }
                            }
                            Err(e) => ResponseLine::error(format!("mode change failed: {e}")),
                        }
                    }
                };
                let _ = command.reply.send(response);
            }
            _ = interrupt.recv() => { info!("SIGINT: stopping"); break; }
            _ = terminate.recv() => { info!("SIGTERM: stopping"); break; }
        }
    }
    server.abort();
    control::remove(&daemon.control_socket);
    for watcher in watchers {
        watcher.abort();
    }
    let failed = shutdown(
        interfaces.list,
        daemon.keep_attached && detach_reply.is_none(),
    );
    if let Some(reply) = detach_reply {
        let _ = reply.send(if failed.is_empty() {
            ResponseLine::ok(Reply::Done {
                message: format!(
                    "detached {} and stopped the daemon",
                    daemon.interfaces.join(", ")
                ),
            })
        } else {
            ResponseLine::error(format!(
                "the daemon stopped, but detaching failed: {}",
                failed.join("; ")
            ))
        });
    }
    // Requests still queued get "shutting down"; answers in flight are written.
    drop(control_rx);
    control_server.stop().await;
    Ok(())
}

/// Raises the soft limit of open files to the hard one (systemd starts
/// services at 1024): connections are capped anyway, but the maps, links,
/// sockets and connections of several interfaces need room.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                warn!(soft, hard, error = %e, "cannot raise the limit of open files");
            }
        }
        _ => {}
    }
}

/// Protects every interface: loads each instance (adopting its pinned
/// maps), pushes the rules to all of them as one generation, then attaches
/// each (swapping onto a pinned link, or afresh), so nothing is attached
/// before it enforces the rules. On failure, what this start attached
/// afresh is detached again and what it adopted is left as it was found.
fn protect_all(
    daemon: &config::DaemonSection,
    config: &Config,
    metrics: &mut Metrics,
) -> anyhow::Result<Interfaces> {
    let mut instances: Vec<Instance> = Vec::new();
    for iface in &daemon.interfaces {
        match load::load(iface, &daemon.pin_dir, daemon.max_sources) {
            Ok(instance) => instances.push(instance),
            Err(e) => {
                abandon(instances);
                return Err(e).with_context(|| format!("protecting {iface}"));
            }
        }
    }
    let mut interfaces = Interfaces::new(instances);
    fault::stop_at(fault::Step::Push);
    if let Err(e) = interfaces.push(&config.rules, metrics) {
        abandon(interfaces.list);
        return Err(e).context("pushing the rules");
    }
    for i in 0..interfaces.list.len() {
        if let Err(e) = interfaces.list[i].attach(daemon.mode) {
            let iface = interfaces.list[i].iface.clone();
            abandon(interfaces.list);
            return Err(e).with_context(|| format!("protecting {iface}"));
        }
    }
    Ok(interfaces)
}

/// Undoes a failed start: detaches what it attached afresh, leaves what it
/// adopted in place (it was protecting before this process came).
fn abandon(instances: Vec<Instance>) {
    for instance in instances {
        if instance.adopted() {
            let iface = instance.iface.clone();
            instance.keep();
            warn!(
                iface,
                "start-up failed: the adopted protection stays in place"
            );
        } else if let Err(e) = instance.detach() {
            error!(iface = %e, "start-up failed, and detaching failed too");
        }
    }
}

/// Released sources logged by name per interface and tick; the rest are
/// counted in one line.
const RELEASED_LOGGED_PER_TICK: usize = 16;

fn aggregate_one(
    instance: &Instance,
    metrics: &mut Metrics,
    names: &[(u32, String)],
    daemon: &config::DaemonSection,
    limited: &mut BTreeSet<SourceKey>,
    sweep: &mut aggregate::Sweep,
) -> Option<aggregate::Snapshot> {
    let capacity = daemon.max_sources;
    let snapshot =
        match aggregate::pass(&instance.ebpf, daemon.top_k, sweep, daemon.sources_per_tick) {
            Ok(snapshot) => snapshot,
            Err(e) => {
                error!(iface = %instance.iface, error = %e, "aggregation failed");
                return None;
            }
        };
    // "limited" comes from the kernel's events (events.rs); "released" is
    // seen here: a source no CPU is refusing any more. A few per tick by
    // name, the rest as a count: a spoofed flood ending must not flood
    // the log.
    let released: Vec<&SourceKey> = limited.difference(&snapshot.limited).collect();
    for key in released.iter().take(RELEASED_LOGGED_PER_TICK) {
        info!(iface = %instance.iface, source = %key, "source released");
    }
    if released.len() > RELEASED_LOGGED_PER_TICK {
        info!(
            iface = %instance.iface,
            more = released.len() - RELEASED_LOGGED_PER_TICK,
            "more sources released (not listed)"
        );
    }
    limited.clone_from(&snapshot.limited);
    let stats = program_stats(instance);
    metrics.record(&instance.iface, &snapshot, capacity, names, stats);
    metrics.record_link(
        &instance.iface,
        instance.reattachments,
        matches!(instance.link, LinkCheck::Attached | LinkCheck::Reattached),
    );
    Some(snapshot)
}

/// Keeps an instance attached to the interface of its name (re-attaching
/// to a re-created one), logging each change of state once.
fn check_link(instance: &mut Instance, mode: AttachMode) {
    let before = instance.link;
    let iface = instance.iface.clone();
    match instance.check_link(mode) {
        Ok(LinkCheck::Reattached) => {
            info!(
                iface,
                mode = instance.mode,
                "re-attached to the re-created interface"
            )
        }
        Ok(LinkCheck::InterfaceGone) if before != LinkCheck::InterfaceGone => {
            warn!(
                iface,
                "the interface vanished; protection resumes when it is back"
            )
        }
        Ok(LinkCheck::Unpinned) if before != LinkCheck::Unpinned => warn!(
            iface,
            "the pinned link was removed by someone else (xdp-limiter detach?); not re-attaching"
        ),
        Ok(_) => {}
        Err(e) => {
            // Retried every tick; said once until the state changes.
            if before != LinkCheck::InterfaceGone {
                error!(iface, error = %e, "re-attaching to the re-created interface failed; retrying every tick");
            }
            instance.link = LinkCheck::InterfaceGone;
        }
    }
}

/// What the last aggregation passes saw of one interface.
#[derive(Default)]
struct Observed {
    last: Option<(Instant, aggregate::Snapshot)>,
    passed_pps: f64,
    dropped_pps: f64,
}

impl Observed {
    fn update(&mut self, snapshot: aggregate::Snapshot) {
        let now = Instant::now();
        let sum = |s: &aggregate::Snapshot, outcomes: &[Outcome]| -> u64 {
            outcomes
                .iter()
                .map(|o| s.outcomes[*o as usize].packets)
                .sum()
        };
        let passed = [Outcome::Passed, Outcome::Allowed, Outcome::DryRunWouldDrop];
        let dropped = [Outcome::DroppedLimit, Outcome::DroppedDeny];
        if let Some((then, previous)) = &self.last {
            let seconds = now.duration_since(*then).as_secs_f64().max(1e-3);
            let rate = |outcomes: &[Outcome]| {
                sum(&snapshot, outcomes).saturating_sub(sum(previous, outcomes)) as f64 / seconds
            };
            self.passed_pps = rate(&passed);
            self.dropped_pps = rate(&dropped);
        }
        self.last = Some((now, snapshot));
    }
}

fn status(
    config: &Config,
    interfaces: &Interfaces,
    observed: &[Observed],
    capacity: u32,
) -> Status {
    Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        generation: interfaces.generation,
        dry_run: config.rules.dry_run,
        rules: config.rules.rules.len() + 1,
        interfaces: interfaces
            .list
            .iter()
            .zip(observed)
            .map(|(instance, seen)| {
                let snapshot = seen.last.as_ref().map(|(_, s)| s);
                InterfaceStatus {
                    name: instance.iface.clone(),
                    mode: instance.mode.to_string(),
                    program_id: instance
                        .ebpf
                        .program(limiter_common::names::PROGRAM)
                        .and_then(|p| p.info().ok())
                        .map_or(0, |info| info.id()),
                    tracked_sources: snapshot.map_or(0, |s| s.tracked_sources),
                    capacity,
                    limited_sources: snapshot.map_or(0, |s| s.limited.len() as u64),
                    passed_pps: seen.passed_pps,
                    dropped_pps: seen.dropped_pps,
                }
            })
            .collect(),
    }
}

fn top(
    config: &Config,
    interfaces: &Interfaces,
    observed: &[Observed],
    limit: usize,
) -> Vec<TopSource> {
    let names = rule_names(&config.rules, interfaces.generation);
    let now_ns = aggregate::kernel_now().as_nanos() as u64;
    let mut sources: Vec<TopSource> = Vec::new();
    for (instance, seen) in interfaces.list.iter().zip(observed) {
        let Some((_, snapshot)) = &seen.last else {
            continue;
        };
        let windows = instance
            .ebpf
            .map(limiter_common::names::WINDOWS)
            .and_then(|m| {
                aya::maps::HashMap::<_, SourceKey, limiter_common::WindowState>::try_from(m).ok()
            });
        let kernel_rules = instance
            .ebpf
            .map(limiter_common::names::RULES)
            .and_then(|m| aya::maps::Array::<_, Rule>::try_from(m).ok());
        for rate in &snapshot.top {
            let position = names.iter().position(|(index, _)| *index == rate.rule);
            let spec = position.and_then(|p| {
                if p == 0 {
                    Some(&config.rules.default)
                } else {
                    config.rules.rules.get(p - 1)
                }
            });
            // A penalty holds while the rule in force carries its tag; the
            // window is keyed by the rule's budget.
            let rule = kernel_rules
                .as_ref()
                .and_then(|r| r.get(&rate.rule, 0).ok());
            let blocked = rule.is_some_and(|rule| {
                windows
                    .as_ref()
                    .and_then(|w| w.get(&rate.key.with_class(rule.budget), 0).ok())
                    .is_some_and(|w| w.blocked_at(now_ns, rule.block_tag))
            });
            let state = match spec.map(|s| (s.action, s.dry_run || config.rules.dry_run)) {
                Some((limiter_common::Action::Allow, _)) => "allowed",
                Some((limiter_common::Action::Deny, _)) => "denied",
                _ if !rate.limited => "ok",
                Some((_, true)) => "would-drop",
                _ if blocked => "blocked",
                _ => "limited",
            };
            sources.push(TopSource {
                interface: instance.iface.clone(),
                source: rate.key.to_string(),
                pps: rate.offered.packets,
                bps: rate.offered.bytes * 8,
                dropped: rate.dropped_total.packets,
                rule: position.map_or_else(|| "-".to_string(), |p| names[p].1.clone()),
                limit_pps: spec.and_then(|s| s.limits.pps),
                state: state.to_string(),
            });
        }
    }
    sources.sort_by_key(|s| std::cmp::Reverse(s.pps));
    sources.truncate(limit);
    sources
}

/// Applies one rule edit: validated as a whole file would be, pushed to
/// every interface, and with `save` written to the configuration file. A
/// rejected edit changes nothing.
fn edit_rules(
    options: &RunOptions,
    config: &mut Config,
    interfaces: &mut Interfaces,
    metrics: &mut Metrics,
    edit: RuleEdit,
    save: bool,
) -> Result<String, String> {
    let (file, mut fresh, what) = apply_rule_edit(&config.file, edit)?;
    apply_overrides(&mut fresh, options);
    config::check_frame_sizes(&fresh.rules, &fresh.daemon.interfaces)
        .map_err(|e| format!("rejected: {e}"))?;
    let generation = interfaces
        .push(&fresh.rules, metrics)
        .map_err(|e| format!("pushing the rules failed: {e}"))?;
    config.rules = fresh.rules;
    config.file = file;
    info!(change = %what, generation, "rules changed through the control socket");
    let done = format!("{what}; rule generation {generation}");
    if save {
        return save_file(options, config, &done);
    }
    Ok(done)
}

/// The pure part of a rule edit: `edit` applied to a copy of `file`, the
/// result validated as a whole file would be. Returns the edited file, its
/// validated configuration (before command-line overrides) and what
/// changed, or the answer to give; `file` itself is never touched, so a
/// rejected edit changes nothing. Public so the property tests can drive
/// it without a kernel.
pub fn apply_rule_edit(
    file: &config::FileConfig,
    edit: RuleEdit,
) -> Result<(config::FileConfig, Config, String), String> {
    let mut file = file.clone();
    let describe = |r: &config::RuleSection| {
        r.cidr.map_or_else(
            || "the default rule".to_string(),
            |c| format!("the rule for {c}"),
        )
    };
    if let RuleEdit::Set { rule } | RuleEdit::Remove { rule } = &edit {
        // Only the default rule has no cidr, and these cannot name it: say
        // what is missing rather than that no such rule exists.
        if rule.cidr.is_none() {
            return Err(
                "a rule needs a cidr (the default rule is replaced with `default set`)".into(),
            );
        }
    }
    let what = match edit {
        RuleEdit::Add { rule } => {
            if rule.cidr.is_none() {
                return Err("a rule needs a cidr".into());
            }
            if file.rules.iter().any(|r| r.same_rule(&rule)) {
                return Err(format!(
                    "{} with that match exists; use `rule set`",
                    describe(&rule)
                ));
            }
            let what = format!("added {}", describe(&rule));
            file.rules.push(rule);
            what
        }
        RuleEdit::Set { rule } => {
            let Some(slot) = file.rules.iter_mut().find(|r| r.same_rule(&rule)) else {
                return Err(format!(
                    "{} with that match does not exist; use `rule add`",
                    describe(&rule)
                ));
            };
            let what = format!("replaced {}", describe(&rule));
            *slot = rule;
            what
        }
        RuleEdit::Remove { rule } => {
            let Some(index) = file.rules.iter().position(|r| r.same_rule(&rule)) else {
                return Err(format!(
                    "{} with that match does not exist",
                    describe(&rule)
                ));
            };
            file.rules.remove(index);
            format!("removed {}", describe(&rule))
        }
        RuleEdit::Default { rule } => {
            if rule.cidr.is_some() {
                return Err("the default rule covers every source; it takes no cidr".into());
            }
            file.default = rule;
            "replaced the default rule".to_string()
        }
    };
    let fresh = file
        .clone()
        .validate()
        .map_err(|e| format!("rejected: {e}"))?;
    Ok((file, fresh, what))
}

/// Writes the configuration in force to the file the daemon was started
/// with: to a new file, synced, then renamed over it (and the directory
/// synced), so a crash leaves the old file or the new one, never half of
/// one. A file that changed on disk since the daemon last read or wrote it
/// is not overwritten: that would silently drop an edit not yet reloaded.
fn save_file(options: &RunOptions, config: &mut Config, done: &str) -> Result<String, String> {
    let Some(path) = &options.config else {
        return Err(format!(
            "{done} (live), but not saved: the daemon was started without --config"
        ));
    };
    let on_disk = std::fs::read_to_string(path).ok();
    if on_disk != config.text {
        return Err(format!(
            "{done} (live), but not saved: {} changed on disk since the daemon last read it; \
             `xdp-limiter reload` loads the file (dropping live edits not in it), or edit the file",
            path.display()
        ));
    }
    let text = config.file.to_toml();
    write_durably(path, &text)
        .map_err(|e| format!("{done} (live), but saving {} failed: {e}", path.display()))?;
    config.text = Some(text);
    Ok(format!("{done}; saved to {}", path.display()))
}

/// Replaces `path` with `text` atomically and durably.
fn write_durably(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("toml.new");
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Run time and count of the program, when `kernel.bpf_stats_enabled` is on.
fn program_stats(instance: &Instance) -> Option<(u64, u64)> {
    let program = instance.ebpf.program(limiter_common::names::PROGRAM)?;
    let info = program.info().ok()?;
    let runs = info.run_count();
    (runs > 0).then(|| (info.run_time().as_nanos() as u64, runs))
}

/// Re-reads the configuration file and pushes it; a bad file is rejected
/// with the reason logged and the running configuration stays in force.
fn reload(
    options: &RunOptions,
    config: &mut Config,
    interfaces: &mut Interfaces,
    metrics: &mut Metrics,
) -> Option<u32> {
    let Some(path) = &options.config else {
        warn!("SIGHUP: no configuration file to reload (started without --config)");
        return None;
    };
    let mut fresh = match Config::load(path) {
        Ok(fresh) => fresh,
        Err(e) => {
            error!(error = %e, "SIGHUP: configuration rejected; the running one stays in force");
            return None;
        }
    };
    apply_overrides(&mut fresh, options);
    if let Err(e) = config::check_frame_sizes(&fresh.rules, &fresh.daemon.interfaces) {
        error!(error = %e, "SIGHUP: configuration rejected; the running one stays in force");
        return None;
    }
    if fresh.daemon != config.daemon {
        warn!("SIGHUP: [daemon] settings changed; they take effect on restart");
    }
    let generation = match interfaces.push(&fresh.rules, metrics) {
        Ok(generation) => generation,
        Err(e) => {
            error!(error = %e, "SIGHUP: pushing rules failed");
            return None;
        }
    };
    info!(
        rules = fresh.rules.rules.len() + 1,
        "SIGHUP: configuration reloaded"
    );
    // Later rule edits start from what was reloaded, not from the old file.
    config.rules = fresh.rules;
    config.file = fresh.file;
    config.text = fresh.text;
    Some(generation)
}

/// Leaves or detaches every instance; returns what failed to detach.
fn shutdown(instances: Vec<Instance>, keep_attached: bool) -> Vec<String> {
    let mut failed = Vec::new();
    for instance in instances {
        let iface = instance.iface.clone();
        if keep_attached {
            instance.keep();
        } else if let Err(e) = instance.detach() {
            error!(iface, error = %e, "detaching failed");
            failed.push(format!("{iface}: {e}"));
        } else {
            info!(iface, "detached");
        }
    }
    failed
}
