//! The daemon's lists and bans in a netns lab, and the feeds that ban
//! through it: fail2ban's action (Debian's fail2ban, a private instance
//! watching a log this test writes).

use std::{fs, net::UdpSocket, process::Command, time::Duration};

use limiter_tests::{
    daemon::{binary, Daemon, Files},
    lab::{limit_config, Lab, HEAVY, MARKER, MEDIUM, RX_IF},
    wait_until,
};
use nix::sys::signal::Signal;
use serde_json::Value;

const PORT: u16 = 7000;

/// `limit_config(5)` (50 frames per 10 s window) with the bans kept in
/// the test's directory and a deny list read from `blocked.txt` beside
/// the configuration.
fn config(files: &Files) -> String {
    let state = files.dir.join("state");
    limit_config(5).replacen(
        "[daemon]\n",
        &format!("[daemon]\nstate_dir = \"{}\"\n", state.display()),
        1,
    ) + "\n[[lists]]\nname = \"blocked\"\naction = \"deny\"\nfile = \"blocked.txt\"\n"
}

fn start(lab: &Lab, files: &Files) -> Daemon {
    let config = files.config();
    Daemon::start(
        &lab.rx,
        files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
    )
}

/// Frames of `n` sent from `source` that reached the receiver.
fn through(lab: &Lab, receiver: &UdpSocket, source: std::net::Ipv4Addr, n: usize) -> usize {
    let got = lab.exchange(receiver, PORT, &[(source, n)], MARKER);
    got.get(&source).copied().unwrap_or(0)
}

fn bans(files: &Files) -> Vec<Value> {
    let text = files.cli_ok(&["bans", "--output", "json"]);
    serde_json::from_str::<Vec<Value>>(&text).expect("bans as JSON")
}

fn status(files: &Files) -> Value {
    serde_json::from_str(&files.cli_ok(&["status", "--output", "json"])).expect("status as JSON")
}

#[test]
fn a_daemon_judges_lists_and_bans_that_end_on_their_own_and_survive_a_restart() {
    let lab = Lab::three_senders();
    let files = Files::new();
    fs::write(files.dir.join("blocked.txt"), format!("# test\n{MEDIUM}\n")).unwrap();
    files.write_config(&config(&files));
    let receiver = lab.receiver(PORT);
    let daemon = start(&lab, &files);

    assert_eq!(through(&lab, &receiver, MEDIUM, 10), 0, "in the deny list");
    assert_eq!(through(&lab, &receiver, HEAVY, 10), 10);
    let list = &status(&files)["lists"][0];
    assert_eq!(
        (list["name"].as_str(), list["prefixes"].as_u64()),
        (Some("blocked"), Some(1))
    );
    assert!(list["packets"].as_u64().unwrap() >= 10, "{list}");

    // A ban takes effect at once, and ends by itself.
    let out = files.cli_ok(&["ban", &HEAVY.to_string(), "--for", "2s", "--reason", "test"]);
    assert!(out.contains(&format!("banned {HEAVY}/32 for 2s")), "{out}");
    assert_eq!(through(&lab, &receiver, HEAVY, 10), 0, "banned");
    let listed = bans(&files);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["cidr"], format!("{HEAVY}/32"));
    assert_eq!(
        (listed[0]["reason"].as_str(), listed[0]["origin"].as_str()),
        (Some("test"), Some("cli"))
    );
    assert!(listed[0]["remaining_s"].as_u64().unwrap() <= 2);
    assert_eq!(daemon.metric("xdp_limiter_bans"), Some(1.0));
    assert_eq!(
        daemon.metric("xdp_limiter_ban_changes_total{change=\"ban\",origin=\"cli\"}"),
        Some(1.0)
    );
    daemon.wait_log("ban ended");
    let log = daemon.log();
    for event in [
        "event=\"ban\"",
        "event=\"ban_ended\"",
        "event=\"lists_loaded\"",
    ] {
        assert!(log.contains(event), "{event} missing: {log}");
    }
    assert_eq!(through(&lab, &receiver, HEAVY, 10), 10, "the ban ended");
    assert!(bans(&files).is_empty());
    daemon.wait_metric(
        "xdp_limiter_ban_changes_total{change=\"expired\",origin=\"cli\"}",
        |v| v == 1.0,
    );
    assert!(
        daemon
            .metric(&format!(
                "xdp_limiter_list_packets_total{{action=\"deny\",interface=\"{RX_IF}\",list=\"blocked\"}}"
            ))
            .unwrap_or(0.0)
            >= 10.0
    );

    // A ban until unbanned outlives the daemon (stopped, which removes
    // its pins: restored from the state directory).
    files.cli_ok(&["ban", &HEAVY.to_string(), "--for", "forever"]);
    assert!(daemon.stop().success());
    let daemon = start(&lab, &files);
    assert!(daemon.log().contains("bans restored"), "{}", daemon.log());
    let listed = bans(&files);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["remaining_s"], Value::Null);
    assert_eq!(through(&lab, &receiver, HEAVY, 5), 0, "still banned");
    assert!(files
        .cli_ok(&["unban", &HEAVY.to_string()])
        .contains("unbanned"));
    assert_eq!(through(&lab, &receiver, HEAVY, 5), 5);
    let again = files.cli(&["unban", &HEAVY.to_string()]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("is not banned"));
    files.cli_ok(&["unban", &HEAVY.to_string(), "--missing-ok"]);

    // Bad bans are refused with a reason.
    for (args, reason) in [
        (vec!["ban", "0.0.0.0/0", "--for", "1h"], "every address"),
        (vec!["ban", "192.0.2.0/24", "--for", "0s"], "more than zero"),
        (vec!["ban", "192.0.2.0/24", "--for", "soon"], "soon"),
    ] {
        let out = files.cli(&args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(reason), "{args:?}: {stderr}");
    }

    // The list file re-read on reload; a bad one keeps the list in force.
    fs::write(files.dir.join("blocked.txt"), "not-a-prefix\n").unwrap();
    // `check --config` (the unit's ExecStartPre) reads the lists too.
    let with_interface = fs::read_to_string(files.config()).unwrap().replacen(
        "[daemon]\n",
        &format!("[daemon]\ninterfaces = [\"{RX_IF}\"]\n"),
        1,
    );
    let checked = files.dir.join("check.toml");
    fs::write(&checked, with_interface).unwrap();
    let check = Command::new(binary())
        .args(["check", "--config"])
        .arg(&checked)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert!(!check.status.success(), "{stderr}");
    assert!(
        stderr.contains("blocked.txt line 1") && stderr.contains("not-a-prefix"),
        "{stderr}"
    );
    daemon.signal(Signal::SIGHUP);
    daemon.wait_log("configuration rejected");
    assert_eq!(through(&lab, &receiver, MEDIUM, 5), 0, "the old list stays");
    fs::write(files.dir.join("blocked.txt"), "203.0.113.0/24\n").unwrap();
    daemon.signal(Signal::SIGHUP);
    daemon.wait_log("configuration reloaded");
    assert_eq!(through(&lab, &receiver, MEDIUM, 5), 5, "no longer listed");
    assert_eq!(status(&files)["lists"][0]["prefixes"], 1);

    // A list's own prefixes edited live, and saved into the file.
    let out = files.cli_ok(&["list", "add", "blocked", &MEDIUM.to_string(), "--save"]);
    assert!(
        out.contains("1 added to list blocked (now 2 prefixes); saved"),
        "{out}"
    );
    assert_eq!(through(&lab, &receiver, MEDIUM, 5), 0, "added");
    let saved = fs::read_to_string(files.config()).unwrap();
    assert!(
        saved.contains(&format!("prefixes = [\"{MEDIUM}/32\"]")),
        "{saved}"
    );
    assert!(saved.contains("file = \"blocked.txt\""), "{saved}");
    files.cli_ok(&["list", "rm", "blocked", &MEDIUM.to_string()]);
    assert_eq!(
        through(&lab, &receiver, MEDIUM, 5),
        5,
        "removed (live only)"
    );
    for (args, reason) in [
        (
            vec!["list", "rm", "blocked", "203.0.113.0/24"],
            "not among list blocked's prefixes",
        ),
        (
            vec!["list", "add", "nosuch", "192.0.2.9"],
            "no list is named \"nosuch\"",
        ),
    ] {
        let out = files.cli(&args);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(reason),
            "{args:?}: {out:?}"
        );
    }
}

/// fail2ban's private instance: its configuration in `dir`, our action
/// file as shipped (dist/fail2ban), a jail banning a source after two
/// failures in `app.log` for `bantime` seconds.
fn fail2ban_config(files: &Files, bantime: u32) -> std::path::PathBuf {
    let conf = files.dir.join("f2b");
    fs::create_dir_all(conf.join("filter.d")).unwrap();
    fs::create_dir_all(conf.join("action.d")).unwrap();
    let dir = files.dir.display();
    fs::write(
        conf.join("fail2ban.local"),
        format!(
            "[Definition]\nloglevel = INFO\nlogtarget = {dir}/fail2ban.log\nsyslogsocket = auto\n\
             socket = {dir}/f2b.sock\npidfile = {dir}/f2b.pid\ndbfile = :memory:\n\
             allowipv6 = auto\ndbpurgeage = 1d\n"
        ),
    )
    .unwrap();
    fs::write(
        conf.join("filter.d/test.conf"),
        "[Definition]\nfailregex = ^FAIL from <HOST>$\ndatepattern = {NONE}\n",
    )
    .unwrap();
    let action = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dist/fail2ban/action.d/xdp-limiter.conf");
    fs::copy(action, conf.join("action.d/xdp-limiter.conf")).unwrap();
    fs::write(files.dir.join("app.log"), "").unwrap();
    fs::write(
        conf.join("jail.local"),
        format!(
            "[test]\nenabled = true\nbackend = polling\nfilter = test\nlogpath = {dir}/app.log\n\
             maxretry = 2\nfindtime = 60\nbantime = {bantime}\n\
             action = xdp-limiter[xdp_limiter=\"{}\", socket=\"{}\"]\n",
            binary().display(),
            files.socket().display()
        ),
    )
    .unwrap();
    conf
}

/// A server process killed if the test fails before stopping it.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn fail2ban_bans_and_unbans_through_the_shipped_action() {
    let lab = Lab::three_senders();
    let files = Files::new();
    fs::write(files.dir.join("blocked.txt"), "").unwrap();
    files.write_config(&config(&files));
    let receiver = lab.receiver(PORT);
    let daemon = start(&lab, &files);
    let conf = fail2ban_config(&files, 3600);
    let socket = files.dir.join("f2b.sock");
    let mut server = Server(
        Command::new("fail2ban-server")
            .args(["-f", "-x", "-c"])
            .arg(&conf)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("fail2ban-server (cargo xtask setup installs fail2ban)"),
    );
    let client = |args: &[&str]| {
        Command::new("fail2ban-client")
            .arg("-s")
            .arg(&socket)
            .args(args)
            .output()
            .expect("fail2ban-client")
    };
    let ready = wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
        client(&["status", "test"]).status.success().then_some(())
    });
    assert!(
        ready.is_some(),
        "{}",
        fs::read_to_string(files.dir.join("fail2ban.log")).unwrap_or_default()
    );

    // Two failures: fail2ban bans HEAVY for the jail's bantime.
    fs::write(
        files.dir.join("app.log"),
        format!("FAIL from {HEAVY}\nFAIL from {HEAVY}\n"),
    )
    .unwrap();
    let banned = wait_until(Duration::from_secs(15), Duration::from_millis(50), || {
        bans(&files).into_iter().next()
    })
    .unwrap_or_else(|| {
        panic!(
            "no ban: {}",
            fs::read_to_string(files.dir.join("fail2ban.log")).unwrap_or_default()
        )
    });
    assert_eq!(banned["cidr"], format!("{HEAVY}/32"));
    assert_eq!(banned["reason"], "fail2ban test");
    let remaining = banned["remaining_s"].as_u64().unwrap();
    assert!(
        (3590..=3600).contains(&remaining),
        "the jail's bantime: {remaining}"
    );
    assert_eq!(through(&lab, &receiver, HEAVY, 5), 0);

    // fail2ban's unban lifts it; stopping fail2ban unbans nothing more.
    let out = client(&["set", "test", "unbanip", &HEAVY.to_string()]);
    assert!(
        String::from_utf8_lossy(&out.stdout).trim() == "1",
        "{out:?}"
    );
    assert!(bans(&files).is_empty());
    assert_eq!(through(&lab, &receiver, HEAVY, 5), 5);
    assert!(client(&["stop"]).status.success());
    assert!(server.0.wait().unwrap().success());
    let log = fs::read_to_string(files.dir.join("fail2ban.log")).unwrap_or_default();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(
        errors.is_empty(),
        "fail2ban's errors: {errors:#?}\ndaemon: {}",
        daemon.log()
    );
}

/// A CrowdSec local API of Debian's crowdsec, alone (`-no-cs`: no
/// agent), with everything under `dir` and listening on 127.0.0.1:8080 of
/// namespace `ns`; a bouncer registered with key `KEY`.
struct Lapi {
    server: Server,
    dir: std::path::PathBuf,
    ns: String,
}

const KEY: &str = "xdp-limiter-test-bouncer-key-0123456789";

impl Lapi {
    fn start(ns: &limiter_tests::netns::NetNs, dir: std::path::PathBuf) -> Self {
        fs::create_dir_all(dir.join("data")).unwrap();
        let d = dir.display();
        fs::write(
            dir.join("config.yaml"),
            format!(
                "common:\n  daemonize: false\n  log_media: stdout\n  log_level: info\n  working_dir: .\n\
                 config_paths:\n  config_dir: {d}/\n  data_dir: {d}/data/\n  simulation_path: {d}/simulation.yaml\n  \
                 hub_dir: {d}/hub/\n  index_path: {d}/hub/.index.json\n  notification_dir: {d}/notifications/\n  \
                 plugin_dir: /usr/lib/crowdsec/plugins/\ncrowdsec_service:\n  acquisition_path: {d}/acquis.yaml\n\
                 cscli:\n  output: human\n  color: \"no\"\ndb_config:\n  log_level: info\n  type: sqlite\n  \
                 db_path: {d}/data/crowdsec.db\n  use_wal: false\napi:\n  client:\n    insecure_skip_verify: false\n    \
                 credentials_path: {d}/local_api_credentials.yaml\n  server:\n    log_level: info\n    \
                 listen_uri: 127.0.0.1:8080\n    profiles_path: {d}/profiles.yaml\n    console_path: {d}/console.yaml\n    \
                 trusted_ips:\n      - 127.0.0.1\n      - ::1\nprometheus:\n  enabled: false\n"
            ),
        )
        .unwrap();
        fs::write(
            dir.join("profiles.yaml"),
            "name: default_ip_remediation\nfilters:\n - Alert.Remediation == true && Alert.GetScope() == \"Ip\"\n\
             decisions:\n - type: ban\n   duration: 4h\non_success: break\n",
        )
        .unwrap();
        fs::write(
            dir.join("simulation.yaml"),
            "simulation: false\nexclusions: []\n",
        )
        .unwrap();
        let lapi = |program: &str| {
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net=/run/netns/{}", ns.name()))
                .arg(program)
                .arg("-c")
                .arg(dir.join("config.yaml"))
                .current_dir(&dir);
            cmd
        };
        let credentials = dir.join("local_api_credentials.yaml");
        for args in [
            vec![
                "machines",
                "add",
                "test",
                "--password",
                "TestPassw0rdTestPassw0rd",
                "-f",
                credentials.to_str().unwrap(),
                "--url",
                "http://127.0.0.1:8080/",
            ],
            vec!["bouncers", "add", "xdp-limiter", "-k", KEY, "-o", "raw"],
        ] {
            let out = lapi("cscli")
                .args(&args)
                .output()
                .expect("cscli (cargo xtask setup installs crowdsec)");
            assert!(
                out.status.success(),
                "cscli {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let server = Server(
            lapi("crowdsec")
                .arg("-no-cs")
                .stdin(std::process::Stdio::null())
                .stdout(fs::File::create(dir.join("lapi.log")).unwrap())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("crowdsec"),
        );
        let mut lapi = Self {
            server,
            dir,
            ns: ns.name().to_string(),
        };
        let health = wait_until(Duration::from_secs(20), Duration::from_millis(20), || {
            if let Ok(Some(status)) = lapi.server.0.try_wait() {
                panic!("crowdsec exited ({status}): {}", lapi.log());
            }
            let answer = ns.enter(|| {
                ureq::get("http://127.0.0.1:8080/health")
                    .timeout(Duration::from_secs(1))
                    .call()
                    .ok()
                    .map(|r| r.status())
            });
            (answer == Some(200)).then_some(())
        });
        assert!(
            health.is_some(),
            "the local API never answered: {}",
            lapi.log()
        );
        lapi
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("lapi.log")).unwrap_or_default()
    }

    /// `cscli decisions <args>` through the running local API.
    fn decisions(&self, args: &[&str]) {
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.ns))
            .args(["cscli", "-c"])
            .arg(self.dir.join("config.yaml"))
            .arg("decisions")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("cscli");
        assert!(
            out.status.success(),
            "cscli decisions {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn crowdsec_decisions_become_bans_and_their_deletion_lifts_them() {
    let lab = Lab::three_senders();
    let files = Files::new();
    fs::write(files.dir.join("blocked.txt"), "").unwrap();
    let lapi = Lapi::start(&lab.rx, files.dir.join("crowdsec"));
    fs::write(files.dir.join("bouncer.key"), format!("{KEY}\n")).unwrap();
    files.write_config(&format!(
        "{}\n[crowdsec]\napi_url = \"http://127.0.0.1:8080/\"\napi_key_file = \"{}\"\npoll_interval = \"1s\"\n",
        config(&files),
        files.dir.join("bouncer.key").display()
    ));
    let receiver = lab.receiver(PORT);
    let daemon = start(&lab, &files);

    lapi.decisions(&[
        "add",
        "--ip",
        &HEAVY.to_string(),
        "--duration",
        "1h",
        "--reason",
        "ssh-bf",
    ]);
    lapi.decisions(&[
        "add",
        "--range",
        "203.0.113.0/24",
        "--duration",
        "2h",
        "--reason",
        "scan",
    ]);
    let banned = wait_until(Duration::from_secs(15), Duration::from_millis(100), || {
        let all = bans(&files);
        (all.len() == 2).then_some(all)
    })
    .unwrap_or_else(|| panic!("no bans: {}", daemon.log()));
    let heavy = banned
        .iter()
        .find(|b| b["cidr"] == format!("{HEAVY}/32"))
        .expect("HEAVY banned");
    assert_eq!(
        (heavy["origin"].as_str(), heavy["reason"].as_str()),
        (Some("crowdsec"), Some("ssh-bf"))
    );
    assert!(
        (3590..=3600).contains(&heavy["remaining_s"].as_u64().unwrap()),
        "{heavy}"
    );
    assert!(banned.iter().any(|b| b["cidr"] == "203.0.113.0/24"));
    assert_eq!(through(&lab, &receiver, HEAVY, 5), 0);
    assert_eq!(through(&lab, &receiver, MEDIUM, 5), 5);

    // A deleted decision lifts its ban; a CLI ban CrowdSec never set stays.
    files.cli_ok(&["ban", &MEDIUM.to_string(), "--for", "1h"]);
    lapi.decisions(&["delete", "--ip", &HEAVY.to_string()]);
    let lifted = wait_until(Duration::from_secs(15), Duration::from_millis(100), || {
        let all = bans(&files);
        (!all.iter().any(|b| b["cidr"] == format!("{HEAVY}/32"))).then_some(all)
    })
    .unwrap_or_else(|| panic!("the ban stayed: {}", daemon.log()));
    assert_eq!(lifted.len(), 2, "{lifted:?}");
    assert_eq!(through(&lab, &receiver, HEAVY, 5), 5);
    assert!(
        daemon
            .metric("xdp_limiter_crowdsec_polls_total{result=\"ok\"}")
            .unwrap()
            >= 2.0
    );
    assert_eq!(
        daemon
            .metric("xdp_limiter_crowdsec_polls_total{result=\"error\"}")
            .unwrap_or(0.0),
        0.0
    );
    assert_eq!(
        daemon.metric("xdp_limiter_ban_changes_total{change=\"unban\",origin=\"crowdsec\"}"),
        Some(1.0)
    );
}
