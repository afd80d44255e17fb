//! Bans: set and lifted through the control socket (`xdp-limiter ban`,
//! fail2ban's action, the CrowdSec bouncer) on every interface, ended by
//! the kernel's clock, swept away once ended, and kept across restarts:
//! the ban tries are pinned, and each change is written to
//! `[daemon] state_dir`/bans.json, from which a daemon that starts with
//! empty tries (after a reboot, a detach or an upgrade) restores the
//! bans that have not ended.

use std::{
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ipnet::IpNet;
use limiter_common::lists::{Ban, BanOrigin, BAN_FOREVER};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::{metrics::BanChange, state::Daemon};
use crate::{
    kernel::{self, bans::BanEntry},
    proto::BanStatus,
};

/// The file the bans are kept in, in `[daemon] state_dir`.
const BANS_FILE: &str = "bans.json";

/// What the daemon knows of the bans without walking them.
#[derive(Clone, Copy, Debug, Default)]
pub struct BanBook {
    /// The earliest end of a ban (the kernel's clock; `u64::MAX`: none),
    /// when the next sweep is due. 0 at start-up: sweep at once.
    pub next_end: u64,
    /// Bans in force after the last change or sweep.
    pub in_force: usize,
}

/// A ban as the state file keeps it: its end by the wall clock (the
/// kernel's clock restarts with the machine).
#[derive(Debug, Deserialize, Serialize)]
struct SavedBan {
    cidr: IpNet,
    /// Seconds since the epoch; `None`: until unbanned.
    until_unix_s: Option<u64>,
    origin: String,
    #[serde(default)]
    reason: String,
}

pub fn origin_name(origin: BanOrigin) -> &'static str {
    match origin {
        BanOrigin::Cli => "cli",
        BanOrigin::Crowdsec => "crowdsec",
    }
}

fn now_ns() -> u64 {
    kernel::now().as_nanos() as u64
}

impl Daemon {
    /// Bans `cidr` for `duration` (`None`: until unbanned) on every
    /// interface, or on none.
    pub(super) fn ban(
        &mut self,
        cidr: IpNet,
        duration: Option<Duration>,
        reason: &str,
        origin: BanOrigin,
    ) -> Result<String, String> {
        let cidr = cidr.trunc();
        if cidr.prefix_len() == 0 {
            return Err(format!("refusing to ban {cidr}: it is every address"));
        }
        if duration == Some(Duration::ZERO) {
            return Err("a ban needs a duration above zero (or none: until unbanned)".into());
        }
        let now = now_ns();
        let expires = duration.map_or(BAN_FOREVER, |d| {
            now.saturating_add(d.as_nanos().min(u128::from(u64::MAX)) as u64)
        });
        self.write_ban(cidr, &Ban::new(now, expires, origin, reason))?;
        let until = duration.map_or("until unbanned".to_string(), |d| {
            format!("for {}", humantime::format_duration(d))
        });
        info!(event = "ban", %cidr, until, reason, origin = origin_name(origin), "banned");
        self.metrics
            .lists
            .ban_changed(BanChange::Ban, origin_name(origin));
        self.bans_changed();
        Ok(format!("banned {cidr} {until}"))
    }

    /// Writes `ban` of `cidr` on every interface, or on none.
    fn write_ban(&mut self, cidr: IpNet, ban: &Ban) -> Result<(), String> {
        self.ban_book.next_end = self.ban_book.next_end.min(ban.expires_ns);
        for i in 0..self.ifaces.len() {
            if let Err(e) = kernel::bans::ban(&mut self.ifaces[i].instance.program.maps, cidr, ban)
            {
                for iface in &mut self.ifaces[..i] {
                    let _ = kernel::bans::unban(&mut iface.instance.program.maps, cidr);
                }
                return Err(format!("banning {cidr} failed: {e}"));
            }
        }
        Ok(())
    }

    /// Lifts the ban of exactly `cidr` on every interface (no such ban is
    /// an error unless `missing_ok`).
    pub(super) fn unban(
        &mut self,
        cidr: IpNet,
        missing_ok: bool,
        origin: BanOrigin,
    ) -> Result<String, String> {
        let cidr = cidr.trunc();
        let mut found = false;
        for iface in &mut self.ifaces {
            found |= kernel::bans::unban(&mut iface.instance.program.maps, cidr)
                .map_err(|e| format!("unbanning {cidr} failed: {e}"))?;
        }
        if !found && missing_ok {
            return Ok(format!("{cidr} was not banned"));
        }
        if !found {
            return Err(format!("{cidr} is not banned (`bans` lists the bans)"));
        }
        info!(event = "unban", %cidr, origin = origin_name(origin), "unbanned");
        self.metrics
            .lists
            .ban_changed(BanChange::Unban, origin_name(origin));
        self.bans_changed();
        Ok(format!("unbanned {cidr}"))
    }

    /// A CrowdSec poll's answer: its bans set, its ended decisions' bans
    /// lifted (only bans CrowdSec set), and after a `startup` poll the
    /// CrowdSec bans it no longer holds lifted. One line per ban, or one
    /// for the whole answer when it is large (a startup poll can carry
    /// tens of thousands).
    pub(super) fn apply_crowdsec(&mut self, batch: crate::crowdsec::Batch) {
        const LINES: usize = 20;
        let origin = origin_name(BanOrigin::Crowdsec);
        let held: Vec<BanEntry> = self
            .held_bans()
            .into_iter()
            .filter(|e| e.ban.origin() == BanOrigin::Crowdsec)
            .collect();
        let mut lift: Vec<IpNet> = batch
            .unban
            .iter()
            .filter(|net| held.iter().any(|e| e.net == **net))
            .copied()
            .collect();
        if batch.complete {
            lift.extend(
                held.iter()
                    .map(|e| e.net)
                    .filter(|net| !batch.ban.iter().any(|(n, _, _)| n == net)),
            );
        }
        let loud = lift.len() + batch.ban.len() <= LINES;
        let mut lifted = 0;
        for net in lift {
            let mut found = false;
            for iface in &mut self.ifaces {
                found |=
                    kernel::bans::unban(&mut iface.instance.program.maps, net).unwrap_or(false);
            }
            if found {
                lifted += 1;
                self.metrics.lists.ban_changed(BanChange::Unban, origin);
                if loud {
                    info!(event = "unban", cidr = %net, origin, "unbanned");
                }
            }
        }
        let now = now_ns();
        let mut banned = 0;
        for (net, left, scenario) in &batch.ban {
            let expires = now.saturating_add(left.as_nanos().min(u128::from(u64::MAX)) as u64);
            match self.write_ban(*net, &Ban::new(now, expires, BanOrigin::Crowdsec, scenario)) {
                Ok(()) => {
                    banned += 1;
                    self.metrics.lists.ban_changed(BanChange::Ban, origin);
                    if loud {
                        let until = format!(
                            "for {}",
                            humantime::format_duration(Duration::from_secs(left.as_secs()))
                        );
                        info!(event = "ban", cidr = %net, until, reason = scenario.as_str(), origin, "banned");
                    }
                }
                Err(e) => warn!(error = %e, origin, "cannot set a ban"),
            }
        }
        if !loud {
            info!(
                banned,
                lifted, origin, "bans set and lifted from the decision stream"
            );
        }
        if banned + lifted > 0 {
            self.bans_changed();
        }
    }

    /// Every ban the kernel holds (the first interface's: every interface
    /// holds the same), ended ones not yet swept included.
    fn held_bans(&self) -> Vec<BanEntry> {
        self.ifaces
            .first()
            .and_then(|i| kernel::bans::list(&i.instance.program.maps).ok())
            .unwrap_or_default()
    }

    /// The bans in force (the first interface's: every interface holds the
    /// same), the soonest to end first.
    pub(super) fn bans(&self) -> Result<Vec<BanStatus>, String> {
        let Some(iface) = self.ifaces.first() else {
            return Ok(Vec::new());
        };
        let now = now_ns();
        let mut bans: Vec<BanStatus> = kernel::bans::list(&iface.instance.program.maps)
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|entry| entry.ban.active(now))
            .map(|entry| status(&entry, now))
            .collect();
        bans.sort_by_key(|b| (b.remaining_s.unwrap_or(u64::MAX), b.cidr));
        Ok(bans)
    }

    /// Removes the ended bans, logged and counted each, once the earliest
    /// end the daemon knows of has passed (not every tick: a walk of the
    /// ban tries costs a syscall a ban).
    pub(super) fn sweep_bans(&mut self) {
        let now = now_ns();
        if now < self.ban_book.next_end {
            return;
        }
        let mut ended = Vec::new();
        for iface in &mut self.ifaces {
            match kernel::bans::sweep(&mut iface.instance.program.maps, now) {
                Ok(found) => ended.extend(found),
                Err(e) => warn!(iface = %iface.instance.iface, error = %e, "cannot sweep the bans"),
            }
        }
        // One line and one count per ban, not per interface.
        ended.sort_by_key(|e| e.net);
        ended.dedup_by_key(|e| e.net);
        for entry in &ended {
            let origin = origin_name(entry.ban.origin());
            info!(event = "ban_ended", cidr = %entry.net, reason = entry.ban.reason(), origin, "ban ended");
            self.metrics.lists.ban_changed(BanChange::Expired, origin);
        }
        self.bans_changed();
    }

    /// After a change: the earliest end, the count, the gauge, and the
    /// state file.
    fn bans_changed(&mut self) {
        let Ok(bans) = self.bans() else {
            return;
        };
        // Every ban the kernel holds, ended ones not yet swept included.
        let next_end = self
            .ifaces
            .iter()
            .filter_map(|i| kernel::bans::list(&i.instance.program.maps).ok())
            .flatten()
            .map(|e| e.ban.expires_ns)
            .min()
            .unwrap_or(u64::MAX);
        self.ban_book = BanBook {
            next_end,
            in_force: bans.len(),
        };
        self.metrics.lists.set_bans(bans.len());
        let Some(path) = self.bans_file() else {
            return;
        };
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let saved: Vec<SavedBan> = bans
            .into_iter()
            .map(|b| SavedBan {
                cidr: b.cidr,
                until_unix_s: b.remaining_s.map(|r| wall + r),
                origin: b.origin,
                reason: b.reason,
            })
            .collect();
        let text = serde_json::to_string_pretty(&saved).expect("bans serialise");
        // Written only when it says something new: a daemon that never
        // banned leaves no file (nor a directory) behind.
        let on_disk = std::fs::read_to_string(&path).ok();
        if on_disk.as_deref() == Some(text.as_str()) || (saved.is_empty() && on_disk.is_none()) {
            return;
        }
        let tmp = path.with_extension("json.tmp");
        let written = std::fs::create_dir_all(path.parent().unwrap_or(&path))
            .and_then(|()| std::fs::write(&tmp, text))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            warn!(path = %path.display(), error = %e, "cannot save the bans; they last while the pins do");
        }
    }

    fn bans_file(&self) -> Option<PathBuf> {
        let dir = &self.config.daemon.state_dir;
        (!dir.as_os_str().is_empty()).then(|| dir.join(BANS_FILE))
    }

    /// At start-up: the saved bans that have not ended and that the
    /// kernel does not hold already (it does when the tries were adopted).
    pub(super) fn restore_bans(&mut self) {
        let Some(path) = self.bans_file() else {
            return;
        };
        let saved: Vec<SavedBan> = match std::fs::read_to_string(&path) {
            Ok(text) => match serde_json::from_str(&text) {
                Ok(saved) => saved,
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "the saved bans are unreadable; starting without them");
                    return;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "cannot read the saved bans");
                return;
            }
        };
        let held: Vec<IpNet> = self.held_bans().into_iter().map(|e| e.net).collect();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let mut restored = 0;
        for ban in saved {
            let left = match ban.until_unix_s {
                Some(until) if until <= wall => continue,
                Some(until) => Some(Duration::from_secs(until - wall)),
                None => None,
            };
            if held.contains(&ban.cidr) {
                continue;
            }
            let origin = if ban.origin == "crowdsec" {
                BanOrigin::Crowdsec
            } else {
                BanOrigin::Cli
            };
            let now = now_ns();
            let expires = left.map_or(BAN_FOREVER, |d| now + d.as_nanos() as u64);
            match self.write_ban(ban.cidr, &Ban::new(now, expires, origin, &ban.reason)) {
                Ok(_) => restored += 1,
                Err(e) => warn!(error = %e, "cannot restore a saved ban"),
            }
        }
        if restored > 0 {
            info!(restored, path = %path.display(), "bans restored");
        }
        self.sweep_bans();
        self.bans_changed();
    }
}

/// A ban as `bans` shows it, at `now` (the kernel's clock).
fn status(entry: &BanEntry, now: u64) -> BanStatus {
    let ban = &entry.ban;
    BanStatus {
        cidr: entry.net,
        remaining_s: (ban.expires_ns != BAN_FOREVER)
            .then(|| ban.expires_ns.saturating_sub(now).div_ceil(1_000_000_000)),
        age_s: now.saturating_sub(ban.banned_ns) / 1_000_000_000,
        origin: origin_name(ban.origin()).to_string(),
        reason: ban.reason().to_string(),
    }
}
