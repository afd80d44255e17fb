//! A few seconds of the end-to-end benchmark's lab (`cargo xtask bench
//! e2e`): the live-frames generator paces real traffic over veth to the
//! real daemon, the sink counts what passed, and the figures the benchmark
//! reports come out right. Also: every scenario's filter installs, the
//! lab leaves nothing behind, and the service scenario (nginx, clients, a
//! SYN flood) runs and reports in a few seconds.

use std::{
    path::Path,
    sync::{atomic::AtomicBool, Mutex},
    time::Duration,
};

use limiter_bench::e2e::{
    lab::{Lab, RX_CPU, RX_IF},
    measure::{run_once, Run, Timing},
    scenario::{self, Expectation, Installed, Limit, Scenario},
    service::{self, Attach, Filter, FloodSource, FloodTool, Plan, Variant},
    traffic::{Mix, Programs, Rate},
};
use limiter_bench_common::traffic::PREFIX16_BITS;

const MIX: Mix = Mix {
    light_sources: 2_000,
    heavy_sources: 4,
    heavy_share: 0.9,
    random_share: 0.0,
    ipv6_share: 0.25,
    random_bits: 0,
};
const LIMIT: Limit = Limit {
    pps: 1000,
    burst: 1000,
};
const RATE: u64 = 100_000;

/// The two tests run one at a time: labs and daemons being set up next to
/// a measurement would disturb it.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn limiter_caps_heavy_sources_and_passes_light_ones_end_to_end() {
    let _serial = serial();
    let lab = Lab::new();
    let names = [lab.tx.name().to_string(), lab.rx.name().to_string()];
    let affinity = std::fs::read_to_string(format!("/proc/{}/status", lab.napi_pid))
        .expect("receive thread status");
    assert!(
        affinity.contains(&format!("Cpus_allowed_list:\t{RX_CPU}\n")),
        "receive thread not pinned to CPU {RX_CPU}:\n{affinity}"
    );
    let mut programs = Programs::load(&lab, &MIX);
    let installed = Scenario::XdpLimiter.install(&lab, &mut programs, LIMIT);
    programs.set_rate(Rate::Fixed(RATE));
    // Edges half a window past the flood's start: between the sliding
    // window's bursts (see docs/architecture.md).
    let timing = Timing {
        warmup: Duration::from_millis(1_500),
        measure: Duration::from_secs(2),
        idle_max: Duration::from_secs(3),
        quiet: Duration::ZERO,
    };
    let (run, attempts) = valid_run(
        &lab,
        &programs,
        &MIX,
        Scenario::XdpLimiter.expectation(),
        timing,
    );

    // The generator paces (unpaced it sends 5-7 Mpps): within 3% of the
    // rate over the time it was not stalled (a stall of its CPU, which this
    // shared machine sees, is skipped rather than made up, and on record),
    // and the receiver keeps up at this load (ring loss under 2%: the
    // receive thread can be descheduled too).
    assert!(
        run.generator_stalled < 0.3,
        "the generator was stalled {:.1}% of the time (in each of {attempts} attempts)",
        run.generator_stalled * 100.0
    );
    let paced = RATE as f64 * (1.0 - run.generator_stalled);
    assert!(
        (run.offered_pps / paced - 1.0).abs() < 0.03,
        "offered {} pps, paced at {RATE} for {:.1}% of the time",
        run.offered_pps,
        (1.0 - run.generator_stalled) * 100.0
    );
    assert!(
        run.ring_loss < 0.02,
        "ring loss {} in each of {attempts} attempts: the receive thread was starved",
        run.ring_loss
    );
    assert_eq!(run.unknown, 0, "datagrams without a stamp reached the sink");
    // Heavy sources (22,500 pps each) are capped at the limit; light ones
    // (45 pps each) all pass.
    assert!(
        run.heavy_max_error < 0.03,
        "a heavy source strayed {:.2}% from {} pps (mean {:.0})",
        run.heavy_max_error * 100.0,
        LIMIT.pps,
        run.heavy_admitted_pps
    );
    // That the limiter refused no light source is asserted exactly, from
    // its events: a refused source starts an episode, logged as "source
    // limited" (4 heavy sources' lines are far under the log's cap). The
    // sink's count is corrected for the ring's loss on average only: a
    // burst of ring loss (under 2% allowed) can land on light frames (a
    // run that lost 0.35% at the ring kept 99.896% of them), so it is held
    // to 1% here.
    let Installed::Daemon(daemon) = &installed else {
        panic!("the xdp-limiter scenario runs the daemon");
    };
    let log = daemon.0.log();
    let refused_light: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("source limited") && names_a_light_source(l))
        .collect();
    assert!(
        refused_light.is_empty(),
        "light sources refused: {refused_light:#?}"
    );
    assert!(
        !log.contains("limited_suppressed"),
        "lines held back:\n{log}"
    );
    assert!(
        log.contains("source limited"),
        "the heavy sources' episodes:\n{log}"
    );
    assert!(run.light_kept > 0.99, "light kept {}", run.light_kept);
    assert!(
        (run.passed_pps / run.expected_passed_pps - 1.0).abs() < 0.02,
        "passed {} pps, expected {}",
        run.passed_pps,
        run.expected_passed_pps
    );
    // What was offered and not expected through was dropped: within the
    // ring's loss (under 2% of what was offered) and the passed rate's
    // tolerance (2% of the expected, less than 2% of the offered).
    let expected_dropped = run.offered_pps - run.expected_passed_pps;
    assert!(
        (run.dropped_pps - expected_dropped).abs() < 0.04 * run.offered_pps,
        "dropped {} pps, expected {expected_dropped} (offered {})",
        run.dropped_pps,
        run.offered_pps
    );
    assert!(
        run.cpu_ns_per_packet > 0.0 && run.receiver_busy > 0.0 && run.receiver_busy < 1.0,
        "receiver figures: {run:?}"
    );

    drop(installed);
    drop(programs);
    drop(lab);
    for name in names {
        assert!(
            !Path::new("/run/netns").join(&name).exists(),
            "namespace {name} left behind"
        );
    }
}

#[test]
fn every_scenario_installs_its_filter() {
    let _serial = serial();
    for scenario in Scenario::known() {
        let lab = Lab::new();
        let mut programs = Programs::load(&lab, &MIX);
        let installed = scenario.install(&lab, &mut programs, LIMIT);
        let text = |program: &str, args: &[&str]| {
            String::from_utf8_lossy(&lab.rx.run(program, args).stdout).into_owned()
        };
        let xdp_attached = text("ip", &["link", "show", "dev", RX_IF]).contains("xdp");
        match scenario {
            Scenario::NoFilter => assert!(!xdp_attached),
            Scenario::XdpDropAll | Scenario::XdpCountDrop => {
                assert!(xdp_attached, "no XDP program on {RX_IF}")
            }
            Scenario::XdpLimiter | Scenario::XdpLimiterAgg16 => {
                assert!(xdp_attached, "no XDP program on {RX_IF}");
                assert!(matches!(installed, Installed::Daemon(_)));
            }
            Scenario::NftInput | Scenario::NftIngress => {
                let rules = text("nft", &["list", "ruleset"]);
                let hook = if scenario == Scenario::NftInput {
                    "hook input"
                } else {
                    "hook ingress"
                };
                assert!(
                    rules.contains(hook)
                        && rules.contains("update @m4")
                        && rules.contains("update @m6"),
                    "{scenario}: {rules}"
                );
            }
            Scenario::IptablesHashlimit => {
                for tool in ["iptables", "ip6tables"] {
                    let rules = text(tool, &["-S", "INPUT"]);
                    assert!(
                        rules.contains("--hashlimit-above 1000/sec")
                            && rules.contains("--hashlimit-mode srcip"),
                        "{tool}: {rules}"
                    );
                }
            }
        }
    }
}

/// The `random16` traffic against `xdp-limiter-agg16` in a few seconds:
/// the flood from one /16 passes at its aggregate (ten times the
/// per-source limit), though each of its sources is far under its own
/// limit, and the light sources, in another /16, keep every frame.
#[test]
fn a_slash16_flood_is_held_to_its_aggregate() {
    let _serial = serial();
    const RANDOM16: Mix = Mix {
        light_sources: 2_000,
        heavy_sources: 1,
        heavy_share: 0.04,
        random_share: 0.91,
        ipv6_share: 0.25,
        random_bits: PREFIX16_BITS,
    };
    let lab = Lab::new();
    let mut programs = Programs::load(&lab, &RANDOM16);
    let scenario = Scenario::XdpLimiterAgg16;
    let _installed = scenario.install(&lab, &mut programs, LIMIT);
    programs.set_rate(Rate::Fixed(50_000));
    let timing = Timing {
        warmup: Duration::from_millis(1_500),
        measure: Duration::from_secs(2),
        idle_max: Duration::from_secs(3),
        quiet: Duration::ZERO,
    };
    let (run, _) = valid_run(&lab, &programs, &RANDOM16, scenario.expectation(), timing);
    let aggregate = (LIMIT.pps * scenario::AGG16_FACTOR) as f64;
    // The flood offers about 45k frames a second from 65,536 addresses.
    assert!(
        (run.random_passed_pps / aggregate - 1.0).abs() < 0.05,
        "the /16 flood passed {} pps, its aggregate is {aggregate}",
        run.random_passed_pps
    );
    // Light kept is estimated from the overall ring loss (exact without
    // any): off by up to that loss on a loaded machine.
    assert!(
        run.light_kept > 0.999 - run.ring_loss,
        "light kept {} (ring loss {})",
        run.light_kept,
        run.ring_loss
    );
    assert!(
        (run.passed_pps / run.expected_passed_pps - 1.0).abs() < 0.05,
        "passed {} pps, expected {}",
        run.passed_pps,
        run.expected_passed_pps
    );
}

/// The service scenario in a few seconds: nginx in the lab, 10 clients and
/// a paced spoofed SYN flood from the generator, xdp-limiter native at 100
/// pps with a penalty (a small limit with a penalty, whose flood stays in
/// the cheap tier: 10 cheap frames per source, never counted in a window,
/// well above what the flood's one-frame sources read). The clients are all answered quickly, the flood is sent at
/// its rate and reaches the server (SYN cookies), and the daemon judged
/// the flood in its cheap tier, with (almost) no window.
#[test]
fn service_clients_are_answered_under_a_paced_syn_flood() {
    let _serial = serial();
    let plan = Plan {
        clients: 10,
        client_rate: 5.0,
        duration: Duration::from_secs(2),
        timeout: Duration::from_secs(3),
        flood_pps: 20_000,
        flood_tool: FloodTool::Generator,
        reference_pps: 100,
        flood_source: FloodSource::Random,
    };
    let filter = Filter::Limiter {
        attach: Attach::Native,
        pps: 100,
        variant: Variant::Block,
    };
    let cell = service::run_cell(filter, &plan, 1, &AtomicBool::new(false))
        .expect("the service cell runs")
        .expect("not interrupted");
    let run = &cell.runs[0];
    eprintln!("{}", cell.json());
    assert_eq!(run.scheduled, 100, "10 clients x 5/s x 2 s");
    assert!(run.success >= 0.99, "success {}: {run:?}", run.success);
    assert!(run.p99_ms < 500.0, "p99 {} ms", run.p99_ms);
    let paced = plan.flood_pps as f64 * (1.0 - run.flood_stalled);
    assert!(
        (run.flood_pps / paced - 1.0).abs() < 0.1,
        "flood {} pps, paced at {} for {:.1}% of the time",
        run.flood_pps,
        plan.flood_pps,
        (1.0 - run.flood_stalled) * 100.0
    );
    let cookies = run.tcp.get("SyncookiesSent").copied().unwrap_or(0) as f64;
    assert!(
        cookies > 0.5 * run.flood_pps * 2.0,
        "the flood's SYNs reach the listener: {:?}",
        run.tcp
    );
    let outcomes = cell.outcomes.as_ref().expect("the daemon's outcomes");
    // Spoofed sources (one frame each) stay in the cheap tier, penalty or
    // not, and take (almost) no window.
    assert!(
        outcomes.get("cheap").copied().unwrap_or(0.0) > 0.5 * plan.flood_pps as f64,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("new_window").copied().unwrap_or(0.0) < 0.01 * plan.flood_pps as f64,
        "{outcomes:?}"
    );
}

/// Whether a "source limited" line names a light source of the
/// generator (`limiter_bench_common::traffic::source_v4`/`source_v6`:
/// 10.1.0.0/16, or 2001:db8:1XX:: with the class byte 1).
fn names_a_light_source(line: &str) -> bool {
    let Some(source) = line
        .split_whitespace()
        .find_map(|word| word.strip_prefix("source="))
    else {
        return false;
    };
    let address = source.trim_matches('"').split('/').next().unwrap_or("");
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(v4)) => v4.octets()[..2] == [10, 1],
        Ok(std::net::IpAddr::V6(v6)) => {
            v6.segments()[..2] == [0x2001, 0x0db8] && v6.segments()[2] >> 8 == 1
        }
        Err(_) => false,
    }
}

/// A measurement of `mix` at `LIMIT`, and the attempts it took. It is
/// valid only if this shared machine let the generator pace and the
/// receiver keep up (the callers assert it); one taken while other work
/// starved either says nothing about the limiter, so it is taken again,
/// at most three times in all, each retry recorded (`retry`: more than
/// one in a suite run fails the suite).
fn valid_run(
    lab: &Lab,
    programs: &Programs,
    mix: &Mix,
    expectation: Expectation,
    timing: Timing,
) -> (Run, u32) {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let run = run_once(
            lab,
            programs,
            mix,
            expectation,
            LIMIT,
            timing,
            &AtomicBool::new(false),
        )
        .expect("not interrupted");
        eprintln!("attempt {attempts}: {run:#?}");
        if (run.generator_stalled < 0.3 && run.ring_loss < 0.02) || attempts == 3 {
            return (run, attempts);
        }
        limiter_tests::retry::record(
            &format!("e2e_smoke {mix:?}"),
            &format!(
                "generator stalled {:.1}%, ring loss {:.2}%",
                run.generator_stalled * 100.0,
                run.ring_loss * 100.0
            ),
        );
    }
}

#[test]
fn a_light_source_is_told_from_the_others_in_a_log_line() {
    let line = |source: &str| {
        format!("INFO source limited event=\"source_limited\" iface=\"veth-rx\" source={source} rule=\"default\"")
    };
    assert!(names_a_light_source(&line("10.1.7.9")));
    assert!(names_a_light_source(&line("2001:db8:100:7::/64")));
    assert!(!names_a_light_source(&line("10.2.0.1")));
    assert!(!names_a_light_source(&line("2001:db8:200::/64")));
    assert!(!names_a_light_source("INFO protecting iface=veth-rx"));
}
