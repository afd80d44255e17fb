//! The run-time CLI against a real daemon over its control socket:
//! `status`, `top`, `mode`, `reload`, text and JSON output, and bad input
//! of every kind (no daemon, non-root caller, malformed messages).

use std::{
    io::{BufRead, BufReader, Write},
    net::Ipv4Addr,
    os::unix::net::UnixStream,
    process::Command,
    time::{Duration, Instant},
};

use limiter_tests::{
    daemon::{binary, Daemon, Files},
    lab::{limit_config, Lab, HEAVY, MARKER, MEDIUM, RX_IF, TX_IF},
    netns::run_ok,
};
use serde_json::Value;

const PORT: u16 = 7100;

struct Setup {
    lab: Lab,
    files: Files,
    daemon: Daemon,
}

fn setup() -> Setup {
    let lab = Lab::three_senders();
    let files = Files::new();
    files.write_config(&limit_config(2));
    let config = files.config();
    let daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
    );
    Setup { lab, files, daemon }
}

/// `xdp-limiter <args> --socket <the daemon's>` that must fail with exit
/// status `code`: its standard error.
#[track_caller]
fn failing(files: &Files, args: &[&str], code: i32) -> String {
    let out = files.cli(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    stderr
}

fn json(files: &Files, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["--output", "json"]);
    serde_json::from_str(&files.cli_ok(&args)).expect("JSON output")
}

/// Whether the daemon's rules include one for `cidr`.
fn rule_live(files: &Files, cidr: &str) -> bool {
    json(files, &["rule", "ls"])["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .any(|r| r["cidr"] == cidr)
}

/// Polls `status` until `ok(status)` (bounded).
fn wait_status(files: &Files, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = json(files, &["status"]);
        if ok(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "status never got there: {status:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn status_and_top_report_the_live_daemon_field_by_field() {
    let s = setup();
    let receiver = s.lab.receiver(PORT);
    let got = s
        .lab
        .exchange(&receiver, PORT, &[(HEAVY, 100), (MEDIUM, 15)], MARKER);
    assert_eq!(got.get(&HEAVY), Some(&20));

    // Per-CPU state: heavy (refused) and medium (more than half its
    // allowance); the marker's allowed frame needed none (cheap tier).
    let status = wait_status(&s.files, |v| v["interfaces"][0]["tracked_sources"] == 2);
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(status["generation"], 1);
    assert_eq!(status["dry_run"], false);
    assert_eq!(status["rules"], 2);
    let iface = &status["interfaces"][0];
    assert_eq!(iface["name"], RX_IF);
    assert_eq!(iface["mode"], "native");
    assert!(
        iface["program_id"].as_u64().is_some_and(|id| id > 0),
        "{iface}"
    );
    assert_eq!(iface["capacity"], 16384);
    assert!(iface["passed_pps"].is_number() && iface["dropped_pps"].is_number());
    let text = s.files.cli_ok(&["status"]);
    assert!(text.contains("enforce, 2 rules (generation 1)"), "{text}");
    assert!(text.contains(RX_IF) && text.contains("2/16384"), "{text}");

    // The burst shows in the per-second rate during the next second.
    let deadline = Instant::now() + Duration::from_secs(5);
    let top = loop {
        let top = json(&s.files, &["top", "--once"]);
        let heavy = top
            .as_array()
            .expect("a list")
            .iter()
            .find(|e| e["source"] == HEAVY.to_string())
            .cloned();
        if heavy
            .as_ref()
            .is_some_and(|h| h["pps"].as_u64() >= Some(100))
        {
            break top;
        }
        assert!(
            Instant::now() < deadline,
            "heavy never topped the list: {top:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let entries = top.as_array().expect("a list");
    assert_eq!(
        entries[0]["source"],
        HEAVY.to_string(),
        "heaviest first: {top:#}"
    );
    assert_eq!(entries[0]["interface"], RX_IF);
    assert_eq!(entries[0]["dropped"], 80);
    assert!(entries[0]["bps"].as_u64() >= Some(100 * 106 * 8));
    let medium = entries
        .iter()
        .find(|e| e["source"] == MEDIUM.to_string())
        .expect("medium listed");
    assert_eq!(medium["dropped"], 0);
    assert_eq!(medium["state"], "ok");
    let one = json(&s.files, &["top", "--once", "--limit", "1"]);
    assert_eq!(one.as_array().map(Vec::len), Some(1));
    let text = s.files.cli_ok(&["top", "--once"]);
    assert!(
        text.starts_with("source") && text.contains(&HEAVY.to_string()),
        "{text}"
    );
}

#[test]
fn mode_and_reload_change_enforcement_live() {
    let s = setup();
    let receiver = s.lab.receiver(PORT);
    let got = s.lab.exchange(&receiver, PORT, &[(HEAVY, 25)], MARKER);
    assert_eq!(got.get(&HEAVY), Some(&20));

    assert!(s
        .files
        .cli_ok(&["mode", "dry-run"])
        .contains("mode dry-run"));
    assert_eq!(json(&s.files, &["status"])["dry_run"], true);
    let got = s.lab.exchange(&receiver, PORT, &[(HEAVY, 10)], MARKER);
    assert_eq!(got.get(&HEAVY), Some(&10), "dry-run drops nothing: {got:?}");

    let out = s.files.cli_ok(&["mode", "enforce", "--save"]);
    assert!(
        out.contains("mode enforce") && out.contains("saved to"),
        "{out}"
    );
    let saved = std::fs::read_to_string(s.files.config()).expect("config file");
    assert!(saved.contains("dry_run = false"), "{saved}");
    let got = s.lab.exchange(&receiver, PORT, &[(HEAVY, 10)], MARKER);
    assert_eq!(got.get(&HEAVY), None, "enforcing again: {got:?}");

    s.files.write_config(&limit_config(5)); // 50 per window
    assert!(s.files.cli_ok(&["reload"]).contains("reloaded"));
    assert_eq!(
        json(&s.files, &["rule", "ls"])["default"]["pps"],
        5,
        "the daemon's rules are the reloaded file's"
    );
    let got = s.lab.exchange(&receiver, PORT, &[(HEAVY, 40)], MARKER);
    assert_eq!(got.get(&HEAVY), Some(&30), "{got:?}");

    s.files.write_config("[default]\npps = -1\n");
    assert!(failing(&s.files, &["reload"], 1).contains("reload failed"));
    s.daemon.wait_log("configuration rejected");
    let got = s.lab.exchange(&receiver, PORT, &[(HEAVY, 5)], MARKER);
    assert_eq!(got.get(&HEAVY), None, "the running limits stay: {got:?}");
}

/// Sends a raw line to the control socket; the reply line as JSON.
fn raw(files: &Files, line: &str) -> Value {
    let mut stream = UnixStream::connect(files.socket()).expect("connect");
    stream.write_all(line.as_bytes()).expect("write");
    stream.write_all(b"\n").expect("write");
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).expect("read");
    serde_json::from_str(&answer).expect("a JSON reply")
}

#[test]
fn bad_requests_and_callers_get_clear_errors_and_change_nothing() {
    let s = setup();
    for (line, expect) in [
        ("this is not json", "malformed request"),
        (r#"{"command":"status"}"#, "missing field `version`"),
        (
            r#"{"version":2,"command":"status"}"#,
            "protocol version 2 is not supported",
        ),
        (r#"{"version":1,"command":"rm-rf"}"#, "unknown variant"),
        (
            r#"{"version":1,"command":"mode","dry_run":7}"#,
            "invalid type",
        ),
    ] {
        let reply = raw(&s.files, line);
        assert_eq!(reply["version"], 1);
        let error = reply["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{line}: {reply}"));
        assert!(error.contains(expect), "{line}: {error}");
    }
    let status = json(&s.files, &["status"]);
    assert_eq!(status["generation"], 1, "nothing changed");
    assert_eq!(status["dry_run"], false);

    let socket = std::fs::metadata(s.files.socket()).expect("socket");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(socket.permissions().mode() & 0o777, 0o600);
    assert_eq!(socket.uid(), 0);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(binary())
        .args(["mode", "dry-run", "--socket"])
        .arg(s.files.socket())
        .output()
        .expect("setpriv");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("permission denied") || stderr.contains("not running"),
        "{stderr}"
    );
    assert_eq!(
        json(&s.files, &["status"])["dry_run"],
        false,
        "the mode did not change"
    );

    let out = Command::new(binary())
        .args(["status", "--socket", "/tmp/xlt-no-such.sock"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("xdp-limiter is not running"), "{stderr}");

    assert!(failing(&s.files, &["mode", "turbo"], 2).contains("invalid value 'turbo'"));
}

#[test]
fn rule_add_limits_a_live_source_and_rule_rm_releases_it() {
    let s = setup();
    let receiver = s.lab.receiver(PORT);
    let got = s.lab.exchange(&receiver, PORT, &[(MEDIUM, 15)], MARKER);
    assert_eq!(
        got.get(&MEDIUM),
        Some(&15),
        "under the default 20 per window"
    );

    // 1 pps over 10 s: 10 per window, and 15 were already admitted.
    let medium = format!("{MEDIUM}/32");
    let out = s
        .files
        .cli_ok(&["rule", "add", &medium, "--pps", "1", "--window", "10s"]);
    assert!(
        out.contains(&format!(
            "added the rule for {medium} as {medium}; rule generation 2"
        )),
        "{out}"
    );
    let got = s.lab.exchange(&receiver, PORT, &[(MEDIUM, 5)], MARKER);
    assert_eq!(got.get(&MEDIUM), None, "now limited: {got:?}");

    let rules = json(&s.files, &["rule", "ls"]);
    let list = rules["rules"].as_array().expect("rules");
    assert_eq!(list.len(), 2, "{rules:#}");
    assert_eq!(list[1]["cidr"], medium);
    assert_eq!(list[1]["pps"], 1);
    assert_eq!(list[1]["window"], "10s");
    assert_eq!(list[1]["action"], "limit");
    assert_eq!(rules["default"]["pps"], 2);
    let text = s.files.cli_ok(&["rule", "ls"]);
    assert!(
        text.contains(&format!("{medium} ")) && text.contains("1 pps, window 10s"),
        "{text}"
    );

    let out = s.files.cli_ok(&["rule", "rm", &medium]);
    assert!(out.contains("removed the rule for"), "{out}");
    let got = s.lab.exchange(&receiver, PORT, &[(MEDIUM, 10)], MARKER);
    assert_eq!(
        got.get(&MEDIUM),
        Some(&5),
        "back under the default (20): {got:?}"
    );
}

#[test]
fn rule_changes_with_save_survive_in_the_file_and_default_set_works() {
    let s = setup();
    // The rule's prefix and match: what `rule set` finds it by.
    let dns = ["198.51.100.0/24", "--proto", "udp", "--ports", "53"];
    let limits = [
        "--pps", "10k", "--bps", "5Mbit", "--burst", "1k", "--block", "30s", "--save",
    ];
    let out = s
        .files
        .cli_ok(&[&["rule", "add"][..], &dns, &limits].concat());
    assert!(out.contains("saved to"), "{out}");
    let saved = limiter_user::config::Config::load(&s.files.config()).expect("valid file");
    let rule = saved.rules.rules.last().expect("saved rule");
    assert_eq!(rule.cidr.to_string(), "198.51.100.0/24");
    assert_eq!(rule.limits.pps, Some(10_000));
    assert_eq!(rule.limits.bytes_per_second, Some(625_000));
    assert_eq!(rule.limits.burst_packets, 1000);
    assert_eq!(rule.limits.block, Some(Duration::from_secs(30)));
    assert_eq!(rule.matches.ports, Some((53, 53)));

    let out = s
        .files
        .cli_ok(&[&["rule", "set"][..], &dns, &["--pps", "20"]].concat());
    assert!(out.contains("replaced the rule"), "{out}");
    assert_eq!(json(&s.files, &["rule", "ls"])["rules"][1]["pps"], 20);
    let out = s
        .files
        .cli_ok(&["default", "set", "--pps", "3", "--window", "10s"]);
    assert!(out.contains("replaced the default rule"), "{out}");
    let rules = json(&s.files, &["rule", "ls"]);
    assert_eq!(rules["default"]["pps"], 3);
    assert_eq!(rules["default"]["dry_run"], false);
    assert_eq!(json(&s.files, &["status"])["generation"], 4);
}

#[test]
fn invalid_rule_changes_are_rejected_and_leave_rules_unchanged() {
    let s = setup();
    let before = json(&s.files, &["rule", "ls"]);
    // Refused by the CLI's own parsing: exit 2 with usage.
    for args in [
        vec!["rule", "add", "10.0.0.0/33", "--pps", "5"],
        vec!["rule", "add", "not-a-cidr", "--pps", "5"],
        vec!["rule", "add", "10.0.0.0/8", "--pps", "-5"],
        vec!["rule", "add", "10.0.0.0/8", "--pps", "lots"],
        vec!["rule", "add", "10.0.0.0/8", "--proto", "tcpp", "--pps", "5"],
        vec!["rule", "add", "10.0.0.0/8", "--ports", "http", "--pps", "5"],
    ] {
        failing(&s.files, &args, 2);
    }
    // A malformed level: the grammar, before anything is sent.
    let stderr = failing(
        &s.files,
        &[
            "rule",
            "add",
            "10.0.0.0/8",
            "--pps",
            "10",
            "--level",
            "nonsense",
        ],
        2,
    );
    assert!(
        stderr.contains("invalid value 'nonsense' for '--level <LEVEL>'")
            && stderr.contains("is not a level: KIND[/V4[/V6]]:PPS[+BURST][@WINDOW]"),
        "{stderr}"
    );
    // Refused by the daemon's validation: exit 1 with the reason.
    for (args, expect) in [
        (
            vec![
                "rule",
                "add",
                "10.0.0.0/8",
                "--proto",
                "udp",
                "--ports",
                "99-10",
                "--pps",
                "5",
            ],
            "port range 99-10 is reversed",
        ),
        (
            vec!["rule", "add", "10.0.0.0/8", "--pps", "999T"],
            "exceeds the maximum",
        ),
        (
            vec!["rule", "add", "10.0.0.0/8"],
            "needs a packet or byte rate",
        ),
        (
            vec!["rule", "add", "10.0.0.0/8", "--pps", "5", "--window", "2m"],
            "window",
        ),
        (
            vec!["rule", "add", "2001:db8::/96", "--pps", "5"],
            "longer than the /64",
        ),
        (
            vec!["rule", "add", &format!("{MARKER}/32"), "--action", "allow"],
            "exists; use `rule set`",
        ),
        (
            vec!["rule", "rm", "10.9.9.0/24"],
            "the rule for 10.9.9.0/24 with that match does not exist",
        ),
        (
            vec!["rule", "set", "10.9.9.0/24", "--pps", "5"],
            "use `rule add`",
        ),
        // Levels the daemon refuses, each naming the rule's field (the
        // new rule is rules[1]: rules[0] allows the marker).
        (
            vec![
                "rule",
                "add",
                "10.0.0.0/8",
                "--pps",
                "5",
                "--level",
                "rule:50",
                "--level",
                "prefix/33:10",
            ],
            "rules[1].levels[1]: IPv4 prefix /33 is longer than the /32 sources are keyed by",
        ),
        (
            vec![
                "rule",
                "add",
                "10.0.0.0/8",
                "--action",
                "deny",
                "--level",
                "rule:50",
            ],
            "rules[1].levels: only a `limit` rule has levels, not `deny`",
        ),
        (
            vec![
                "rule",
                "add",
                "10.0.0.0/8",
                "--pps",
                "5",
                "--level",
                "source:5@50ms",
            ],
            "rules[1].levels[0]: window 50ms is outside 100ms..=60s",
        ),
        (
            vec![
                "rule",
                "add",
                "10.0.0.0/8",
                "--pps",
                "5",
                "--level",
                "source:1@1s",
                "--level",
                "source:1@2s",
                "--level",
                "source:1@3s",
                "--level",
                "source:1@4s",
                "--level",
                "source:1@5s",
            ],
            "rules[1].levels: 5 levels, more than the 4",
        ),
    ] {
        let stderr = failing(&s.files, &args, 1);
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
    // A malformed level from a client that does not check it: the daemon
    // names its field.
    let reply = raw(
        &s.files,
        r#"{"version":1,"command":"rules","save":false,"edit":{"op":"add","rule":{"cidr":"10.0.0.0/8","pps":5,"levels":["rule:50","nonsense"]}}}"#,
    );
    let error = reply["error"].as_str().unwrap_or_else(|| panic!("{reply}"));
    assert!(
        error.contains(r#"rules[1].levels[1]: "nonsense" is not a level"#),
        "{error}"
    );
    assert_eq!(json(&s.files, &["rule", "ls"]), before, "rules unchanged");
    assert_eq!(
        json(&s.files, &["status"])["generation"],
        1,
        "nothing pushed"
    );
}

#[test]
fn rule_levels_show_in_rule_ls_and_status_and_their_drops_are_counted() {
    let s = setup();
    // HEAVY and MEDIUM share 192.0.2.0/24 (the marker has its own /32):
    // each may send 1,000 frames a window, the /24 together 10.
    let out = s.files.cli_ok(&[
        "rule",
        "add",
        "192.0.2.0/24",
        "--pps",
        "100",
        "--window",
        "10s",
        "--level",
        "prefix/24:1",
        "--level",
        "source:50@1m",
    ]);
    assert!(out.contains("rule generation 2"), "{out}");

    let rules = json(&s.files, &["rule", "ls"]);
    assert_eq!(rules["rules"][0]["levels"], serde_json::json!([]));
    assert_eq!(
        rules["rules"][1]["levels"],
        serde_json::json!(["prefix/24/48:1", "source:50@1m"])
    );
    let text = s.files.cli_ok(&["rule", "ls"]);
    assert!(
        text.lines().any(|line| line.starts_with("192.0.2.0/24")
            && line.ends_with("100 pps, window 10s, levels: prefix/24/48:1, source:50@1m")),
        "{text}"
    );
    let status = json(&s.files, &["status"]);
    assert_eq!(
        status["rule_levels"],
        serde_json::json!([{"rule": "192.0.2.0/24", "levels": ["prefix/24/48:1", "source:50@1m"]}])
    );
    let text = s.files.cli_ok(&["status"]);
    assert!(
        text.contains("\n192.0.2.0/24 levels: prefix/24/48:1, source:50@1m\n"),
        "{text}"
    );

    // 25 frames from the /24: at most its 10 pass; every refusal is the
    // /24 level's, counted under the rule and under that level.
    let receiver = s.lab.receiver(PORT);
    let got = s
        .lab
        .exchange(&receiver, PORT, &[(HEAVY, 15), (MEDIUM, 10)], MARKER);
    let passed: usize = got.values().sum();
    assert!((1..=10).contains(&passed), "{got:?}");
    let refused = (25 - passed) as f64;
    let level = format!(
        "xdp_limiter_level_dropped_packets_total{{interface=\"{RX_IF}\",level=\"prefix/24/48@10s\",rule=\"192.0.2.0/24\"}}"
    );
    assert_eq!(s.daemon.wait_metric(&level, |v| v >= refused), refused);
    let metrics = s.daemon.metrics();
    assert_eq!(
        limiter_tests::daemon::parse_metric(
            &metrics,
            &format!(
                "xdp_limiter_rule_dropped_packets_total{{interface=\"{RX_IF}\",rule=\"192.0.2.0/24\"}}"
            )
        ),
        Some(refused)
    );
    assert_eq!(
        limiter_tests::daemon::parse_metric(
            &metrics,
            &format!(
                "xdp_limiter_level_dropped_packets_total{{interface=\"{RX_IF}\",level=\"source@1m\",rule=\"192.0.2.0/24\"}}"
            )
        ),
        Some(0.0)
    );
    // Only the rule with levels has level series.
    assert_eq!(
        metrics
            .lines()
            .filter(|l| l.starts_with("xdp_limiter_level_dropped_packets_total{"))
            .count(),
        2,
        "{metrics}"
    );
}

/// The rows of `top --level SELECTOR` (JSON), by aggregate.
fn aggregates(files: &Files, selector: &str) -> Vec<Value> {
    json(files, &["top", "--once", "--level", selector])
        .as_array()
        .expect("an array of aggregates")
        .clone()
}

#[test]
fn top_level_shows_the_aggregates_of_the_levels_it_selects() {
    let s = setup();
    let stderr = failing(&s.files, &["top", "--once", "--level", "/24"], 1);
    assert!(stderr.contains("no rule in force has levels"), "{stderr}");

    // A sender in a second /24; one rule over both, with a /24 level and
    // a whole-rule level, their windows long enough to hold the counts
    // while the test reads them.
    let other = Ipv4Addr::new(192, 0, 3, 5);
    s.lab
        .tx
        .ip(&["addr", "add", &format!("{other}/24"), "dev", TX_IF]);
    s.files.cli_ok(&[
        "rule",
        "add",
        "192.0.0.0/16",
        "--pps",
        "100",
        "--window",
        "10s",
        "--level",
        "prefix/24:10@1m",
        "--level",
        "rule:1000@1m",
    ]);
    let receiver = s.lab.receiver(PORT);
    let got = s.lab.exchange(
        &receiver,
        PORT,
        &[(HEAVY, 15), (MEDIUM, 10), (other, 7)],
        MARKER,
    );
    assert_eq!(got.get(&HEAVY), Some(&15), "{got:?}");

    // Both /24s, the fuller first, each with its count (+-1: the window's
    // estimate), its allowance (10 pps over 1 min) and the share used.
    let near = |row: &Value, want: u64| {
        let packets = row["packets"].as_u64().expect("packets");
        assert!(packets.abs_diff(want) <= 1, "{want}: {row}");
        let used = row["used"].as_f64().expect("used");
        assert!((used - packets as f64 / 600.0).abs() < 1e-9, "{row}");
    };
    for selector in ["/24", "prefix/24", "prefix/24/48@1m", "prefix"] {
        let rows = aggregates(&s.files, selector);
        assert_eq!(rows.len(), 2, "{selector}: {rows:?}");
        for (row, key, packets) in [
            (&rows[0], "192.0.2.0/24", 25),
            (&rows[1], "192.0.3.0/24", 7),
        ] {
            assert_eq!(row["key"], key, "{selector}: {rows:?}");
            assert_eq!(row["rule"], "192.0.0.0/16");
            assert_eq!(row["level"], "prefix/24/48@1m");
            assert_eq!(row["allowance"], 600);
            assert_eq!(row["interface"], RX_IF);
            near(row, packets);
        }
    }
    let text = s.files.cli_ok(&["top", "--once", "--level", "/24"]);
    let lines: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    for (fields, key, packets) in [
        (&lines[0], "192.0.2.0/24", 25u64),
        (&lines[1], "192.0.3.0/24", 7),
    ] {
        assert_eq!(
            fields[..3],
            ["192.0.0.0/16", "prefix/24/48@1m", key],
            "{text}"
        );
        let counted: u64 = fields[3].parse().expect("packets");
        assert!(counted.abs_diff(packets) <= 1, "{text}");
        assert_eq!(fields[4], "600", "{text}");
        assert!(fields[5].ends_with('%') && fields[6] == RX_IF, "{text}");
    }
    assert!(text.starts_with("rule "), "a header: {text}");

    // The whole rule: one aggregate of every frame; --limit cuts the list.
    let rows = aggregates(&s.files, "rule");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["key"], "rule");
    assert_eq!(rows[0]["level"], "rule@1m");
    assert!(
        rows[0]["packets"].as_u64().expect("packets").abs_diff(32) <= 1,
        "{rows:?}"
    );
    let one = json(
        &s.files,
        &["top", "--once", "--level", "/24", "--limit", "1"],
    );
    assert_eq!(one.as_array().map(Vec::len), Some(1), "{one}");
    assert_eq!(one[0]["key"], "192.0.2.0/24");

    // A selector that chooses nothing, or is no selector: refused, naming
    // the levels in force.
    for (selector, why) in [
        ("/16", "no level in force matches `/16`"),
        ("source", "no level in force matches `source`"),
        ("aggregate", "\"aggregate\" is not a level selector"),
    ] {
        let stderr = failing(&s.files, &["top", "--once", "--level", selector], 1);
        assert!(
            stderr.contains(why)
                && stderr.contains("the levels in force: 192.0.0.0/16: prefix/24/48@1m, rule@1m"),
            "{selector}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
    let stderr = failing(
        &s.files,
        &["top", "--once", "--level", "/24", "--sort", "dropped"],
        2,
    );
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

#[test]
fn completions_and_the_man_page_come_from_the_clap_definition() {
    let out = run_ok(Command::new(binary()).args(["completions", "bash"]));
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(
        script.contains("xdp-limiter") && script.contains("rule"),
        "{script}"
    );
    let out = run_ok(Command::new(binary()).arg("man"));
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        page.contains(".TH xdp-limiter 8") && page.contains("status"),
        "{page}"
    );
    // A page per command, for the package.
    let dir = std::env::temp_dir().join(format!("xl-man-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    run_ok(Command::new(binary()).args(["man", "--dir"]).arg(&dir));
    let rule_add = std::fs::read_to_string(dir.join("xdp-limiter-rule-add.8")).expect("a page");
    let pages = std::fs::read_dir(&dir).unwrap().count();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        rule_add.contains(".TH xdp-limiter-rule-add 8") && rule_add.contains("pps"),
        "{rule_add}"
    );
    assert!(pages >= 15, "{pages} pages");
}

/// `tmux` drives the live view like a person at a terminal.
fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("run tmux");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn live_top_refreshes_sorts_on_keys_and_quits_on_q() {
    let s = setup();
    let session = format!("xlt-top-{}", std::process::id());
    let command = format!(
        "{} top --socket {}",
        binary().display(),
        s.files.socket().display()
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "120",
        "-y",
        "30",
        &command,
    ]);
    let screen = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = tmux(&["capture-pane", "-p", "-t", &session]);
            if text.contains(needle) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "never showed {needle:?}:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    screen("sorted by Pps");
    tmux(&["send-keys", "-t", &session, "d"]);
    screen("sorted by Dropped");
    tmux(&["send-keys", "-t", &session, "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Command::new("tmux")
        .args(["has-session", "-t", &session])
        .output()
        .expect("tmux")
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "top did not quit on q");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn detach_stops_a_running_daemon_and_removes_protection() {
    let s = setup();
    let out = s
        .files
        .cli_ok(&["detach", "--pin-dir", s.files.pin_dir.to_str().unwrap()]);
    assert!(
        out.contains(&format!("detached {RX_IF} and stopped the daemon")),
        "{out}"
    );
    // The answer comes after the detach: when the command returns, the
    // interface is already unprotected, before the daemon has exited.
    let link = s.lab.rx.ip(&["-details", "link", "show", RX_IF]);
    assert!(
        !String::from_utf8_lossy(&link.stdout).contains("prog/xdp"),
        "detached"
    );
    assert!(!s.files.pin_dir.join(RX_IF).exists(), "pins removed");
    assert!(!s.files.socket().exists(), "socket removed");
    let status = s.daemon.wait();
    assert!(status.success(), "{status}");
}

#[test]
fn rule_edits_match_however_rules_are_spelled_and_save_never_loses_a_file_edit() {
    let lab = Lab::three_senders();
    let files = Files::new();
    files.write_config(&format!(
        "{}\n[[rules]]\ncidr = \"198.51.100.0/24\"\nprotocol = \"UDP\"\nports = 53\npps = 10\n\n\
         [[rules]]\ncidr = \"203.0.113.0/24\"\nprotocol = 17\npps = 10\n",
        limit_config(2)
    ));
    let config = files.config();
    let _daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
    );
    // A protocol written "UDP" or 17 in the file is `--proto udp` here.
    files.cli_ok(&[
        "rule",
        "rm",
        "198.51.100.0/24",
        "--proto",
        "udp",
        "--ports",
        "53",
    ]);
    files.cli_ok(&["rule", "rm", "203.0.113.0/24", "--proto", "udp"]);
    assert_eq!(
        json(&files, &["rule", "ls"])["rules"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "only the marker's rule is left"
    );
    // Host bits are an error, not a second rule for the same prefix.
    let stderr = failing(&files, &["rule", "add", "10.0.0.1/8", "--pps", "5"], 1);
    assert!(
        stderr.contains("10.0.0.1/8 has host bits set (did you mean 10.0.0.0/8?)"),
        "{stderr}"
    );
    // An edit of the file not yet reloaded is not overwritten by --save.
    let edited = format!(
        "{}\n# added by hand\n[[rules]]\ncidr = \"192.0.2.128/25\"\npps = 9\n",
        std::fs::read_to_string(&config).expect("read")
    );
    std::fs::write(&config, &edited).expect("edit the file");
    let stderr = failing(
        &files,
        &["rule", "add", "10.1.0.0/16", "--pps", "5", "--save"],
        1,
    );
    assert!(stderr.contains("changed on disk"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&config).expect("read"),
        edited,
        "the hand edit is kept"
    );
    assert!(
        rule_live(&files, "10.1.0.0/16"),
        "the change itself is live"
    );
    // Once reloaded, saving works again (and keeps the hand edit).
    files.cli_ok(&["reload"]);
    files.cli_ok(&["rule", "add", "10.2.0.0/16", "--pps", "5", "--save"]);
    let saved = std::fs::read_to_string(&config).expect("read");
    assert!(
        saved.contains("192.0.2.128/25") && saved.contains("10.2.0.0/16"),
        "{saved}"
    );
}

/// A small tmpfs mounted for one test, unmounted on drop.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(at: std::path::PathBuf, size: &str) -> Self {
        std::fs::create_dir_all(&at).expect("mount point");
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&at),
        );
        Self(at)
    }

    fn remount(&self, options: &str) {
        run_ok(
            Command::new("mount")
                .args(["-o", &format!("remount,{options}")])
                .arg(&self.0),
        );
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn save_to_a_full_or_read_only_directory_fails_clearly_and_keeps_the_file() {
    let lab = Lab::three_senders();
    let files = Files::new();
    let fs = SmallFs::mount(files.dir.join("etc"), "64k");
    let config = fs.0.join("config.toml");
    std::fs::write(&config, limit_config(2)).expect("write config");
    let _daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
    );
    let original = std::fs::read_to_string(&config).expect("read");
    let live = |cidr: &str| rule_live(&files, cidr);

    // A full disk: the new file cannot be written.
    let filler = fs.0.join("filler");
    let mut junk = std::fs::File::create(&filler).expect("filler");
    while std::io::Write::write_all(&mut junk, &[0u8; 4096]).is_ok() {}
    drop(junk);
    let stderr = failing(
        &files,
        &["rule", "add", "10.1.0.0/16", "--pps", "5", "--save"],
        1,
    );
    assert!(
        stderr.contains("(live), but saving") && stderr.contains("No space left"),
        "{stderr}"
    );
    assert!(live("10.1.0.0/16"), "the change itself is live");
    assert_eq!(
        std::fs::read_to_string(&config).expect("read"),
        original,
        "file intact"
    );
    assert!(
        !fs.0.join("config.toml.new").exists(),
        "no half-written file left"
    );
    std::fs::remove_file(&filler).expect("free the space");

    // A read-only directory (as ProtectSystem=full makes /etc).
    fs.remount("ro");
    let stderr = failing(
        &files,
        &["rule", "add", "10.2.0.0/16", "--pps", "5", "--save"],
        1,
    );
    assert!(stderr.contains("Read-only file system"), "{stderr}");
    assert!(live("10.2.0.0/16"));
    assert_eq!(std::fs::read_to_string(&config).expect("read"), original);

    // Writable again: saved, with both earlier live changes.
    fs.remount("rw");
    files.cli_ok(&["rule", "add", "10.3.0.0/16", "--pps", "5", "--save"]);
    let saved = std::fs::read_to_string(&config).expect("read");
    for cidr in ["10.1.0.0/16", "10.2.0.0/16", "10.3.0.0/16"] {
        assert!(saved.contains(cidr), "{cidr} in:\n{saved}");
    }
}

/// The `top --once` row of `source`, if it is there.
fn top_row(files: &Files, source: &str) -> Option<Value> {
    json(files, &["top", "--once"])
        .as_array()?
        .iter()
        .find(|r| r["source"] == source)
        .cloned()
}

#[test]
fn unblock_lifts_a_penalty_and_top_shows_it() {
    let lab = Lab::three_senders();
    let files = Files::new();
    files.write_config(&format!(
        "[daemon]\ntick = \"100ms\"\n\n[default]\npps = 2\nblock = \"1h\"\ndry_run = false\n\n\
         [[rules]]\ncidr = \"{MARKER}/32\"\naction = \"allow\"\n"
    ));
    let config = files.config();
    let _daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
    );
    let receiver = lab.receiver(PORT);
    let got = lab.exchange(&receiver, PORT, &[(HEAVY, 5), (MEDIUM, 1)], MARKER);
    let blocked_at = Instant::now();
    assert_eq!(got.get(&HEAVY), Some(&2));
    let deadline = Instant::now() + Duration::from_secs(10);
    while top_row(&files, &HEAVY.to_string()).is_none_or(|r| r["state"] != "blocked") {
        assert!(
            Instant::now() < deadline,
            "top never showed {HEAVY} blocked"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let out = files.cli_ok(&["unblock", "192.0.2.0/24"]);
    assert!(out.contains("unblocked 1 source in 192.0.2.0/24"), "{out}");
    assert_ne!(
        top_row(&files, &HEAVY.to_string()).expect("still in top")["state"],
        "blocked"
    );
    // Once its window has slid (1 s), it is admitted again: no 1 h penalty.
    while blocked_at.elapsed() < Duration::from_millis(1300) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let got = lab.exchange(&receiver, PORT, &[(HEAVY, 1)], MARKER);
    assert_eq!(got.get(&HEAVY), Some(&1), "admitted again: {got:?}");

    let out = files.cli_ok(&["unblock", "203.0.113.0/24"]);
    assert!(out.contains("unblocked 0 sources"), "{out}");
    failing(&files, &["unblock", "not-a-cidr"], 2);
}
