//! Unit tests of the configuration: defaults, a full file, every kind of
//! bad value named, the shipped example and systemd unit, round trips.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use super::*;
use crate::rules::PROTO_UDP;

#[test]
fn no_file_means_a_dry_run_default_rule() {
    let config = Config::builtin();
    assert_eq!(config.rules.default.limits.pps, Some(DEFAULT_PPS));
    assert!(config.rules.default.dry_run, "a first run never drops");
    assert!(!config.rules.dry_run);
    assert_eq!(config.daemon.metrics_addr.to_string(), DEFAULT_METRICS_ADDR);
    assert_eq!(config.daemon.pin_dir, PathBuf::from(DEFAULT_PIN_DIR));
    assert_eq!(
        Config::parse("", "empty").unwrap(),
        config,
        "an empty file is the built-in"
    );
}

#[test]
fn a_full_file_parses() {
    let text = r#"
        [daemon]
        interfaces = ["eth0"]
        mode = "native"
        tick = "500ms"
        keep_attached = true

        [limits]
        ipv6_prefix = 56
        buckets_per_window = 12

        [default]
        pps = 500
        dry_run = false

        [[rules]]
        cidr = "10.0.0.0/8"
        action = "allow"

        [[rules]]
        cidr = "0.0.0.0/0"
        protocol = "udp"
        ports = "53"
        pps = 50
        burst_packets = 10
        window = "10s"
        block = "1m"

        [[rules]]
        cidr = "2001:db8::/32"
        protocol = "tcp"
        tcp_syn = true
        bytes_per_second = 100000
    "#;
    let config = Config::parse(text, "test.toml").unwrap();
    assert_eq!(config.daemon.mode, AttachMode::Native);
    assert_eq!(config.daemon.tick, Duration::from_millis(500));
    assert_eq!(config.rules.v6_prefix_len, 56);
    assert_eq!(config.rules.default.limits.pps, Some(500));
    assert!(!config.rules.default.dry_run);
    let dns = &config.rules.rules[1];
    assert_eq!(dns.matches.ports, Some((53, 53)));
    assert_eq!(dns.matches.protocol, Some(PROTO_UDP));
    assert_eq!(dns.limits.block, Some(Duration::from_secs(60)));
    assert!(config.rules.rules[2].matches.tcp_syn);
}

#[track_caller]
fn rejected(text: &str, expect: &str) {
    let err = Config::parse(text, "bad.toml")
        .expect_err("must be rejected")
        .to_string();
    assert!(
        err.contains(expect),
        "error {err:?} does not mention {expect:?}"
    );
}

#[test]
fn bad_files_are_rejected_with_the_field_and_value_named() {
    rejected("[default]\npps = \"fast\"", "pps");
    rejected("[default]\npps = -5", "pps");
    rejected("[daemon]\ncolour = 1", "colour");
    rejected("[[rules]]\npps = 5", "rules[0].cidr: missing");
    rejected("[[rules]]\ncidr = \"10.0.0.0/33\"", "cidr");
    rejected(
        "[[rules]]\ncidr = \"10.0.0.0/8\"\nprotocol = \"tcpp\"\npps = 1",
        "rules[0].protocol: unknown protocol \"tcpp\"",
    );
    rejected(
        "[[rules]]\ncidr = \"10.0.0.0/8\"\nprotocol = \"udp\"\nports = \"99-10\"\npps = 1",
        "rules[0].ports: port range 99-10 is reversed",
    );
    rejected(
        "[[rules]]\ncidr = \"10.0.0.0/8\"\nports = \"http\"\npps = 1",
        "rules[0].ports",
    );
    rejected(
        "[[rules]]\ncidr = \"10.0.0.0/8\"\nwindow = \"2m\"\npps = 1",
        "rules[0].window",
    );
    rejected(
        "[[rules]]\ncidr = \"10.0.0.0/8\"",
        "rules[0]: a `limit` rule needs",
    );
    rejected("[default]\ncidr = \"10.0.0.0/8\"", "default.cidr");
    rejected("[daemon]\ntick = \"1ms\"", "daemon.tick");
    rejected("[daemon]\nmetrics_addr = \"nowhere\"", "metrics_addr");
    rejected("[daemon]\ninterfaces = [\"a/b\"]", "daemon.interfaces[0]");
    rejected("[limits]\nipv4_prefix = 40", "IPv4 key prefix length 40");
    rejected(
        "[daemon]\nmax_sources = 100000000",
        "daemon.max_sources: 100000000 is outside 1..=16777216",
    );
    rejected("[daemon]\nmax_sources = 0", "daemon.max_sources");
    rejected(
        "[[rules]]\ncidr = \"10.0.0.0/8\"\nprotocol = 0\npps = 1",
        "rules[0].protocol: 0 is not a protocol",
    );
    rejected(
        "[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 1\nblock = \"2d\"",
        "rules[0].block",
    );
    rejected(
        "[default]\nbytes_per_second = 1000",
        "default.bytes_per_second: 1000 bytes per window cannot admit one full-size frame",
    );
    rejected("not toml at all", "bad.toml");
}

#[test]
fn the_shipped_example_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/config.toml");
    let config = Config::load(&path).expect("dist/config.toml is valid");
    assert_eq!(config.daemon.interfaces, vec!["eth0".to_string()]);
    assert!(!config.rules.default.dry_run);
    assert_eq!(config.rules.rules.len(), 2);
}

/// `ProtectSystem=full` makes /etc read-only: the unit must allow the
/// directory of the file it runs with, or `--save` fails.
#[test]
fn the_shipped_unit_lets_save_write_its_configuration_directory() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/xdp-limiter.service");
    let unit = std::fs::read_to_string(&path).expect("the unit");
    let value = |key: &str| {
        unit.lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::trim)
            .collect::<Vec<_>>()
    };
    let exec = value("ExecStart").join(" ");
    let config = exec
        .split_whitespace()
        .skip_while(|w| *w != "--config")
        .nth(1)
        .expect("ExecStart names --config");
    let dir = Path::new(config).parent().expect("a directory");
    assert_eq!(value("ProtectSystem"), vec!["full"]);
    let writable: Vec<&str> = value("ReadWritePaths")
        .iter()
        .flat_map(|v| v.split_whitespace())
        .collect();
    assert!(
        writable.iter().any(|w| Path::new(w) == dir),
        "ReadWritePaths {writable:?} lacks {}",
        dir.display()
    );
}

#[test]
fn a_configuration_survives_a_round_trip_through_toml() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/config.toml");
    let config = Config::load(&path).unwrap();
    let again = Config::parse(&config.file.to_toml(), "round trip").unwrap();
    assert_eq!(again.rules, config.rules);
    assert_eq!(again.daemon, config.daemon);
}

#[test]
fn ports_parse() {
    assert_eq!(parse_ports("53"), Some((53, 53)));
    assert_eq!(parse_ports("1000-2000"), Some((1000, 2000)));
    assert_eq!(parse_ports("x"), None);
    assert_eq!(parse_ports("1-"), None);
}

/// A rule with every optional field set, so that each key is written.
pub(crate) fn rule_with_every_key() -> RuleSection {
    RuleSection {
        cidr: Some("192.0.2.0/24".parse().unwrap()),
        protocol: Some(ProtocolSpec::Number(PROTO_UDP)),
        ports: Some(PortsSpec::Port(53)),
        pps: Some(10),
        bytes_per_second: Some(10_000),
        block: Some(Duration::from_secs(30)),
        dry_run: Some(true),
        ..RuleSection::default()
    }
}

#[test]
fn rule_keys_are_the_keys_a_rule_has() {
    let value = serde_json::to_value(rule_with_every_key()).unwrap();
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut want = RuleSection::KEYS.to_vec();
    keys.sort_unstable();
    want.sort_unstable();
    assert_eq!(keys, want);
}
