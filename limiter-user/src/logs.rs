//! The daemon's log: text for people (the default) or one JSON object a
//! line for machines (`--log-format json`, `[daemon] log_format`), each
//! event's fields at the top level beside `timestamp`, `level`, `target`
//! and `message`. The events a SIEM or CrowdSec reads carry an `event`
//! field naming their kind (docs/events.md).

use std::{io::IsTerminal, path::Path};

use serde::{Deserialize, Serialize};

/// How the log is written.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// `2026-11-28T04:36:52Z  INFO target: message key=value ...`.
    #[default]
    Text,
    /// `{"timestamp":...,"level":"INFO","event":"source_limited",...}`.
    Json,
}

/// Sets the process's logger: `RUST_LOG` filters (default `info`), to
/// standard error.
pub fn init(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

/// The `[daemon] log_format` of the file at `path`, read before the
/// configuration is (the log must be set first): `None` when the file or
/// the key is missing or unreadable, which the daemon's own load then
/// reports.
pub fn format_in_file(path: &Path) -> Option<LogFormat> {
    let text = std::fs::read_to_string(path).ok()?;
    let table: toml::Table = toml::from_str(&text).ok()?;
    let value = table.get("daemon")?.get("log_format")?.clone();
    value.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_names_the_format_or_says_nothing() {
        let dir = std::env::temp_dir().join(format!("xl-logs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let json = file("json.toml", "[daemon]\nlog_format = \"json\"\n");
        let text = file("text.toml", "[daemon]\nlog_format = \"text\"\n");
        let none = file("none.toml", "[daemon]\ntick = \"1s\"\n");
        let bad = file("bad.toml", "[daemon]\nlog_format = \"xml\"\n");
        assert_eq!(format_in_file(&json), Some(LogFormat::Json));
        assert_eq!(format_in_file(&text), Some(LogFormat::Text));
        assert_eq!(format_in_file(&none), None);
        assert_eq!(format_in_file(&bad), None);
        assert_eq!(format_in_file(&dir.join("missing.toml")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
