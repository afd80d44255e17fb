//! The daemon's log: text for people (the default) or one JSON object a
//! line for machines (`--log-format json`, `[daemon] log_format`), each
//! event's fields at the top level beside `timestamp`, `level`, `target`
//! and `message`. The events a SIEM or CrowdSec reads carry an `event`
//! field naming their kind (docs/events.md).
//!
//! Under systemd (standard error is the journal's stream,
//! `$JOURNAL_STREAM`), the text form goes to journald natively instead:
//! each field is a journal field of its own (`SOURCE=`, `RULE=`,
//! `LEVEL=`, `ACTION=`, `EVENT=`, ...), so `journalctl -o json` and
//! field matches (`journalctl EVENT=source_limited`) need no regex.

use std::{fmt::Write as _, io::IsTerminal, path::Path};

use serde::{Deserialize, Serialize};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

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
/// standard error, or for the text form to journald when standard error
/// is the journal's stream.
pub fn init(format: LogFormat) {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    if format == LogFormat::Text && libsystemd::logging::connected_to_journal() {
        tracing_subscriber::registry()
            .with(filter())
            .with(Journal)
            .init();
        return;
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
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

/// Sends each event to journald: `MESSAGE` in the text form's words
/// (`source limited iface=eth0 source=192.0.2.3 ...`), each field also as
/// a journal field of its own ([`journal_field`]), `PRIORITY` from the
/// level, `TARGET` and `SYSLOG_IDENTIFIER`.
struct Journal;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Journal {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        use libsystemd::logging::Priority;
        let mut fields = JournalFields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let priority = match *meta.level() {
            tracing::Level::ERROR => Priority::Error,
            tracing::Level::WARN => Priority::Warning,
            tracing::Level::INFO => Priority::Info,
            _ => Priority::Debug,
        };
        let message = fields.message + &fields.text;
        let vars = fields.vars.into_iter().chain([
            ("TARGET".to_string(), meta.target().to_string()),
            ("SYSLOG_IDENTIFIER".to_string(), "xdp-limiter".to_string()),
        ]);
        // A line journald does not take has nowhere else to go.
        let _ = libsystemd::logging::journal_send(priority, &message, vars);
    }
}

/// An event's message and its other fields, named for the journal.
#[derive(Default)]
struct JournalFields {
    message: String,
    /// ` name=value` for each field, as the text form writes them.
    text: String,
    vars: Vec<(String, String)>,
}

impl JournalFields {
    fn add(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = value;
        } else {
            let _ = write!(self.text, " {}={value}", field.name());
            self.vars.push((journal_field(field.name()), value));
        }
    }
}

impl Visit for JournalFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.add(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.add(field, format!("{value:?}"));
    }
}

/// The journal field of an event's field: upper case, anything but
/// letters, digits and `_` as `_` (journald's rule), so `source` is
/// `SOURCE`. The level that refused a source is `LEVEL` (in JSON it is
/// `limit_level`: there `level` is the line's severity, which the journal
/// keeps in `PRIORITY`).
pub fn journal_field(name: &str) -> String {
    if name == "limit_level" {
        return "LEVEL".to_string();
    }
    let mut field: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    if !field.starts_with(|c: char| c.is_ascii_uppercase()) {
        field.insert_str(0, "F_");
    }
    field
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

    #[test]
    fn event_fields_take_journald_names() {
        assert_eq!(journal_field("source"), "SOURCE");
        assert_eq!(journal_field("dry_run"), "DRY_RUN");
        assert_eq!(journal_field("limit_level"), "LEVEL");
        assert_eq!(journal_field("log.target"), "LOG_TARGET");
        assert_eq!(journal_field("_private"), "F__PRIVATE");
        assert_eq!(journal_field("4xx"), "F_4XX");
    }
}
