//! Guarded enforcement against a real daemon in a netns lab with real
//! traffic: a guard the traffic breaks rolls the daemon back to dry-run on
//! its own (metrics scraped over HTTP, the log's event, `status`); light
//! traffic lets a short period pass and enforcement stays; a rule's guard
//! rolls back that rule alone; bad guards through the CLI change nothing
//! (checked on the breach test's daemon, before it enforces).

use std::time::{Duration, Instant};

use limiter_tests::{
    daemon::{Daemon, Files},
    lab::{Lab, HEAVY, MARKER, MEDIUM, RX_IF},
};
use limiter_user::config::Config;
use serde_json::Value;

const PORT: u16 = 7300;
/// A flood: 100 frames a round, rounds this far apart (hundreds of
/// frames a second against a limit of 5).
const FLOOD_PACE: Duration = Duration::from_millis(150);
/// Light traffic: one frame a round, rounds this far apart (at most 2.5
/// frames a second against a limit of 5).
const LIGHT_PACE: Duration = Duration::from_millis(400);

/// Every source 5 pps over a 1 s window, enforcing by itself; `MARKER`
/// allowed; a 100 ms tick; global dry-run as `dry_run` says; `extra`
/// appended (more rules).
fn config(dry_run: bool, extra: &str) -> String {
    format!(
        "[daemon]\ntick = \"100ms\"\n\n[limits]\ndry_run = {dry_run}\n\n\
         [default]\npps = 5\nwindow = \"1s\"\ndry_run = false\n\n\
         [[rules]]\ncidr = \"{MARKER}/32\"\naction = \"allow\"\n{extra}"
    )
}

fn start(text: &str) -> (Lab, Files, Daemon) {
    let lab = Lab::three_senders();
    let files = Files::new();
    files.write_config(text);
    let config = files.config();
    let daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
    );
    (lab, files, daemon)
}

fn status(files: &Files) -> Value {
    serde_json::from_str(&files.cli_ok(&["status", "--output", "json"])).expect("JSON status")
}

/// Sends `burst` frames from `source` every round of at least `pace`,
/// until `done(status)` or the deadline; the last status.
fn send_until(
    lab: &Lab,
    files: &Files,
    (source, burst, pace): (std::net::Ipv4Addr, usize, Duration),
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(12);
    loop {
        lab.send(source, PORT, burst, 64);
        let status = status(files);
        if done(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "never got there: {status:#}");
        // Paces the traffic; the condition above is what the loop waits
        // for.
        std::thread::sleep(pace);
    }
}

#[track_caller]
fn metric(daemon: &Daemon, series: &str) -> f64 {
    daemon
        .metric(series)
        .unwrap_or_else(|| panic!("{series} missing:\n{}", daemon.metrics()))
}

#[test]
fn bad_guards_change_nothing_and_a_breached_guard_rolls_back_on_its_own() {
    let (lab, files, daemon) = start(&config(true, ""));
    bad_guards_change_nothing(&files, &daemon);
    // The global series exist from start-up.
    assert_eq!(
        metric(&daemon, r#"xdp_limiter_guard_state{scope="global"}"#),
        0.0
    );
    assert_eq!(
        metric(
            &daemon,
            r#"xdp_limiter_guard_rollbacks_total{scope="global"}"#
        ),
        0.0
    );
    let out = files.cli_ok(&[
        "mode",
        "enforce",
        "--guard",
        "dropped_share <= 10%",
        "--guard",
        "dropped_pps <= 1000000",
        "--for",
        "1m",
        "--save",
    ]);
    assert!(
        out.contains("mode enforce")
            && out.contains("guarded for 1m by dropped_share <= 10%")
            && out.contains("saved to"),
        "{out}"
    );
    let saved = std::fs::read_to_string(files.config()).unwrap();
    assert!(
        saved.contains("dry_run = false") && saved.contains("guard_for = \"1m\""),
        "{saved}"
    );
    let watching = status(&files);
    assert_eq!(watching["dry_run"], false);
    assert_eq!(watching["guard"]["state"], "watching", "{watching:#}");
    assert_eq!(
        daemon.wait_metric(r#"xdp_limiter_guard_state{scope="global"}"#, |v| v == 1.0),
        1.0
    );

    // A flood from HEAVY, 20 times its limit: most of it dropped.
    let rolled = send_until(&lab, &files, (HEAVY, 100, FLOOD_PACE), |s| {
        s["dry_run"] == true
    });
    let guard = &rolled["guard"];
    assert_eq!(guard["state"], "rolled-back", "{rolled:#}");
    assert_eq!(guard["rollback"]["guard"], "dropped_share <= 10%");
    let measured = guard["rollback"]["measured_value"].as_f64().expect("value");
    assert!(measured > 0.1 && measured <= 1.0, "{measured}");
    assert!(guard["rollback"]["at_unix_s"].as_u64().unwrap() > 1_700_000_000);

    // Back in dry-run: the flood passes again.
    let receiver = lab.receiver(PORT);
    let got = lab.exchange(&receiver, PORT, &[(HEAVY, 50)], MARKER);
    assert_eq!(got.get(&HEAVY), Some(&50), "dry-run drops nothing: {got:?}");

    assert_eq!(
        metric(&daemon, r#"xdp_limiter_guard_state{scope="global"}"#),
        3.0
    );
    assert_eq!(
        metric(
            &daemon,
            r#"xdp_limiter_guard_rollbacks_total{scope="global"}"#
        ),
        1.0
    );
    let log = daemon.log();
    let event = log
        .lines()
        .find(|l| l.contains("guard breached: rolled back to dry-run"))
        .unwrap_or_else(|| panic!("no rollback event:\n{log}"));
    assert!(
        event.contains("WARN")
            && event.contains("dropped_share <= 10%")
            && event.contains("threshold=10%"),
        "{event}"
    );
    let text = files.cli_ok(&["status"]);
    assert!(text.contains(": dry-run,"), "{text}");
    assert!(
        text.contains("guard (global): rolled-back")
            && text.contains("rolled back to dry-run")
            && text.contains("dropped_share <= 10% measured"),
        "{text}"
    );
    // Enforced with --save, so the rollback is saved too (a restart must
    // not re-enforce what just hurt); the guards wait in the file.
    let file = std::fs::read_to_string(files.config()).unwrap();
    assert!(file.contains("[limits]\ndry_run = true"), "{file}");
    assert!(file.contains("dropped_share <= 10%"), "{file}");

    // A new mode command replaces the finished period.
    files.cli_ok(&["mode", "enforce"]);
    let after = status(&files);
    assert!(after.get("guard").is_none(), "{after:#}");
    assert_eq!(
        metric(&daemon, r#"xdp_limiter_guard_state{scope="global"}"#),
        0.0
    );
}

#[test]
fn a_period_without_breach_passes_and_enforcement_stays() {
    // The guards from the configuration: the period starts with the
    // daemon.
    let text = config(false, "").replace(
        "dry_run = false\n\n[default]",
        "dry_run = false\nguards = [\"dropped_share <= 5%\", \"limited_sources <= 0\"]\n\
         guard_for = \"5s\"\n\n[default]",
    );
    assert!(text.contains("guard_for"), "{text}");
    // The period starts after this instant (with the daemon), on the same
    // monotonic clock the daemon ends it by.
    let before_start = Instant::now();
    let (lab, files, daemon) = start(&text);
    // Light traffic, under every limit, until the period is over.
    let watching = status(&files);
    assert_eq!(watching["dry_run"], false);
    assert_eq!(watching["guard"]["state"], "watching", "{watching:#}");
    assert!(watching["guard"]["remaining_s"].as_u64().unwrap() <= 5);
    let passed = send_until(&lab, &files, (MEDIUM, 1, LIGHT_PACE), |s| {
        s["guard"]["state"] != "watching"
    });
    assert_eq!(passed["guard"]["state"], "passed", "{passed:#}");
    assert!(
        before_start.elapsed() >= Duration::from_secs(5),
        "the 5 s period passed after {:?}",
        before_start.elapsed()
    );
    assert_eq!(passed["dry_run"], false);
    assert_eq!(passed["guard"]["guards"][1]["last"], "0", "{passed:#}");
    assert!(passed["guard"].get("rollback").is_none());
    assert_eq!(
        metric(&daemon, r#"xdp_limiter_guard_state{scope="global"}"#),
        2.0
    );
    assert_eq!(
        metric(
            &daemon,
            r#"xdp_limiter_guard_rollbacks_total{scope="global"}"#
        ),
        0.0
    );
    daemon.wait_log("guard period passed: enforcement stays");

    // Still enforcing after the period: a flood sent now is dropped, and
    // the guard no longer rolls anything back.
    let receiver = lab.receiver(PORT);
    let got = lab.exchange(&receiver, PORT, &[(HEAVY, 50)], MARKER);
    let heavy = got.get(&HEAVY).copied().unwrap_or(0);
    assert!(heavy <= 6, "enforcing: {got:?}");
    daemon.next_pass();
    assert_eq!(status(&files)["dry_run"], false);
    assert_eq!(
        metric(&daemon, r#"xdp_limiter_guard_state{scope="global"}"#),
        2.0
    );

    // A reload into enforce with guards starts a new period; a flood now
    // breaches it. The period came from the file, so the rollback is
    // live only: the file is left as its owner wrote it.
    let before = std::fs::read_to_string(files.config()).unwrap();
    assert!(files.cli_ok(&["reload"]).contains("reloaded"));
    let again = status(&files);
    assert_eq!(again["guard"]["state"], "watching", "{again:#}");
    let rolled = send_until(&lab, &files, (HEAVY, 100, FLOOD_PACE), |s| {
        s["dry_run"] == true
    });
    assert_eq!(rolled["guard"]["state"], "rolled-back", "{rolled:#}");
    assert_eq!(std::fs::read_to_string(files.config()).unwrap(), before);
    assert_eq!(
        metric(
            &daemon,
            r#"xdp_limiter_guard_rollbacks_total{scope="global"}"#
        ),
        1.0
    );
}

#[test]
fn a_rules_guard_rolls_back_that_rule_alone() {
    // HEAVY (in dry-run) and MEDIUM (enforcing) have rules of their own.
    let extra = format!(
        "\n[[rules]]\ncidr = \"{HEAVY}/32\"\npps = 5\nwindow = \"1s\"\ndry_run = true\n\
         \n[[rules]]\ncidr = \"{MEDIUM}/32\"\npps = 5\nwindow = \"1s\"\n"
    );
    let (lab, files, daemon) = start(&config(false, &extra));
    let heavy = format!("{HEAVY}/32");
    let out = files.cli_ok(&[
        "rule",
        "set",
        &heavy,
        "--pps",
        "5",
        "--guard",
        "dropped_share <= 10%",
        "--for",
        "1m",
        "--save",
    ]);
    assert!(
        out.contains("rules[1] guarded for 1m by dropped_share <= 10%") && out.contains("saved to"),
        "{out}"
    );
    assert_eq!(
        daemon.wait_metric(r#"xdp_limiter_guard_state{scope="rules[1]"}"#, |v| v == 1.0),
        1.0
    );

    let rolled = send_until(&lab, &files, (HEAVY, 100, FLOOD_PACE), |s| {
        s["rule_guards"][0]["state"] == "rolled-back"
    });
    let guard = &rolled["rule_guards"][0];
    assert_eq!(guard["scope"], "rules[1]");
    assert_eq!(guard["rollback"]["guard"], "dropped_share <= 10%");
    // That rule alone: the global mode still enforces, no global guard.
    assert_eq!(rolled["dry_run"], false);
    assert!(rolled.get("guard").is_none(), "{rolled:#}");
    let rules: Value =
        serde_json::from_str(&files.cli_ok(&["rule", "ls", "--output", "json"])).unwrap();
    let rule = |cidr: &str| {
        rules["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["cidr"] == cidr)
            .cloned()
            .unwrap_or_else(|| panic!("no rule {cidr}: {rules:#}"))
    };
    assert_eq!(rule(&heavy)["dry_run"], true, "{rules:#}");
    assert_eq!(rule(&heavy)["guards"][0], "dropped_share <= 10%");
    assert_ne!(rule(&format!("{MEDIUM}/32"))["dry_run"], true);
    // Set with --save, so the rule's rollback is saved too.
    let saved = Config::load(&files.config()).expect("the saved file is valid");
    let section = saved
        .file
        .rules
        .iter()
        .find(|r| r.cidr.is_some_and(|c| c.to_string() == heavy))
        .expect("the rule in the file");
    assert_eq!(section.dry_run, Some(true));
    assert_eq!(section.guards, ["dropped_share <= 10%"]);

    let receiver = lab.receiver(PORT);
    let got = lab.exchange(&receiver, PORT, &[(HEAVY, 40), (MEDIUM, 40)], MARKER);
    assert_eq!(
        got.get(&HEAVY),
        Some(&40),
        "HEAVY's rule is dry-run: {got:?}"
    );
    let medium = got.get(&MEDIUM).copied().unwrap_or(0);
    assert!(medium <= 6, "MEDIUM's rule still enforces: {got:?}");

    assert_eq!(
        metric(&daemon, r#"xdp_limiter_guard_state{scope="rules[1]"}"#),
        3.0
    );
    assert_eq!(
        metric(
            &daemon,
            r#"xdp_limiter_guard_rollbacks_total{scope="rules[1]"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(&daemon, r#"xdp_limiter_guard_state{scope="global"}"#),
        0.0
    );
    let log = daemon.log();
    assert!(
        log.lines()
            .any(|l| l.contains("guard breached: rolled back to dry-run")
                && l.contains("scope=\"rules[1]\"")
                || l.contains("guard breached") && l.contains("scope=rules[1]")),
        "{log}"
    );
}

/// Bad guards through the CLI (and one straight to the socket): each a
/// clear error, the mode unchanged (dry-run), no guard period. Run on the
/// breach test's daemon before it enforces (a daemon start is the
/// costliest step of these tests).
fn bad_guards_change_nothing(files: &Files, daemon: &Daemon) {
    let failing = |args: &[&str], code: i32, needle: &str| {
        let out = files.cli(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    };
    failing(
        &["mode", "enforce", "--guard", "dropped_frames <= 5%"],
        2,
        "unknown guard metric \"dropped_frames\"",
    );
    failing(
        &["mode", "enforce", "--guard", "dropped_share == 5%"],
        2,
        "malformed guard",
    );
    failing(
        &["mode", "enforce", "--guard", "limited_sources <= 150%"],
        2,
        "above 100%",
    );
    failing(
        &[
            "mode",
            "enforce",
            "--guard",
            "dropped_share <= 5%",
            "--for",
            "1s",
        ],
        1,
        "outside 5s..=24h",
    );
    failing(
        &["mode", "enforce", "--for", "1m"],
        1,
        "needs at least one guard",
    );
    failing(
        &["mode", "dry-run", "--guard", "dropped_share <= 5%"],
        1,
        "cannot be given with dry-run",
    );
    failing(
        &[
            "rule",
            "set",
            &format!("{MARKER}/32"),
            "--action",
            "allow",
            "--guard",
            "dropped_share <= 5%",
        ],
        1,
        "guards watch a limit",
    );
    // The daemon checks what reaches it by other means too.
    let line = r#"{"version":1,"command":"mode","dry_run":false,"guards":["nope <= 1"]}"#;
    let reply = raw(files, line);
    assert!(
        reply["error"]
            .as_str()
            .is_some_and(|e| e.contains("unknown guard metric")),
        "{reply}"
    );
    let after = status(files);
    assert_eq!(after["dry_run"], true, "the mode did not change: {after:#}");
    assert!(after.get("guard").is_none(), "{after:#}");
    assert_eq!(
        metric(daemon, r#"xdp_limiter_guard_state{scope="global"}"#),
        0.0
    );
}

/// Sends a raw request line to the control socket; the reply as JSON.
fn raw(files: &Files, line: &str) -> Value {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(files.socket()).expect("connect");
    stream.write_all(line.as_bytes()).unwrap();
    stream.write_all(b"\n").unwrap();
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).expect("JSON reply")
}
