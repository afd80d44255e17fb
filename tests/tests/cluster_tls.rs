//! The daemon against a Redis on a shared network: a real `redis-server`
//! that speaks TLS only, asks for a client certificate and lets in one ACL
//! user (`limiter_tests::redis::Security`), reached by a real daemon in a
//! node namespace. The daemon syncs through it, and whatever goes wrong
//! (the port refuses, the name does not resolve, the password is wrong,
//! the CA is not the one that signed Redis's certificate, the address is
//! not one the certificate names, a reload of a file TOML cannot parse)
//! neither its log (at debug level), nor `status`, nor `/metrics` ever
//! shows the password.

use std::{net::Ipv4Addr, path::Path, time::Duration};

use limiter_tests::{
    cluster_lab::{node_if, redis_addr, ClusterLab},
    daemon::Daemon,
    redis::{Pki, RedisServer, Security, ACL_USER, PORT},
    wait_until,
};
use serde_json::Value;

/// The ACL user's password: shown nowhere.
const PASSWORD: &str = "xl-Secret-7f3a";
/// A wrong password tried: shown nowhere either.
const WRONG_PASSWORD: &str = "xl-Wrong-93c1";
/// An address of the Redis namespace its certificate does not name.
const UNNAMED: Ipv4Addr = Ipv4Addr::new(10, 20, 0, 5);

fn lab() -> ClusterLab {
    let security = Security {
        tls: true,
        client_certs: true,
        acl_password: Some(PASSWORD.into()),
        ..Security::default()
    };
    let lab = ClusterLab::with_redis(
        1,
        RedisServer::start_on_all_addresses_secured(security, &[redis_addr(0)]),
    );
    lab.redis
        .ns()
        .ip(&["addr", "add", &format!("{UNNAMED}/24"), "dev", "veth-s0"]);
    lab
}

/// Node 0's configuration: every source cluster-scoped, Redis at `url`
/// verified against `ca`, with the client certificate. Ticks of 1 s: a
/// connection that fails (a TLS handshake, then the login refused and
/// retried once) fits in a tick on a loaded machine, so the log says why
/// it failed rather than that the tick ran out.
/// The daemon's configuration against `url`. The timeout is the most the
/// sync interval allows: these tests read why a connection fails (the
/// certificate, the password), which the log can say only once the TLS
/// handshake has ended; a debug build's handshake beside the rest of the
/// suite has taken over 300 ms, and then every attempt only timed out.
fn config(url: &str, ca: &Path, pki: &Pki) -> String {
    format!(
        "[daemon]\ntick = \"100ms\"\n\n\
         [cluster]\nredis = [\"{url}\"]\nnode = \"node-0\"\n\
         sync_interval = \"1s\"\ntimeout = \"900ms\"\n\
         tls_ca_file = \"{}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n\n\
         [default]\npps = 1000\nwindow = \"1s\"\nscope = \"cluster\"\ndry_run = false\n",
        ca.display(),
        pki.client_cert.display(),
        pki.client_key.display()
    )
}

fn url(password: &str, host: &str, port: u16) -> String {
    format!("rediss://{ACL_USER}:{password}@{host}:{port}")
}

fn start(lab: &ClusterLab, text: &str) -> Daemon {
    let node = &lab.nodes[0];
    node.files.write_config(text);
    let path = node.files.config();
    Daemon::start_with_env(
        &node.ns,
        &node.files,
        &["-i", &node_if(0), "-c", path.to_str().expect("UTF-8 path")],
        &[("RUST_LOG", "debug")],
    )
}

fn status_json(lab: &ClusterLab) -> Value {
    let out = lab.nodes[0].files.cli_ok(&["status", "--output", "json"]);
    serde_json::from_str(&out).expect("status JSON")
}

/// Everything an operator can see of the daemon: its log, `status` in
/// both forms and a scrape of `/metrics`.
fn everything_shown(lab: &ClusterLab, daemon: &Daemon) -> String {
    let files = &lab.nodes[0].files;
    format!(
        "{}\n{}\n{}\n{}",
        daemon.log(),
        files.cli_ok(&["status"]),
        files.cli_ok(&["status", "--output", "json"]),
        daemon.metrics()
    )
}

#[track_caller]
fn assert_no_password(what: &str, shown: &str) {
    for secret in [PASSWORD, WRONG_PASSWORD] {
        assert!(!shown.contains(secret), "{what}: {secret} shown:\n{shown}");
    }
}

#[test]
fn the_daemon_syncs_over_tls_as_the_acl_user_and_never_shows_the_password() {
    let lab = lab();
    let pki = lab.redis.pki().clone();
    let redis = redis_addr(0).to_string();

    // Working: the node syncs (its heartbeat counts it alive).
    let daemon = start(&lab, &config(&url(PASSWORD, &redis, PORT), &pki.ca, &pki));
    daemon.wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == 1.0);
    let status = status_json(&lab);
    assert_eq!(
        status["cluster"]["redis"][0],
        format!("rediss://{ACL_USER}:***@{redis}:{PORT}"),
        "{status:#}"
    );
    // Redis holds the heartbeat the node wrote as the ACL user.
    let nodes = lab.redis.cli(&["zrange", "xl:nodes", "0", "-1"]);
    assert!(nodes.contains("node-0"), "{nodes}");
    // A reload of a file TOML cannot parse, the password on the line at
    // fault: refused, and neither the answer nor the log quotes it.
    lab.nodes[0].files.write_config(&format!(
        "[cluster]\nredis = \"{}\"\n",
        url(PASSWORD, &redis, PORT)
    ));
    let reload = lab.nodes[0].files.cli(&["reload"]);
    let answer = format!(
        "{}{}",
        String::from_utf8_lossy(&reload.stdout),
        String::from_utf8_lossy(&reload.stderr)
    );
    assert!(!reload.status.success(), "{answer}");
    assert_no_password("a reload TOML refused", &answer);
    // The log says why (everything_shown below checks it shows no
    // password).
    daemon.wait_log("TOML parse error");
    assert_no_password("working", &everything_shown(&lab, &daemon));
    daemon.stop();

    let unnamed = UNNAMED.to_string();
    for (what, url, ca, says) in [
        (
            "connection refused",
            url(PASSWORD, &redis, 6390),
            &pki.ca,
            "refused",
        ),
        (
            "DNS failure",
            url(PASSWORD, "no-such-redis.invalid", PORT),
            &pki.ca,
            "failed to lookup address",
        ),
        (
            "wrong password",
            url(WRONG_PASSWORD, &redis, PORT),
            &pki.ca,
            "authentication failed",
        ),
        (
            "a CA that did not sign Redis's certificate",
            url(PASSWORD, &redis, PORT),
            &pki.other_ca,
            "UnknownIssuer",
        ),
        (
            "an address the certificate does not name",
            url(PASSWORD, &unnamed, PORT),
            &pki.ca,
            "not valid for name",
        ),
    ] {
        let daemon = start(&lab, &config(&url, ca, &pki));
        // Three failed ticks: the first failure and the degradation are
        // logged with their cause.
        let degraded = wait_until(Duration::from_secs(15), Duration::from_millis(50), || {
            (status_json(&lab)["cluster"]["live"]["degraded"] == true).then_some(())
        });
        assert!(
            degraded.is_some(),
            "{what}: never degraded:\n{}",
            daemon.log()
        );
        let log = daemon.log();
        let cluster_lines: Vec<&str> = log.lines().filter(|l| l.contains("cluster")).collect();
        assert!(
            log.contains("node degraded") && log.contains(says),
            "{what}: the log does not say {says:?}:\n{}",
            cluster_lines.join("\n")
        );
        let shown_url = url.replace(PASSWORD, "***").replace(WRONG_PASSWORD, "***");
        assert!(
            log.contains(&shown_url),
            "{what}: {shown_url} not in:\n{log}"
        );
        let failures: f64 = ["timeout", "connection", "server", "other"]
            .iter()
            .filter_map(|kind| {
                daemon.metric(&format!(
                    "xdp_limiter_cluster_redis_errors_total{{kind=\"{kind}\"}}"
                ))
            })
            .sum();
        assert!(failures >= 3.0, "{what}: {failures} Redis errors counted");
        assert_no_password(what, &everything_shown(&lab, &daemon));
        daemon.stop();
    }
}

/// The login kept outside the configuration (`cluster.password_file` and
/// `username_file`, as systemd credentials or files only root reads):
/// the daemon syncs as the ACL user, and neither its files' text nor
/// anything it shows holds the password.
#[test]
fn the_daemon_logs_in_with_the_user_and_password_of_its_secret_files() {
    let lab = lab();
    let pki = lab.redis.pki().clone();
    let dir = lab.nodes[0].files.config();
    let dir = dir.parent().expect("the configuration's directory");
    let (password, user) = (dir.join("redis-password"), dir.join("redis-user"));
    std::fs::write(&password, format!("{PASSWORD}\n")).unwrap();
    std::fs::write(&user, format!("{ACL_USER}\n")).unwrap();
    let text = config(&format!("rediss://{}:{PORT}", redis_addr(0)), &pki.ca, &pki).replace(
        "[cluster]\n",
        &format!(
            "[cluster]\npassword_file = \"{}\"\nusername_file = \"{}\"\n",
            password.display(),
            user.display()
        ),
    );
    assert!(!text.contains(PASSWORD));
    let daemon = start(&lab, &text);
    daemon.wait_metric("xdp_limiter_cluster_nodes_alive", |v| v == 1.0);
    let nodes = lab.redis.cli(&["zrange", "xl:nodes", "0", "-1"]);
    assert!(nodes.contains("node-0"), "{nodes}");
    assert_no_password("secret files", &everything_shown(&lab, &daemon));
    daemon.stop();
}
