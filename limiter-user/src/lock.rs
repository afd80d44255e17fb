//! Locks between xdp-limiter processes.
//!
//! One daemon per pin directory and per interface: exclusive `flock`s on
//! files under `/run/xdp-limiter/`, taken before the daemon touches
//! anything, held for its whole life and released by the kernel when it
//! exits, however it exits (SIGKILL included), so a stale lock cannot
//! outlive its daemon.
//!
//! A second `xdp-limiter run` for the same pin directory, or for an
//! interface another daemon protects (interfaces are named per network
//! namespace, so the lock names the namespace too), is refused with the
//! other daemon's pid before it adopts, pushes or binds anything.

use std::{
    fs::{File, OpenOptions},
    io::{Read, Seek, Write},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use nix::fcntl::{Flock, FlockArg};

/// Where the lock files live.
pub const LOCK_DIR: &str = "/run/xdp-limiter";

/// Why a daemon may not start.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "another xdp-limiter daemon (pid {pid}) is running for {what}; \
         stop it first (xdp-limiter detach, or systemctl stop xdp-limiter)"
    )]
    Held { what: String, pid: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The locks a running daemon holds; dropping them releases them.
#[derive(Debug)]
pub struct Locks {
    _held: Vec<Flock<File>>,
}

/// Takes the locks of `pin_dir` and of every interface in `interfaces` (in
/// this process's network namespace), or says who holds one.
pub fn acquire(pin_dir: &Path, interfaces: &[String]) -> Result<Locks, LockError> {
    acquire_in(Path::new(LOCK_DIR), pin_dir, interfaces)
}

fn acquire_in(dir: &Path, pin_dir: &Path, interfaces: &[String]) -> Result<Locks, LockError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LockError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let netns = std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino())
        .map_err(io(Path::new("/proc/self/ns/net")))?;
    let mut wanted = vec![(
        format!("pins-{:016x}.lock", path_hash(pin_dir)),
        format!("pin directory {}", pin_dir.display()),
    )];
    for iface in interfaces {
        wanted.push((
            format!("iface-{netns}-{iface}.lock"),
            format!("interface {iface}"),
        ));
    }
    let mut held = Vec::with_capacity(wanted.len());
    for (name, what) in wanted {
        let path = dir.join(name);
        let file = open(&path).map_err(io(&path))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut lock) => {
                // The holder's pid, for the message a second daemon prints.
                lock.set_len(0).map_err(io(&path))?;
                lock.rewind().map_err(io(&path))?;
                write!(lock, "{}", std::process::id()).map_err(io(&path))?;
                held.push(lock);
            }
            Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                return Err(LockError::Held {
                    what,
                    pid: if pid.is_empty() { "?".into() } else { pid },
                });
            }
            Err((_, errno)) => {
                return Err(LockError::Io {
                    path,
                    source: errno.into(),
                })
            }
        }
    }
    Ok(Locks { _held: held })
}

/// Serialises mounting bpffs between xdp-limiter processes (a blocking
/// lock, held while checking and mounting), so two daemons starting at
/// once on a machine where it is not mounted mount it once, not stacked.
pub fn bpffs_mount() -> Result<Flock<File>, LockError> {
    let dir = Path::new(LOCK_DIR);
    let path = dir.join("bpffs-mount.lock");
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let file = open(&path).map_err(io)?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| io(errno.into()))
}

/// Opens (creating, root-only) a lock file without truncating it: its
/// content is the holder's pid, which a refused daemon reads.
fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
}

/// A stable name for a pin directory (its absolute form, `.` and `..`
/// resolved lexically: the directory may not exist yet).
fn path_hash(path: &Path) -> u64 {
    use std::hash::Hasher;
    let mut clean = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                clean.pop();
            }
            std::path::Component::CurDir => {}
            other => clean.push(other),
        }
    }
    let mut hash = fnv::FnvHasher::default();
    hash.write(clean.as_os_str().as_encoded_bytes());
    hash.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xdp-limiter-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid_until_it_lets_go() {
        let dir = scratch();
        let pins = Path::new("/sys/fs/bpf/x");
        let first = acquire_in(&dir, pins, &["eth0".into()]).expect("first");
        let err = acquire_in(&dir, Path::new("/sys/fs/bpf/./y/../x"), &[]).unwrap_err();
        assert!(
            err.to_string().contains(&format!(
                "(pid {}) is running for pin directory",
                std::process::id()
            )),
            "{err}"
        );
        let err = acquire_in(&dir, Path::new("/sys/fs/bpf/other"), &["eth0".into()]).unwrap_err();
        assert!(err.to_string().contains("for interface eth0"), "{err}");
        acquire_in(&dir, Path::new("/sys/fs/bpf/other"), &["eth1".into()])
            .expect("other pins, other interface");
        drop(first);
        acquire_in(&dir, pins, &["eth0".into()]).expect("released on drop");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
