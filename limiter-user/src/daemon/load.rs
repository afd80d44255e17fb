//! Loading the embedded program for one interface, pinning its state maps
//! and XDP link under bpffs, adopting what an earlier daemon pinned (its
//! counters continue), replacing the program on a live link atomically, and
//! detaching.
//!
//! Layout: `<pin_dir>/<iface>/maps-v<layout version>/<MAP>` and
//! `<pin_dir>/<iface>/link`.
//! While the link is pinned the interface stays protected whatever happens
//! to the daemon (even SIGKILL); a new daemon loads the program against the
//! pinned maps and swaps it onto the pinned link with `bpf_link_update`, so
//! there is no moment without protection.

use std::{
    fs,
    io::ErrorKind,
    path::{Path, PathBuf},
};

use aya::{
    maps::{MapData, MapInfo},
    programs::{
        links::{FdLink, PinnedLink},
        xdp::{XdpLink, XdpLinkId},
        XdpMode,
    },
    Ebpf, EbpfLoader,
};
use limiter_common::{maps::PINNED, names};
use tracing::{info, warn};

use super::config::AttachMode;
use crate::object::{xdp_program, EBPF_OBJECT};

/// Why an interface could not be protected.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("no such interface: {0}")]
    NoInterface(String),
    #[error("loading BPF programs needs root (CAP_BPF and CAP_NET_ADMIN)")]
    NotRoot,
    #[error("{0} is not on a bpffs (mount -t bpf bpf <dir>, or pick a pin_dir under /sys/fs/bpf)")]
    NotBpffs(PathBuf),
    #[error("bpffs is not mounted at {path} and mounting it failed: {source}")]
    Bpffs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("{path}: {source}")]
    Pin {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("loading the XDP program: {0}")]
    Load(String),
    #[error("{0}")]
    Lock(#[from] super::lock::LockError),
    #[error(
        "{iface} already has an XDP program that xdp-limiter did not attach; \
         remove it first (ip link set dev {iface} xdp off)"
    )]
    Busy { iface: String },
    #[error("attaching to {iface} in {mode} mode: {message}")]
    Attach {
        iface: String,
        mode: &'static str,
        message: String,
    },
}

/// A protected interface (once attached).
pub struct Instance {
    pub iface: String,
    pub ebpf: Ebpf,
    /// How the program is attached ("native", "generic", or "adopted");
    /// "loaded" until [`Instance::attach`].
    pub mode: &'static str,
    /// A pinned link was there when this instance was loaded: something
    /// protected the interface before this process.
    found_link: bool,
    dir: PathBuf,
    /// Times the program was attached afresh because its link had lost its
    /// interface (deleted and re-created), at adoption or while running.
    pub reattachments: u64,
    /// What the last [`Instance::check_link`] found.
    pub link: LinkCheck,
}

/// What became of an instance's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkCheck {
    /// Attached to the interface of that name.
    Attached,
    /// No interface of that name: protection resumes when it is back.
    InterfaceGone,
    /// The link pin was removed by someone else: not re-attached.
    Unpinned,
    /// The interface was re-created and the program attached to it again.
    Reattached,
}

/// The directory of `iface`'s pins.
pub fn iface_dir(pin_dir: &Path, iface: &str) -> PathBuf {
    pin_dir.join(iface)
}

fn pin_err(path: &Path) -> impl Fn(std::io::Error) -> AttachError + '_ {
    move |source| AttachError::Pin {
        path: path.to_path_buf(),
        source,
    }
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
pub fn ensure_bpffs(pin_dir: &Path) -> Result<(), AttachError> {
    let root = Path::new("/sys/fs/bpf");
    if pin_dir.starts_with(root) {
        let _lock = super::lock::bpffs_mount()?;
        if !is_bpffs(root) {
            super::fault::stop_at(super::fault::Step::Bpffs);
            info!(path = %root.display(), "mounting bpffs");
            nix::mount::mount(
                Some("bpf"),
                root,
                Some("bpf"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .map_err(|source| AttachError::Bpffs {
                path: root.to_path_buf(),
                source,
            })?;
        }
    }
    if on_bpffs(pin_dir) {
        Ok(())
    } else {
        Err(AttachError::NotBpffs(pin_dir.to_path_buf()))
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
fn drop_incompatible_pins(iface_dir: &Path, max_sources: u32) {
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
    drop_mismatched_sizes(&current, max_sources);
}

/// Removes pinned maps whose key, value or capacity differs from the table
/// (`limiter_common::maps`).
fn drop_mismatched_sizes(maps_dir: &Path, max_sources: u32) {
    for spec in PINNED {
        let path = maps_dir.join(spec.name);
        if !path.exists() {
            continue;
        }
        let compatible = MapInfo::from_pin(&path).is_ok_and(|info| {
            info.key_size() == spec.key_size
                && info.value_size() == spec.value_size
                && spec
                    .expected_max_entries(max_sources)
                    .is_none_or(|m| info.max_entries() == m)
        });
        if !compatible {
            warn!(map = spec.name, path = %path.display(), "pinned map has another layout or size; starting it afresh");
            let _ = fs::remove_file(&path);
        }
    }
}

/// Loads the program for `iface` against its pinned maps (adopting
/// existing ones, creating and pinning the others). Nothing is attached
/// yet: the caller pushes the rules into the maps first, then calls
/// [`Instance::attach`], so a fresh attach enforces from its first frame.
pub fn load(iface: &str, pin_dir: &Path, max_sources: u32) -> Result<Instance, AttachError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(AttachError::NotRoot);
    }
    nix::net::if_::if_nametoindex(iface).map_err(|_| AttachError::NoInterface(iface.into()))?;
    ensure_bpffs(pin_dir)?;
    let dir = iface_dir(pin_dir, iface);
    drop_incompatible_pins(&dir, max_sources);
    let maps_dir = maps_dir(&dir);
    fs::create_dir_all(&maps_dir).map_err(pin_err(&maps_dir))?;
    let found_link = dir.join("link").exists();

    let map_paths: Vec<(&str, PathBuf)> = PINNED
        .iter()
        .map(|spec| (spec.name, maps_dir.join(spec.name)))
        .collect();
    let mut loader = EbpfLoader::new();
    loader
        .map_max_entries(names::SOURCES, max_sources)
        .map_max_entries(names::WINDOWS, max_sources);
    for (name, path) in &map_paths {
        loader.map_pin_path(name, path.as_path());
    }
    let mut ebpf = loader
        .load(EBPF_OBJECT)
        .map_err(|e| AttachError::Load(e.to_string()))?;
    xdp_program(&mut ebpf)
        .map_err(|e| AttachError::Load(e.to_string()))?
        .load()
        .map_err(|e| AttachError::Load(e.to_string()))?;
    super::fault::stop_at(super::fault::Step::Loaded);
    Ok(Instance {
        iface: iface.into(),
        ebpf,
        mode: "loaded",
        found_link,
        dir,
        reattachments: 0,
        link: LinkCheck::Attached,
    })
}

/// The index of the interface the XDP link pinned at `path` is attached
/// to: 0 once that interface is gone (the link is defunct); `None` when
/// nothing is pinned there or the kernel does not say. Read from the
/// link's `/proc/self/fdinfo` entry (`ifindex:`), found by its link id.
pub fn pinned_link_ifindex(path: &Path) -> Option<u32> {
    let link = FdLink::from(PinnedLink::from_pin(path).ok()?);
    let id = link.info().ok()?.id().to_string();
    for entry in fs::read_dir("/proc/self/fdinfo").ok()?.flatten() {
        let Ok(text) = fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |name: &str| {
            text.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key == name).then(|| value.trim().to_string())
            })
        };
        if field("link_id").as_deref() == Some(id.as_str()) {
            return field("ifindex").and_then(|v| v.parse().ok());
        }
    }
    None
}

impl Instance {
    /// Attaches the loaded program: onto the pinned link if there is one
    /// (one `bpf_link_update`: no moment without protection), else freshly
    /// in `mode`, pinning the new link.
    pub fn attach(&mut self, mode: AttachMode) -> Result<(), AttachError> {
        super::fault::stop_at(super::fault::Step::Attach);
        let iface = self.iface.as_str();
        let program = xdp_program(&mut self.ebpf).map_err(|e| AttachError::Load(e.to_string()))?;
        let link_path = self.dir.join("link");
        let current = nix::net::if_::if_nametoindex(iface)
            .map_err(|_| AttachError::NoInterface(iface.into()))?;
        let pinned = PinnedLink::from_pin(&link_path).ok();
        let defunct = pinned.is_some()
            && pinned_link_ifindex(&link_path).is_some_and(|linked| linked != current);
        self.mode = match pinned {
            Some(pinned) if !defunct => {
                let link = XdpLink::try_from(FdLink::from(pinned)).map_err(|e| {
                    AttachError::Load(format!("pinned link {}: {e}", link_path.display()))
                })?;
                program
                    .attach_to_link(link)
                    .map_err(|e| AttachError::Attach {
                        iface: iface.into(),
                        mode: "adopted",
                        message: e.to_string(),
                    })?;
                info!(
                    iface,
                    "adopted the pinned link: program replaced atomically, counters kept"
                );
                "adopted"
            }
            _ => {
                if defunct {
                    warn!(
                        iface,
                        "the pinned link is defunct (its interface was deleted and re-created): attaching afresh"
                    );
                    self.reattachments += 1;
                }
                if link_path.exists() {
                    let _ = fs::remove_file(&link_path);
                }
                attach_and_pin(program, iface, mode, &link_path)?
            }
        };
        self.link = LinkCheck::Attached;
        Ok(())
    }

    /// Checks that the program is still attached to the interface of its
    /// name; if the interface was deleted and created again (a driver
    /// reload, a re-created veth, VLAN or bond), attaches it to the new one
    /// in `mode`. Its maps, and so every source's state, are kept.
    pub fn check_link(&mut self, mode: AttachMode) -> Result<LinkCheck, AttachError> {
        let link_path = self.dir.join("link");
        let Ok(current) = nix::net::if_::if_nametoindex(self.iface.as_str()) else {
            self.link = LinkCheck::InterfaceGone;
            return Ok(self.link);
        };
        if !link_path.exists() {
            self.link = LinkCheck::Unpinned;
            return Ok(self.link);
        }
        match pinned_link_ifindex(&link_path) {
            Some(linked) if linked != current => {
                let _ = fs::remove_file(&link_path);
                let program =
                    xdp_program(&mut self.ebpf).map_err(|e| AttachError::Load(e.to_string()))?;
                self.mode = attach_and_pin(program, &self.iface, mode, &link_path)?;
                self.reattachments += 1;
                self.link = LinkCheck::Reattached;
            }
            _ => self.link = LinkCheck::Attached,
        }
        Ok(self.link)
    }
}

/// Attaches `program` to `iface` afresh and pins the new link at
/// `link_path`; the mode it got.
fn attach_and_pin(
    program: &mut aya::programs::Xdp,
    iface: &str,
    mode: AttachMode,
    link_path: &Path,
) -> Result<&'static str, AttachError> {
    let (link_id, attached) = attach_fresh(program, iface, mode)?;
    let link = program
        .take_link(link_id)
        .map_err(|e| AttachError::Load(e.to_string()))?;
    let fd_link = FdLink::try_from(link).map_err(|e| AttachError::Load(e.to_string()))?;
    fd_link.pin(link_path).map_err(|e| AttachError::Pin {
        path: link_path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(attached)
}

fn attach_fresh(
    program: &mut aya::programs::Xdp,
    iface: &str,
    mode: AttachMode,
) -> Result<(XdpLinkId, &'static str), AttachError> {
    let busy = |message: &str| {
        message.contains("File exists") || message.contains("Device or resource busy")
    };
    let attach = |program: &mut aya::programs::Xdp, xdp_mode, name: &'static str| {
        program.attach(iface, xdp_mode).map_err(|e| {
            let message = format!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            );
            if busy(&message) {
                AttachError::Busy {
                    iface: iface.into(),
                }
            } else {
                AttachError::Attach {
                    iface: iface.into(),
                    mode: name,
                    message,
                }
            }
        })
    };
    match mode {
        AttachMode::Native => attach(program, XdpMode::Driver, "native").map(|id| (id, "native")),
        AttachMode::Generic => attach(program, XdpMode::Skb, "generic").map(|id| (id, "generic")),
        AttachMode::Auto => match attach(program, XdpMode::Driver, "native") {
            Ok(id) => Ok((id, "native")),
            Err(AttachError::Busy { iface }) => Err(AttachError::Busy { iface }),
            Err(native) => {
                warn!(iface, error = %native, "native XDP is not available; falling back to generic mode (slower)");
                attach(program, XdpMode::Skb, "generic").map(|id| (id, "generic"))
            }
        },
    }
}

impl Instance {
    /// Whether a pinned link protected the interface before this process
    /// loaded this instance (it is adopted, or about to be).
    pub fn adopted(&self) -> bool {
        self.found_link
    }

    /// Stops protecting: removes the pinned link (which detaches the
    /// program) and the pinned maps.
    pub fn detach(self) -> Result<(), AttachError> {
        let dir = self.dir.clone();
        drop(self.ebpf);
        remove_pins(&dir)
    }

    /// Leaves everything pinned: the interface stays protected.
    pub fn keep(self) {
        info!(iface = %self.iface, pins = %self.dir.display(), "leaving the program attached");
    }
}

/// Removes `iface`'s pins (the link first, so the program detaches, then
/// the maps of every layout version). Missing pins are fine.
pub fn remove_pins(dir: &Path) -> Result<(), AttachError> {
    match fs::remove_file(dir.join("link")) {
        Err(e) if e.kind() != ErrorKind::NotFound => {
            return Err(AttachError::Pin {
                path: dir.join("link"),
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
        Err(e) if e.kind() != ErrorKind::NotFound => Err(AttachError::Pin {
            path: dir.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Removes every pin in `dir`, then `dir`.
fn remove_dir_of_pins(dir: &Path) -> Result<(), AttachError> {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            match fs::remove_file(entry.path()) {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    return Err(AttachError::Pin {
                        path: entry.path(),
                        source: e,
                    })
                }
                _ => {}
            }
        }
    }
    match fs::remove_dir(dir) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(AttachError::Pin {
            path: dir.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Whether a pinned map path holds a map (used by `detach` to report).
pub fn is_pinned(dir: &Path) -> bool {
    dir.join("link").exists() || MapData::from_pin(maps_dir(dir).join(names::CONFIG)).is_ok()
}
