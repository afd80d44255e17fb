//! `xdp-limiter run`: protect interfaces until told to stop.
//!
//! Start-up (`startup`) refuses a second daemon and binds every address
//! before touching anything, then loads (or adopts) the program per
//! interface, pushes the rules and attaches. Then one loop: aggregate on a
//! fixed tick ([`Daemon::tick`], `aggregate`, `metrics`), reload on SIGHUP,
//! answer control requests ([`Daemon::handle`], `control`, `edit`), and stop
//! on SIGINT/SIGTERM or `detach`, detaching unless asked to keep protection
//! in place.

pub mod aggregate;
mod bans;
mod conns;
mod control;
mod edit;
pub mod events;
mod guarded;
mod handle;
pub mod history;
pub mod known;
mod level_rates;
mod lists;
mod metrics;
mod notify;
mod rule_table;
mod shield;
mod startup;
mod state;
mod suggest;
mod sync;
mod tick;
mod top_levels;

use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

use self::handle::Handled;
pub use self::{
    edit::apply_rule_edit,
    metrics::{PROVEN_ROOM, SHARED_ROOM},
    startup::{effective_config, RunOptions},
    state::Daemon,
    top_levels::NO_LEVELS,
};
use crate::{
    kernel::AttachError,
    lock,
    proto::{Reply, ResponseLine},
};

/// Runs the daemon until SIGINT, SIGTERM or `detach`.
pub async fn run(options: RunOptions) -> anyhow::Result<()> {
    // Signals first: a SIGTERM during start-up must still mean a clean stop.
    let mut hangup = signal(SignalKind::hangup())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let config = effective_config(&options)?;
    let settings = config.daemon.clone();
    // Before anything is touched: one daemon per pin directory and
    // interface, and every address and socket bound, so a start that
    // cannot run fails here and leaves whatever protects the interfaces
    // (another daemon, or the pins a killed one left) alone.
    if !nix::unistd::geteuid().is_root() {
        return Err(AttachError::NotRoot.into());
    }
    startup::raise_open_files_limit();
    let _locks = lock::acquire(&settings.pin_dir, &settings.interfaces)?;
    let listener = metrics::bind(settings.metrics_addr).await?;
    let (control_tx, mut control_rx) = tokio::sync::mpsc::channel::<control::Command>(16);
    let control_server = control::serve(&settings.control_socket, control_tx).await?;

    // Before anything is attached: a node name another live daemon
    // heartbeats under is refused (the two would each claim the whole
    // limit of a source).
    let token = sync::instance_token();
    let protected = match &config.cluster {
        Some(cluster_config) => sync::claim_node_name(cluster_config, &token).await,
        None => Ok(()),
    }
    .and_then(|()| startup::protect_all(options, config));
    let mut daemon = match protected {
        Ok(daemon) => daemon,
        Err(e) => {
            drop(control_rx);
            control_server.stop().await;
            control::remove(&settings.control_socket);
            return Err(e);
        }
    };
    daemon.start_configured_guards();

    // The cluster sync, with [cluster]: cluster-hot events reach it from
    // every interface's watcher.
    let (cluster_tx, cluster_rx) = tokio::sync::mpsc::channel(sync::EVENT_QUEUE);
    let cluster_task = start_cluster(&mut daemon, token, cluster_rx);
    let cluster_events = cluster_task.as_ref().map(|_| cluster_tx);
    // Every task stopped with the daemon: the sync, the watchers, the
    // metrics endpoint.
    let mut tasks = start_watchers(&mut daemon, cluster_events);
    tasks.extend(cluster_task);
    // The CrowdSec bouncer, with [crowdsec]: its answers reach the loop.
    let (crowdsec_tx, mut crowdsec_rx) = tokio::sync::mpsc::channel(4);
    if let Some(crowdsec) = daemon.config.crowdsec.clone() {
        info!(api = %crowdsec.api_url, "following the CrowdSec local API's decisions");
        let polls = daemon.metrics.lists.crowdsec_polls.clone();
        tasks.push(crate::crowdsec::start(crowdsec, crowdsec_tx.clone(), polls));
    }
    tasks.push(metrics::serve(listener, daemon.metrics.registry.clone()));
    info!(addr = %settings.metrics_addr, "serving metrics on /metrics");
    info!(socket = %settings.control_socket.display(), "control socket ready");

    let mut tick = tokio::time::interval(settings.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Answered once the interfaces really are detached.
    let mut detach_reply = None;
    notify::ready_protecting(&settings.interfaces, daemon.generation);
    let mut watchdog = notify::Watchdog::from_env();

    loop {
        tokio::select! {
            _ = tick.tick() => {
                daemon.tick();
                if let Some(watchdog) = watchdog.as_mut() {
                    watchdog.tick();
                }
            }
            _ = hangup.recv() => {
                daemon.reload();
            }
            Some(batch) = crowdsec_rx.recv() => daemon.apply_crowdsec(batch),
            Some(command) = control_rx.recv() => match daemon.handle(command.request) {
                Handled::Answer(response) => {
                    let _ = command.reply.send(response);
                }
                Handled::Detach => {
                    info!("detach requested through the control socket: stopping");
                    detach_reply = Some(command.reply);
                    break;
                }
            },
            _ = interrupt.recv() => { info!("SIGINT: stopping"); break; }
            _ = terminate.recv() => { info!("SIGTERM: stopping"); break; }
        }
    }
    notify::stopping();
    drop(crowdsec_tx);
    control::remove(&settings.control_socket);
    tasks.iter().for_each(tokio::task::JoinHandle::abort);
    let failed = startup::shutdown(
        daemon.into_instances(),
        settings.keep_attached && detach_reply.is_none(),
    );
    if let Some(reply) = detach_reply {
        let _ = reply.send(detached(&settings.interfaces, &failed));
    }
    // Requests still queued get "shutting down"; answers in flight are written.
    drop(control_rx);
    control_server.stop().await;
    Ok(())
}

/// Starts the cluster sync of `daemon`'s `[cluster]`, if it has one,
/// heartbeating as `token` and fed cluster-hot events by `events`. A sync
/// that cannot start leaves cluster rules to the kernel's fallback.
fn start_cluster(
    daemon: &mut Daemon,
    token: String,
    events: tokio::sync::mpsc::Receiver<limiter_common::LimitEvent>,
) -> Option<tokio::task::JoinHandle<()>> {
    let cluster_config = daemon.config.cluster.clone()?;
    let live = sync::SharedLive::default();
    let ifaces: Vec<String> = daemon
        .ifaces
        .iter()
        .map(|i| i.instance.iface.clone())
        .collect();
    match sync::start(
        cluster_config,
        token,
        &daemon.config.daemon.pin_dir,
        &ifaces,
        daemon.rules.clone(),
        events,
        daemon.metrics.cluster.clone(),
        live.clone(),
    ) {
        Ok(task) => {
            daemon.cluster_live = Some(live);
            info!("cluster sync started");
            Some(task)
        }
        Err(e) => {
            warn!(error = %e, "cannot start the cluster sync; cluster rules fall back in the kernel");
            None
        }
    }
}

/// One event watcher per interface (its "source limited" lines within the
/// log cap all interfaces share; cluster-hot events to `cluster`), and
/// the task that sums up what the cap held back.
fn start_watchers(
    daemon: &mut Daemon,
    cluster: Option<tokio::sync::mpsc::Sender<limiter_common::LimitEvent>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let settings = &daemon.config.daemon;
    let log_cap = events::SharedLogCap::new(events::LogCap::new(
        settings.limited_log_per_second,
        settings.limited_log_burst,
        daemon.metrics.limited_log_suppressed.clone(),
        std::time::Instant::now(),
    ));
    let mut watchers = vec![events::summarise(log_cap.clone())];
    for iface in &mut daemon.ifaces {
        let instance = &mut iface.instance;
        match instance.program.maps.events.take() {
            Some(ring) => watchers.push(events::watch(
                instance.iface.clone(),
                ring,
                daemon.rules.clone(),
                cluster.clone(),
                log_cap.clone(),
            )),
            None => {
                warn!(iface = %instance.iface, "no event ring buffer; limit events are not logged")
            }
        }
    }
    watchers
}

/// The answer to `detach` once the daemon stopped: `failed` holds the
/// interfaces whose detaching failed, with why.
fn detached(interfaces: &[String], failed: &[String]) -> ResponseLine {
    if failed.is_empty() {
        ResponseLine::ok(Reply::Done {
            message: format!("detached {} and stopped the daemon", interfaces.join(", ")),
        })
    } else {
        ResponseLine::error(format!(
            "the daemon stopped, but detaching failed: {}",
            failed.join("; ")
        ))
    }
}
