//! The daemon's log for machines: with `[daemon] log_format = "json"`
//! every line of a real daemon's log is one JSON object, and each event
//! kind a SIEM reads (a guard period started and passed, a source limited
//! and released) carries the fields docs/events.md lists, at the top
//! level. `--log-format text` overrides the file.
//!
//! Under systemd (`$JOURNAL_STREAM` naming its standard error) the daemon
//! logs to journald natively, each field a journal field: read here off
//! a journal socket of the test's own, bound where journald's is
//! (`/run/systemd/journal/socket`) in a mount namespace of the daemon's.

use std::{
    collections::{BTreeMap, HashMap},
    os::unix::{fs::MetadataExt, net::UnixDatagram},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

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

/// One journal entry of the native protocol: `KEY=value` lines, or `KEY`,
/// a little-endian 64-bit length and the value for one with a newline.
fn journal_entry(mut datagram: &[u8]) -> HashMap<String, String> {
    let mut fields = HashMap::new();
    while !datagram.is_empty() {
        let end = datagram
            .iter()
            .position(|&b| b == b'\n')
            .expect("a field ends with a newline");
        let line = String::from_utf8_lossy(&datagram[..end]).into_owned();
        datagram = &datagram[end + 1..];
        if let Some((key, value)) = line.split_once('=') {
            fields.insert(key.to_string(), value.to_string());
        } else {
            let len = u64::from_le_bytes(datagram[..8].try_into().unwrap()) as usize;
            let value = String::from_utf8_lossy(&datagram[8..8 + len]).into_owned();
            fields.insert(line, value);
            datagram = &datagram[8 + len + 1..];
        }
    }
    fields
}

/// The daemon, killed when the test ends however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

#[test]
fn under_systemd_each_event_goes_to_journald_with_its_fields() {
    let lab = Lab::new(&[MARKER, HEAVY]);
    let files = Files::new();
    // The text form (the default): journald's when stderr is its stream.
    files.write_config(&config().replace("log_format = \"json\"\n", ""));
    let journal = files.dir.join("journal");
    std::fs::create_dir_all(&journal).unwrap();
    let socket = UnixDatagram::bind(journal.join("socket")).expect("bind the journal socket");
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // systemd hands a service its stream and names it in JOURNAL_STREAM
    // (device:inode); a file stands in for the stream here.
    let stderr_path = files.dir.join("stderr");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let meta = stderr.metadata().unwrap();
    let stream = format!("{}:{}", meta.dev(), meta.ino());

    let _daemon = Running(
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", lab.rx.name()))
            .args(["unshare", "--mount", "--propagation", "private", "sh", "-c"])
            .arg(
                "mount -t tmpfs journal /run && mkdir -p /run/systemd/journal \
                 && mount --bind \"$JOURNAL_DIR\" /run/systemd/journal && exec \"$@\"",
            )
            .arg("sh")
            .arg(limiter_tests::daemon::binary())
            .args(["run", "-i", RX_IF, "-c"])
            .arg(files.config())
            .arg("--pin-dir")
            .arg(&files.pin_dir)
            .arg("--control-socket")
            .arg(files.socket())
            .env("JOURNAL_DIR", &journal)
            .env("JOURNAL_STREAM", &stream)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn the daemon"),
    );

    let mut entries: Vec<HashMap<String, String>> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut wait_for = |entries: &mut Vec<HashMap<String, String>>,
                        what: &str,
                        found: &dyn Fn(&HashMap<String, String>) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !entries.iter().any(found) {
            assert!(
                Instant::now() < deadline,
                "no {what} in the journal within 30 s: {entries:#?}\nstderr: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
            if let Ok(n) = socket.recv(&mut buf) {
                entries.push(journal_entry(&buf[..n]));
            }
        }
    };
    wait_for(&mut entries, "control socket ready", &|e| {
        e.get("MESSAGE")
            .is_some_and(|m| m.contains("control socket ready"))
    });
    let receiver = lab.receiver(PORT);
    let got = lab.exchange(&receiver, PORT, &[(HEAVY, 20)], MARKER);
    assert!(got.get(&HEAVY).copied().unwrap_or(0) <= 5, "{got:?}");
    for kind in [
        "source_limited",
        "source_released",
        "guard_started",
        "guard_passed",
    ] {
        wait_for(&mut entries, kind, &|e| {
            e.get("EVENT").is_some_and(|v| v == kind)
        });
    }
    let first = |kind: &str| {
        entries
            .iter()
            .find(|e| e.get("EVENT").is_some_and(|v| v == kind))
            .unwrap()
            .clone()
    };
    let heavy = HEAVY.to_string();
    let limited = first("source_limited");
    for (key, value) in [
        ("SOURCE", heavy.as_str()),
        ("RULE", "default"),
        ("LEVEL", "source"),
        ("ACTION", "drop"),
        ("IFACE", RX_IF),
        ("DRY_RUN", "false"),
        ("PRIORITY", "6"),
        ("SYSLOG_IDENTIFIER", "xdp-limiter"),
    ] {
        assert_eq!(
            limited.get(key).map(String::as_str),
            Some(value),
            "{key} in {limited:#?}"
        );
    }
    let message = &limited["MESSAGE"];
    assert!(
        message.starts_with("source limited") && message.contains(&format!("source={heavy}")),
        "{message}"
    );
    let released = first("source_released");
    assert_eq!(released["SOURCE"], heavy, "{released:#?}");
    assert_eq!(released["IFACE"], RX_IF, "{released:#?}");
    assert_eq!(first("guard_started")["SCOPE"], "global");
    let passed = first("guard_passed");
    assert_eq!(passed["SCOPE"], "global", "{passed:#?}");
    assert_eq!(passed["PERIOD"], "5s", "{passed:#?}");
    // Every entry is well formed: a message, a priority, a target.
    for e in &entries {
        for key in ["MESSAGE", "PRIORITY", "TARGET"] {
            assert!(e.contains_key(key), "{key} in {e:#?}");
        }
    }
    // Nothing went to the stream: the journal had it all.
    let written = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(written.is_empty(), "{written}");
}
