//! The daemon's TOML configuration: every field has a serde default, so no
//! file at all means a sane built-in configuration (a default rule in
//! dry-run, so a first run never drops an operator's traffic by surprise).
//! Validation names the field and the value; a configuration that fails it
//! is never applied.
//!
//! `schema` is the file's form (what serde reads and `--save` writes, and
//! what the control protocol carries for rules); `validate` turns it into
//! the typed [`Config`] the daemon runs; `cluster` is the `[cluster]`
//! section in both forms, `tls` the TLS files it names. The daemon, the
//! CLI and the wire protocol all import from here; this module imports
//! none of them.

mod cluster;
mod schema;
pub(crate) mod text;
mod tls;
mod validate;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

pub use cluster::*;
pub use schema::*;
pub use tls::{PemFile, TlsFiles};
pub use validate::{check_cluster_in_force, check_frame_sizes};

/// `[crowdsec]` validated: the local API's address and the bouncer's key.
#[derive(Clone, PartialEq)]
pub struct CrowdsecConfig {
    pub api_url: hyper::Uri,
    pub api_key: String,
    pub poll_interval: Duration,
}

impl std::fmt::Debug for CrowdsecConfig {
    // The key is a secret: never in a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrowdsecConfig")
            .field("api_url", &self.api_url)
            .field("poll_interval", &self.poll_interval)
            .finish_non_exhaustive()
    }
}

use crate::rules::{RuleError, RuleSet};

/// Default per-source packet rate of the built-in default rule.
pub const DEFAULT_PPS: u64 = 1000;
/// Largest `daemon.max_sources` (2^24): each source costs per-CPU state
/// (see docs/configuration.md for the memory formula).
pub const MAX_SOURCES: u32 = 1 << 24;
/// Where state maps and links are pinned.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/xdp-limiter";
/// Where the daemon keeps its bans across restarts.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/xdp-limiter";
/// Where Prometheus scrapes.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9470";
/// The "source limited" lines per second the daemon writes at most by
/// default, all interfaces together.
pub const DEFAULT_LIMITED_LOG_PER_SECOND: u32 = 10;
/// The lines it may write at once by default, above the rate, after a
/// quiet spell.
pub const DEFAULT_LIMITED_LOG_BURST: u32 = 20;
/// The shortest and longest horizon `[daemon] history` takes.
pub const MIN_HORIZON: Duration = Duration::from_secs(60);
pub const MAX_HORIZON: Duration = Duration::from_secs(24 * 3600);
/// Where the daemon's control socket listens unless configured otherwise.
pub const DEFAULT_SOCKET: &str = "/run/xdp-limiter/control.sock";

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{field}: {message}")]
    Field { field: String, message: String },
    #[error("{0}")]
    Rules(#[from] RuleError),
}

/// A validated configuration, with the file form it came from (what
/// `--save` writes back).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub daemon: DaemonSection,
    pub rules: RuleSet,
    /// `[cluster]` validated; `None`: no cluster (every rule node-scoped).
    /// The daemon keeps the one it started with across reloads (a change
    /// takes effect on restart, as `[daemon]` does).
    pub cluster: Option<ClusterConfig>,
    /// `[crowdsec]` validated, its key read; `None`: no bouncer. Kept
    /// across reloads, as `[daemon]` is.
    pub crowdsec: Option<CrowdsecConfig>,
    pub file: FileConfig,
    /// The file's text as the daemon last read or wrote it (`None`: no
    /// file): `--save` refuses to overwrite a file that changed since.
    pub text: Option<String>,
}

impl Config {
    /// The built-in configuration (what no file means).
    pub fn builtin() -> Self {
        FileConfig::default()
            .validate()
            .expect("the built-in configuration is valid")
    }

    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Self::parse(&text, &path.display().to_string())?;
        config.text = Some(text);
        Ok(config)
    }

    /// Parses and validates TOML `text` (`origin` names it in errors).
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        // TOML's errors quote the line at fault: never a password.
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: redact_secrets(&e.to_string(), text)
                .trim_end()
                .replace('\n', " "),
        })?;
        file.validate()
    }
}

#[cfg(test)]
mod tests;
