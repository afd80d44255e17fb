//! What the daemon tells systemd (`Type=notify`, `sd_notify(3)`): ready
//! once every interface is protected and the rules are pushed, alive at
//! each tick while systemd runs a watchdog (`WatchdogSec=`), stopping when
//! it stops. Without `NOTIFY_SOCKET` (not under systemd) nothing is sent.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::{debug, warn};

/// The watchdog systemd asked for, and when it was last fed.
pub struct Watchdog {
    every: Duration,
    fed: Instant,
}

impl Watchdog {
    /// The watchdog systemd runs for this process (`WATCHDOG_USEC`), fed
    /// at a quarter of its timeout; `None` without one.
    pub fn from_env() -> Option<Self> {
        let timeout = sd_notify::watchdog_enabled()?;
        Some(Self {
            every: timeout / 4,
            fed: Instant::now(),
        })
    }

    /// After a tick: says the daemon is alive when a quarter of the
    /// timeout has passed since it last did. A tick that never comes (the
    /// loop wedged) lets the watchdog expire, and systemd restart us.
    pub fn tick(&mut self) {
        if self.fed.elapsed() >= self.every {
            send(&[NotifyState::Watchdog]);
            self.fed = Instant::now();
        }
    }
}

/// Ready: the interfaces are protected and the rules pushed.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Ready, with the status `systemctl status` shows: the interfaces
/// protected and the rule generation they run.
pub fn ready_protecting(interfaces: &[String], generation: u32) {
    ready(&format!(
        "protecting {}, rule generation {generation}",
        interfaces.join(", ")
    ));
}

/// Stopping.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

fn send(states: &[NotifyState]) {
    match sd_notify::notify(states) {
        Ok(()) => debug!(?states, "told systemd"),
        Err(e) => warn!(error = %e, "cannot tell systemd (NOTIFY_SOCKET)"),
    }
}
