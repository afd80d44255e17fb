//! Starting and stopping: the configuration the command line asks for,
//! protecting every interface without ever leaving one attached without
//! rules, undoing a failed start without touching what it adopted, and
//! leaving or detaching at the end.

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Context as _;
use tracing::{error, info, warn};

use super::state::Daemon;
use crate::{
    config::{self, AttachKind, AttachMode, Config, DaemonSection},
    fault,
    kernel::{Instance, LoadOptions},
};

/// Options of `xdp-limiter run` that override the file.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub config: Option<PathBuf>,
    pub interfaces: Vec<String>,
    pub mode: Option<AttachMode>,
    pub attach: Option<AttachKind>,
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

/// Applies the command line's overrides to a configuration read from the
/// file (at start, and again at every reload and edit).
pub fn apply_overrides(config: &mut Config, options: &RunOptions) {
    for iface in &options.interfaces {
        if !config.daemon.interfaces.contains(iface) {
            config.daemon.interfaces.push(iface.clone());
        }
    }
    if let Some(mode) = options.mode {
        config.daemon.mode = mode;
    }
    if let Some(attach) = options.attach {
        config.daemon.attach = attach;
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

/// Raises the soft limit of open files to the hard one (systemd starts
/// services at 1024): connections are capped anyway, but the maps, links,
/// sockets and connections of several interfaces need room.
pub fn raise_open_files_limit() {
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
pub fn protect_all(options: RunOptions, config: Config) -> anyhow::Result<Daemon> {
    let settings: DaemonSection = config.daemon.clone();
    let mut instances: Vec<Instance> = Vec::new();
    for iface in &settings.interfaces {
        let options = LoadOptions {
            max_sources: settings.max_sources,
            max_hot_sources: Some(settings.max_hot_sources),
            max_list_prefixes: settings.max_list_prefixes,
            component: (settings.attach == AttachKind::Dispatcher).then_some(settings.priority),
            ..LoadOptions::default()
        };
        match Instance::load(iface, &settings.pin_dir, options) {
            Ok(instance) => instances.push(instance),
            Err(e) => {
                abandon(instances);
                return Err(e).with_context(|| format!("protecting {iface}"));
            }
        }
    }
    let rules = config.rules.clone();
    let mut daemon = Daemon::new(options, config, instances);
    fault::stop_at(fault::Step::Push);
    if let Err(e) = daemon.push(&rules) {
        abandon(daemon.into_instances());
        return Err(e).context("pushing the rules");
    }
    let lists = daemon.config.file.lists.clone();
    if let Err(e) = daemon
        .read_lists(&lists)
        .and_then(|read| daemon.load_lists(read))
    {
        abandon(daemon.into_instances());
        return Err(e.context("loading the lists"));
    }
    daemon.restore_bans();
    for i in 0..daemon.ifaces.len() {
        if let Err(e) = daemon.ifaces[i].instance.attach(settings.mode) {
            let iface = daemon.ifaces[i].instance.iface.clone();
            abandon(daemon.into_instances());
            return Err(e).with_context(|| format!("protecting {iface}"));
        }
    }
    for iface in &daemon.ifaces {
        info!(iface = %iface.instance.iface, mode = iface.instance.attachment.as_str(), generation = daemon.generation, "protecting");
    }
    Ok(daemon)
}

/// Undoes a failed start: detaches what it attached afresh, leaves what it
/// adopted in place (it was protecting before this process came).
fn abandon(instances: Vec<Instance>) {
    for instance in instances {
        let iface = instance.iface.clone();
        if instance.adopted() {
            instance.keep();
            warn!(
                iface,
                "start-up failed: the adopted protection stays in place"
            );
        } else if let Err(e) = instance.detach() {
            error!(iface, error = %e, "start-up failed, and detaching failed too");
        }
    }
}

/// Leaves or detaches every instance; returns what failed to detach.
pub fn shutdown(instances: Vec<Instance>, keep_attached: bool) -> Vec<String> {
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
