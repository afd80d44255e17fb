//! The SYN-cookie shield: while the kernel finds the windows' tickets all
//! taken (`PRESSURE`'s ticket entry, kept 61 s after the last time), the
//! daemon sets `net.ipv4.tcp_syncookies = 2` in its network namespace, so
//! that the kernel answers every SYN with a cookie and a new TCP client's
//! handshake proves its address to the XDP program (`judge/proof.rs`);
//! the value it found goes back once the pressure is over, and when the
//! daemon stops. docs/operations.md, "Floods that fill the windows".

use std::{fs, io, path::PathBuf};

use tracing::{info, warn};

/// The sysctl, as a file of this process's network namespace.
const SYNCOOKIES: &str = "/proc/sys/net/ipv4/tcp_syncookies";
/// Cookies for every SYN, not only when a listener's queue overflows.
const ALWAYS: &str = "2";

/// Whether the shield is up, and what it replaced.
#[derive(Debug)]
pub(super) struct Shield {
    enabled: bool,
    path: PathBuf,
    /// The value found before the shield went up (`Some` while up).
    saved: Option<String>,
}

impl Shield {
    pub(super) fn new(enabled: bool) -> Self {
        Self::at(enabled, PathBuf::from(SYNCOOKIES))
    }

    fn at(enabled: bool, path: PathBuf) -> Self {
        Self {
            enabled,
            path,
            saved: None,
        }
    }

    /// Whether the shield is up.
    pub(super) fn up(&self) -> bool {
        self.saved.is_some()
    }

    /// Raises the shield while `pressured`, lowers it once not.
    pub(super) fn observe(&mut self, pressured: bool) {
        if !self.enabled {
            return;
        }
        match (pressured, self.up()) {
            (true, false) => match self.raise() {
                Ok(found) => {
                    info!(
                        event = "syncookie_shield",
                        state = "up",
                        found = %found,
                        "the windows' tickets are all taken: SYN cookies for every connection"
                    );
                    self.saved = Some(found);
                }
                Err(e) => {
                    warn!(error = %e, path = %self.path.display(), "raising the SYN-cookie shield failed");
                    // Not tried again every tick.
                    self.enabled = false;
                }
            },
            (false, true) => self.lower(),
            _ => {}
        }
    }

    /// Sets cookies for every SYN; what was there before.
    fn raise(&self) -> io::Result<String> {
        let found = fs::read_to_string(&self.path)?.trim().to_string();
        if found != ALWAYS {
            fs::write(&self.path, ALWAYS)?;
        }
        Ok(found)
    }

    /// Puts back the value found when the shield went up.
    fn lower(&mut self) {
        let Some(found) = self.saved.take() else {
            return;
        };
        match fs::write(&self.path, &found) {
            Ok(()) => info!(
                event = "syncookie_shield",
                state = "down",
                restored = %found,
                "the windows' pressure is over: SYN cookies as before"
            ),
            Err(e) => {
                warn!(error = %e, path = %self.path.display(), "lowering the SYN-cookie shield failed")
            }
        }
    }
}

impl Drop for Shield {
    fn drop(&mut self) {
        self.lower();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(value: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tcp_syncookies");
        fs::write(&path, value).unwrap();
        (dir, path)
    }

    #[test]
    fn the_shield_sets_cookies_under_pressure_and_puts_the_old_value_back() {
        let (_dir, path) = file("1\n");
        let mut shield = Shield::at(true, path.clone());
        shield.observe(false);
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "1\n",
            "no pressure: untouched"
        );
        shield.observe(true);
        assert!(shield.up());
        assert_eq!(fs::read_to_string(&path).unwrap(), "2");
        shield.observe(true);
        shield.observe(false);
        assert!(!shield.up());
        assert_eq!(fs::read_to_string(&path).unwrap(), "1");
    }

    #[test]
    fn a_daemon_that_stops_under_pressure_puts_the_old_value_back() {
        let (_dir, path) = file("0");
        let mut shield = Shield::at(true, path.clone());
        shield.observe(true);
        assert_eq!(fs::read_to_string(&path).unwrap(), "2");
        drop(shield);
        assert_eq!(fs::read_to_string(&path).unwrap(), "0");
    }

    #[test]
    fn a_shield_turned_off_changes_nothing() {
        let (_dir, path) = file("1");
        let mut shield = Shield::at(false, path.clone());
        shield.observe(true);
        assert!(!shield.up());
        assert_eq!(fs::read_to_string(&path).unwrap(), "1");
    }
}
