//! Network namespaces and veth pairs for tests, as guards that always clean
//! up (also when the test panics).
//!
//! Names carry the test process id and a counter, so tests run in parallel
//! and concurrent test processes never collide; namespaces left behind by a
//! process that was killed are removed by the next one.

use std::{
    fs::File,
    process::{Command, Output},
    sync::atomic::{AtomicUsize, Ordering},
    thread,
};

use nix::sched::{setns, CloneFlags};

/// Prefix of every namespace the tests create.
const PREFIX: &str = "xlt";

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// A network namespace, deleted (with every interface in it) on drop.
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates `xlt-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> Self {
        remove_stale_namespaces();
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}-{tag}-{}-{id}", std::process::id());
        run_ok(Command::new("ip").args(["netns", "add", &name]));
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `program args` inside the namespace; panics unless it exits 0.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        run_ok(self.command(program).args(args))
    }

    /// `ip args` inside the namespace.
    pub fn ip(&self, args: &[&str]) -> Output {
        self.run("ip", args)
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) {
        self.run("sysctl", &["-q", "-w", &format!("{key}={value}")]);
    }

    /// Runs `f` on a thread that has entered the namespace, so sockets it
    /// opens, interface names it resolves and XDP attachments it makes
    /// belong there. The calling thread stays where it is.
    pub fn enter<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let path = format!("/run/netns/{}", self.name);
        thread::scope(|scope| {
            scope
                .spawn(|| {
                    let ns = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                    setns(ns, CloneFlags::CLONE_NEWNET)
                        .unwrap_or_else(|e| panic!("setns {path}: {e}"));
                    f()
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let deleted = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        if !matches!(deleted, Ok(s) if s.success()) {
            eprintln!("warning: could not delete netns {}: {deleted:?}", self.name);
        }
    }
}

/// A veth pair with one end in each namespace, both up. It disappears with
/// the namespaces.
pub struct Veth;

impl Veth {
    /// Creates `a_if` in `a` and its peer `b_if` in `b`.
    pub fn connect(a: &NetNs, a_if: &str, b: &NetNs, b_if: &str) {
        run_ok(Command::new("ip").args([
            "link",
            "add",
            a_if,
            "netns",
            a.name(),
            "type",
            "veth",
            "peer",
            "name",
            b_if,
            "netns",
            b.name(),
        ]));
        a.ip(&["link", "set", a_if, "up"]);
        b.ip(&["link", "set", b_if, "up"]);
    }
}

/// Deletes `xlt-*-<pid>-*` namespaces whose process no longer exists.
fn remove_stale_namespaces() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.rsplitn(3, '-');
        let (Some(_id), Some(pid), Some(head)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if !head.starts_with(&format!("{PREFIX}-")) {
            continue;
        }
        let alive = pid
            .parse::<u32>()
            .map(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
            .unwrap_or(true);
        if !alive {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
}

/// Runs `cmd`; panics with its command line and stderr unless it exits 0.
#[track_caller]
pub fn run_ok(cmd: &mut Command) -> Output {
    let line = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start {line}: {e}"));
    assert!(
        out.status.success(),
        "{line} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
