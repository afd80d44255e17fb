//! Pins under bpffs: the layout of an interface's pins, mounting bpffs
//! where it is missing, refusing pins the daemon cannot trust, dropping
//! pinned maps this build must not adopt, and removing pins (which
//! detaches a pinned link's program).
//!
//! Layout: `<pin_dir>/<iface>/maps-v<layout version>/<MAP>` and
//! `<pin_dir>/<iface>/link`. While the link is pinned the interface stays
//! protected whatever happens to the daemon (even SIGKILL).
//!
//! Whoever can write into the pin directory decides which maps the next
//! daemon adopts (a map adopted is the limiter's state: its windows, its
//! rules). The daemon mounts bpffs and creates its directories readable by
//! root only, and adopts what it finds only if it could have made it:
//! owned by root, not writable by group or others, and each map of the
//! type and key and value sizes of the table (`limiter_common::maps`).

use std::{
    fs,
    io::ErrorKind,
    os::unix::fs::{DirBuilderExt, MetadataExt},
    path::{Path, PathBuf},
};

use aya::maps::{MapData, MapInfo, MapType};
use limiter_common::{
    maps::{MapKind, MapSpec, PINNED},
    names,
};
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
    #[error(
        "refusing to adopt {path}: {problem}; xdp-limiter makes its pins owned by root, \
         writable by root only and with the maps its program defines, so something else \
         made or changed it: inspect it, and remove it if it is not yours"
    )]
    Untrusted { path: PathBuf, problem: String },
}

/// The directory of `iface`'s pins.
pub fn iface_dir(pin_dir: &Path, iface: &str) -> PathBuf {
    pin_dir.join(iface)
}

/// Mode of the directories the daemon creates, and of bpffs when the
/// daemon mounts it: only root may see or place pins.
pub(crate) const PRIVATE_MODE: u32 = 0o700;

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
            info!(path = %root.display(), "mounting bpffs (mode 0700)");
            // bpffs's default root mode is 1777: anyone could create the
            // pin directory before the daemon does.
            nix::mount::mount(
                Some("bpf"),
                root,
                Some("bpf"),
                nix::mount::MsFlags::empty(),
                Some("mode=0700"),
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

/// Creates `dir` and any missing parent with mode 0700 (an existing one
/// is left as it is; [`check_adoptable`] judged it).
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), PinError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_MODE)
        .create(dir)
        .map_err(|source| PinError::Io {
            path: dir.to_path_buf(),
            source,
        })
}

/// What makes `path` (found in place) untrustworthy, if anything: not
/// owned by root, writable by group or others, a symbolic link, or not of
/// the kind expected (a directory or a pinned object).
fn untrusted(path: &Path, directory: bool) -> Result<Option<String>, PinError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(PinError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let kind = meta.file_type();
    let problem = if kind.is_symlink() {
        Some("it is a symbolic link".to_string())
    } else if directory && !kind.is_dir() {
        Some("it is not a directory".to_string())
    } else if !directory && kind.is_dir() {
        Some("it is a directory, not a pinned object".to_string())
    } else if meta.uid() != 0 {
        Some(format!("it is owned by uid {}, not root", meta.uid()))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "its mode {:04o} lets group or others write it",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    Ok(problem)
}

/// Refuses `path` if it exists and is [`untrusted`].
fn check_trusted(path: &Path, directory: bool) -> Result<(), PinError> {
    match untrusted(path, directory)? {
        Some(problem) => Err(PinError::Untrusted {
            path: path.to_path_buf(),
            problem,
        }),
        None => Ok(()),
    }
}

/// The BPF map type of a table entry.
fn map_type(kind: MapKind) -> MapType {
    match kind {
        MapKind::LruPerCpuHash => MapType::LruPerCpuHash,
        MapKind::LruHash => MapType::LruHash,
        MapKind::Hash => MapType::Hash,
        MapKind::Array => MapType::Array,
        MapKind::PerCpuArray => MapType::PerCpuArray,
        MapKind::LpmTrie => MapType::LpmTrie,
        MapKind::RingBuf => MapType::RingBuf,
    }
}

/// How the map pinned at `path` differs from `spec` in type, key size or
/// value size (its capacity is the configuration's business, see
/// [`drop_incompatible_pins`]).
fn spec_mismatch(path: &Path, spec: &MapSpec) -> Option<String> {
    let info = match MapInfo::from_pin(path) {
        Ok(info) => info,
        Err(e) => return Some(format!("it is not a BPF map ({e})")),
    };
    let expected = map_type(spec.kind);
    match info.map_type() {
        Ok(found) if found == expected => {}
        Ok(found) => {
            return Some(format!(
                "it is a {found:?} map, {} must be a {expected:?} map",
                spec.name
            ))
        }
        Err(e) => return Some(format!("its map type is unknown ({e})")),
    }
    if info.key_size() != spec.key_size {
        return Some(format!(
            "its key size is {} bytes, {} has {}",
            info.key_size(),
            spec.name,
            spec.key_size
        ));
    }
    if info.value_size() != spec.value_size {
        return Some(format!(
            "its value size is {} bytes, {} has {}",
            info.value_size(),
            spec.name,
            spec.value_size
        ));
    }
    None
}

/// Refuses to adopt what is pinned for an interface unless the daemon
/// could have made it: `pin_dir`, the interface's directory `iface_dir`,
/// its directories of maps, its maps and its link must be owned by root
/// and not writable by group or others, and every map of this layout
/// version must have the table's type, key size and value size. Nothing
/// missing is an error (it is created afresh), and nothing is changed: a
/// refused start leaves the pins, and any protection they hold, in place.
pub(crate) fn check_adoptable(pin_dir: &Path, iface_dir: &Path) -> Result<(), PinError> {
    check_trusted(pin_dir, true)?;
    check_trusted(iface_dir, true)?;
    check_trusted(&iface_dir.join("link"), false)?;
    let mut entries: Vec<PathBuf> = match fs::read_dir(iface_dir) {
        Ok(entries) => entries.filter_map(Result::ok).map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    };
    entries.sort();
    for path in entries
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "link"))
    {
        check_trusted(path, fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()))?;
    }
    let maps = maps_dir(iface_dir);
    for spec in PINNED {
        let path = maps.join(spec.name);
        if fs::symlink_metadata(&path).is_err() {
            continue;
        }
        check_trusted(&path, false)?;
        if let Some(problem) = spec_mismatch(&path, &spec) {
            return Err(PinError::Untrusted { path, problem });
        }
    }
    Ok(())
}

/// Removes the pinned maps of other layout versions (an upgrade that
/// changed the layout starts its state afresh) and, of this version, those
/// whose capacity differs (`max_sources` changed). Run after
/// [`check_adoptable`], which refuses maps of this version of another type
/// or key or value size.
pub(crate) fn drop_incompatible_pins(iface_dir: &Path, options: &LoadOptions) {
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
pub(crate) fn map_pins(maps_dir: &Path) -> Vec<(&'static str, PathBuf)> {
    PINNED
        .iter()
        .map(|spec| (spec.name, maps_dir.join(spec.name)))
        .collect()
}

/// Removes pinned maps whose capacity differs from what the options ask
/// for (`max_sources` or `max_hot_sources` changed).
fn drop_mismatched_sizes(maps_dir: &Path, options: &LoadOptions) {
    for spec in PINNED {
        let path = maps_dir.join(spec.name);
        if !path.exists() {
            continue;
        }
        let compatible = MapInfo::from_pin(&path).is_ok_and(|info| {
            options
                .expected_max_entries(&spec)
                .is_none_or(|m| info.max_entries() == m)
        });
        if !compatible {
            warn!(map = spec.name, path = %path.display(), "pinned map has another capacity; starting it afresh");
            let _ = fs::remove_file(&path);
        }
    }
}

/// Removes `iface`'s pins: the link first, detached from the interface
/// before it is unpinned (so the program is off when this returns, even
/// if something else holds the link), then the maps of every layout
/// version. Missing pins are fine.
pub(crate) fn remove_pins(dir: &Path) -> Result<(), PinError> {
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
pub(crate) fn is_pinned(dir: &Path) -> bool {
    dir.join("link").exists() || MapData::from_pin(maps_dir(dir).join(names::CONFIG)).is_ok()
}

/// The interfaces with a directory of pins under `pin_dir` (none if it
/// does not exist).
pub(crate) fn pinned_interfaces(pin_dir: &Path) -> Vec<String> {
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
