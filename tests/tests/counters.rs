//! What the daemon exports stays true over time: every `_total` is
//! monotonic across reloads, mode changes, rule edits and sweeps, every
//! refused frame counts against exactly one rule, and a daemon protecting
//! two interfaces runs one rule generation on both and names their rules.

use std::{collections::BTreeMap, net::Ipv4Addr};

use limiter_tests::{
    daemon::{parse_metric, parse_series, Daemon, Files},
    lab::{limit_config, Lab, HEAVY, HEAVY2, MARKER, MARKER2, MEDIUM, RX2_ADDR, RX2_IF, RX_IF},
};
use serde_json::Value;

const PORT: u16 = 7100;

/// `limit_config(pps)` with `MARKER2` allowed too, and `extra` appended to
/// `[daemon]`.
fn config(pps: u64, extra: &str) -> String {
    limit_config(pps).replacen("[daemon]\n", &format!("[daemon]\n{extra}"), 1)
        + &format!("\n[[rules]]\ncidr = \"{MARKER2}/32\"\naction = \"allow\"\n")
}

/// The sum of the series of metric `name` whose labels contain all of
/// `labels`.
fn sum(scrape: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    scrape
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{name}{{")) || *k == name)
        .filter(|(k, _)| labels.iter().all(|l| k.contains(l)))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn every_total_is_monotonic_and_rule_drops_add_up_across_reloads_modes_and_sweeps() {
    // 100 spoofed sources for 64 slots of per-CPU state (and room for all
    // of their windows): sweeps see evictions. Each sends 11 frames, more
    // than half its allowance of 20: with the tiers on, that gives it
    // per-CPU state (hot).
    let spoofed: Vec<Ipv4Addr> = (10..110).map(|i| Ipv4Addr::new(192, 0, 2, i)).collect();
    let mut sources = vec![MARKER, HEAVY, MEDIUM];
    sources.extend(&spoofed);
    let lab = Lab::new(&sources);
    let files = Files::new();
    files.write_config(&config(2, "max_sources = 256\nmax_hot_sources = 64\n"));
    let config_path = files.config();
    let daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config_path.to_str().expect("utf-8")],
    );
    let receiver = lab.receiver(PORT);
    let iface = format!("interface=\"{RX_IF}\"");
    let mut previous: BTreeMap<String, f64> = BTreeMap::new();
    let actions: [&[&str]; 6] = [
        &["reload"],
        &["mode", "dry-run"],
        &["mode", "enforce"],
        &["rule", "add", "203.0.113.0/24", "--pps", "5"],
        &["rule", "rm", "203.0.113.0/24"],
        &["reload"],
    ];
    for (round, action) in actions.iter().enumerate() {
        let mut sends = vec![(HEAVY, 30), (MEDIUM, 3)];
        sends.extend(spoofed.iter().map(|s| (*s, 11)));
        lab.exchange(&receiver, PORT, &sends, MARKER);
        daemon.next_pass();
        let now = parse_series(&daemon.metrics());
        for (name, before) in &previous {
            if name.contains("_total") && !name.contains("_bucket") {
                let after = now.get(name).copied().unwrap_or(0.0);
                assert!(
                    after >= *before,
                    "round {round}: {name} went from {before} to {after}"
                );
            }
        }
        let refused: f64 = ["dropped_limit", "dropped_deny", "dry_run_would_drop"]
            .iter()
            .map(|o| {
                sum(
                    &now,
                    "xdp_limiter_packets_total",
                    &[&iface, &format!("outcome=\"{o}\"")],
                )
            })
            .sum();
        let by_rule = sum(&now, "xdp_limiter_rule_dropped_packets_total", &[&iface]);
        assert!(refused > 0.0, "round {round}: something was refused");
        assert_eq!(
            by_rule, refused,
            "round {round}: every refused frame counts against exactly one rule"
        );
        let new = sum(
            &now,
            "xdp_limiter_packets_total",
            &[&iface, "outcome=\"new_source\""],
        );
        let evicted = sum(&now, "xdp_limiter_source_evictions_total", &[&iface]);
        assert!(
            evicted <= new,
            "round {round}: {evicted} evictions of {new} sources"
        );
        // The rules gauge says how many rules are in force, whatever
        // generations came before.
        let status: Value =
            serde_json::from_str(&files.cli_ok(&["status", "--output", "json"])).expect("JSON");
        assert_eq!(
            sum(&now, "xdp_limiter_rules", &[&iface]),
            status["rules"].as_f64().expect("a count"),
            "round {round}: xdp_limiter_rules"
        );
        previous = now;
        files.cli_ok(action);
    }
    assert!(
        sum(&previous, "xdp_limiter_source_evictions_total", &[&iface]) > 0.0,
        "the sweeps saw evictions"
    );
}

#[test]
fn two_interfaces_run_one_generation_and_name_their_rules() {
    let lab = Lab::three_senders();
    lab.add_second_link();
    let files = Files::new();
    files.write_config(&config(2, ""));
    let config_path = files.config();
    let config_path = config_path.to_str().expect("utf-8");
    // An earlier daemon on the first interface only, through three
    // generations, leaves its program pinned.
    let old = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config_path, "--keep-attached"],
    );
    files.cli_ok(&["reload"]);
    files.cli_ok(&["reload"]);
    assert!(old.stop().success());

    let daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-i", RX2_IF, "-c", config_path],
    );
    let status: Value =
        serde_json::from_str(&files.cli_ok(&["status", "--output", "json"])).expect("JSON");
    assert_eq!(status["interfaces"].as_array().map(Vec::len), Some(2));
    let receivers = [
        (
            lab.receiver(PORT),
            limiter_tests::lab::RX_ADDR,
            HEAVY,
            MARKER,
            RX_IF,
        ),
        (
            lab.receiver_at(RX2_ADDR, PORT),
            RX2_ADDR,
            HEAVY2,
            MARKER2,
            RX2_IF,
        ),
    ];
    for (receiver, dst, heavy, marker, _) in &receivers {
        let got = lab.exchange_with(receiver, *dst, PORT, &[(*heavy, 30)], *marker);
        assert_eq!(got.get(heavy), Some(&20), "{heavy}: limited at 20: {got:?}");
    }
    daemon.next_pass();
    let metrics = daemon.metrics();
    for (_, _, heavy, _, iface) in &receivers {
        let series = format!(
            "xdp_limiter_rule_dropped_packets_total{{interface=\"{iface}\",rule=\"default\"}}"
        );
        assert_eq!(
            parse_metric(&metrics, &series),
            Some(10.0),
            "{iface}: the default rule's drops:\n{metrics}"
        );
        daemon.wait_log(&format!("source={heavy} rule=\"default\""));
    }
    assert!(
        !daemon.log().contains("rule=\"#"),
        "every event names its rule:\n{}",
        daemon.log()
    );
    // `limited` means some CPU is refusing the source without looking,
    // which lasts only until its window could admit again (at most a
    // bucket, 1 s here): a loaded machine can take longer than that
    // between the exchange and the view. So each round refreshes the
    // refusal (more than a window's allowance again) and reads
    // the view after a pass that saw it; the rule must be named in every
    // round, the state must reach `limited` in one of a few.
    let mut rounds = 0;
    loop {
        rounds += 1;
        for (receiver, dst, heavy, marker, _) in &receivers {
            // More than the allowance of a window: some are refused.
            let got = lab.exchange_with(receiver, *dst, PORT, &[(*heavy, 30)], *marker);
            assert!(got.get(heavy).is_none_or(|n| *n <= 20), "{heavy}: {got:?}");
        }
        daemon.next_pass();
        let top: Value =
            serde_json::from_str(&files.cli_ok(&["top", "--once", "--output", "json"]))
                .expect("JSON");
        let mut limited = true;
        for (_, _, heavy, _, iface) in &receivers {
            let row = top
                .as_array()
                .expect("rows")
                .iter()
                .find(|r| r["source"] == heavy.to_string())
                .unwrap_or_else(|| panic!("{heavy} in top: {top:#}"));
            assert_eq!(row["interface"], *iface);
            assert_eq!(row["rule"], "default", "{top:#}");
            limited &= row["state"] == "limited";
        }
        if limited {
            break;
        }
        assert!(
            rounds < 5,
            "the heavy sources never showed as limited: {top:#}"
        );
    }
}
