//! `xdp-limiter run`: protect interfaces until told to stop.
//!
//! Start-up loads (or adopts) the program per interface and pushes the
//! rules; then one loop aggregates on a fixed tick, reloads the
//! configuration on SIGHUP, and stops on SIGINT/SIGTERM, detaching unless
//! asked to keep protection in place.

pub mod aggregate;
pub mod config;
pub mod events;
pub mod load;
pub mod metrics;

use std::{collections::BTreeSet, net::SocketAddr, path::PathBuf, time::Instant};

use anyhow::Context as _;
use limiter_common::{rules::MAX_RULES, SourceKey};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use self::{
    config::{AttachMode, Config},
    load::Instance,
    metrics::Metrics,
};
use crate::push;

/// Options of `xdp-limiter run` that override the file.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub config: Option<PathBuf>,
    pub interfaces: Vec<String>,
    pub mode: Option<AttachMode>,
    pub keep_attached: bool,
    pub metrics_addr: Option<SocketAddr>,
    pub pin_dir: Option<PathBuf>,
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
}

/// Human names of the rule indices of a rule set in a `RULES` half.
fn rule_names(config: &Config, generation: u32) -> Vec<(u32, String)> {
    let base = (generation % 2) * MAX_RULES;
    std::iter::once((base, "default".to_string()))
        .chain((0..config.rules.rules.len()).map(|i| (base + 1 + i as u32, format!("rules[{i}]"))))
        .collect()
}

/// Runs the daemon until SIGINT or SIGTERM.
pub async fn run(options: RunOptions) -> anyhow::Result<()> {
    let mut config = effective_config(&options)?;
    let daemon = config.daemon.clone();

    let mut instances: Vec<Instance> = Vec::new();
    let mut generation = 0;
    for iface in &daemon.interfaces {
        let attached = load::protect(iface, &daemon.pin_dir, daemon.mode, daemon.max_sources)
            .and_then(|mut instance| {
                generation = push::push(&mut instance.ebpf, &config.rules)
                    .map_err(|e| load::AttachError::Load(e.to_string()))?;
                Ok(instance)
            });
        match attached {
            Ok(instance) => {
                info!(iface, mode = instance.mode, generation, "protecting");
                instances.push(instance);
            }
            Err(e) => {
                shutdown(instances, daemon.keep_attached);
                return Err(e).with_context(|| format!("protecting {iface}"));
            }
        }
    }

    let names: events::RuleNames =
        std::sync::Arc::new(std::sync::RwLock::new(rule_names(&config, generation)));
    let mut watchers = Vec::new();
    for instance in &mut instances {
        match instance
            .ebpf
            .take_map(limiter_common::names::EVENTS)
            .map(aya::maps::RingBuf::try_from)
        {
            Some(Ok(ring)) => {
                watchers.push(events::watch(instance.iface.clone(), ring, names.clone()))
            }
            _ => {
                warn!(iface = %instance.iface, "no event ring buffer; limit events are not logged")
            }
        }
    }

    let mut metrics = Metrics::new();
    let server = match metrics::serve(daemon.metrics_addr, metrics.registry.clone()).await {
        Ok(server) => server,
        Err(e) => {
            shutdown(instances, daemon.keep_attached);
            return Err(e);
        }
    };
    info!(addr = %daemon.metrics_addr, "serving metrics on /metrics");

    let mut hangup = signal(SignalKind::hangup())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut tick = tokio::time::interval(daemon.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut limited: Vec<BTreeSet<SourceKey>> = vec![BTreeSet::new(); instances.len()];

    loop {
        tokio::select! {
            _ = tick.tick() => {
                let started = Instant::now();
                let names = rule_names(&config, generation);
                for (instance, limited) in instances.iter().zip(limited.iter_mut()) {
                    aggregate_one(instance, &mut metrics, &names, daemon.max_sources, daemon.top_k, limited);
                }
                metrics.aggregation.observe(started.elapsed().as_secs_f64());
            }
            _ = hangup.recv() => {
                if let Some(g) = reload(&options, &mut config, &mut instances) {
                    generation = g;
                    if let Ok(mut names) = names.write() {
                        *names = rule_names(&config, generation);
                    }
                }
            }
            _ = interrupt.recv() => { info!("SIGINT: stopping"); break; }
            _ = terminate.recv() => { info!("SIGTERM: stopping"); break; }
        }
    }
    server.abort();
    for watcher in watchers {
        watcher.abort();
    }
    shutdown(instances, daemon.keep_attached);
    Ok(())
}

fn aggregate_one(
    instance: &Instance,
    metrics: &mut Metrics,
    names: &[(u32, String)],
    capacity: u32,
    top_k: usize,
    limited: &mut BTreeSet<SourceKey>,
) {
    let snapshot = match aggregate::pass(&instance.ebpf, top_k) {
        Ok(snapshot) => snapshot,
        Err(e) => {
            error!(iface = %instance.iface, error = %e, "aggregation failed");
            return;
        }
    };
    // "limited" comes from the kernel's events (events.rs); "released" is
    // seen here: a source no CPU is refusing any more.
    for key in limited.difference(&snapshot.limited) {
        info!(iface = %instance.iface, source = %crate::display::source(key), "source released");
    }
    limited.clone_from(&snapshot.limited);
    let stats = program_stats(instance);
    metrics.record(&instance.iface, &snapshot, capacity, names, stats);
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
fn reload(options: &RunOptions, config: &mut Config, instances: &mut [Instance]) -> Option<u32> {
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
    if fresh.daemon != config.daemon {
        warn!("SIGHUP: [daemon] settings changed; they take effect on restart");
    }
    let mut generation = None;
    for instance in instances.iter_mut() {
        match push::push(&mut instance.ebpf, &fresh.rules) {
            Ok(g) => generation = Some(g),
            Err(e) => {
                error!(iface = %instance.iface, error = %e, "SIGHUP: pushing rules failed");
                return None;
            }
        }
    }
    info!(
        rules = fresh.rules.rules.len() + 1,
        "SIGHUP: configuration reloaded"
    );
    config.rules = fresh.rules;
    generation
}

fn shutdown(instances: Vec<Instance>, keep_attached: bool) {
    for instance in instances {
        let iface = instance.iface.clone();
        if keep_attached {
            instance.keep();
        } else if let Err(e) = instance.detach() {
            error!(iface, error = %e, "detaching failed");
        } else {
            info!(iface, "detached");
        }
    }
}
