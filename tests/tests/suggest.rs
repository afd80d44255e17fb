//! `xdp-limiter suggest` against a real daemon on real traffic: 40
//! sources at 10 pps and 2 at 100 pps for a few seconds, paced, through a
//! veth in a lab; then the suggestion at the 0.9 quantile lands on the
//! light sources' rate and at the 0.99 quantile on the heavy ones' (times
//! the headroom), the shares of what the limits would have done agree
//! with what was sent, `--apply` leaves a dry-run rule with the proposed
//! limit, the rate histograms (sources, and the /24 level's aggregate) and
//! the limit gauge appear in a real scrape of /metrics, and every bad input is refused with nothing changed.
//!
//! With the tiers on, 1,000 polite sources at known rates and 5 flooders
//! at 100 times the polite mean: the proposal is where the polite sources
//! alone put it, within 10 %, and rests on about 1,000 sources.
//!
//! Tolerances: a light source sends 10 a second on a 10 ms pacing loop
//! that never catches up a stall with a burst (`send_steady`), so one
//! complete second holds 9 to 11 of its frames (exact buckets below 16
//! pps); a heavy one 99 to 101, read back as its bucket's upper edge (at
//! most 6.25 % above: 103 for 100). A source counts once a history slot
//! at its highest second in the slot.

use std::{
    io::{BufRead, BufReader, Write},
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    os::unix::net::UnixStream,
    time::{Duration, Instant},
};

use limiter_tests::{
    daemon::{Daemon, Files},
    lab::{Lab, RX_ADDR, RX_IF},
};
use serde_json::Value;

const PORT: u16 = 7300;
const LIGHT: usize = 40;
const LIGHT_PPS: u64 = 10;
const HEAVY: usize = 2;
const HEAVY_PPS: u64 = 100;
const SENDING: Duration = Duration::from_secs(5);

fn light(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, 10 + i as u8)
}

fn heavy(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, 200 + i as u8)
}

/// Tiers off, so that every source has per-source counters to observe
/// (with them on, these light sources would be in the cheap tier); small
/// maps, which per-CPU state makes slow to create.
const CONFIG: &str = "[daemon]\ntick = \"250ms\"\nhistory = \"10m\"\n\
    max_sources = 4096\nmax_hot_sources = 1024\n\n\
    [limits]\ntiers = false\n\n[default]\npps = 1000\nwindow = \"2s\"\ndry_run = false\n\
    levels = [\"prefix/24:100000\"]\n\n\
    [[rules]]\ncidr = \"198.18.0.0/15\"\naction = \"allow\"\n";

/// Every flow `(source, rate)` sends at its rate for `duration`, paced on
/// a 10 ms loop; a stalled loop sends at most one frame a flow late and
/// drops the rest it missed, so that no second of a flow holds more
/// than its rate and one frame, however late the sender runs (the
/// history keeps each source's highest second).
fn send_steady(lab: &Lab, flows: &[(Ipv4Addr, u64)], duration: Duration) -> Vec<u64> {
    lab.tx.enter(|| {
        let sockets: Vec<UdpSocket> = flows
            .iter()
            .map(|(source, _)| {
                UdpSocket::bind(SocketAddrV4::new(*source, 0))
                    .unwrap_or_else(|e| panic!("bind {source}: {e}"))
            })
            .collect();
        let start = Instant::now();
        let mut last = start;
        let mut due = vec![0.0f64; flows.len()];
        let mut sent = vec![0u64; flows.len()];
        while start.elapsed() < duration {
            let now = Instant::now();
            let dt = now.duration_since(last).as_secs_f64();
            last = now;
            for (k, (_, rate)) in flows.iter().enumerate() {
                due[k] = (due[k] + *rate as f64 * dt).min(*rate as f64 * 0.01 + 1.0);
                while due[k] >= 1.0 {
                    let _ = sockets[k].send_to(&[1u8; 32], SocketAddrV4::new(RX_ADDR, PORT));
                    sent[k] += 1;
                    due[k] -= 1.0;
                }
            }
            // Pacing, not synchronization.
            std::thread::sleep(Duration::from_millis(10));
        }
        sent
    })
}

/// `suggest <args> --output json`, which must succeed.
fn suggest(files: &Files, args: &[&str]) -> Value {
    let mut all = vec!["suggest"];
    all.extend(args);
    all.extend(["--output", "json"]);
    serde_json::from_str(&files.cli_ok(&all)).expect("JSON output")
}

/// `suggest <args>`, which must fail with exit status `code`: its
/// standard error.
#[track_caller]
fn refused(files: &Files, args: &[&str], code: i32) -> String {
    let mut all = vec!["suggest"];
    all.extend(args);
    let out = files.cli(&all);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    stderr
}

/// One raw request line on the control socket: the daemon's answer.
fn raw(files: &Files, line: &str) -> Value {
    let mut stream = UnixStream::connect(files.socket()).expect("connect");
    stream
        .write_all(format!("{line}\n").as_bytes())
        .expect("write");
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).expect("read");
    serde_json::from_str(&answer).expect("a JSON reply")
}

fn share(effect: &Value, key: &str) -> f64 {
    effect[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} in {effect}"))
}

/// The one rule of a suggestion answer (only `default` limits packets).
fn only_rule(answer: &Value) -> &Value {
    let rules = answer["rules"].as_array().expect("rules");
    assert_eq!(
        rules.len(),
        1,
        "only the default limits packets: {answer:#}"
    );
    assert_eq!(rules[0]["rule"], "default");
    &rules[0]
}

fn in_range(value: &Value, range: std::ops::RangeInclusive<u64>, what: &str, answer: &Value) {
    let v = value
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: {answer:#}"));
    assert!(
        range.contains(&v),
        "{what} {v} not in {range:?}: {answer:#}"
    );
}

#[test]
fn suggest_lands_where_the_distribution_of_per_source_rates_says() {
    let sources: Vec<Ipv4Addr> = (0..LIGHT).map(light).chain((0..HEAVY).map(heavy)).collect();
    let lab = Lab::new(&sources);
    let files = Files::new();
    files.write_config(CONFIG);
    let config = files.config();
    let daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
    );
    let rules_before = files.cli_ok(&["rule", "ls", "--output", "json"]);

    // Before any traffic: nothing to suggest from.
    let err = refused(&files, &[], 1);
    assert!(
        err.contains("no history yet") && err.contains("wait"),
        "{err}"
    );

    // Bad input, each refused with a message naming what is wrong.
    for (args, code, expect) in [
        (
            &["--since", "1h"][..],
            1,
            "--since 1h is outside the history",
        ),
        (
            &["--since", "0s"][..],
            1,
            "--since 0s is outside the history",
        ),
        (&["--quantile", "0"][..], 2, "0 is outside (0, 1]"),
        (&["--quantile", "1.5"][..], 2, "1.5 is outside (0, 1]"),
        (&["--headroom", "0.5"][..], 2, "0.5 is below 1"),
        (&["--rule", "web"][..], 1, "no rule web"),
        (
            &["--rule", "198.18.0.0/15"][..],
            1,
            "198.18.0.0/15 is not a `limit` rule",
        ),
    ] {
        let err = refused(&files, args, code);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
    // The daemon checks what the CLI checks, for other clients.
    for (line, expect) in [
        (
            r#"{"version":1,"command":"suggest","quantile":1.5,"headroom":2}"#,
            "--quantile 1.5 is outside (0, 1]",
        ),
        (
            r#"{"version":1,"command":"suggest","quantile":0.5,"headroom":0.5}"#,
            "--headroom 0.5 is below 1",
        ),
    ] {
        let reply = raw(&files, line);
        let error = reply["error"].as_str().unwrap_or_else(|| panic!("{reply}"));
        assert!(error.contains(expect), "{line}: {error}");
    }

    let flows: Vec<(Ipv4Addr, u64)> = (0..LIGHT)
        .map(|i| (light(i), LIGHT_PPS))
        .chain((0..HEAVY).map(|i| (heavy(i), HEAVY_PPS)))
        .collect();
    let sent = send_steady(&lab, &flows, SENDING);
    assert!(sent.iter().all(|s| *s > 0), "{sent:?}");
    daemon.next_pass();

    // 40 of 42 sources at 10 pps: the 0.9 quantile is a light one's rate.
    let answer = suggest(&files, &["--quantile", "0.9"]);
    assert_eq!(answer["since"], "10m", "the whole history by default");
    assert_eq!(answer["horizon"], "10m");
    assert_eq!(answer["sampled_share"], 1.0, "every source in the sample");
    assert_eq!(
        answer["active_sources"],
        Value::Null,
        "tiers off: no sketch"
    );
    let rule = only_rule(&answer);
    assert_eq!(rule["current_pps"], 1000);
    assert_eq!(rule["sources"], 42, "{answer:#}");
    // Each source once a 10 s slot: 42, or twice as many if the sending
    // crossed a slot's end.
    in_range(&rule["samples"], 42..=84, "samples", &answer);
    assert_eq!(rule["refused_samples"], 0, "{answer:#}");
    in_range(&rule["quantile_pps"], 9..=11, "the 0.9 quantile", &answer);
    in_range(&rule["proposed_pps"], 18..=22, "the 0.9 proposal", &answer);
    // The proposal is above the quantile: at most 10 % of samples over
    // it, the heavy ones' (2 of 42, about 5 %).
    let proposed = &rule["proposed"];
    let limited = share(proposed, "limited_sources_share");
    assert!(limited > 0.0 && limited <= 0.1, "{answer:#}");
    // Traffic over it: 2 x (100 - ~20) of 40 x 10 + 2 x 100 a second,
    // about 27 %.
    let traffic = share(proposed, "limited_traffic_share");
    assert!((0.15..=0.4).contains(&traffic), "{answer:#}");
    // The limit in force (1000) is above every source.
    assert_eq!(share(&rule["current"], "limited_sources_share"), 0.0);
    assert_eq!(share(&rule["current"], "limited_traffic_share"), 0.0);

    // The top 1 % are the heavy ones' full seconds.
    let answer = suggest(&files, &["--quantile", "0.99", "--headroom", "2"]);
    let rule = only_rule(&answer);
    in_range(
        &rule["quantile_pps"],
        90..=115,
        "the 0.99 quantile",
        &answer,
    );
    in_range(
        &rule["proposed_pps"],
        180..=230,
        "the 0.99 proposal",
        &answer,
    );
    assert_eq!(share(&rule["proposed"], "limited_sources_share"), 0.0);
    assert_eq!(share(&rule["proposed"], "limited_traffic_share"), 0.0);
    assert!(
        answer.get("applied").is_none(),
        "nothing applied without --apply"
    );

    // The text form says the same.
    let text = files.cli_ok(&["suggest", "--quantile", "0.99"]);
    let line = text
        .lines()
        .find(|l| l.starts_with("default"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(&rule["proposed_pps"].to_string()), "{text}");

    // Nothing above changed the rules.
    assert_eq!(
        files.cli_ok(&["rule", "ls", "--output", "json"]),
        rules_before
    );

    // The histogram, as Prometheus scrapes it: light sources under 20,
    // heavy ones between 50 and 200.
    let series = |le: &str| {
        format!("xdp_limiter_source_rate_pps_bucket{{interface=\"{RX_IF}\",rule=\"default\",le=\"{le}\"}}")
    };
    let metrics = daemon.metrics();
    let bucket = |le: &str| {
        limiter_tests::daemon::parse_metric(&metrics, &series(le))
            .unwrap_or_else(|| panic!("no {} in\n{metrics}", series(le)))
    };
    assert!(bucket("20") > 0.0, "{metrics}");
    assert!(bucket("200") > bucket("50"), "{metrics}");
    assert_eq!(bucket("+Inf"), bucket("1000000"));
    assert_eq!(
        limiter_tests::daemon::parse_metric(
            &metrics,
            "xdp_limiter_rule_limit_pps{rule=\"default\"}"
        ),
        Some(1000.0)
    );

    // The /24 level's aggregate (every source here: about 600 pps) in its
    // own histogram.
    let level = metrics
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "xdp_limiter_level_rate_pps_bucket{{interface=\"{RX_IF}\",level=\"prefix/24"
            )) && l.contains("rule=\"default\",le=\"1000\"}")
        })
        .unwrap_or_else(|| panic!("no level histogram in\n{metrics}"));
    let at_most_1000: f64 = level.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(at_most_1000 > 0.0, "{level}");

    // --apply: the proposal set live as a dry-run rule, the window kept.
    let answer = suggest(&files, &["--quantile", "0.99", "--apply"]);
    let proposed = only_rule(&answer)["proposed_pps"]
        .as_u64()
        .expect("a proposal");
    let applied = answer["applied"].as_str().expect("applied");
    assert!(
        applied.contains("DRY-RUN") && applied.contains(&format!("default: {proposed} pps")),
        "{applied}"
    );
    let rules = files.cli_ok(&["rule", "ls", "--output", "json"]);
    let rules: Value = serde_json::from_str(&rules).expect("JSON");
    assert_eq!(rules["default"]["pps"], proposed, "{rules:#}");
    assert_eq!(rules["default"]["dry_run"], true, "{rules:#}");
    assert_eq!(rules["default"]["window"], "2s", "{rules:#}");
    assert_eq!(
        rules["rules"][0]["action"], "allow",
        "the other rule untouched"
    );
    daemon.wait_metric("xdp_limiter_rule_limit_pps{rule=\"default\"}", |v| {
        v == proposed as f64
    });

    // The README's loop: under the global dry-run a proposal keeps the
    // rule's own flag (the mode makes it dry-run), so a guarded `mode
    // enforce` then enforces it under its guards.
    files.cli_ok(&["default", "set", "--pps", "1000", "--window", "2s"]);
    files.cli_ok(&["mode", "dry-run"]);
    let answer = suggest(&files, &["--quantile", "0.9", "--apply"]);
    let proposed = only_rule(&answer)["proposed_pps"]
        .as_u64()
        .expect("a proposal");
    let applied = answer["applied"].as_str().expect("applied");
    assert!(
        applied.contains("as the whole daemon is") && applied.contains("mode enforce"),
        "{applied}"
    );
    let rules: Value =
        serde_json::from_str(&files.cli_ok(&["rule", "ls", "--output", "json"])).expect("JSON");
    assert_eq!(rules["default"]["pps"], proposed, "{rules:#}");
    assert_eq!(
        rules["default"]["dry_run"], false,
        "the rule keeps its own flag under the global dry-run: {rules:#}"
    );
    files.cli_ok(&[
        "mode",
        "enforce",
        "--guard",
        "dropped_share <= 50%",
        "--for",
        "10m",
    ]);
    let status: Value =
        serde_json::from_str(&files.cli_ok(&["status", "--output", "json"])).expect("JSON");
    assert_eq!(status["dry_run"], false, "{status:#}");
    assert_eq!(status["guard"]["state"], "watching", "{status:#}");
    daemon.wait_metric("xdp_limiter_guard_state{scope=\"global\"}", |v| v == 1.0);
}

/// `n` addresses of 10.100.0.0/16, from 10.100.0.1 on.
fn spread(n: usize) -> Vec<Ipv4Addr> {
    (1..=n as u32)
        .map(|k| Ipv4Addr::new(10, 100, (k >> 8) as u8, k as u8))
        .collect()
}

/// The sender's namespace owns every address of 10.100.0.0/16 (a `local`
/// route): a socket binds to any of them.
fn lab_with_spread() -> Lab {
    let lab = Lab::new(&[Ipv4Addr::new(192, 0, 2, 250)]);
    lab.tx
        .ip(&["route", "add", "local", "10.100.0.0/16", "dev", "lo"]);
    lab
}

#[test]
fn flooders_do_not_steer_suggest_and_it_sees_the_sources_with_windows_tiers_on() {
    // 1,000 sockets and the daemon's: room above the usual 1,024.
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, hard.min(65_536), hard).expect("setrlimit");

    const POLITE: usize = 1_000;
    const FLOODERS: usize = 5;
    let addrs = spread(POLITE + FLOODERS);
    // Polite source i sends 10 + i mod 21 a second (10 to 30, mean 20): each
    // leaves the cheap tier (16 frames over two seconds) and is judged on
    // its window alone, never hot. A flooder sends 100 times the mean, over
    // the limit, and is refused.
    let polite: Vec<(Ipv4Addr, u64)> = (0..POLITE)
        .map(|i| (addrs[i], 10 + (i % 21) as u64))
        .collect();
    let mut all = polite.clone();
    all.extend(addrs[POLITE..].iter().map(|a| (*a, 2_000)));
    let lab = lab_with_spread();
    let files = Files::new();
    files.write_config(
        "[daemon]\ntick = \"100ms\"\nhistory = \"1m\"\n\n\
         [default]\npps = 1000\nwindow = \"1s\"\ndry_run = false\n",
    );
    let config = files.config();
    let daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
    );
    // The last 3 one-second slots of each phase: after its first second,
    // when every polite source has left the cheap tier.
    let ask = ["--quantile", "0.999", "--since", "3s"];

    send_steady(&lab, &polite, Duration::from_secs(4));
    let alone = suggest(&files, &ask);
    let rule = only_rule(&alone);
    // The 30 pps sources' highest second: 29 to 31 frames (a steady 10 ms
    // loop never sends more than one frame late), read as its bucket's
    // upper edge (31 for 30 or 31; 29 for 29), twice: 58 to 62, and an
    // admitted rate a window reads a frame off either way: 28 to 32 (33 at
    // the upper edge).
    in_range(
        &rule["quantile_pps"],
        29..=35,
        "the polite quantile",
        &alone,
    );
    in_range(
        &rule["proposed_pps"],
        58..=70,
        "the polite proposal",
        &alone,
    );
    in_range(&rule["sources"], 950..=1_000, "sources known", &alone);
    assert_eq!(rule["refused_samples"], 0, "{alone:#}");
    assert_eq!(alone["sampled_share"], 1.0, "{alone:#}");
    let active = alone["active_sources"]
        .as_u64()
        .expect("tiers on: an estimate");
    assert!(active >= 900, "{alone:#}");
    let polite_proposal = rule["proposed_pps"].as_u64().unwrap() as f64;

    send_steady(&lab, &all, Duration::from_secs(4));
    let flooded = suggest(&files, &ask);
    let rule = only_rule(&flooded);
    let proposal = rule["proposed_pps"].as_u64().expect("a proposal") as f64;
    assert!(
        (proposal - polite_proposal).abs() <= 0.1 * polite_proposal,
        "flooded {proposal} vs polite alone {polite_proposal}: {flooded:#}"
    );
    // The flooders are counted apart, at their offered rate.
    in_range(
        &rule["refused_samples"],
        1..=u64::MAX,
        "refused samples",
        &flooded,
    );
    in_range(
        &rule["refused_max_pps"],
        1_500..=u64::MAX,
        "refused rate",
        &flooded,
    );
    let text = files.cli_ok(&["suggest", "--quantile", "0.999", "--since", "3s"]);
    assert!(
        text.contains("samples of sources refused by the limit in force"),
        "{text}"
    );
    // The sample, in a real scrape: every source, one in one.
    assert!(daemon
        .metric("xdp_limiter_known_sources")
        .is_some_and(|n| n >= 1_000.0));
    assert_eq!(daemon.metric("xdp_limiter_known_sample_one_in"), Some(1.0));
}
