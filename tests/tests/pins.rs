//! What the daemon adopts from bpffs: its own pins across a restart, kept
//! readable by root only; never a pin directory or map someone else could
//! have placed (owned by another uid, writable by group or others, or a
//! map of another type or size than the table's).

use std::{
    fs,
    os::{
        fd::{FromRawFd, OwnedFd},
        unix::fs::{MetadataExt, PermissionsExt},
    },
    path::Path,
};

use limiter_common::maps::{MapSpec, CLUSTER_SHARES};
use limiter_tests::{
    daemon::{Daemon, Files},
    lab::{limit_config, Lab, RX_IF},
};
use limiter_user::kernel::pins;

/// `bpf(2)` command creating a map.
const BPF_MAP_CREATE: nix::libc::c_long = 0;
/// `BPF_MAP_TYPE_HASH`: a plain hash, where `CLUSTER_SHARES` is an LRU hash.
const BPF_MAP_TYPE_HASH: u32 = 1;

/// The first members of `union bpf_attr` for `BPF_MAP_CREATE`, the rest
/// zero.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    rest: [u64; 14],
}

/// Pins a new map of `map_type` with `spec`'s key and value sizes at
/// `path`: what someone other than the daemon could have left there.
fn pin_foreign_map(path: &Path, map_type: u32, spec: &MapSpec) {
    let mut attr = MapCreateAttr {
        map_type,
        key_size: spec.key_size,
        value_size: spec.value_size,
        max_entries: 16,
        ..MapCreateAttr::default()
    };
    // SAFETY: `attr` is the `map_create` member of `union bpf_attr`, fully
    // initialised (the rest zero), with no pointers in it.
    let fd = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_bpf,
            BPF_MAP_CREATE,
            &mut attr as *mut MapCreateAttr,
            size_of::<MapCreateAttr>() as nix::libc::c_uint,
        )
    };
    assert!(
        fd >= 0,
        "BPF_MAP_CREATE: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the kernel just returned this fd, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let map = aya::maps::MapData::from_fd(fd).expect("map from fd");
    map.pin(path).expect("pin the foreign map");
}

/// A lab, its files with the usual limits, and the daemon arguments.
fn setup() -> (Lab, Files) {
    let lab = Lab::three_senders();
    let files = Files::new();
    files.write_config(&limit_config(2));
    (lab, files)
}

fn args(files: &Files) -> Vec<String> {
    vec![
        "-i".into(),
        RX_IF.into(),
        "-c".into(),
        files.config().to_str().expect("utf-8").into(),
    ]
}

/// Starts the daemon expecting a refusal; its one error line, after
/// checking nothing was attached.
#[track_caller]
fn refused(lab: &Lab, files: &Files) -> String {
    let args = args(files);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, log) = Daemon::start_failing(&lab.rx, files, &args);
    assert_eq!(status.code(), Some(1), "{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{log}");
    assert_eq!(lab.attached_program(), None, "nothing attached:\n{log}");
    errors[0].to_string()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).expect("stat").mode() & 0o7777
}

#[test]
fn pins_a_world_writable_or_foreign_pin_directory_is_refused() {
    let (lab, files) = setup();
    let iface_dir = pins::iface_dir(&files.pin_dir, RX_IF);

    fs::create_dir(&files.pin_dir).expect("pin dir");
    fs::set_permissions(&files.pin_dir, fs::Permissions::from_mode(0o777)).expect("chmod");
    let error = refused(&lab, &files);
    assert!(
        error.contains(&format!(
            "refusing to adopt {}: its mode 0777 lets group or others write it",
            files.pin_dir.display()
        )),
        "{error}"
    );

    fs::set_permissions(&files.pin_dir, fs::Permissions::from_mode(0o700)).expect("chmod");
    nix::unistd::chown(&files.pin_dir, Some(65534.into()), Some(65534.into())).expect("chown");
    let error = refused(&lab, &files);
    assert!(
        error.contains(&format!(
            "refusing to adopt {}: it is owned by uid 65534, not root",
            files.pin_dir.display()
        )),
        "{error}"
    );

    // The interface's directory, below a pin directory that is fine.
    nix::unistd::chown(&files.pin_dir, Some(0.into()), Some(0.into())).expect("chown");
    fs::create_dir(&iface_dir).expect("iface dir");
    nix::unistd::chown(&iface_dir, Some(65534.into()), None).expect("chown");
    let error = refused(&lab, &files);
    assert!(
        error.contains(&format!(
            "refusing to adopt {}: it is owned by uid 65534, not root",
            iface_dir.display()
        )),
        "{error}"
    );
    assert!(iface_dir.exists(), "a refused start removes nothing");

    // Fixed, the same start works.
    nix::unistd::chown(&iface_dir, Some(0.into()), None).expect("chown");
    let args = args(&files);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start(&lab.rx, &files, &args);
    assert!(lab.attached_program().is_some());
    assert!(daemon.stop().success());
}

#[test]
fn pins_a_map_pinned_with_another_type_is_refused_and_left_in_place() {
    let (lab, files) = setup();
    let maps_dir = pins::maps_dir(&pins::iface_dir(&files.pin_dir, RX_IF));
    fs::create_dir_all(&maps_dir).expect("maps dir");
    // CLUSTER_SHARES's key and value sizes, but a plain hash: sizes alone
    // would let it through.
    let path = maps_dir.join(CLUSTER_SHARES.name);
    pin_foreign_map(&path, BPF_MAP_TYPE_HASH, &CLUSTER_SHARES);

    let error = refused(&lab, &files);
    assert!(
        error.contains(&format!(
            "refusing to adopt {}: it is a Hash map, CLUSTER_SHARES must be a LruHash map",
            path.display()
        )),
        "{error}"
    );
    assert!(path.exists(), "the foreign map is left for the operator");

    fs::remove_file(&path).expect("the operator removes it");
    let args = args(&files);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start(&lab.rx, &files, &args);
    assert!(daemon.stop().success());
}

#[test]
fn pins_the_daemons_own_pins_are_private_and_adopted_across_a_restart() {
    let (lab, files) = setup();
    let args = args(&files);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = Daemon::start(&lab.rx, &files, &args);
    let program = lab.attached_program().expect("attached");
    let iface_dir = pins::iface_dir(&files.pin_dir, RX_IF);
    for dir in [
        files.pin_dir.clone(),
        iface_dir.clone(),
        pins::maps_dir(&iface_dir),
    ] {
        assert_eq!(mode(&dir), 0o700, "{} is root's only", dir.display());
    }
    first.kill();
    assert_eq!(lab.attached_program(), Some(program), "still pinned");

    let second = Daemon::start(&lab.rx, &files, &args);
    second.wait_log("adopted the pinned link");
    assert!(
        !second.log().contains("starting it afresh"),
        "every map adopted:\n{}",
        second.log()
    );
    assert!(second.stop().success());
}
