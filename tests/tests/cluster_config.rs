//! The operator's side of cluster limits against the real daemon in a
//! netns lab: a configuration with `[cluster]` and cluster-scoped rules is
//! loaded and shown by `status` and `rule ls`; `rule add --scope cluster`
//! is checked, saved and refused as documented; a bad `[cluster]` on
//! SIGHUP, or cluster-scoped rules for a daemon started without one, are
//! refused with the running rules intact. The sync with Redis is not
//! implemented on this branch, so no Redis server is needed (nothing
//! connects to the URLs) and no test looks at what a cluster-scoped rule
//! admits.

use limiter_tests::{
    daemon::{Daemon, Files},
    lab::{limit_config, Lab, HEAVY, MARKER, MEDIUM, RX_IF},
};
use nix::sys::signal::Signal;
use serde_json::Value;

const PORT: u16 = 7300;

/// A `[cluster]` section whose Redis URL has a password (which must never
/// be shown) and a node name.
const CLUSTER: &str = "[cluster]\nredis = [\"redis://:s3cret@10.99.0.1:6380\"]\n\
                       node = \"edge-1\"\nsync_interval = \"200ms\"\nfallback = \"local\"\n";

/// `limit_config(2)` (every source 20 frames per 10 s, MARKER allowed),
/// plus `CLUSTER` and a cluster-scoped rule for HEAVY.
fn cluster_config() -> String {
    format!(
        "{}\n[[rules]]\ncidr = \"{HEAVY}/32\"\npps = 1\nwindow = \"10s\"\nscope = \"cluster\"\n\n{CLUSTER}",
        limit_config(2)
    )
}

fn start(files: &Files, lab: &Lab) -> Daemon {
    let config = files.config();
    Daemon::start(
        &lab.rx,
        files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
    )
}

fn json(files: &Files, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["--output", "json"]);
    serde_json::from_str(&files.cli_ok(&args)).expect("JSON output")
}

/// `xdp-limiter <args>` that must fail with exit status 1: its stderr.
#[track_caller]
fn refused(files: &Files, args: &[&str]) -> String {
    let out = files.cli(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    stderr
}

#[test]
fn status_and_rule_ls_show_the_cluster_and_each_rules_scope() {
    let lab = Lab::three_senders();
    let files = Files::new();
    files.write_config(&cluster_config());
    let _daemon = start(&files, &lab);

    let status = json(&files, &["status"]);
    let cluster = &status["cluster"];
    assert_eq!(cluster["configured"], true, "{status:#}");
    assert_eq!(cluster["cluster_rules"], 1);
    assert_eq!(cluster["node"], "edge-1");
    assert_eq!(cluster["mode"], "single");
    assert_eq!(
        cluster["redis"],
        serde_json::json!(["redis://:***@10.99.0.1:6380"])
    );
    assert_eq!(cluster["sync_interval"], "200ms");
    assert_eq!(cluster["timeout"], "50ms");
    assert_eq!(cluster["threshold"], 0.25);
    assert_eq!(cluster["fallback"], "local");
    assert_eq!(cluster["grace"], "10s");
    // The sync runs against an unreachable Redis: live state, never synced.
    let live = &cluster["live"];
    assert_eq!(live["nodes_alive"], 0, "{cluster:#}");
    assert!(live["last_sync_age_ms"].is_null(), "{cluster:#}");
    let text = files.cli_ok(&["status"]);
    assert!(
        text.contains(
            "cluster: node edge-1, single Redis redis://:***@10.99.0.1:6380, 1 cluster-scoped rule"
        ),
        "{text}"
    );
    assert!(
        text.contains("sync: 0 nodes alive, last sync never"),
        "{text}"
    );
    assert!(!text.contains("s3cret") && !status.to_string().contains("s3cret"));

    let rules = json(&files, &["rule", "ls"]);
    assert_eq!(rules["default"]["scope"], "node", "{rules:#}");
    assert_eq!(rules["rules"][0]["scope"], "node");
    assert_eq!(rules["rules"][1]["cidr"], format!("{HEAVY}/32"));
    assert_eq!(rules["rules"][1]["scope"], "cluster");
    let text = files.cli_ok(&["rule", "ls"]);
    let heavy = text
        .lines()
        .find(|l| l.starts_with(&format!("{HEAVY}/32 ")))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(heavy.contains(" limit   cluster "), "{text}");
    assert!(
        text.lines()
            .find(|l| l.starts_with("default"))
            .is_some_and(|l| l.contains(" node ")),
        "{text}"
    );

    // A cluster-scoped rule added live: not saved while the file, which
    // holds a password, is readable by others (the change stays live and
    // the file as it was, the password never in the answer); saved once
    // the file is owner-only: it gets the scope and keeps [cluster] as
    // written (password included).
    let before = std::fs::read_to_string(files.config()).expect("the file");
    let edit = |verb| {
        [
            "rule",
            verb,
            "203.0.113.0/24",
            "--pps",
            "5",
            "--scope",
            "cluster",
            "--save",
        ]
    };
    let answer = refused(&files, &edit("add"));
    assert!(
        answer.contains("(live), but not saved") && answer.contains("chmod 600"),
        "{answer}"
    );
    assert!(!answer.contains("s3cret"), "{answer}");
    assert_eq!(std::fs::read_to_string(files.config()).unwrap(), before);
    assert_eq!(json(&files, &["status"])["cluster"]["cluster_rules"], 2);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(files.config(), std::fs::Permissions::from_mode(0o600))
            .expect("chmod 600");
    }
    let out = files.cli_ok(&edit("set"));
    assert!(out.contains("saved to"), "{out}");
    let saved = std::fs::read_to_string(files.config()).expect("the file");
    let reread = limiter_user::config::Config::load(&files.config()).expect("a valid file");
    assert_eq!(
        reread.rules.rules[2].scope,
        limiter_common::Scope::Cluster,
        "{saved}"
    );
    assert_eq!(reread.rules.rules[1].scope, limiter_common::Scope::Cluster);
    assert_eq!(reread.rules.rules[0].scope, limiter_common::Scope::Node);
    assert!(
        saved.contains("\"redis://:s3cret@10.99.0.1:6380\""),
        "{saved}"
    );
    assert_eq!(json(&files, &["status"])["cluster"]["cluster_rules"], 2);
    // `rule set` can make it node-scoped again.
    files.cli_ok(&["rule", "set", "203.0.113.0/24", "--pps", "5"]);
    assert_eq!(json(&files, &["rule", "ls"])["rules"][2]["scope"], "node");
    assert_eq!(json(&files, &["status"])["cluster"]["cluster_rules"], 1);

    // What this version cannot share is refused, and nothing changes.
    let before = json(&files, &["rule", "ls"]);
    let generation = json(&files, &["status"])["generation"].clone();
    for (args, expect) in [
        (
            vec![
                "rule",
                "add",
                "10.1.0.0/16",
                "--action",
                "allow",
                "--scope",
                "cluster",
            ],
            "rules[3].scope: only a `limit` rule can be cluster-scoped, not `allow`",
        ),
        (
            vec![
                "rule",
                "add",
                "10.1.0.0/16",
                "--pps",
                "5",
                "--block",
                "30s",
                "--scope",
                "cluster",
            ],
            "rules[3].block: a cluster-scoped rule cannot carry a penalty",
        ),
        (
            vec![
                "rule",
                "add",
                "10.1.0.0/16",
                "--bps",
                "5Mbit",
                "--scope",
                "cluster",
            ],
            "rules[3].bytes_per_second: a cluster-scoped rule limits packets only",
        ),
    ] {
        let stderr = refused(&files, &args);
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
    let out = files.cli(&[
        "rule",
        "add",
        "10.1.0.0/16",
        "--pps",
        "5",
        "--scope",
        "everywhere",
    ]);
    assert_eq!(out.status.code(), Some(2), "clap refuses an unknown scope");
    assert_eq!(json(&files, &["rule", "ls"]), before, "rules unchanged");
    assert_eq!(json(&files, &["status"])["generation"], generation);
}

#[test]
fn a_bad_cluster_section_on_sighup_is_refused_and_the_running_rules_stay() {
    let lab = Lab::three_senders();
    let files = Files::new();
    files.write_config(&cluster_config());
    let daemon = start(&files, &lab);
    let rules = json(&files, &["rule", "ls"]);
    let status = json(&files, &["status"]);

    // A file whose rules would admit everything, with a bad [cluster].
    let bad = format!(
        "[default]\npps = 1000\ndry_run = false\n\n[[rules]]\ncidr = \"{HEAVY}/32\"\npps = 1000\n\
         scope = \"cluster\"\n\n{}",
        CLUSTER.replace("sync_interval = \"200ms\"", "sync_interval = \"1ms\"")
    );
    files.write_config(&bad);
    daemon.signal(Signal::SIGHUP);
    daemon.wait_log("configuration rejected");
    let log = daemon.log();
    assert!(
        log.contains("cluster.sync_interval: 1ms is outside 10ms..=10s"),
        "{log}"
    );
    assert_eq!(
        json(&files, &["rule", "ls"]),
        rules,
        "the running rules stay"
    );
    let after = json(&files, &["status"]);
    assert_eq!(after["generation"], status["generation"]);
    assert_eq!(after["cluster"], status["cluster"]);
    // And the kernel still enforces them: MEDIUM is held to the running
    // default (20 per window), not the rejected file's 1000 pps.
    let receiver = lab.receiver(PORT);
    let got = lab.exchange(&receiver, PORT, &[(MEDIUM, 25)], MARKER);
    assert_eq!(got.get(&MEDIUM), Some(&20), "{got:?}");

    // A valid file with another [cluster]: the rules are reloaded, the
    // cluster settings wait for a restart (said in the log and visible in
    // status).
    files.write_config(&cluster_config().replace("edge-1", "edge-2"));
    assert!(files.cli_ok(&["reload"]).contains("reloaded"));
    daemon.wait_log("[cluster] settings changed; they take effect on restart");
    let after = json(&files, &["status"]);
    assert_eq!(after["cluster"]["node"], "edge-1", "{after:#}");
    assert_ne!(after["generation"], status["generation"]);
}

#[test]
fn a_daemon_started_without_cluster_refuses_cluster_scoped_rules() {
    let lab = Lab::three_senders();
    let files = Files::new();
    files.write_config(&limit_config(2));
    let daemon = start(&files, &lab);
    let status = json(&files, &["status"]);
    assert_eq!(
        status["cluster"],
        serde_json::json!({"configured": false, "cluster_rules": 0}),
        "{status:#}"
    );
    let text = files.cli_ok(&["status"]);
    assert!(text.contains("cluster: not configured"), "{text}");
    let rules = json(&files, &["rule", "ls"]);

    let stderr = refused(
        &files,
        &[
            "rule",
            "add",
            "10.1.0.0/16",
            "--pps",
            "5",
            "--scope",
            "cluster",
        ],
    );
    assert!(
        stderr.contains("rules[1].scope: a cluster-scoped rule needs a [cluster] section"),
        "{stderr}"
    );
    let stderr = refused(
        &files,
        &["default", "set", "--pps", "5", "--scope", "cluster"],
    );
    assert!(
        stderr.contains("default.scope: a cluster-scoped rule needs a [cluster] section"),
        "{stderr}"
    );

    // [cluster] added to the file with a cluster-scoped rule: the reload is
    // refused ([cluster] takes effect on restart), rules unchanged.
    files.write_config(&cluster_config());
    assert!(refused(&files, &["reload"]).contains("reload failed"));
    daemon.wait_log("the daemon runs without [cluster]");
    assert_eq!(json(&files, &["rule", "ls"]), rules);
    assert_eq!(
        json(&files, &["status"])["generation"],
        status["generation"]
    );

    // [cluster] added without cluster-scoped rules: reloaded (the section
    // waits for a restart), and cluster-scoped edits are still refused,
    // though the file now has the section.
    files.write_config(&format!("{}\n{CLUSTER}", limit_config(2)));
    assert!(files.cli_ok(&["reload"]).contains("reloaded"));
    let stderr = refused(
        &files,
        &[
            "rule",
            "add",
            "10.1.0.0/16",
            "--pps",
            "5",
            "--scope",
            "cluster",
        ],
    );
    assert!(
        stderr.contains("rules[1].scope: the daemon runs without [cluster]"),
        "{stderr}"
    );
    assert_eq!(json(&files, &["status"])["cluster"]["configured"], false);
}
