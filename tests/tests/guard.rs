//! Guarded enforcement against a real daemon in a netns lab with real
//! traffic. Polite sources (10.100.0.0/16, paced under the limit) are
//! known before a period begins; then a flood of new sources and one of
//! an over-limit source do not roll anything back, while the known
//! sources refused (their rate grown past the limit, or a rule set below
//! it) roll back: the global mode, or that rule alone (metrics scraped
//! over HTTP, the log's event, `status`). Light traffic lets a short
//! period pass and enforcement stays; a rule removed between two others
//! leaves their history, metrics and guard; bad guards through the CLI
//! change nothing (checked on the first test's daemon, before it
//! enforces).

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use limiter_tests::{
    daemon::{Daemon, Files},
    lab::{Lab, HEAVY, MARKER, MEDIUM, RX_ADDR, RX_IF},
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
    // The sender owns every address of 10.100.0.0/16 (a `local` route).
    lab.tx
        .ip(&["route", "add", "local", "10.100.0.0/16", "dev", "lo"]);
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

/// `n` polite sources of 10.100.`third`.0/24, from .1 on.
fn polite_sources(third: u8, n: u8) -> Vec<Ipv4Addr> {
    (1..=n).map(|k| Ipv4Addr::new(10, 100, third, k)).collect()
}

/// Sends from every source `pps` frames a second (read each round, so the
/// test can change it), paced on a 20 ms loop, until `stop`. A stalled
/// loop (the machine is shared) sends at most one frame late, never a
/// burst of the frames it missed: the senders stay polite however late
/// they run.
fn send_polite(lab: &Lab, sources: &[Ipv4Addr], pps: &AtomicU64, stop: &AtomicBool) {
    lab.tx.enter(|| {
        let sockets: Vec<UdpSocket> = sources
            .iter()
            .map(|s| UdpSocket::bind(SocketAddrV4::new(*s, 0)).expect("bind polite"))
            .collect();
        let mut due = 0.0;
        let mut last = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            due += pps.load(Ordering::Relaxed) as f64 * now.duration_since(last).as_secs_f64();
            due = due.min(1.0);
            last = now;
            while due >= 1.0 {
                for socket in &sockets {
                    let _ = socket.send_to(&[3u8; 32], SocketAddrV4::new(RX_ADDR, PORT));
                }
                due -= 1.0;
            }
            // Pacing, not synchronization.
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

/// Runs `body` while `sources` send politely, 2 frames a second each (the
/// rate `body` is handed, which it may change); the senders stop with it.
fn with_polite<R>(lab: &Lab, sources: &[Ipv4Addr], body: impl FnOnce(&AtomicU64) -> R) -> R {
    let (pps, stop) = (AtomicU64::new(2), AtomicBool::new(false));
    std::thread::scope(|scope| {
        scope.spawn(|| send_polite(lab, sources, &pps, &stop));
        let _stop = limiter_tests::SetOnDrop(&stop);
        body(&pps)
    })
}

/// Waits until the daemon knows `n` sources under `rule` (what `suggest`
/// counts over the last minute).
fn wait_known(files: &Files, rule: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = files.cli(&[
            "suggest", "--rule", rule, "--since", "1m", "--output", "json",
        ]);
        let known = serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v["rules"][0]["sources"].as_u64())
            .unwrap_or(0);
        if known >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{rule}: {known} of {n} sources known"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `judging N known sources` in a command's answer: N.
fn judging(out: &str) -> u64 {
    let (_, after) = out
        .split_once("judging ")
        .unwrap_or_else(|| panic!("{out}"));
    after
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"))
}

/// A flood of `count` new sources (10.100.100.0 on), `frames` each,
/// past the limit of 5: refused, and never known before.
fn spray_new(lab: &Lab, count: u32, frames: usize) {
    lab.tx.enter(|| {
        for k in 0..count {
            let addr = Ipv4Addr::new(10, 100, 100 + (k >> 8) as u8, k as u8);
            let socket = UdpSocket::bind(SocketAddrV4::new(addr, 0)).expect("bind spray");
            for _ in 0..frames {
                let _ = socket.send_to(&[5u8; 32], SocketAddrV4::new(RX_ADDR, PORT));
            }
        }
    });
}

#[test]
fn floods_do_not_roll_back_a_guard_and_known_sources_refused_do() {
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
    with_polite(&lab, &polite_sources(0, 40), |pps| {
        wait_known(&files, "default", 40);
        let out = files.cli_ok(&[
            "mode",
            "enforce",
            "--guard",
            "limited_sources <= 10%",
            "--guard",
            "dropped_share <= 5%",
            "--guard",
            "dropped_pps <= 10",
            "--for",
            "8s",
            "--save",
        ]);
        assert!(
            out.contains("mode enforce")
                && out.contains("guarded for 8s by limited_sources <= 10%")
                && out.contains("saved to"),
            "{out}"
        );
        assert!((40..=42).contains(&judging(&out)), "{out}");
        let saved = std::fs::read_to_string(files.config()).unwrap();
        assert!(
            saved.contains("dry_run = false") && saved.contains("guard_for = \"8s\""),
            "{saved}"
        );
        assert_eq!(
            daemon.wait_metric(r#"xdp_limiter_guard_state{scope="global"}"#, |v| v == 1.0),
            1.0
        );

        // The period under two floods: 3,000 new sources sending 8 frames
        // each (3 over the limit), and HEAVY at 20 times its limit.
        let drops = r#"xdp_limiter_rule_dropped_packets_total{interface="veth-rx",rule="default"}"#;
        let dropped_before = daemon.metric(drops).unwrap_or(0.0);
        let mut sprayed = 0;
        let passed = loop {
            spray_new(&lab, 500, 8);
            sprayed += 500;
            lab.send(HEAVY, PORT, 100, 64);
            let s = status(&files);
            if s["guard"]["state"] != "watching" {
                break s;
            }
        };
        assert!(sprayed >= 1_000, "{sprayed} new sources during the period");
        assert_eq!(passed["guard"]["state"], "passed", "{passed:#}");
        assert_eq!(passed["dry_run"], false);
        assert!(passed["guard"].get("rollback").is_none(), "{passed:#}");
        let dropped = daemon.wait_metric(drops, |v| v > dropped_before) - dropped_before;
        assert!(dropped >= 1_000.0, "the floods were dropped: {dropped}");
        assert_eq!(
            metric(
                &daemon,
                r#"xdp_limiter_guard_rollbacks_total{scope="global"}"#
            ),
            0.0
        );

        // A new period; then the known sources grow past the limit (8 a
        // second against 5): refused, they roll the mode back.
        let out = files.cli_ok(&[
            "mode",
            "enforce",
            "--guard",
            "limited_sources <= 10%",
            "--for",
            "1m",
            "--save",
        ]);
        assert!((40..=42).contains(&judging(&out)), "{out}");
        pps.store(8, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(15);
        let rolled = loop {
            let s = status(&files);
            if s["dry_run"] == true {
                break s;
            }
            assert!(Instant::now() < deadline, "no rollback: {s:#}");
            std::thread::sleep(Duration::from_millis(200));
        };
        let guard = &rolled["guard"];
        assert_eq!(guard["state"], "rolled-back", "{rolled:#}");
        assert_eq!(guard["rollback"]["guard"], "limited_sources <= 10%");
        let measured = guard["rollback"]["measured_value"].as_f64().expect("value");
        assert!(measured > 0.1 && measured <= 1.0, "{measured}");
        assert!(guard["rollback"]["at_unix_s"].as_u64().unwrap() > 1_700_000_000);
    });

    // Back in dry-run: a flood passes again.
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
            && event.contains("limited_sources <= 10%")
            && event.contains("threshold=10%"),
        "{event}"
    );
    let text = files.cli_ok(&["status"]);
    assert!(text.contains(": dry-run,"), "{text}");
    assert!(
        text.contains("guard (global): rolled-back")
            && text.contains("rolled back to dry-run")
            && text.contains("limited_sources <= 10% measured"),
        "{text}"
    );
    // Enforced with --save, so the rollback is saved too (a restart must
    // not re-enforce what just hurt); the guards wait in the file.
    let file = std::fs::read_to_string(files.config()).unwrap();
    assert!(file.contains("[limits]\ndry_run = true"), "{file}");
    assert!(file.contains("limited_sources <= 10%"), "{file}");

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
    // daemon, knowing no source yet: it takes in those read unrefused in
    // its first seconds.
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
    assert_eq!(passed["guard"]["known_sources"], 1, "MEDIUM: {passed:#}");
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

    // A reload into enforce with guards starts a new period, which
    // HEAVY's flood does not end (HEAVY was refused before it began):
    // it passes, and the file is left as its owner wrote it.
    let before = std::fs::read_to_string(files.config()).unwrap();
    assert!(files.cli_ok(&["reload"]).contains("reloaded"));
    let again = status(&files);
    assert_eq!(again["guard"]["state"], "watching", "{again:#}");
    let passed = send_until(&lab, &files, (HEAVY, 100, FLOOD_PACE), |s| {
        s["guard"]["state"] != "watching"
    });
    assert_eq!(passed["guard"]["state"], "passed", "{passed:#}");
    assert_eq!(passed["dry_run"], false);
    assert_eq!(std::fs::read_to_string(files.config()).unwrap(), before);
    assert_eq!(
        metric(
            &daemon,
            r#"xdp_limiter_guard_rollbacks_total{scope="global"}"#
        ),
        0.0
    );
}

/// Rules `a` (10.100.1.0/24), `b` (10.100.2.0/24) and `c` (10.100.3.0/24),
/// each 5 pps over 1 s, enforcing.
fn three_rules() -> String {
    let rule = |name: &str, third: u8| {
        format!("\n[[rules]]\nname = \"{name}\"\ncidr = \"10.100.{third}.0/24\"\npps = 5\nwindow = \"1s\"\n")
    };
    config(false, &(rule("a", 1) + &rule("b", 2) + &rule("c", 3)))
}

#[test]
fn a_rules_guard_rolls_back_that_rule_alone() {
    let (lab, files, daemon) = start(&three_rules());
    let mut polite = polite_sources(1, 20);
    polite.extend(polite_sources(2, 20));
    with_polite(&lab, &polite, |_| {
        wait_known(&files, "a", 20);
        wait_known(&files, "b", 20);
        // A flood from a new source in `a` and one in `b`: refused, not
        // known; they roll nothing back.
        lab.tx.enter(|| {
            for third in [1, 2] {
                let addr = Ipv4Addr::new(10, 100, third, 200);
                let socket = UdpSocket::bind(SocketAddrV4::new(addr, 0)).expect("bind");
                for _ in 0..200 {
                    let _ = socket.send_to(&[5u8; 32], SocketAddrV4::new(RX_ADDR, PORT));
                }
            }
        });
        // `a` set below its polite sources' 2 a second.
        let out = files.cli_ok(&[
            "rule",
            "set",
            "10.100.1.0/24",
            "--pps",
            "1",
            "--guard",
            "limited_sources <= 10%",
            "--for",
            "1m",
            "--save",
        ]);
        assert!(
            out.contains("a guarded for 1m by limited_sources <= 10%, judging 20 known sources")
                && out.contains("saved to"),
            "{out}"
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        let rolled = loop {
            let s = status(&files);
            if s["rule_guards"][0]["state"] != "watching" {
                break s;
            }
            assert!(Instant::now() < deadline, "no rollback: {s:#}");
            std::thread::sleep(Duration::from_millis(200));
        };
        let guard = &rolled["rule_guards"][0];
        assert_eq!(guard["state"], "rolled-back", "{rolled:#}");
        assert_eq!(guard["scope"], "a");
        assert_eq!(guard["rollback"]["guard"], "limited_sources <= 10%");
        // That rule alone: the global mode still enforces, no global guard.
        assert_eq!(rolled["dry_run"], false);
        assert!(rolled.get("guard").is_none(), "{rolled:#}");
    });
    let rules: Value =
        serde_json::from_str(&files.cli_ok(&["rule", "ls", "--output", "json"])).unwrap();
    let rule = |name: &str| {
        rules["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no rule {name}: {rules:#}"))
    };
    assert_eq!(rule("a")["dry_run"], true, "{rules:#}");
    assert_eq!(rule("a")["pps"], 1, "{rules:#}");
    assert_eq!(rule("a")["guards"][0], "limited_sources <= 10%");
    assert_ne!(rule("b")["dry_run"], true);
    // Set with --save, so the rule's rollback is saved too.
    let saved = Config::load(&files.config()).expect("the saved file is valid");
    let section = saved
        .file
        .rules
        .iter()
        .find(|r| r.name.as_deref() == Some("a"))
        .expect("the rule in the file");
    assert_eq!(section.dry_run, Some(true));
    assert_eq!(section.guards, ["limited_sources <= 10%"]);

    // `b` still enforces: a burst from one of its sources is cut; `a`'s
    // passes whole.
    let receiver = lab.receiver(PORT);
    let (a, b) = (Ipv4Addr::new(10, 100, 1, 1), Ipv4Addr::new(10, 100, 2, 1));
    let got = lab.exchange(&receiver, PORT, &[(a, 40), (b, 40)], MARKER);
    assert_eq!(got.get(&a), Some(&40), "a is dry-run: {got:?}");
    assert!(
        got.get(&b).copied().unwrap_or(0) <= 6,
        "b enforces: {got:?}"
    );
    assert_eq!(
        metric(&daemon, r#"xdp_limiter_guard_state{scope="a"}"#),
        3.0
    );
    assert_eq!(
        metric(&daemon, r#"xdp_limiter_guard_rollbacks_total{scope="a"}"#),
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
                && (l.contains("scope=\"a\"") || l.contains("scope=a"))),
        "{log}"
    );
}

#[test]
fn a_rule_removed_between_two_others_leaves_their_history_metrics_and_guard() {
    let (lab, files, daemon) = start(&three_rules());
    let mut polite = polite_sources(1, 10);
    polite.extend(polite_sources(3, 10));
    with_polite(&lab, &polite, |_| {
        wait_known(&files, "a", 10);
        wait_known(&files, "c", 10);
        // `c` guarded for long; and a burst it drops.
        let out = files.cli_ok(&[
            "rule",
            "set",
            "10.100.3.0/24",
            "--pps",
            "5",
            "--window",
            "1s",
            "--guard",
            "limited_sources <= 50%",
            "--for",
            "10m",
        ]);
        assert_eq!(judging(&out), 10, "{out}");
        lab.tx.enter(|| {
            let socket = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::new(10, 100, 3, 200), 0))
                .expect("bind");
            for _ in 0..50 {
                let _ = socket.send_to(&[5u8; 32], SocketAddrV4::new(RX_ADDR, PORT));
            }
        });
        let drops_c = r#"xdp_limiter_rule_dropped_packets_total{interface="veth-rx",rule="c"}"#;
        let dropped = daemon.wait_metric(drops_c, |v| v >= 40.0);
        let before = status(&files);
        let guard_before = before["rule_guards"][0].clone();
        assert_eq!(guard_before["scope"], "c", "{before:#}");

        // `b`, between them, goes.
        let out = files.cli_ok(&["rule", "rm", "--name", "b"]);
        assert!(out.contains("removed") && out.contains("(b)"), "{out}");
        daemon.next_pass();

        // `c`'s guard runs on, the same period (not restarted), judging
        // the same sources; its drops keep their series; both rules keep
        // their history under their names.
        let after = status(&files);
        let guard = &after["rule_guards"][0];
        assert_eq!(guard["scope"], "c", "{after:#}");
        assert_eq!(guard["state"], "watching", "{after:#}");
        assert_eq!(guard["known_sources"], guard_before["known_sources"]);
        assert!(
            guard["remaining_s"].as_u64() <= guard_before["remaining_s"].as_u64(),
            "{guard_before:#} then {guard:#}"
        );
        assert!(metric(&daemon, drops_c) >= dropped);
        assert!(
            daemon
                .metric(r#"xdp_limiter_guard_state{scope="c"}"#)
                .is_some_and(|v| v == 1.0),
            "{}",
            daemon.metrics()
        );
        for rule in ["a", "c"] {
            let answer: Value = serde_json::from_str(&files.cli_ok(&[
                "suggest", "--rule", rule, "--since", "1m", "--output", "json",
            ]))
            .unwrap();
            let sources = answer["rules"][0]["sources"].as_u64().unwrap_or(0);
            assert!(sources >= 10, "{rule}: {answer:#}");
        }
        let gone = files.cli(&["suggest", "--rule", "b"]);
        assert!(
            String::from_utf8_lossy(&gone.stderr).contains("no rule b"),
            "{gone:?}"
        );
    });
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
