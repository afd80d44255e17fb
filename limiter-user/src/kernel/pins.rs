//! Pins under bpffs: the layout of an interface's pins, mounting bpffs
//! where it is missing, dropping pinned maps this build must not adopt, and
//! removing pins (which detaches a pinned link's program).
//!
//! Layout: `<pin_dir>/<iface>/maps-v<layout version>/<MAP>` and
//! `<pin_dir>/<iface>/link`. While the link is pinned the interface stays
//! protected whatever happens to the daemon (even SIGKILL).

use std::{
    fs,
    io::ErrorKind,
    path::{Path, PathBuf},
};

use aya::maps::{MapData, MapInfo};
use limiter_common::{maps::PINNED, names};
use tracing::{info, warn};

use super::{sys, LoadOptions};
use crate::{fault, lock};

/// Why pins could not be set up or removed.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("{0} is not on a bpffs (mount -t bpf bpf <dir>, or pick a pin_dir under /sys/fs/bpf)")]
    NotBpffs(PathBuf),
    #[error("bpffs is not mounted at {path} and mounting it failed: {source}")]
    Bpffs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Lock(#[from] lock::LockError),
}

/// The directory of `iface`'s pins.
pub fn iface_dir(pin_dir: &Path, iface: &str) -> PathBuf {
    pin_dir.join(iface)
}

/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Whether `path` itself is on a bpffs.
fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|fs| fs.filesystem_type().0 == BPF_FS_MAGIC)
}

/// The nearest existing ancestor of `path` is on a bpffs.
fn on_bpffs(path: &Path) -> bool {
    let existing = path
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    is_bpffs(existing)
}

/// Mounts bpffs on `/sys/fs/bpf` if `pin_dir` is below it and that is not
/// a bpffs (it is not mounted at boot on every system), then checks that
/// `pin_dir` is on a bpffs. The check is the filesystem type (statfs), and
/// check and mount happen under a lock every xdp-limiter process takes, so
/// daemons starting at once mount it once.
pub fn ensure_bpffs(pin_dir: &Path) -> Result<(), PinError> {
    let root = Path::new("/sys/fs/bpf");
    if pin_dir.starts_with(root) {
        let _lock = lock::bpffs_mount()?;
        if !is_bpffs(root) {
            fault::stop_at(fault::Step::Bpffs);
            info!(path = %root.display(), "mounting bpffs");
            nix::mount::mount(
                Some("bpf"),
                root,
                Some("bpf"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .map_err(|source| PinError::Bpffs {
                path: root.to_path_buf(),
                source,
            })?;
        }
    }
    if on_bpffs(pin_dir) {
        Ok(())
    } else {
        Err(PinError::NotBpffs(pin_dir.to_path_buf()))
    }
}

/// The directory of the pinned maps: named after the map layout version
/// (`limiter_common::MAP_LAYOUT_VERSION`), so a build never adopts maps of
/// another layout, even one that only reordered fields.
pub fn maps_dir(iface_dir: &Path) -> PathBuf {
    iface_dir.join(format!("maps-v{}", limiter_common::MAP_LAYOUT_VERSION))
}

/// Removes the pinned maps of other layout versions (an upgrade that
/// changed the layout starts its state afresh) and, of this version, those
/// whose sizes differ (`max_sources` changed).
pub fn drop_incompatible_pins(iface_dir: &Path, options: &LoadOptions) {
    let current = maps_dir(iface_dir);
    if let Ok(entries) = fs::read_dir(iface_dir) {
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let is_maps = entry.file_name().to_string_lossy().starts_with("maps");
            if is_maps && path.is_dir() && path != current {
                warn!(path = %path.display(), "pinned maps of another layout version; starting afresh");
                let _ = remove_dir_of_pins(&path);
            }
        }
    }
    drop_mismatched_sizes(&current, options);
}

/// Where each pinned map of this layout lives in `maps_dir`, for
/// [`LoadOptions::pins`](super::LoadOptions::pins).
pub fn map_pins(maps_dir: &Path) -> Vec<(&'static str, PathBuf)> {
    PINNED
        .iter()
        .map(|spec| (spec.name, maps_dir.join(spec.name)))
        .collect()
}

/// Removes pinned maps whose key, value or capacity differs from the table
/// (`limiter_common::maps`).
fn drop_mismatched_sizes(maps_dir: &Path, options: &LoadOptions) {
    for spec in PINNED {
        let path = maps_dir.join(spec.name);
        if !path.exists() {
            continue;
        }
        let compatible = MapInfo::from_pin(&path).is_ok_and(|info| {
            info.key_size() == spec.key_size
                && info.value_size() == spec.value_size
                && options
                    .expected_max_entries(&spec)
                    .is_none_or(|m| info.max_entries() == m)
        });
        if !compatible {
            warn!(map = spec.name, path = %path.display(), "pinned map has another layout or size; starting it afresh");
            let _ = fs::remove_file(&path);
        }
    }
}

/// Removes `iface`'s pins: the link first, detached from the interface
/// before it is unpinned (so the program is off when this returns, even
/// if something else holds the link), then the maps of every layout
/// version. Missing pins are fine.
pub fn remove_pins(dir: &Path) -> Result<(), PinError> {
    let link = dir.join("link");
    if let Ok(fd) = sys::obj_get(&link) {
        // A link whose interface is gone is detached already; either way
        // the unpinning below releases it.
        if let Err(e) = sys::link_detach(&fd) {
            warn!(path = %link.display(), error = %e, "detaching the pinned link");
        }
    }
    match fs::remove_file(&link) {
        Err(e) if e.kind() != ErrorKind::NotFound => {
            return Err(PinError::Io {
                path: link,
                source: e,
            })
        }
        _ => {}
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            if entry.path().is_dir() {
                remove_dir_of_pins(&entry.path())?;
            }
        }
    }
    match fs::remove_dir(dir) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(PinError::Io {
            path: dir.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Removes every pin in `dir`, then `dir`.
fn remove_dir_of_pins(dir: &Path) -> Result<(), PinError> {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            match fs::remove_file(entry.path()) {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    return Err(PinError::Io {
                        path: entry.path(),
                        source: e,
                    })
                }
                _ => {}
            }
        }
    }
    match fs::remove_dir(dir) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(PinError::Io {
            path: dir.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Whether anything of an interface is pinned in `dir` (its link or its
/// maps).
pub fn is_pinned(dir: &Path) -> bool {
    dir.join("link").exists() || MapData::from_pin(maps_dir(dir).join(names::CONFIG)).is_ok()
}

/// The interfaces with a directory of pins under `pin_dir` (none if it
/// does not exist).
pub fn pinned_interfaces(pin_dir: &Path) -> Vec<String> {
    fs::read_dir(pin_dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
