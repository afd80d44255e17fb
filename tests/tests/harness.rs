//! Tests of the test harness itself: the guards must clean up, or a failing
//! test would leave namespaces behind for every later run.

use std::path::Path;

use limiter_tests::netns::{NetNs, Veth};

#[test]
fn namespace_is_removed_on_drop_and_on_panic() {
    let name = {
        let ns = NetNs::new("drop");
        assert!(Path::new("/run/netns").join(ns.name()).exists());
        ns.name().to_string()
    };
    assert!(
        !Path::new("/run/netns").join(&name).exists(),
        "{name} left behind"
    );

    let result = std::panic::catch_unwind(|| {
        let ns = NetNs::new("panic");
        let name = ns.name().to_string();
        std::panic::panic_any(name);
    });
    let name = *result
        .expect_err("the closure panics")
        .downcast::<String>()
        .expect("panic payload is the name");
    assert!(
        !Path::new("/run/netns").join(&name).exists(),
        "{name} left behind after panic"
    );
}

#[test]
fn namespaces_have_unique_names_and_veth_joins_them() {
    let a = NetNs::new("uniq");
    let b = NetNs::new("uniq");
    assert_ne!(a.name(), b.name());
    Veth::connect(&a, "v-a", &b, "v-b");
    let out = a.ip(&["-o", "link", "show", "v-a"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("v-a@"));
    // enter() runs on a thread inside the namespace: it sees v-b only in b.
    let seen_in_b = b.enter(|| nix_if_exists("v-b"));
    assert!(seen_in_b, "v-b is visible inside namespace b");
    let seen_in_a = a.enter(|| nix_if_exists("v-b"));
    assert!(!seen_in_a, "v-b is not visible inside namespace a");
}

/// Whether an interface name resolves in the calling thread's namespace.
fn nix_if_exists(name: &str) -> bool {
    nix::net::if_::if_nametoindex(name).is_ok()
}
