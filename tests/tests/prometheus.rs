//! The shipped dashboard and alert rules checked against the real thing:
//!
//! - `promtool check rules` and `promtool test rules` on
//!   `dist/prometheus/alerts.yml` and its unit tests (each alert fires on
//!   synthetic series when it should and not otherwise), and proof that
//!   they bite: a broken expression is refused, a wrong threshold or a
//!   lost `for:` fails the unit tests;
//! - a real daemon under real traffic in a one-node cluster lab (a real
//!   `redis-server`, a `limit` rule with a level and a guard that rolls it
//!   back, guarded enforcement of the whole daemon, a flood over the
//!   default limit), scraped every second by a real Prometheus in the daemon's
//!   namespace, which evaluates every PromQL expression of
//!   `dist/grafana/xdp-limiter.json` (each panel's targets and each
//!   template variable's query) and every alert rule: each query returns
//!   data with the labels its legend names, each rule evaluates without
//!   error, and the alerts the lab's state calls for (the rollback firing,
//!   the drop share pending) and no others are active.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use limiter_tests::{
    cluster_lab::{node_addr, node_config, node_if, ClusterLab, SINK_PORT, SOURCE},
    prometheus::{promtool, rules_dir, Prometheus},
    wait_until,
};
use serde_json::Value;

/// The scrape job the alert rules select (`up{job="xdp-limiter"}`).
const JOB: &str = "xdp-limiter";
/// The daemon's metrics address in its namespace (the default).
const TARGET: &str = "127.0.0.1:9470";
/// What `$__rate_interval` and `$__interval` stand for: five scrapes.
const RANGE: &str = "5s";

fn dashboard_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/grafana/xdp-limiter.json")
}

fn dashboard() -> Value {
    let text = fs::read_to_string(dashboard_path()).expect("read the dashboard");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every panel, those inside rows too.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        all.push(panel);
        if let Some(inner) = panel["panels"].as_array() {
            all.extend(inner);
        }
    }
    all
}

/// One query of a panel: where it is, its expression, and the labels its
/// legend names (`{{interface}} {{outcome}}`).
struct Target {
    panel: String,
    expr: String,
    legend: Vec<String>,
}

fn targets(dashboard: &Value) -> Vec<Target> {
    panels(dashboard)
        .into_iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or("?").to_string();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |target| Target {
                    panel: format!("{title} [{}]", target["refId"].as_str().unwrap_or("?")),
                    expr: target["expr"]
                        .as_str()
                        .expect("a target's expr")
                        .to_string(),
                    legend: legend_labels(target["legendFormat"].as_str().unwrap_or("")),
                })
        })
        .collect()
}

/// The labels a Grafana legend format names (`{{ name }}`).
fn legend_labels(legend: &str) -> Vec<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|part| part.split_once("}}"))
        .map(|(name, _)| name.trim().to_string())
        .collect()
}

/// `expr` with Grafana's variables replaced: the range ones by [`RANGE`],
/// the template ones by `values` (`name` -> regex).
fn substitute(expr: &str, values: &[(&str, &str)]) -> String {
    let mut expr = expr
        .replace("$__rate_interval", RANGE)
        .replace("${__rate_interval}", RANGE)
        .replace("$__interval", RANGE)
        .replace("$__range", RANGE);
    for (name, value) in values {
        expr = expr
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    assert!(
        !expr.contains('$'),
        "a variable the test does not know is left in {expr}"
    );
    expr
}

/// A template variable's `label_values(SELECTOR, LABEL)`, as PromQL that
/// returns one series per value: `group by (LABEL) (SELECTOR)`.
fn label_values_query(query: &str) -> (String, String) {
    let inner = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values query: {query}"));
    let (selector, label) = inner
        .rsplit_once(',')
        .unwrap_or_else(|| panic!("label_values without a label: {query}"));
    let label = label.trim().to_string();
    (format!("group by ({label}) ({})", selector.trim()), label)
}

/// The alert rules `alerts.yml` defines (its `- alert:` lines).
fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_string())
        .collect()
}

fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn promtool_checks_the_alert_rules_and_their_unit_tests_pass() {
    let dir = rules_dir();
    let rules = fs::read_to_string(dir.join("alerts.yml")).expect("read alerts.yml");
    let names = alert_names(&rules);
    for wanted in [
        "XdpLimiterDown",
        "XdpLimiterMetricsAbsent",
        "XdpLimiterSourceMapNearlyFull",
        "XdpLimiterWindowsNearlyFull",
        "XdpLimiterInsertFailures",
        "XdpLimiterHighDropShare",
        "XdpLimiterGuardRolledBack",
        "XdpLimiterClusterDegraded",
        "XdpLimiterAggregationOverrunning",
        "XdpLimiterCrowdsecUnreachable",
        "XdpLimiterRuleRoomFull",
        "XdpLimiterPrefixRoomFull",
        "XdpLimiterProvenRoomFull",
        "XdpLimiterSynCookieShieldUp",
    ] {
        assert!(
            names.iter().any(|n| n == wanted),
            "{wanted} missing: {names:?}"
        );
    }
    let check = promtool(&dir, &["check", "rules", "alerts.yml"]);
    let text = output_text(&check);
    assert!(
        check.status.success(),
        "promtool check rules failed:\n{text}"
    );
    assert!(
        text.contains(&format!("SUCCESS: {} rules found", names.len())),
        "{text}"
    );
    let test = promtool(&dir, &["test", "rules", "alerts.test.yml"]);
    let text = output_text(&test);
    assert!(test.status.success(), "promtool test rules failed:\n{text}");
    assert!(text.contains("SUCCESS"), "{text}");
    // Every alert has a unit test that expects it to fire.
    let tests = fs::read_to_string(dir.join("alerts.test.yml")).expect("read alerts.test.yml");
    for name in &names {
        assert!(
            tests.contains(&format!(
                "alertname: {name}\n        exp_alerts:\n          - "
            )),
            "no unit test of {name} firing"
        );
    }
}

/// A scratch copy of `dist/prometheus` with `alerts.yml` edited by `edit`.
fn edited_rules(tag: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xlt-rules-{tag}-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("scratch dir");
    let src = rules_dir();
    let rules = fs::read_to_string(src.join("alerts.yml")).expect("read alerts.yml");
    let edited = edit(&rules);
    assert_ne!(edited, rules, "the edit changed nothing");
    fs::write(dir.join("alerts.yml"), edited).expect("write alerts.yml");
    fs::copy(src.join("alerts.test.yml"), dir.join("alerts.test.yml")).expect("copy tests");
    dir
}

#[test]
fn a_broken_rule_is_refused_and_a_wrong_threshold_or_lost_for_fails_the_unit_tests() {
    // An expression cut short: `check rules` refuses it, naming the alert.
    let dir = edited_rules("broken", |r| {
        r.replacen(
            "expr: xdp_limiter_cluster_degraded == 1",
            "expr: xdp_limiter_cluster_degraded == (1",
            1,
        )
    });
    let out = promtool(&dir, &["check", "rules", "alerts.yml"]);
    let text = output_text(&out);
    assert!(!out.status.success(), "a broken expression passed:\n{text}");
    assert!(text.contains("XdpLimiterClusterDegraded"), "{text}");
    assert!(text.contains("parse error"), "{text}");
    fs::remove_dir_all(&dir).ok();

    // A drop-share threshold of 75%: the 50% case no longer fires.
    let dir = edited_rules("threshold", |r| r.replacen("> 0.25", "> 0.75", 1));
    let out = promtool(&dir, &["check", "rules", "alerts.yml"]);
    assert!(out.status.success(), "{}", output_text(&out));
    let out = promtool(&dir, &["test", "rules", "alerts.test.yml"]);
    let text = output_text(&out);
    assert!(!out.status.success(), "the unit tests missed it:\n{text}");
    assert!(text.contains("XdpLimiterHighDropShare"), "{text}");
    assert!(!text.contains("XdpLimiterWindowsNearlyFull"), "{text}");
    fs::remove_dir_all(&dir).ok();

    // The source map alert without its `for:`: it fires at once, where the
    // unit tests expect it pending.
    let dir = edited_rules("for", |r| {
        r.replacen(
            "expr: xdp_limiter_tracked_sources / xdp_limiter_source_capacity > 0.9\n        for: 10m\n",
            "expr: xdp_limiter_tracked_sources / xdp_limiter_source_capacity > 0.9\n",
            1,
        )
    });
    let out = promtool(&dir, &["test", "rules", "alerts.test.yml"]);
    let text = output_text(&out);
    assert!(!out.status.success(), "the unit tests missed it:\n{text}");
    assert!(text.contains("XdpLimiterSourceMapNearlyFull"), "{text}");
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_dashboard_is_templated_on_instance_and_interface_and_every_panel_queries_prometheus() {
    let dashboard = dashboard();
    assert!(dashboard["schemaVersion"].as_u64().unwrap_or(0) >= 36);
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for wanted in ["datasource", "instance", "interface"] {
        assert!(variables.contains(&wanted), "{wanted}: {variables:?}");
    }
    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(panel["id"].as_u64().expect("id")),
            "duplicate id: {title}"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            let expr = target["expr"].as_str().expect("expr");
            assert!(!expr.trim().is_empty(), "{title}");
        }
    }
    // The panels the issue names, each present.
    let exprs: Vec<Target> = targets(&dashboard);
    for metric in [
        "xdp_limiter_packets_total",
        "xdp_limiter_limited_sources",
        "xdp_limiter_rule_dropped_packets_total",
        "xdp_limiter_level_dropped_packets_total",
        "xdp_limiter_source_rate_pps_bucket",
        "xdp_limiter_rule_limit_pps",
        "xdp_limiter_tracked_sources",
        "xdp_limiter_windows_kept",
        "xdp_limiter_source_evictions_total",
        "xdp_limiter_program_run_time_nanoseconds_total",
        "xdp_limiter_aggregation_duration_seconds_bucket",
        "xdp_limiter_cluster_degraded",
        "xdp_limiter_cluster_nodes_alive",
        "xdp_limiter_guard_state",
        "xdp_limiter_guard_rollbacks_total",
    ] {
        assert!(
            exprs.iter().any(|t| t.expr.contains(metric)),
            "no panel queries {metric}"
        );
    }
}

/// Sets `kernel.bpf_stats_enabled` (the program's run time and count, for
/// the run time panel) for the test's length, and restores it.
struct BpfStats(String);

impl BpfStats {
    const PATH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";

    fn enable() -> Self {
        let before = fs::read_to_string(Self::PATH).expect("read bpf_stats_enabled");
        fs::write(Self::PATH, "1").expect("enable bpf stats");
        Self(before.trim().to_string())
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write(Self::PATH, &self.0);
    }
}

/// The polite sources' rule (and its name).
const POLITE: &str = "10.100.2.0/24";

/// The lab's daemon: the default rule cluster-scoped at 100 pps (the
/// flood's source goes over it), a node rule for the light sources'
/// prefix at 50 pps per source with a level of 200 pps per /24 (ten
/// sources at 40 pps fill it; one source at 80 pps goes over its own
/// limit), and one for ten polite sources at 10 pps in 10.100.2.0/24.
/// Once the daemon knows the polite ones, their rule is set to 5 pps
/// guarded by `limited_sources <= 0` (`lower_the_polite_rule`): they are
/// refused, and roll it back to dry-run (a real rollback for the
/// dashboard's guard panels and the rollback alert).
fn config() -> String {
    format!(
        "{}\n[[rules]]\ncidr = \"10.100.0.0/16\"\npps = 50\nwindow = \"1s\"\n\
         levels = [\"prefix/24:200\"]\n\n\
         [[rules]]\ncidr = \"10.100.2.0/24\"\npps = 50\nwindow = \"1s\"\n",
        node_config(0, 100, "1s", "100ms", "")
    )
}

/// Flows of the lab: `(source, datagrams per second)`.
fn flows() -> Vec<(std::net::Ipv4Addr, u64)> {
    let mut flows = vec![(SOURCE, 500), (std::net::Ipv4Addr::new(10, 100, 1, 1), 80)];
    flows.extend((1..=10).map(|k| (std::net::Ipv4Addr::new(10, 100, 0, k), 40)));
    flows.extend((1..=10).map(|k| (std::net::Ipv4Addr::new(10, 100, 2, k), 10)));
    flows
}

/// Once the daemon knows the polite rule's 10 sources, sets it below
/// their rate under a guard that their refusal breaches.
fn lower_the_polite_rule(lab: &ClusterLab) {
    let files = &lab.nodes[0].files;
    let known = wait_until(Duration::from_secs(20), Duration::from_millis(250), || {
        let out = files.cli(&[
            "suggest", "--rule", POLITE, "--since", "1m", "--output", "json",
        ]);
        serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v["rules"][0]["sources"].as_u64())
            .filter(|n| *n >= 10)
    });
    assert!(
        known.is_some(),
        "the polite rule's sources never became known"
    );
    let out = files.cli_ok(&[
        "rule",
        "set",
        POLITE,
        "--pps",
        "5",
        "--window",
        "1s",
        "--guard",
        "limited_sources <= 0",
        "--for",
        "10m",
    ]);
    assert!(out.contains("judging 10 known sources"), "{out}");
    // The rollback, seen by the daemon itself before Prometheus is asked.
    let rolled = wait_until(Duration::from_secs(20), Duration::from_millis(250), || {
        let status: Value =
            serde_json::from_str(&files.cli_ok(&["status", "--output", "json"])).ok()?;
        (status["rule_guards"][0]["state"] == "rolled-back").then_some(())
    });
    if rolled.is_none() {
        let log = lab.daemon(0).log();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "{out}\nno rollback: {}\n{}",
            files.cli_ok(&["status", "--output", "json"]),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

/// Sends `flows` to node 0 until `stop`, paced in 10 ms slices.
fn traffic(lab: &ClusterLab, stop: &AtomicBool) {
    lab.traffic.enter(|| {
        let flows = flows();
        let sockets: Vec<std::net::UdpSocket> = flows
            .iter()
            .map(|(source, _)| {
                std::net::UdpSocket::bind((*source, 0))
                    .unwrap_or_else(|e| panic!("bind {source}: {e}"))
            })
            .collect();
        let start = Instant::now();
        let mut sent = vec![0u64; flows.len()];
        let to = std::net::SocketAddrV4::new(node_addr(0), SINK_PORT);
        while !stop.load(Ordering::Relaxed) {
            let elapsed = start.elapsed().as_secs_f64();
            for (k, (_, rate)) in flows.iter().enumerate() {
                while sent[k] < (*rate as f64 * elapsed) as u64 {
                    let _ = sockets[k].send_to(&[3u8; 32], to);
                    sent[k] += 1;
                }
            }
            // Pacing, not synchronization.
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

#[test]
fn every_dashboard_query_and_alert_rule_evaluates_on_a_real_prometheus_scraping_a_daemon() {
    let started = Instant::now();
    let _stats = BpfStats::enable();
    let mut lab = ClusterLab::new(1);
    lab.start_daemons(|_| config());
    lab.daemon(0)
        .wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == 1.0);
    // Guarded enforcement of the whole daemon, by a guard the lab's
    // traffic keeps (a handful of sources limited): watching throughout.
    lab.nodes[0].files.cli_ok(&[
        "mode",
        "enforce",
        "--guard",
        "limited_sources <= 1000",
        "--for",
        "10m",
    ]);
    eprintln!("lab and daemon up after {:?}", started.elapsed());
    let rules = rules_dir().join("alerts.yml");
    // The Prometheus part (the "under 60 s") from here: a lab
    // and a BPF load on a loaded machine take what they take.
    let prometheus_started = Instant::now();
    let prometheus = Prometheus::start(&lab.nodes[0].ns, JOB, &[TARGET], &[&rules]);
    let stop = AtomicBool::new(false);
    let (failures, alert_states) = std::thread::scope(|scope| {
        let flood = scope.spawn(|| traffic(&lab, &stop));
        let _stop = limiter_tests::SetOnDrop(&stop);
        lower_the_polite_rule(&lab);
        let result = evaluate(&prometheus);
        stop.store(true, Ordering::Relaxed);
        flood.join().expect("traffic");
        result
    });
    assert!(
        failures.is_empty(),
        "{} queries failed:\n{}\nPrometheus log:\n{}",
        failures.len(),
        failures.join("\n"),
        prometheus.log()
    );
    // The polite rule's guard rolled it back: that alert fires, for that
    // scope only. Nothing else fires; the drop share (the flood's source
    // loses 4/5 of its frames, about 40% of all) is over 25%, so that
    // alert is pending its 15 minutes: its expression matched the
    // daemon's real series.
    for (name, state) in &alert_states {
        let expected = match name.as_str() {
            "XdpLimiterGuardRolledBack" => "firing",
            "XdpLimiterHighDropShare" => "pending",
            _ => "inactive",
        };
        assert_eq!(state, expected, "{name}: {alert_states:?}");
    }
    let firing = prometheus
        .vector("ALERTS{alertstate=\"firing\"}")
        .expect("ALERTS");
    let scopes: Vec<_> = firing
        .iter()
        .map(|(labels, _)| (labels["alertname"].clone(), labels["scope"].clone()))
        .collect();
    assert_eq!(
        scopes,
        [(
            Value::from("XdpLimiterGuardRolledBack"),
            Value::from(POLITE)
        )],
        "{firing:?}"
    );
    drop(prometheus);
    assert!(
        prometheus_started.elapsed() < Duration::from_secs(60),
        "the Prometheus part took {:?}",
        prometheus_started.elapsed()
    );
}

/// Waits until Prometheus holds enough of the lab's traffic, then
/// evaluates the dashboard's variables and targets and the alert rules;
/// returns what failed, and each alert's state.
fn evaluate(prometheus: &Prometheus) -> (Vec<String>, Vec<(String, String)>) {
    // Enough scrapes for every rate over RANGE, and traffic in them:
    // drops per rule and per level, sources limited, a cluster sync.
    let ready = [
        format!("count_over_time(up{{job=\"{JOB}\"}}[1m]) >= 8"),
        format!("sum(increase(xdp_limiter_rule_dropped_packets_total{{rule=\"default\"}}[{RANGE}])) > 0"),
        format!("sum(increase(xdp_limiter_level_dropped_packets_total[{RANGE}])) > 0"),
        format!("sum(increase(xdp_limiter_program_runs_total[{RANGE}])) > 0"),
        "xdp_limiter_limited_sources > 0".to_string(),
        "xdp_limiter_windows_kept".to_string(),
        format!("xdp_limiter_cluster_nodes_alive{{job=\"{JOB}\"}} == 1"),
        "xdp_limiter_guard_state{scope=\"global\"} == 1".to_string(),
        format!("xdp_limiter_guard_state{{scope=\"{POLITE}\"}} == 3"),
        format!("xdp_limiter_guard_rollbacks_total{{scope=\"{POLITE}\"}} == 1"),
    ];
    let t0 = Instant::now();
    let waited = wait_until(Duration::from_secs(30), Duration::from_millis(250), || {
        ready
            .iter()
            .all(|q| prometheus.vector(q).is_ok_and(|v| !v.is_empty()))
            .then_some(())
    });
    if waited.is_none() {
        let missing: Vec<&String> = ready
            .iter()
            .filter(|q| !prometheus.vector(q).is_ok_and(|v| !v.is_empty()))
            .collect();
        panic!(
            "Prometheus never saw the lab's traffic: {missing:?}\n{}",
            prometheus.log()
        );
    }

    eprintln!("Prometheus saw the traffic after {:?}", t0.elapsed());
    let dashboard = dashboard();
    let mut failures = Vec::new();
    // The template variables, with every other variable at "all" (`.*`):
    // each lists the lab's values.
    let mut chosen: Vec<(String, String)> = Vec::new();
    let all: Vec<(&str, &str)> = vec![("instance", ".*"), ("interface", ".*"), ("rule", ".*")];
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if variable["type"] != "query" {
            continue;
        }
        let name = variable["name"].as_str().expect("name");
        let query = variable["query"]["query"]
            .as_str()
            .or_else(|| variable["query"].as_str())
            .expect("a variable's query");
        let (expr, label) = label_values_query(&substitute(query, &all));
        let values: BTreeSet<String> = match prometheus.vector(&expr) {
            Ok(series) => series
                .iter()
                .filter_map(|(labels, _)| labels.get(&label)?.as_str().map(String::from))
                .collect(),
            Err(e) => {
                failures.push(format!("variable {name}: {expr}: {e}"));
                continue;
            }
        };
        let expected: &[&str] = match name {
            "instance" => &[TARGET],
            "interface" => &["veth-n0"],
            "rule" => &["default", "10.100.0.0/16", POLITE],
            _ => &[],
        };
        for value in expected {
            if !values.contains(*value) {
                failures.push(format!(
                    "variable {name}: {expr}: {value} not in {values:?}"
                ));
            }
        }
        if values.is_empty() {
            failures.push(format!("variable {name}: {expr}: no values"));
        }
        if name != "rule" {
            // The real value the variable offers (the rule panels repeat
            // per rule; all of them at once is `.*`).
            chosen.push((
                name.to_string(),
                values.into_iter().next().unwrap_or_default(),
            ));
        }
    }
    assert_eq!(node_if(0), "veth-n0");
    let mut values: Vec<(&str, &str)> = chosen
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    values.push(("rule", ".*"));

    // Every target of every panel: data, a number in it, and each label
    // its legend names on every series.
    for target in targets(&dashboard) {
        let expr = substitute(&target.expr, &values);
        match prometheus.vector(&expr) {
            Err(e) => failures.push(format!("{}: {expr}: {e}", target.panel)),
            Ok(series) if series.is_empty() => {
                failures.push(format!("{}: {expr}: no data", target.panel))
            }
            Ok(series) => {
                if !series.iter().any(|(_, v)| v.is_finite()) {
                    failures.push(format!("{}: {expr}: only NaN: {series:?}", target.panel));
                }
                for (labels, _) in &series {
                    for label in &target.legend {
                        if !labels.contains_key(label) {
                            failures.push(format!(
                                "{}: {expr}: series without `{label}` (legend): {labels:?}",
                                target.panel
                            ));
                        }
                    }
                }
            }
        }
    }

    // The alert rules, as Prometheus loaded them: all of them, each
    // evaluated (every second) without error, and each expression again
    // through the query API.
    let file = fs::read_to_string(rules_dir().join("alerts.yml")).expect("read alerts.yml");
    let names = alert_names(&file);
    let loaded = |prometheus: &Prometheus| -> Vec<Value> {
        prometheus
            .api("rules", &[("type", "alert")])
            .map(|data| {
                data["groups"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default()
    };
    // Evaluated again after the traffic's data was in: each rule's
    // last evaluation differs from the one it had now.
    let before: Vec<Value> = loaded(prometheus)
        .iter()
        .map(|r| r["lastEvaluation"].clone())
        .collect();
    let evaluated = wait_until(Duration::from_secs(10), Duration::from_millis(250), || {
        let rules = loaded(prometheus);
        (rules.len() == names.len()
            && before.len() == names.len()
            && rules
                .iter()
                .zip(&before)
                .all(|(r, b)| r["lastEvaluation"] != *b))
        .then_some(rules)
    });
    let Some(rules) = evaluated else {
        failures.push(format!(
            "Prometheus did not load and evaluate the {} alerts: {:?}",
            names.len(),
            loaded(prometheus)
        ));
        return (failures, Vec::new());
    };
    eprintln!("alerts evaluated after {:?}", t0.elapsed());
    let mut states = Vec::new();
    for rule in &rules {
        let name = rule["name"].as_str().unwrap_or("?").to_string();
        if rule["health"] != "ok" {
            failures.push(format!(
                "alert {name}: health {} ({})",
                rule["health"], rule["lastError"]
            ));
        }
        let query = rule["query"].as_str().unwrap_or_default();
        if let Err(e) = prometheus.vector(query) {
            failures.push(format!("alert {name}: {query}: {e}"));
        }
        states.push((name, rule["state"].as_str().unwrap_or("?").to_string()));
    }
    (failures, states)
}
