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

#[test]
fn the_history_horizon_defaults_to_an_hour_and_takes_1m_to_24h() {
    let history = |text: &str| Config::parse(text, "test.toml").map(|c| c.daemon.history);
    assert_eq!(history("").unwrap(), Duration::from_secs(3600));
    for (text, want) in [("1m", 60), ("90m", 5400), ("24h", 86_400)] {
        let got = history(&format!("[daemon]\nhistory = \"{text}\"")).unwrap();
        assert_eq!(got, Duration::from_secs(want), "{text}");
    }
    for text in ["59s", "0s", "24h 1s"] {
        let err = history(&format!("[daemon]\nhistory = \"{text}\""))
            .expect_err(text)
            .to_string();
        assert!(
            err.contains("daemon.history") && err.contains("1m..=24h"),
            "{err}"
        );
    }
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
    rejected(
        "[daemon]\nhistory = \"30s\"",
        "daemon.history: 30s is outside 1m..=24h",
    );
    rejected(
        "[daemon]\nhistory = \"25h\"",
        "daemon.history: 1day 1h is outside 1m..=24h",
    );
    rejected("[daemon]\nhistory = \"soon\"", "history");
    rejected("[daemon]\nmetrics_addr = \"nowhere\"", "metrics_addr");
    rejected("[daemon]\ninterfaces = [\"a/b\"]", "daemon.interfaces[0]");
    rejected("[limits]\nipv4_prefix = 40", "IPv4 key prefix length 40");
    rejected(
        "[daemon]\nmax_sources = 100000000",
        "daemon.max_sources: 100000000 is outside 1..=16777216",
    );
    rejected("[daemon]\nmax_sources = 0", "daemon.max_sources");
    rejected(
        "[daemon]\nlimited_log_burst = 0",
        "daemon.limited_log_burst: 0 is outside 1..=10000",
    );
    rejected(
        "[daemon]\nlimited_log_per_second = 20000",
        "daemon.limited_log_per_second: 20000 is above 10000",
    );
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
fn levels_parse_and_are_written_back_in_the_grammars_form() {
    let text = "[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 100\n\
                levels = [\"prefix/24:2000\", \"source:20000@1m\", \"rule:50000+10@10s\"]\n";
    let config = Config::parse(text, "levels.toml").unwrap();
    let shown: Vec<String> = config.rules.rules[0]
        .levels
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        shown,
        ["prefix/24/48:2000", "source:20000@1m", "rule:50000+10@10s"]
    );
    let toml = config.file.to_toml();
    for level in &shown {
        assert!(toml.contains(&format!("{level:?}")), "{toml}");
    }
    let again = Config::parse(&toml, "round trip").unwrap();
    assert_eq!(again.rules, config.rules);
    // No levels: no key written.
    assert!(!Config::builtin().file.to_toml().contains("levels"));
}

#[test]
fn bad_levels_are_rejected_with_the_level_named() {
    let rule = |extra: &str| format!("[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 10\n{extra}\n");
    for (levels, expect) in [
        (
            r#"levels = ["prefix/24:2000", "nonsense"]"#,
            r#"rules[0].levels[1]: "nonsense" is not a level: KIND[/V4[/V6]]:PPS[+BURST][@WINDOW]"#,
        ),
        (
            r#"levels = ["prefix:2000"]"#,
            r#"rules[0].levels[0]: "prefix:2000": a prefix level needs its length"#,
        ),
        (
            r#"levels = ["rule:lots"]"#,
            r#"rules[0].levels[0]: "rule:lots": pps "lots" is not a whole number"#,
        ),
        (
            r#"levels = ["rule:10@soon"]"#,
            r#"rules[0].levels[0]: "rule:10@soon": window "soon""#,
        ),
        (
            r#"levels = ["source:10@50ms"]"#,
            "rules[0].levels[0]: window 50ms is outside 100ms..=60s",
        ),
        (
            r#"levels = ["rule:100", "source:10@2m"]"#,
            "rules[0].levels[1]: window 120s is outside 100ms..=60s",
        ),
        (
            r#"levels = ["prefix/24:10", "prefix/24/48:20"]"#,
            "rules[0].levels[1]: keyed and windowed as rules[0].levels[0]; merge them",
        ),
        (
            r#"levels = ["prefix/24:0"]"#,
            "rules[0].levels[0]: pps must be greater than zero",
        ),
        (
            r#"levels = ["source:1@100ms", "source:1@200ms", "source:1@300ms", "source:1@400ms", "source:1@500ms"]"#,
            "rules[0].levels: 5 levels, more than the 4 a rule may have",
        ),
        (r#"levels = "prefix/24:10""#, "levels"),
    ] {
        rejected(&rule(levels), expect);
    }
    for action in ["allow", "deny"] {
        rejected(
            &format!(
                "[[rules]]\ncidr = \"10.0.0.0/8\"\naction = \"{action}\"\nlevels = [\"rule:10\"]\n"
            ),
            &format!("rules[0].levels: only a `limit` rule has levels, not `{action}`"),
        );
    }
    rejected(
        "[limits]\nipv4_prefix = 24\n\n[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 10\n\
         levels = [\"prefix/28:10\"]\n",
        "rules[0].levels[0]: IPv4 prefix /28 is longer than the /24 sources are keyed by \
         (limits.ipv4_prefix)",
    );
    rejected(
        "[cluster]\nredis = [\"redis://a\"]\n\n[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 10\n\
         scope = \"cluster\"\nlevels = [\"prefix/24:10\"]\n",
        "rules[0].levels: a cluster-scoped rule cannot have levels",
    );
    rejected(
        "[default]\npps = 10\nlevels = [\"nonsense\"]\n",
        "default.levels[0]: \"nonsense\" is not a level",
    );
}

#[test]
fn the_shipped_example_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/config.toml");
    let config = Config::load(&path).expect("dist/config.toml is valid");
    assert_eq!(config.daemon.interfaces, vec!["eth0".to_string()]);
    assert!(!config.rules.default.dry_run);
    assert_eq!(config.rules.rules.len(), 2);
}

#[test]
fn the_shipped_levels_example_is_valid_once_uncommented() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let levels = text.find("# Levels:").expect("a commented levels example");
    let start = levels + text[levels..].find("# [[rules]]").expect("its rule");
    let end = text
        .find("# Cluster-wide")
        .expect("the cluster example after it");
    let uncommented: String = text[start..end]
        .lines()
        .map(|line| line.strip_prefix("# ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n");
    let config = Config::parse(&format!("{}{uncommented}\n", &text[..start]), "example").unwrap();
    let web = config.rules.rules.last().unwrap();
    let shown: Vec<String> = web.levels.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        ["prefix/24/48:2000", "source:20000@1m", "rule:50000"]
    );
}

/// `ProtectSystem=strict` makes the whole file system read-only: the
/// unit must allow the directory of the file it runs with (or `--save`
/// fails), the default pin directory's bpffs (or pinning fails) and the
/// runtime directory of the default control socket and the locks.
#[test]
fn the_shipped_unit_lets_the_daemon_write_what_it_writes() {
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
    assert_eq!(value("ProtectSystem"), vec!["strict"]);
    let writable: Vec<&Path> = value("ReadWritePaths")
        .iter()
        .flat_map(|v| v.split_whitespace())
        .map(Path::new)
        .collect();
    let pins = Path::new(DEFAULT_PIN_DIR);
    for needed in [dir, pins.parent().expect("bpffs")] {
        assert!(
            writable.contains(&needed),
            "ReadWritePaths {writable:?} lacks {}",
            needed.display()
        );
    }
    let runtime = Path::new("/run").join(value("RuntimeDirectory").join(""));
    assert_eq!(Path::new(DEFAULT_SOCKET).parent(), Some(runtime.as_path()));
    assert_eq!(Path::new(crate::lock::LOCK_DIR), runtime);
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
        name: Some("every-key".into()),
        cidr: Some("192.0.2.0/24".parse().unwrap()),
        protocol: Some(ProtocolSpec::Number(PROTO_UDP)),
        ports: Some(PortsSpec::Port(53)),
        pps: Some(10),
        bytes_per_second: Some(10_000),
        block: Some(Duration::from_secs(30)),
        dry_run: Some(true),
        scope: limiter_common::Scope::Cluster,
        levels: vec!["prefix/24:100".into()],
        guards: vec!["dropped_share <= 5%".into()],
        guard_for: Some(Duration::from_secs(60)),
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

// ---- [cluster] and rule scopes ----

use limiter_common::Scope;

/// A `[cluster]` section with `extra` lines, and a cluster-scoped default.
fn cluster_file(extra: &str) -> String {
    format!(
        "[cluster]\nredis = [\"redis://10.0.0.1:6379\"]\n{extra}\n\n\
         [default]\npps = 100\nscope = \"cluster\"\n"
    )
}

#[test]
fn no_cluster_section_means_no_cluster() {
    let config = Config::builtin();
    assert_eq!(config.cluster, None);
    assert_eq!(config.file.cluster, None);
    assert!(!config.file.to_toml().contains("[cluster]"));
    assert_eq!(config.rules.default.scope, Scope::Node);
}

#[test]
fn a_cluster_section_has_the_documented_defaults() {
    let config = Config::parse(&cluster_file(""), "cluster.toml").unwrap();
    let cluster = config.cluster.expect("configured");
    assert_eq!(cluster.mode, ClusterMode::Single);
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(
        cluster.node,
        hostname.trim(),
        "the node defaults to the hostname"
    );
    assert_eq!(cluster.sync_interval, Duration::from_millis(100));
    assert_eq!(cluster.timeout, Duration::from_millis(50));
    assert_eq!(cluster.threshold, 0.25);
    assert_eq!(cluster.max_remote_sources, 50_000);
    assert_eq!(cluster.fallback, Fallback::Split);
    assert_eq!(cluster.grace, Duration::from_secs(10));
    assert_eq!(
        cluster.redis[0].endpoint,
        RedisEndpoint::Tcp {
            host: "10.0.0.1".into(),
            port: 6379
        }
    );
    assert_eq!(config.rules.default.scope, Scope::Cluster);
    // The hostname is not written back: the file stays portable.
    assert_eq!(config.file.cluster.as_ref().unwrap().node, None);
    assert!(!config.file.to_toml().contains("node ="));
}

#[test]
fn a_full_cluster_section_parses_and_survives_a_round_trip() {
    let text = r#"
        [cluster]
        redis = ["redis://:secret@10.0.0.1:7000", "redis://10.0.0.2:7000", "redis://[2001:db8::1]"]
        mode = "cluster"
        node = "edge-1.par"
        sync_interval = "250ms"
        timeout = "100ms"
        threshold = 0.5
        max_remote_sources = 2000
        fallback = "local"
        grace = "30s"

        [default]
        pps = 1000

        [[rules]]
        cidr = "192.0.2.0/24"
        protocol = "udp"
        ports = "53"
        pps = 50
        burst_packets = 10
        window = "10s"
        scope = "cluster"

        [[rules]]
        cidr = "198.51.100.0/24"
        pps = 5
        scope = "node"
    "#;
    let config = Config::parse(text, "cluster.toml").unwrap();
    let cluster = config.cluster.clone().unwrap();
    assert_eq!(cluster.mode, ClusterMode::Cluster);
    assert_eq!(cluster.node, "edge-1.par");
    assert_eq!(cluster.sync_interval, Duration::from_millis(250));
    assert_eq!(cluster.timeout, Duration::from_millis(100));
    assert_eq!(cluster.threshold, 0.5);
    assert_eq!(cluster.max_remote_sources, 2000);
    assert_eq!(cluster.fallback, Fallback::Local);
    assert_eq!(cluster.grace, Duration::from_secs(30));
    assert_eq!(cluster.redis.len(), 3);
    assert_eq!(cluster.redis[0].redacted(), "redis://:***@10.0.0.1:7000");
    assert_eq!(cluster.redis[0].url, "redis://:secret@10.0.0.1:7000");
    assert_eq!(
        cluster.redis[2].endpoint,
        RedisEndpoint::Tcp {
            host: "[2001:db8::1]".into(),
            port: 6379
        }
    );
    let debug = format!("{config:?}");
    assert!(
        !debug.contains("secret"),
        "Debug leaks the password: {debug}"
    );
    assert_eq!(config.rules.default.scope, Scope::Node);
    assert_eq!(config.rules.rules[0].scope, Scope::Cluster);
    assert_eq!(config.rules.rules[1].scope, Scope::Node);

    let toml = config.file.to_toml();
    assert!(toml.contains("scope = \"cluster\""), "{toml}");
    assert_eq!(
        toml.matches("scope =").count(),
        1,
        "node scopes stay implicit: {toml}"
    );
    let again = Config::parse(&toml, "round trip").unwrap();
    assert_eq!(again.rules, config.rules);
    assert_eq!(again.cluster, config.cluster);
    assert_eq!(again.file, config.file);
}

#[test]
fn redis_urls_of_every_supported_form_are_accepted() {
    for (url, endpoint, db, shown) in [
        (
            "redis://localhost",
            RedisEndpoint::Tcp {
                host: "localhost".into(),
                port: 6379,
            },
            0,
            "redis://localhost",
        ),
        (
            "redis://user:pw@redis.example:6380/3",
            RedisEndpoint::Tcp {
                host: "redis.example".into(),
                port: 6380,
            },
            3,
            "redis://user:***@redis.example:6380/3",
        ),
        (
            "redis://limiter@10.0.0.1/",
            RedisEndpoint::Tcp {
                host: "10.0.0.1".into(),
                port: 6379,
            },
            0,
            "redis://limiter@10.0.0.1/",
        ),
        (
            "rediss://user:pw@redis.example:6380/3",
            RedisEndpoint::Tcp {
                host: "redis.example".into(),
                port: 6380,
            },
            3,
            "rediss://user:***@redis.example:6380/3",
        ),
        (
            "unix:///run/redis/redis.sock",
            RedisEndpoint::Unix {
                path: "/run/redis/redis.sock".into(),
            },
            0,
            "unix:///run/redis/redis.sock",
        ),
        (
            "redis+unix:///run/redis.sock?db=2&user=u&pass=pw",
            RedisEndpoint::Unix {
                path: "/run/redis.sock".into(),
            },
            2,
            "redis+unix:///run/redis.sock?db=2&user=u&pass=***",
        ),
    ] {
        let parsed = parse_redis_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(parsed.endpoint, endpoint, "{url}");
        assert_eq!(parsed.db, db, "{url}");
        assert_eq!(parsed.redacted(), shown, "{url}");
        assert_eq!(parsed.url, url);
    }
}

#[test]
fn a_sentinel_section_takes_the_primarys_login_and_never_shows_its_password() {
    let text = "[cluster]\nredis = [\"redis://:sentinel-pw@10.0.0.1:26379\"]\n\
                mode = \"sentinel\"\nsentinel_master = \"xl-primary\"\nnode = \"n1\"\n\
                primary_username = \"xl-node\"\nprimary_password = \"primary-pw\"\n";
    let config = Config::parse(text, "sentinel.toml").unwrap();
    let cluster = config.cluster.as_ref().unwrap();
    assert_eq!(cluster.primary_username.as_deref(), Some("xl-node"));
    assert_eq!(
        cluster.primary_password.as_ref().map(Secret::expose),
        Some("primary-pw")
    );
    let shown = format!("{config:?}");
    for secret in ["sentinel-pw", "primary-pw"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(shown.contains("xl-node"), "{shown}");
    // `--save` writes the login back.
    let again = Config::parse(&config.file.to_toml(), "round trip").unwrap();
    assert_eq!(again.cluster, config.cluster);
}

#[test]
fn toml_errors_never_quote_a_password() {
    for text in [
        "[cluster]\nredis = \"redis://u:hunter2@h:6379\"\n",
        "[cluster]\nredis = [\"rediss://:hunter2@h\", 7]\n",
        "[cluster]\nredis = [\"unix:///r.sock?user=u&pass=hunter2\", 7]\n",
        "[cluster]\nredis = [\"redis://h\"]\nprimary_pasword = \"hunter2\"\n",
        "[cluster]\nredis = [\"redis://h\"]\nprimary_password = \"hunter2\" x\n",
    ] {
        let e = Config::parse(text, "c.toml").unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }), "{text}: {e}");
        let shown = e.to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
    }
}

#[test]
fn urls_that_do_not_parse_are_shown_without_their_password() {
    for (url, secret) in [
        ("redis://u:hunter2@h:99999", "hunter2"),
        ("unix:///run/r.sock?pass=hunter2&colour=1", "hunter2"),
        ("redis:/u:hunter2@h", "hunter2"),
    ] {
        assert!(parse_redis_url(url).is_err(), "{url}");
        let shown = redact_url(url);
        assert!(!shown.contains(secret), "{url}: {shown}");
    }
}

#[test]
fn a_sentinel_section_names_its_sentinels_and_the_primary() {
    let text = "[cluster]\nredis = [\"redis://10.0.0.1:26379\", \"redis://10.0.0.2:26379\"]\n\
                mode = \"sentinel\"\nsentinel_master = \"xl-primary\"\nnode = \"n1\"\n";
    let config = Config::parse(text, "sentinel.toml").unwrap();
    let cluster = config.cluster.unwrap();
    assert_eq!(cluster.mode, ClusterMode::Sentinel);
    assert_eq!(cluster.sentinel_master.as_deref(), Some("xl-primary"));
    assert_eq!(cluster.redis.len(), 2);
}

#[test]
fn bad_cluster_sections_are_rejected_with_the_field_named() {
    let section = |lines: &str| format!("[cluster]\n{lines}\n");
    let with_urls = |urls: &str, more: &str| section(&format!("redis = [{urls}]\n{more}"));
    for (text, expect) in [
        // URLs.
        (section(""), "cluster.redis: no Redis URL"),
        (with_urls("", ""), "cluster.redis: no Redis URL"),
        (
            with_urls("\"http://10.0.0.1\"", ""),
            "cluster.redis[0]: unsupported scheme \"http\"",
        ),
        (
            with_urls("\"rediss://10.0.0.1\", \"redis://:pw@10.0.0.2\"", "mode = \"cluster\""),
            "cluster.redis[1]: redis://:***@10.0.0.2 is not TLS but redis[0] (rediss://10.0.0.1) \
             is: every URL is rediss:// or none is",
        ),
        (
            with_urls("\"redis://10.0.0.1\"", "tls_ca_file = \"/etc/ca.pem\""),
            "cluster.tls_ca_file: applies to rediss:// (TLS) URLs only",
        ),
        (
            with_urls("\"unix:///run/r.sock\"", "tls_key_file = \"/k.pem\""),
            "cluster.tls_key_file: applies to rediss:// (TLS) URLs only",
        ),
        (
            with_urls("\"rediss://a\"", "tls_ca_file = \"/nonexistent/ca.pem\""),
            "cluster.tls_ca_file: cannot read /nonexistent/ca.pem: No such file",
        ),
        (
            with_urls("\"rediss://a\"", "tls_cert_file = \"/nonexistent/c.pem\""),
            "cluster.tls_key_file: unset, but cluster.tls_cert_file is set",
        ),
        (
            with_urls("\"rediss://a\"", "tls_key_file = \"/nonexistent/k.pem\""),
            "cluster.tls_cert_file: unset, but cluster.tls_key_file is set",
        ),
        (
            with_urls(
                "\"redis://:pw@a:26379\", \"redis://:other@b:26379\"",
                "mode = \"sentinel\"\nsentinel_master = \"m\"",
            ),
            "cluster.redis[1]: redis://:***@b:26379: logs in to its Sentinel differently from \
             redis[0] (redis://:***@a:26379)",
        ),
        (
            with_urls("\"redis://a\"", "primary_password = \"pw\""),
            "cluster.primary_password: only applies with mode = \"sentinel\"",
        ),
        (
            with_urls(
                "\"redis://a:26379\"",
                "mode = \"sentinel\"\nsentinel_master = \"m\"\nprimary_username = \"u\"",
            ),
            "cluster.primary_password: unset, but cluster.primary_username is set",
        ),
        (
            with_urls("\"10.0.0.1:6379\"", ""),
            "cluster.redis[0]: \"10.0.0.1:6379\" is not a URL",
        ),
        (
            with_urls("\"redis://:pw@\"", ""),
            "cluster.redis[0]: redis://:***@: no host",
        ),
        (
            with_urls("\"redis://h:0\"", ""),
            "cluster.redis[0]: redis://h:0: port \"0\" is not 1..=65535",
        ),
        (
            with_urls("\"redis://h:99999\"", ""),
            "cluster.redis[0]: redis://h:99999: port",
        ),
        (
            with_urls("\"redis://h/x\"", ""),
            "cluster.redis[0]: redis://h/x: database \"x\" is not a number",
        ),
        (
            with_urls("\"redis://h?timeout=1\"", ""),
            "cluster.redis[0]: redis://h?timeout=1: query parameters are not supported",
        ),
        (
            with_urls("\"redis://[::1\"", ""),
            "cluster.redis[0]: redis://[::1: unclosed '['",
        ),
        (
            with_urls("\"unix://run/redis.sock\"", ""),
            "cluster.redis[0]: unix://run/redis.sock: the socket's path must be absolute",
        ),
        (
            with_urls("\"unix:///run/redis.sock?timeout=5\"", ""),
            "cluster.redis[0]: unknown parameter \"timeout\"",
        ),
        (
            with_urls("\"redis://a\", \"redis://a\"", "mode = \"cluster\""),
            "cluster.redis[1]: redis://a is listed twice (also redis[0])",
        ),
        // Modes.
        (
            with_urls("\"redis://a\", \"redis://b\"", ""),
            "cluster.redis: 2 URLs with mode = \"single\"",
        ),
        (
            with_urls("\"unix:///run/redis.sock\"", "mode = \"cluster\""),
            "cluster.redis[0]: unix:///run/redis.sock: a Redis Cluster is reached over TCP",
        ),
        (
            with_urls("\"redis://a/1\"", "mode = \"cluster\""),
            "cluster.redis[0]: redis://a/1: a Redis Cluster has only database 0",
        ),
        (
            with_urls("\"redis://a:26379\"", "mode = \"sentinel\""),
            "cluster.sentinel_master: unset with mode = \"sentinel\"",
        ),
        (
            with_urls(
                "\"unix:///run/sentinel.sock\"",
                "mode = \"sentinel\"\nsentinel_master = \"m\"",
            ),
            "cluster.redis[0]: unix:///run/sentinel.sock: a Sentinel is reached over TCP",
        ),
        (
            with_urls(
                "\"redis://a:26379\"",
                "mode = \"sentinel\"\nsentinel_master = \"has space\"",
            ),
            "cluster.sentinel_master: \"has space\"",
        ),
        (
            with_urls("\"redis://a\"", "sentinel_master = \"m\""),
            "cluster.sentinel_master: only applies with mode = \"sentinel\" (mode is \"single\")",
        ),
        (
            with_urls("\"redis://a\"", "mode = \"sharded\""),
            "unknown variant `sharded`",
        ),
        // The node's name.
        (
            with_urls("\"redis://a\"", "node = \"\""),
            "cluster.node: \"\" is empty",
        ),
        (
            with_urls("\"redis://a\"", "node = \"edge 1\""),
            "cluster.node: \"edge 1\" contains ' '",
        ),
        (
            with_urls("\"redis://a\"", "node = \"edge:1\""),
            "cluster.node: \"edge:1\" contains ':'",
        ),
        (
            with_urls("\"redis://a\"", "node = \"{edge}\""),
            "cluster.node: \"{edge}\" contains '{'",
        ),
        (
            with_urls("\"redis://a\"", "node = \"n\\u0007\""),
            "cluster.node: \"n\\u{7}\" contains '\\u{7}'",
        ),
        (
            with_urls("\"redis://a\"", &format!("node = \"{}\"", "n".repeat(65))),
            "cluster.node: \"nnn",
        ),
        // Durations and fractions.
        (
            with_urls("\"redis://a\"", "sync_interval = \"5ms\"\ntimeout = \"1ms\""),
            "cluster.sync_interval: 5ms is outside 10ms..=10s",
        ),
        (
            with_urls("\"redis://a\"", "sync_interval = \"11s\""),
            "cluster.sync_interval: 11s is outside 10ms..=10s",
        ),
        (
            with_urls("\"redis://a\"", "sync_interval = \"fast\""),
            "sync_interval",
        ),
        (
            with_urls("\"redis://a\"", "timeout = \"100ms\""),
            "cluster.timeout: 100ms must be at least 1ms and shorter than cluster.sync_interval (100ms)",
        ),
        (
            with_urls("\"redis://a\"", "sync_interval = \"20ms\""),
            "cluster.timeout: 50ms must be at least 1ms and shorter than cluster.sync_interval (20ms)",
        ),
        (
            with_urls("\"redis://a\"", "timeout = \"0s\""),
            "cluster.timeout: 0ns must be at least 1ms",
        ),
        (
            with_urls("\"redis://a\"", "threshold = 0.0"),
            "cluster.threshold: 0 is outside (0, 1]",
        ),
        (
            with_urls("\"redis://a\"", "threshold = 1.5"),
            "cluster.threshold: 1.5 is outside (0, 1]",
        ),
        (
            with_urls("\"redis://a\"", "threshold = nan"),
            "cluster.threshold: NaN is outside (0, 1]",
        ),
        (
            with_urls("\"redis://a\"", "threshold = -0.25"),
            "cluster.threshold: -0.25 is outside (0, 1]",
        ),
        (
            with_urls("\"redis://a\"", "max_remote_sources = 0"),
            "cluster.max_remote_sources: 0 is outside 1..=1000000",
        ),
        (
            with_urls("\"redis://a\"", "max_remote_sources = 1000001"),
            "cluster.max_remote_sources: 1000001 is outside 1..=1000000",
        ),
        (
            with_urls("\"redis://a\"", "max_remote_sources = -1"),
            "max_remote_sources",
        ),
        (
            with_urls("\"redis://a\"", "grace = \"200ms\""),
            "cluster.grace: 200ms is outside 300ms..=1h: at least 3 x cluster.sync_interval",
        ),
        (
            with_urls("\"redis://a\"", "sync_interval = \"10s\"\ntimeout = \"1s\""),
            "cluster.grace: 10s is outside 30s..=1h",
        ),
        (
            with_urls("\"redis://a\"", "grace = \"2h\""),
            "cluster.grace: 7200s is outside 300ms..=1h",
        ),
        (
            with_urls("\"redis://a\"", "fallback = \"open\""),
            "unknown variant `open`",
        ),
        (
            with_urls("\"redis://a\"", "colour = 1"),
            "unknown field `colour`",
        ),
    ] {
        rejected(&text, expect);
    }
}

#[test]
fn cluster_scoped_rules_are_refused_where_this_version_cannot_share_them() {
    let cluster = "[cluster]\nredis = [\"redis://a\"]\n\n";
    for (rules, expect) in [
        (
            "[[rules]]\ncidr = \"10.0.0.0/8\"\naction = \"allow\"\nscope = \"cluster\"",
            "rules[0].scope: only a `limit` rule can be cluster-scoped, not `allow`",
        ),
        (
            "[[rules]]\ncidr = \"10.0.0.0/8\"\naction = \"deny\"\nscope = \"cluster\"",
            "rules[0].scope: only a `limit` rule can be cluster-scoped, not `deny`",
        ),
        (
            "[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 5\nblock = \"1m\"\nscope = \"cluster\"",
            "rules[0].block: a cluster-scoped rule cannot carry a penalty",
        ),
        (
            "[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 5\nbytes_per_second = 100000\nscope = \"cluster\"",
            "rules[0].bytes_per_second: a cluster-scoped rule limits packets only",
        ),
        (
            "[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 5\nburst_bytes = 3000\nscope = \"cluster\"",
            "rules[0].bytes_per_second: a cluster-scoped rule limits packets only",
        ),
        (
            "[default]\naction = \"allow\"\nscope = \"cluster\"",
            "default.scope: only a `limit` rule",
        ),
        (
            "[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 5\nscope = \"planet\"",
            "unknown variant `planet`",
        ),
    ] {
        rejected(&format!("{cluster}{rules}\n"), expect);
    }
    // A byte-only default gets no built-in packet rate: said so.
    rejected(
        &format!("{cluster}[default]\nbytes_per_second = 1000000\nscope = \"cluster\"\n"),
        "default.bytes_per_second: a cluster-scoped rule limits packets only",
    );
}

#[test]
fn a_cluster_scoped_rule_without_a_cluster_section_is_refused_naming_it() {
    rejected(
        "[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 5\n\n[[rules]]\ncidr = \"10.1.0.0/16\"\n\
         pps = 5\nscope = \"cluster\"\n",
        "rules[1].scope: a cluster-scoped rule needs a [cluster] section",
    );
    rejected(
        "[default]\npps = 5\nscope = \"cluster\"\n",
        "default.scope: a cluster-scoped rule needs a [cluster] section",
    );
    // Node scope spelled out needs nothing.
    Config::parse("[default]\npps = 5\nscope = \"node\"\n", "node.toml").unwrap();
}

#[test]
fn cluster_rules_need_the_cluster_the_daemon_runs_with() {
    let with = Config::parse(&cluster_file(""), "cluster.toml").unwrap();
    let without = Config::builtin();
    check_cluster_in_force(&with.rules, with.cluster.as_ref()).unwrap();
    check_cluster_in_force(&without.rules, None).unwrap();
    let err = check_cluster_in_force(&with.rules, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("default.scope: the daemon runs without [cluster]")
            && err.contains("restart"),
        "{err}"
    );
}

#[test]
fn node_names_are_checked_as_documented() {
    for good in ["a", "edge-1", "edge_1.par.example", &"n".repeat(64)] {
        assert_eq!(check_node_name(good), Ok(()), "{good}");
    }
    for bad in ["", "a b", "a:b", "a{b}", "a*", "a/b", "é", &"n".repeat(65)] {
        assert!(check_node_name(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn the_shipped_cluster_example_is_valid_once_uncommented() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text
        .find("# [cluster]")
        .expect("a commented [cluster] example");
    let (plain, example) = text.split_at(start);
    let uncommented: String = example
        .lines()
        .map(|line| line.strip_prefix("# ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n");
    let config = Config::parse(&format!("{plain}{uncommented}\n"), "example").unwrap();
    let cluster = config.cluster.expect("[cluster] once uncommented");
    assert_eq!(cluster.node, "edge-1");
    assert_eq!(cluster.redis[0].redacted(), "redis://:***@10.0.0.5:6379");
    let https = config.rules.rules.last().unwrap();
    assert_eq!(https.scope, Scope::Cluster);
    assert_eq!(https.matches.ports, Some((443, 443)));
    assert_eq!(config.rules.rules.len(), 3);
}

mod cluster_fuzz {
    //! `[cluster]` sections of random keys and edge values: validation
    //! never panics, and a refusal names a `cluster.` field or is TOML's.
    use proptest::{prelude::*, sample::select};

    use super::*;

    const KEYS: &[&str] = &[
        "redis",
        "mode",
        "node",
        "sync_interval",
        "timeout",
        "threshold",
        "max_remote_sources",
        "fallback",
        "grace",
        "tls_ca_file",
        "tls_cert_file",
        "tls_key_file",
        "primary_username",
        "primary_password",
    ];
    const VALUES: &[&str] = &[
        "[\"redis://a\"]",
        "[\"redis://a\", \"redis://b\"]",
        "[\"redis://:p@[::1]:1/2\"]",
        "[\"rediss://a\"]",
        "[\"rediss://a\", \"redis://b\"]",
        "\"/nonexistent.pem\"",
        "\"/proc/version\"",
        "[\"unix:///s?db=1&pass=x\"]",
        "[\"unix://\"]",
        "[\"redis://\"]",
        "[\"redis://@:\"]",
        "[\"redis://[\"]",
        "[\"redis://a:b:c@d:e/f?g#h\"]",
        "[\"://\"]",
        "[\"é://é@é\"]",
        "[]",
        "[1]",
        "\"single\"",
        "\"cluster\"",
        "\"split\"",
        "\"local\"",
        "\"\"",
        "\"edge-1\"",
        "\"a b\"",
        "\"0s\"",
        "\"1ns\"",
        "\"10ms\"",
        "\"9ms\"",
        "\"10s\"",
        "\"11s\"",
        "\"1h\"",
        "\"100y\"",
        "0",
        "1",
        "0.25",
        "1.0000001",
        "-0.0",
        "nan",
        "inf",
        "1e308",
        "true",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn random_cluster_sections_never_panic_and_refusals_name_the_field(
            entries in proptest::collection::vec((select(KEYS), select(VALUES)), 0..8),
        ) {
            let mut text = String::from("[cluster]\n");
            let mut seen = Vec::new();
            for (key, value) in entries {
                // A duplicate key is TOML's error, not ours: keep the first.
                if !seen.contains(&key) {
                    seen.push(key);
                    text.push_str(&format!("{key} = {value}\n"));
                }
            }
            match Config::parse(&text, "fuzz.toml") {
                Ok(config) => prop_assert!(config.cluster.is_some()),
                Err(ConfigError::Field { field, .. }) => {
                    prop_assert!(field.starts_with("cluster."), "{field}: {text}")
                }
                Err(ConfigError::Parse { .. }) => {}
                Err(other) => prop_assert!(false, "{other}: {text}"),
            }
        }

        #[test]
        fn any_text_as_a_redis_url_is_parsed_or_refused_without_a_panic(text in "\\PC{0,40}") {
            for url in [text.clone(), format!("redis://{text}"), format!("unix://{text}")] {
                if let Ok(parsed) = parse_redis_url(&url) {
                    prop_assert_eq!(parsed.url, url);
                }
            }
        }
    }
}

#[test]
fn guards_parse_in_limits_and_rules_and_start_only_when_enforcing() {
    let config = Config::parse(
        "[limits]\ndry_run = false\nguards = [\"dropped_share <= 5%\", \"limited_sources <= 1%\"]\n\
         guard_for = \"2m\"\n\n[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 10\n\
         guards = [\"dropped_pps < 100\"]\n",
        "test",
    )
    .unwrap();
    let (guards, period) = config.file.limits.guard_plan().unwrap().expect("a plan");
    assert_eq!(period, Duration::from_secs(120));
    assert_eq!(guards.len(), 2);
    let (rule_guards, rule_period) = config.file.rules[0]
        .guard_plan("rules[0]", false)
        .unwrap()
        .expect("the rule enforces");
    assert_eq!(rule_guards[0].to_string(), "dropped_pps < 100");
    assert_eq!(rule_period, crate::guard::DEFAULT_GUARD_FOR);
    // Written back as read.
    let again = Config::parse(&config.file.to_toml(), "again").unwrap();
    assert_eq!(again.file, config.file);

    // Guards wait in a dry-run file (what a saved rollback writes): valid,
    // no period.
    let waiting = Config::parse(
        "[limits]\ndry_run = true\nguards = [\"dropped_share <= 5%\"]\n\n\
         [default]\npps = 10\nguards = [\"dropped_share <= 5%\"]\n",
        "test",
    )
    .unwrap();
    assert_eq!(waiting.file.limits.guard_plan().unwrap(), None);
    // The default rule is dry-run unless it says otherwise.
    assert_eq!(
        waiting.file.default.guard_plan("default", true).unwrap(),
        None
    );
}

#[test]
fn bad_guards_are_rejected_with_the_field_named() {
    rejected(
        "[limits]\nguards = [\"dropped_share <= 5%\", \"nope <= 1\"]",
        "limits.guards[1]: unknown guard metric \"nope\"",
    );
    rejected(
        "[limits]\nguards = [\"dropped_share <= 500%\"]",
        "limits.guards[0]: guard \"dropped_share <= 500%\": 500% is above 100%",
    );
    rejected(
        "[limits]\nguards = [\"dropped_share <= 5%\"]\nguard_for = \"1s\"",
        "limits.guard_for: guard period 1s is outside 5s..=24h",
    );
    rejected(
        "[limits]\nguard_for = \"1m\"",
        "limits.guard_for: a guard period (--for, guard_for) needs at least one guard",
    );
    rejected(
        "[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 1\nguards = [\"dropped_share 5%\"]",
        "rules[0].guards[0]: malformed guard",
    );
    rejected(
        "[[rules]]\ncidr = \"10.0.0.0/8\"\naction = \"allow\"\nguards = [\"dropped_share <= 5%\"]",
        "rules[0].guards: guards watch a limit",
    );
    rejected(
        "[default]\npps = 1\nguard_for = \"25h\"\nguards = [\"dropped_pps <= 1\"]",
        "default.guard_for: guard period 1day 1h is outside 5s..=24h",
    );
}

/// A file holding `text` in a fresh temporary directory.
fn secret_file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

#[test]
fn redis_logins_are_read_from_files_and_never_shown() {
    let (_p, password) = secret_file("hunter2\n");
    let (_u, user) = secret_file("xl-node\r\n");
    let text = cluster_file(&format!(
        "password_file = {:?}\nusername_file = {:?}",
        password.display().to_string(),
        user.display().to_string()
    ));
    let config = Config::parse(&text, "c.toml").unwrap();
    let login = config.cluster.as_ref().unwrap().login.clone().unwrap();
    assert_eq!(login.password.expose(), "hunter2");
    assert_eq!(login.username.as_deref(), Some("xl-node"));
    assert!(!format!("{config:?}").contains("hunter2"));
    // The file names are what `--save` writes back, never the secret.
    assert!(!config.file.to_toml().contains("hunter2"));
    assert!(!super::text::holds_secret(&config.file));
    // Behind Sentinel, the primary's password too.
    let (_q, primary) = secret_file("primary-pw\n");
    let text = format!(
        "[cluster]\nredis = [\"redis://10.0.0.1:26379\"]\nmode = \"sentinel\"\n\
         sentinel_master = \"m\"\nprimary_password_file = {:?}\n",
        primary.display().to_string()
    );
    let config = Config::parse(&text, "c.toml").unwrap();
    let cluster = config.cluster.unwrap();
    assert_eq!(
        cluster.primary_password.as_ref().map(Secret::expose),
        Some("primary-pw")
    );
}

#[test]
fn secret_files_that_conflict_or_say_nothing_are_rejected_by_name() {
    let (_p, password) = secret_file("hunter2\n");
    let (_e, empty) = secret_file("\n");
    let password = password.display().to_string();
    let empty = empty.display().to_string();
    rejected(
        &cluster_file(&format!("password_file = {empty:?}")),
        "cluster.password_file: ",
    );
    rejected(
        &cluster_file(&format!("password_file = {empty:?}")),
        "is empty",
    );
    rejected(
        &cluster_file("password_file = \"/nonexistent/xl-secret\""),
        "/nonexistent/xl-secret cannot be read",
    );
    rejected(
        &cluster_file(&format!("username_file = {password:?}")),
        "cluster.username_file: set without cluster.password_file",
    );
    let with_url = |url: &str, extra: &str| format!("[cluster]\nredis = [\"{url}\"]\n{extra}\n");
    let both = with_url(
        "redis://:inline@10.0.0.1:6379",
        &format!("password_file = {password:?}"),
    );
    rejected(
        &both,
        "cluster.redis[0]: redis://:***@10.0.0.1:6379 carries a password",
    );
    let err = Config::parse(&both, "c.toml").unwrap_err().to_string();
    assert!(!err.contains("inline"), "{err}");
    let user = with_url(
        "redis://xl@10.0.0.1:6379",
        &format!("password_file = {password:?}\nusername_file = {password:?}"),
    );
    rejected(&user, "names a user and cluster.username_file is set");
    let socket = with_url(
        "unix:///run/redis.sock?user=xl",
        &format!("password_file = {password:?}\nusername_file = {password:?}"),
    );
    rejected(&socket, "names a user and cluster.username_file is set");
    rejected(
        &cluster_file(&format!("primary_password_file = {password:?}")),
        "cluster.primary_password_file: only applies with mode = \"sentinel\"",
    );
}

/// `--save` keeps a file's mode; the unit's umask keeps every other file
/// the daemon creates owner-only.
#[test]
fn the_shipped_unit_sets_an_owner_only_umask() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/xdp-limiter.service");
    let unit = std::fs::read_to_string(&path).expect("the unit");
    assert!(
        unit.lines().any(|l| l.trim() == "UMask=0077"),
        "{}",
        path.display()
    );
}

#[test]
fn a_rule_is_named_as_given_or_by_its_prefix_and_match() {
    let config = Config::parse(
        "[[rules]]\ncidr = \"10.0.0.0/8\"\npps = 5\n\n\
         [[rules]]\ncidr = \"10.0.0.0/8\"\nprotocol = \"UDP\"\nports = \"53\"\npps = 5\n\n\
         [[rules]]\ncidr = \"2001:db8::/32\"\nprotocol = 6\nports = \"80-443\"\ntcp_syn = true\npps = 5\n\n\
         [[rules]]\nname = \"web\"\ncidr = \"192.0.2.0/24\"\npps = 5\n",
        "named.toml",
    )
    .unwrap();
    let names: Vec<&str> = config.rules.specs().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "default",
            "10.0.0.0/8",
            "10.0.0.0/8+udp:53",
            "2001:db8::/32+tcp:80-443+syn",
            "web"
        ]
    );
    assert_eq!(config.rules.position("web"), Some(4));
    assert_eq!(config.rules.name(2), Some("10.0.0.0/8+udp:53"));
}

#[test]
fn a_bad_or_taken_rule_name_is_refused_with_its_field() {
    let rule = |name: &str, cidr: &str| {
        format!("[[rules]]\nname = {name:?}\ncidr = \"{cidr}\"\npps = 5\n\n")
    };
    rejected(
        &(rule("web", "10.0.0.0/8") + &rule("web", "10.1.0.0/16")),
        "rules[1].name: \"web\" names rules[0] too",
    );
    // A given name may not take another rule's derived one.
    rejected(
        &(rule("10.1.0.0/16", "10.0.0.0/8") + "[[rules]]\ncidr = \"10.1.0.0/16\"\npps = 5\n"),
        "rules[1].name: \"10.1.0.0/16\" names rules[0] too",
    );
    for (name, error) in [
        ("a b", "rules[0].name: \"a b\" is not a rule name"),
        ("", "rules[0].name: \"\" is not a rule name"),
        (&"x".repeat(81), "is not a rule name: 1 to 80 characters"),
        ("global", "rules[0].name: \"global\" names the global guard"),
        (
            "default",
            "rules[0].name: \"default\" names the default rule",
        ),
    ] {
        rejected(&rule(name, "10.0.0.0/8"), error);
    }
    rejected(
        "[default]\nname = \"all\"\npps = 5\n",
        "default.name: the default rule is named \"default\"",
    );
}

#[test]
fn lists_are_checked_by_their_fields() {
    let list = |body: &str| format!("[[lists]]\n{body}\n");
    let config = Config::parse(
        &list(
            "name = \"office\"\naction = \"allow\"\nprefixes = [\"192.0.2.0/24\", \"2001:db8::1\"]",
        ),
        "t",
    )
    .unwrap();
    assert_eq!(config.file.lists.len(), 1);
    rejected(
        &list("name = \"x\"\naction = \"deny\""),
        "lists[0]: a list needs a `file`, `prefixes` or both",
    );
    rejected(
        &list("name = \"x\"\naction = \"deny\"\nprefixes = [\"10.0.0.0/8\", \"ten\"]"),
        "lists[0].prefixes[1]: `ten` is not an address or a CIDR prefix",
    );
    rejected(
        &(list("name = \"x\"\naction = \"deny\"\nfile = \"a\"")
            + &list("name = \"x\"\naction = \"allow\"\nfile = \"b\"")),
        "lists[1].name: another list is named \"x\"",
    );
    rejected(
        &list("name = \"x\"\naction = \"drop\"\nfile = \"a\""),
        "unknown variant `drop`",
    );
}

#[test]
fn crowdsec_needs_an_http_url_and_a_key() {
    let dir = std::env::temp_dir().join(format!("xdp-limiter-cs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, "secret-key\n").unwrap();
    let section = |url: &str, key: &std::path::Path, extra: &str| {
        format!(
            "[crowdsec]\napi_url = \"{url}\"\napi_key_file = \"{}\"\n{extra}",
            key.display()
        )
    };
    let config = Config::parse(&section("http://127.0.0.1:8080/", &key, ""), "t").unwrap();
    let crowdsec = config.crowdsec.unwrap();
    assert_eq!(crowdsec.api_key, "secret-key");
    assert_eq!(crowdsec.poll_interval, std::time::Duration::from_secs(10));
    assert!(
        !format!("{crowdsec:?}").contains("secret"),
        "the key stays out of logs"
    );
    rejected(
        &section("https://lapi:8080/", &key, ""),
        "crowdsec.api_url: \"https://lapi:8080/\": an http://HOST:PORT/ URL",
    );
    rejected(
        &section("http://127.0.0.1:8080/", &dir.join("absent"), ""),
        "crowdsec.api_key_file: cannot read",
    );
    std::fs::write(&key, "\n").unwrap();
    rejected(
        &section("http://127.0.0.1:8080/", &key, ""),
        "crowdsec.api_key_file: ",
    );
    std::fs::write(&key, "k").unwrap();
    rejected(
        &section("http://127.0.0.1:8080/", &key, "poll_interval = \"100ms\""),
        "crowdsec.poll_interval: 100ms is outside 1s..1h",
    );
    std::fs::remove_dir_all(dir).unwrap();
}
