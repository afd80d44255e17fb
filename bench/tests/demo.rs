//! `cargo xtask demo`'s driver, run as a user runs it: it exits 0 only if
//! every light source got every frame through and no heavy one got more in
//! a second than its limit and the documented bound, and it prints that
//! verdict with no light source ever shown `LIMITED`.

use std::process::Command;

#[test]
fn the_demo_keeps_both_promises_and_says_so() {
    let output = Command::new(env!("CARGO_BIN_EXE_demo"))
        .env("XDP_LIMITER_BIN", limiter_tests::daemon::binary())
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the demo failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("\nboth kept\n"), "no verdict:\n{stdout}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|line| line.starts_with("192.0.2."))
        .collect();
    assert_eq!(rows.len(), 8 * 20, "8 seconds of 20 sources:\n{stdout}");
    for row in &rows {
        let fields: Vec<&str> = row.split_whitespace().collect();
        let sent: u64 = fields[1].parse().expect("sent/s");
        let light = sent < 100;
        assert_eq!(
            fields.last() == Some(&"LIMITED"),
            !light,
            "light sources ok, heavy ones LIMITED: {row}\n{stdout}"
        );
    }
    assert!(
        stdout.contains("namespaces, veth pair and pins are gone"),
        "no teardown:\n{stdout}"
    );
}
