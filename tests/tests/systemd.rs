//! What the daemon tells systemd, read off a real `NOTIFY_SOCKET`: `READY=1`
//! (with a status naming the interfaces) once the program is attached and
//! the rules pushed, `WATCHDOG=1` at each quarter of `WATCHDOG_USEC` while
//! the loop ticks, `STOPPING=1` when it stops. And `check --config`, the
//! unit's `ExecStartPre` (the unit itself is checked as packaged:
//! `package.rs`).

use std::{
    os::unix::net::UnixDatagram,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use limiter_tests::{
    daemon::{Daemon, Files},
    lab::{Lab, MARKER, RX_IF},
};

/// The datagrams on `socket` until `done` says enough or 10 s pass.
fn read_until(socket: &UnixDatagram, mut done: impl FnMut(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !done(&got) {
        assert!(Instant::now() < deadline, "only {got:?}");
        if let Ok(n) = socket.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    got
}

#[test]
fn the_daemon_says_ready_once_protecting_feeds_the_watchdog_and_says_stopping() {
    let lab = Lab::new(&[MARKER]);
    let files = Files::new();
    files.write_config("[daemon]\ntick = \"100ms\"\n\n[default]\npps = 100\n");
    let path = files.config().with_file_name("notify.sock");
    let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let config = files.config();
    let started = Instant::now();
    // A watchdog of 800 ms: fed every 200 ms, every other tick.
    let daemon = Daemon::start_with_env(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().unwrap()],
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "800000"),
        ],
    );
    let got = read_until(&socket, |got| got.iter().any(|m| m.contains("READY=1")));
    let ready = got.iter().find(|m| m.contains("READY=1")).unwrap();
    assert!(
        ready.contains(&format!("STATUS=protecting {RX_IF}, rule generation")),
        "{ready}"
    );
    // Ready means protecting: the program is attached, and said so first.
    assert!(lab.attached_program().is_some(), "ready before attached");
    assert!(daemon.log().contains("protecting"), "{}", daemon.log());

    // Fed while the loop ticks: 5 feeds take about a second.
    let fed = Instant::now();
    let got = read_until(&socket, |got| {
        got.iter().filter(|m| m.trim() == "WATCHDOG=1").count() >= 5
    });
    let feeds = fed.elapsed();
    assert!(
        feeds >= Duration::from_millis(700) && feeds < Duration::from_secs(5),
        "5 feeds in {feeds:?} (every 200 ms): {got:?}"
    );

    assert!(daemon.stop().success());
    read_until(&socket, |got| got.iter().any(|m| m.contains("STOPPING=1")));
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn check_config_passes_a_good_file_and_names_what_is_wrong_with_a_bad_one() {
    let files = Files::new();
    let check = |text: &str| {
        files.write_config(text);
        Command::new(limiter_tests::daemon::binary())
            .args(["check", "--config"])
            .arg(files.config())
            .output()
            .expect("run check")
    };
    let good = check(
        "[daemon]\ninterfaces = [\"lo\"]\n\n[default]\npps = 100\n\n\
         [[rules]]\nname = \"dns\"\ncidr = \"0.0.0.0/0\"\nprotocol = \"udp\"\nports = \"53\"\npps = 50\n",
    );
    let stdout = String::from_utf8_lossy(&good.stdout);
    assert!(good.status.success(), "{good:?}");
    assert!(
        stdout.contains("valid; rules default, dns; interfaces lo"),
        "{stdout}"
    );
    for (text, why) in [
        ("[default]\npps = \"fast\"\n", "pps"),
        ("[daemon]\ninterfaces = [\"lo\"]\nnope = 1\n", "nope"),
        ("[daemon]\ninterfaces = []\n", "no interface to protect"),
        (
            "[daemon]\ninterfaces = [\"lo\"]\n\n[[rules]]\ncidr = \"10.0.0.1/8\"\npps = 5\n",
            "rules[0]",
        ),
    ] {
        let out = check(text);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text}: {stderr}");
        assert!(
            stderr.contains("configuration ") && stderr.contains(why),
            "{text}: {stderr}"
        );
    }
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/xdp-limiter.service"),
    )
    .expect("the unit");
    assert!(
        unit.lines().any(|l| {
            l == "ExecStartPre=/usr/sbin/xdp-limiter check --config /etc/xdp-limiter/config.toml"
        }),
        "{unit}"
    );
}
