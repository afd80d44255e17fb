//! The daemon's log for machines: with `[daemon] log_format = "json"`
//! every line of a real daemon's log is one JSON object, and each event
//! kind a SIEM reads (a guard period started and passed, a source limited
//! and released) carries the fields docs/events.md lists, at the top
//! level. `--log-format text` overrides the file.

use std::{collections::BTreeMap, process::Command};

use limiter_tests::{
    daemon::{Daemon, Files},
    lab::{Lab, HEAVY, MARKER, RX_IF},
};
use serde_json::Value;

const PORT: u16 = 7300;

/// 5 a second per source, a 1 s penalty past it, enforcing; the marker
/// allowed; a global guard period of 5 s from start-up that the traffic
/// keeps; the log in JSON.
fn config() -> String {
    format!(
        "[daemon]\ntick = \"100ms\"\nlog_format = \"json\"\n\n\
         [limits]\ndry_run = false\nguards = [\"limited_sources <= 100%\"]\nguard_for = \"5s\"\n\n\
         [default]\npps = 5\nwindow = \"1s\"\nblock = \"1s\"\ndry_run = false\n\n\
         [[rules]]\ncidr = \"{MARKER}/32\"\naction = \"allow\"\n"
    )
}

/// Every line of `log` as a JSON object; panics on one that is not.
fn events(log: &str) -> Vec<Value> {
    log.lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}\n{log}"));
            assert!(value.is_object(), "{line}");
            value
        })
        .collect()
}

/// The first event of `kind`.
fn first<'a>(events: &'a [Value], kind: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["event"] == kind)
        .unwrap_or_else(|| panic!("no {kind} event in {events:#?}"))
}

#[test]
fn every_line_is_json_and_each_event_kind_carries_its_fields() {
    let lab = Lab::new(&[MARKER, HEAVY]);
    let files = Files::new();
    files.write_config(&config());
    let config = files.config();
    let daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
    );
    let receiver = lab.receiver(PORT);
    let got = lab.exchange(&receiver, PORT, &[(HEAVY, 20)], MARKER);
    assert!(got.get(&HEAVY).copied().unwrap_or(0) <= 5, "{got:?}");
    daemon.wait_log("\"event\":\"source_released\"");
    daemon.wait_log("\"event\":\"guard_passed\"");
    let log = daemon.log();
    let all = events(&log);

    // Every line: when, how severe, from where, what.
    for e in &all {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(e[key].is_string(), "{key} in {e}");
        }
    }
    let heavy = HEAVY.to_string();
    let limited = first(&all, "source_limited");
    let expect: BTreeMap<&str, Value> = BTreeMap::from([
        ("level", "INFO".into()),
        ("message", "source limited".into()),
        ("iface", RX_IF.into()),
        ("source", heavy.clone().into()),
        ("rule", "default".into()),
        ("limit_level", "source".into()),
        ("action", "drop".into()),
        ("dry_run", false.into()),
    ]);
    for (key, value) in &expect {
        assert_eq!(&limited[*key], value, "{key} in {limited}");
    }
    let released = first(&all, "source_released");
    assert_eq!(released["source"], heavy.as_str(), "{released}");
    assert_eq!(released["iface"], RX_IF, "{released}");
    assert_eq!(released["message"], "source released", "{released}");
    let started = first(&all, "guard_started");
    assert_eq!(started["scope"], "global", "{started}");
    assert!(started["known_sources"].is_u64(), "{started}");
    assert_eq!(started["guards"], "limited_sources <= 100%", "{started}");
    let passed = first(&all, "guard_passed");
    assert_eq!(passed["scope"], "global", "{passed}");
    assert_eq!(passed["period"], "5s", "{passed}");
    assert!(daemon.stop().success());

    // The command line overrides the file: text again.
    let daemon = Daemon::start(
        &lab.rx,
        &files,
        &[
            "-i",
            RX_IF,
            "-c",
            config.to_str().unwrap(),
            "--log-format",
            "text",
        ],
    );
    daemon.wait_log("protecting");
    let log = daemon.log();
    let line = log
        .lines()
        .find(|l| l.contains("protecting"))
        .expect("a line");
    assert!(
        serde_json::from_str::<Value>(line).is_err() && line.contains(" INFO "),
        "{line}"
    );
    // A bad format on the command line is refused by the parser.
    let out = Command::new(limiter_tests::daemon::binary())
        .args(["run", "--log-format", "xml"])
        .output()
        .expect("run the CLI");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid value 'xml'"), "{stderr}");
}
