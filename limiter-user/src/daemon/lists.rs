//! The `[[lists]]` in force: read and merged (`crate::lists`), written to
//! every interface at start-up and on reload (only when what they hold
//! changed; the old lists judge until the new ones are complete,
//! `kernel::lists`), counted each tick and shown by `status`.

use std::{path::PathBuf, time::Instant};

use ipnet::IpNet;
use limiter_common::{lists::ListAction, Counter};
use tracing::{info, warn};

use super::{metrics::action_name, state::Daemon};
use crate::{
    config::ListSection,
    kernel::{self, Maps},
    lists::{self, List, Merged},
    proto::{ListOp, ListStatus},
};

/// The lists the kernel holds: each one's name, action, file and
/// distinct prefixes, and the entries written (to skip a reload that
/// changes nothing).
#[derive(Default)]
pub struct LiveLists {
    lists: Vec<(String, ListAction, Option<PathBuf>, usize)>,
    merged: Option<Merged>,
}

/// Lists read and merged, not yet written.
pub struct ReadLists {
    lists: Vec<List>,
    merged: Merged,
    started: Instant,
}

impl Daemon {
    /// Reads `sections`' files (relative ones beside the configuration
    /// file) and merges them: nothing is written yet.
    pub(super) fn read_lists(&self, sections: &[ListSection]) -> anyhow::Result<ReadLists> {
        let started = Instant::now();
        let base = self.options.config.as_deref().and_then(|p| p.parent());
        let lists = lists::read_all(sections, base)?;
        let merged = lists::merge(&lists, self.config.daemon.max_list_prefixes)?;
        Ok(ReadLists {
            lists,
            merged,
            started,
        })
    }

    /// Makes `read` the lists of every interface.
    pub(super) fn load_lists(&mut self, read: ReadLists) -> anyhow::Result<()> {
        let ReadLists {
            lists,
            merged,
            started,
        } = read;
        // No lists, and none live on any interface (the kernel's flags):
        // nothing to write or clear (a start without lists takes no time
        // here, and logs nothing).
        let none_live = self.ifaces.iter().all(|i| {
            i.instance
                .program
                .maps
                .live_config()
                .is_ok_and(|c| !c.lists(true) && !c.lists(false))
        });
        let changed = self.live_lists.merged.as_ref() != Some(&merged)
            && !(merged == Merged::default() && none_live);
        if changed {
            // What the lists judged so far is counted under their names.
            self.record_list_hits();
            let mut instances: Vec<&mut Maps> = self
                .ifaces
                .iter_mut()
                .map(|i| &mut i.instance.program.maps)
                .collect();
            kernel::lists::load_all(&mut instances, &merged)?;
            for maps in instances {
                if let Err(e) = kernel::lists::reset_hits(maps) {
                    warn!(error = %e, "cannot zero the lists' counters");
                }
            }
            self.metrics.lists.forget_hits();
        }
        self.live_lists.lists = lists
            .into_iter()
            .zip(&merged.counts)
            .map(|(list, count)| (list.name, list.action, list.file, *count))
            .collect();
        let seconds = started.elapsed().as_secs_f64();
        let loaded: Vec<_> = self
            .live_lists
            .lists
            .iter()
            .map(|(name, action, _, count)| (name.clone(), *action, *count))
            .collect();
        self.metrics.lists.loaded(&loaded, seconds);
        if changed {
            info!(
                event = "lists_loaded",
                lists = loaded.len(),
                ipv4_prefixes = merged.v4.len(),
                ipv6_prefixes = merged.v6.len(),
                seconds = (seconds * 100.0).round() / 100.0,
                "lists loaded"
            );
        }
        self.live_lists.merged = Some(merged);
        Ok(())
    }

    fn list_names(&self) -> Vec<(String, ListAction)> {
        self.live_lists
            .lists
            .iter()
            .map(|(name, action, _, _)| (name.clone(), *action))
            .collect()
    }

    /// Each interface's list counters into the metrics (once a tick).
    pub(super) fn record_list_hits(&mut self) {
        let names = self.list_names();
        if names.is_empty() {
            return;
        }
        for iface in &self.ifaces {
            match kernel::lists::hits(&iface.instance.program.maps, names.len()) {
                Ok(hits) => self
                    .metrics
                    .lists
                    .record_hits(&iface.instance.iface, &hits, &names),
                Err(e) => {
                    warn!(iface = %iface.instance.iface, error = %e, "cannot read the lists' counters")
                }
            }
        }
    }

    /// `list add|rm`: `prefixes` added to or removed from the `prefixes`
    /// of list `name` (not its file's), the lists loaded again; with
    /// `save`, the configuration file edited in place too. Nothing changes
    /// when the edit is refused.
    pub(super) fn edit_list(
        &mut self,
        name: &str,
        op: ListOp,
        prefixes: &[IpNet],
        save: bool,
    ) -> Result<String, String> {
        let mut file = self.config.file.clone();
        let Some(section) = file.lists.iter_mut().find(|l| l.name == name) else {
            return Err(format!(
                "no list is named {name:?} (`status` shows the lists)"
            ));
        };
        for prefix in prefixes.iter().map(IpNet::trunc) {
            let held = section.prefixes.iter().position(|p| {
                p.parse::<IpNet>().map(|n| n.trunc()) == Ok(prefix)
                    || p.parse::<std::net::IpAddr>().map(IpNet::from) == Ok(prefix)
            });
            match (op, held) {
                (ListOp::Add, None) => section.prefixes.push(prefix.to_string()),
                (ListOp::Add, Some(_)) => {}
                (ListOp::Remove, Some(i)) => {
                    section.prefixes.remove(i);
                }
                (ListOp::Remove, None) => {
                    return Err(format!(
                        "{prefix} is not among list {name}'s prefixes (a prefix of its file \
                         goes with an edit of the file and a reload)"
                    ))
                }
            }
        }
        if section.file.is_none() && section.prefixes.is_empty() {
            return Err(format!(
                "list {name} would be empty: remove it from the configuration instead"
            ));
        }
        let read = self.read_lists(&file.lists).map_err(|e| e.to_string())?;
        self.load_lists(read)
            .map_err(|e| format!("loading the lists failed: {e:#}"))?;
        self.config.file = file;
        let count = self
            .live_lists
            .lists
            .iter()
            .find(|(n, _, _, _)| n == name)
            .map_or(0, |(_, _, _, count)| *count);
        let verb = match op {
            ListOp::Add => "added to",
            ListOp::Remove => "removed from",
        };
        let done = format!(
            "{} {} list {name} (now {count} prefixes)",
            prefixes.len(),
            verb
        );
        info!(
            list = name,
            op = verb,
            prefixes = prefixes.len(),
            "list edited through the control socket"
        );
        if save {
            super::edit::save(self.options.config.as_deref(), &mut self.config, &done)
        } else {
            Ok(done)
        }
    }

    /// `status`'s lists: what each holds and judged, all interfaces.
    pub(super) fn list_status(&self) -> Vec<ListStatus> {
        let mut totals = vec![Counter::default(); self.live_lists.lists.len()];
        for iface in &self.ifaces {
            if let Ok(hits) = kernel::lists::hits(&iface.instance.program.maps, totals.len()) {
                for (total, hit) in totals.iter_mut().zip(hits) {
                    *total = total.merged(hit);
                }
            }
        }
        self.live_lists
            .lists
            .iter()
            .zip(totals)
            .map(|((name, action, file, prefixes), total)| ListStatus {
                name: name.clone(),
                action: action_name(*action).to_string(),
                prefixes: *prefixes,
                file: file.clone(),
                packets: total.packets,
                bytes: total.bytes,
            })
            .collect()
    }
}
