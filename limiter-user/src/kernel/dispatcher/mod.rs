//! libxdp's multi-program dispatcher (`[daemon] attach = "dispatcher"`):
//! xdp-limiter as one component of the XDP program libxdp users
//! (`xdp-loader`, `xdp-filter`, XDP-Firewall, bpfman) share an interface
//! through, following libxdp's protocol (its `protocol.org`, version 2).
//!
//! The dispatcher is libxdp's own object (`xdp-dispatcher.o`, installed
//! with libxdp), so whatever version of libxdp runs beside us reads it:
//! an XDP program `xdp_dispatcher` that calls the stubs `prog0`..`prog9`
//! in turn, each replaced by a component (a `BPF_PROG_TYPE_EXT` program),
//! and goes on to the next while the component returns one of its chain
//! actions. Its configuration (`Conf`, frozen `.rodata`) says how many
//! slots run, and each one's priority and chain actions. Components run
//! by priority (lowest first); xdp-limiter chains on `XDP_PASS` only.
//!
//! Joining or leaving builds a new dispatcher with the new set of
//! components, links every component into it (an extension can be linked
//! into several programs at once), pins the links and programs under
//! `/sys/fs/bpf/xdp/dispatch-IFINDEX-ID/progN-{link,prog}`, swaps the new
//! dispatcher in by netlink in place of the old one (`XDP_FLAGS_REPLACE`:
//! no frame meets neither) and unpins the old; all under libxdp's lock
//! (`flock` on `/sys/fs/bpf/xdp`). A swap that loses a race with another
//! libxdp user starts over.

mod netlink;
mod swap;

use std::{
    fs::{self, File},
    io,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, Map, MapData},
    programs::{loaded_programs, Extension, ProgramError, ProgramFd, ProgramInfo},
    Pod,
};
use nix::fcntl::{Flock, FlockArg};
use tracing::info;

use crate::config::AttachMode;

use swap::{swap, Member};

/// libxdp's dispatcher object, searched in [`OBJECT_DIRS`] (or the
/// directory `LIBXDP_OBJECT_PATH` names, as libxdp does).
pub const OBJECT: &str = "xdp-dispatcher.o";

/// Where libxdp installs its BPF objects (Debian's multiarch path first).
pub const OBJECT_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/bpf",
    "/usr/lib/aarch64-linux-gnu/bpf",
    "/usr/lib/bpf",
    "/usr/local/lib/bpf",
];

/// The run priority libxdp gives a component that states none.
pub const DEFAULT_PRIORITY: u32 = 50;

/// Slots of a dispatcher (`MAX_DISPATCHER_ACTIONS`).
pub const SLOTS: usize = 10;

/// The dispatcher's name in the kernel: how libxdp tells one.
const DISPATCHER: &str = "xdp_dispatcher";
/// `XDP_DISPATCHER_MAGIC`, `XDP_DISPATCHER_VERSION`.
const MAGIC: u8 = 236;
const VERSION: u8 = 2;
/// What an empty stub returns; always a chain action, so that a slot
/// whose component went away lets frames on (`XDP_DISPATCHER_RETVAL`).
const STUB_RETURN: u32 = 31;
/// `XDP_PASS`: xdp-limiter's one chain action (a frame it drops or
/// redirects goes no further).
const XDP_PASS: u32 = 2;

/// Why xdp-limiter could not join or leave an interface's dispatcher.
#[derive(Debug, thiserror::Error)]
pub enum DispatcherError {
    #[error(
        "libxdp's dispatcher object {OBJECT} is not installed (looked in {0}): \
         install libxdp (Debian: apt install libxdp1) or set LIBXDP_OBJECT_PATH"
    )]
    NoObject(String),
    #[error(
        "this kernel ({kernel}) refuses extension (freplace) programs, which libxdp's \
         dispatcher is made of ({error}); attach with attach = \"link\" instead"
    )]
    Unsupported { kernel: String, error: io::Error },
    #[error(
        "{iface} already has the XDP program `{name}` (id {id}), which is not a libxdp \
         dispatcher: nothing can join it; remove it, or load it through libxdp (xdp-loader)"
    )]
    NotDispatcher {
        iface: String,
        name: String,
        id: u32,
    },
    #[error(
        "{iface}'s dispatcher is of version {version}; this xdp-limiter speaks version {VERSION}"
    )]
    Version { iface: String, version: u8 },
    #[error("{iface}'s dispatcher has all its {SLOTS} slots taken")]
    Full { iface: String },
    #[error("{0}")]
    Refused(Box<super::Refusal>),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Bpf(String),
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> DispatcherError {
    move |source| DispatcherError::Io {
        what: what.into(),
        source,
    }
}

fn bpf_error(what: &str) -> impl FnOnce(ProgramError) -> DispatcherError + '_ {
    move |e| DispatcherError::Bpf(format!("{what}: {e}"))
}

/// The dispatcher's configuration (`struct xdp_dispatcher_config`,
/// version 2), in its `.rodata`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Conf {
    magic: u8,
    version: u8,
    slots_used: u8,
    is_xdp_frags: u8,
    chain_call_actions: [u32; SLOTS],
    run_prios: [u32; SLOTS],
    program_flags: [u32; SLOTS],
}

// SAFETY: plain integers, `repr(C)` with no padding (4 + 3 x 40 bytes),
// the layout of libxdp's `struct xdp_dispatcher_config`.
unsafe impl Pod for Conf {}

/// One component of a dispatcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Component {
    /// The kernel's id of the program.
    pub id: u32,
    /// Its name in the kernel.
    pub name: String,
    /// Its run priority (lowest runs first).
    pub priority: u32,
    /// The XDP actions after which the next component runs (bit N for
    /// action N).
    pub chain_actions: u32,
    /// `BPF_F_XDP_HAS_FRAGS` if it was loaded with it, as libxdp keeps.
    flags: u32,
}

/// What is attached to an interface, as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Programs {
    None,
    /// One program, not a dispatcher.
    Single {
        id: u32,
        name: String,
    },
    /// A libxdp dispatcher and its components in the order they run.
    Dispatcher {
        id: u32,
        components: Vec<Component>,
    },
}

/// A dispatcher running on an interface.
struct Running {
    prog: ProgramFd,
    id: u32,
    generic: bool,
    components: Vec<(Component, Extension)>,
}

/// libxdp's directory under bpffs (`LIBXDP_BPFFS`, else `/sys/fs/bpf`,
/// then `xdp`).
fn bpffs_dir() -> PathBuf {
    let base = std::env::var_os("LIBXDP_BPFFS").map_or_else(|| "/sys/fs/bpf".into(), PathBuf::from);
    base.join("xdp")
}

fn dispatcher_dir(ifindex: u32, id: u32) -> PathBuf {
    bpffs_dir().join(format!("dispatch-{ifindex}-{id}"))
}

/// libxdp's lock: an exclusive `flock` on its bpffs directory.
fn lock() -> Result<Flock<File>, DispatcherError> {
    let dir = bpffs_dir();
    // Mounts /sys/fs/bpf where it is missing, as libxdp expects it.
    super::pins::ensure_bpffs(&dir).map_err(|e| DispatcherError::Bpf(e.to_string()))?;
    fs::create_dir_all(&dir).map_err(io_error(dir.display().to_string()))?;
    let file = File::open(&dir).map_err(io_error(dir.display().to_string()))?;
    Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| io_error(format!("locking {}", dir.display()))(errno.into()))
}

/// The path of libxdp's dispatcher object.
fn object_path() -> Result<PathBuf, DispatcherError> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LIBXDP_OBJECT_PATH")
        .map(|p| vec![PathBuf::from(p)])
        .unwrap_or_default();
    dirs.extend(OBJECT_DIRS.iter().map(PathBuf::from));
    dirs.iter()
        .map(|dir| dir.join(OBJECT))
        .find(|path| path.exists())
        .ok_or_else(|| {
            DispatcherError::NoObject(
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
}

fn program_info(id: u32) -> Option<ProgramInfo> {
    loaded_programs().flatten().find(|info| info.id() == id)
}

/// What is attached to interface `ifindex`.
pub fn programs(ifindex: u32) -> Result<Programs, DispatcherError> {
    Ok(match running(ifindex, "") {
        Ok(Some(running)) => Programs::Dispatcher {
            id: running.id,
            components: running.components.into_iter().map(|(c, _)| c).collect(),
        },
        Ok(None) => Programs::None,
        Err(DispatcherError::NotDispatcher { id, name, .. }) => Programs::Single { id, name },
        Err(e) => return Err(e),
    })
}

/// The libxdp dispatcher on interface `ifindex` (`iface` names it in
/// errors), with its components opened from their pins; `None` when no
/// program is attached; an error when the program is not a dispatcher.
fn running(ifindex: u32, iface: &str) -> Result<Option<Running>, DispatcherError> {
    let Some(attached) = netlink::attached(ifindex).map_err(io_error("reading the interface"))?
    else {
        return Ok(None);
    };
    let info = program_info(attached.prog_id)
        .ok_or_else(|| DispatcherError::Bpf(format!("program {} vanished", attached.prog_id)))?;
    let name = info.name_as_str().unwrap_or_default().to_string();
    let map_ids = info.map_ids().ok().flatten().unwrap_or_default();
    if name != DISPATCHER || map_ids.len() != 1 {
        return Err(DispatcherError::NotDispatcher {
            iface: iface.into(),
            name,
            id: attached.prog_id,
        });
    }
    let map = MapData::from_id(map_ids[0])
        .map_err(|e| DispatcherError::Bpf(format!("the dispatcher's configuration: {e}")))?;
    let conf: Array<MapData, Conf> = Array::try_from(Map::Array(map))
        .map_err(|e| DispatcherError::Bpf(format!("the dispatcher's configuration: {e}")))?;
    let conf = conf
        .get(&0, 0)
        .map_err(|e| DispatcherError::Bpf(format!("the dispatcher's configuration: {e}")))?;
    if conf.magic != MAGIC || conf.version != VERSION {
        return Err(DispatcherError::Version {
            iface: iface.into(),
            version: if conf.magic == MAGIC { conf.version } else { 1 },
        });
    }
    let dir = dispatcher_dir(ifindex, attached.prog_id);
    let mut components = Vec::new();
    for slot in 0..usize::from(conf.slots_used).min(SLOTS) {
        let pin = dir.join(format!("prog{slot}-prog"));
        let program = Extension::from_pin(&pin)
            .map_err(|e| DispatcherError::Bpf(format!("{}: {e}", pin.display())))?;
        let info = program.info().map_err(bpf_error("a component"))?;
        components.push((
            Component {
                id: info.id(),
                name: info.name_as_str().unwrap_or_default().to_string(),
                priority: conf.run_prios[slot],
                chain_actions: conf.chain_call_actions[slot] & !(1 << STUB_RETURN),
                flags: conf.program_flags[slot],
            },
            program,
        ));
    }
    let prog = info.fd().map_err(bpf_error("the dispatcher"))?;
    Ok(Some(Running {
        prog,
        id: attached.prog_id,
        generic: attached.generic,
        components,
    }))
}

/// xdp-limiter's program about to join: loaded once, against the first
/// dispatcher it joins, linked into every later one.
pub struct Joining<'a> {
    pub program: &'a mut Extension,
    /// Its name in the kernel (`xdp_limiter`): an earlier xdp-limiter's
    /// component of that name is replaced, not kept beside it.
    pub name: &'static str,
    pub priority: u32,
}

/// Where xdp-limiter joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Joined {
    pub dispatcher_id: u32,
    /// The kernel's id of xdp-limiter's component.
    pub program_id: u32,
    /// It replaced an earlier xdp-limiter's component.
    pub replaced: bool,
    pub generic: bool,
}

/// Joins the dispatcher on `iface` (creating one where no program is
/// attached, in `mode`: `auto` tries native, then generic); a dispatcher
/// already there keeps its mode.
pub fn join(
    iface: &str,
    ifindex: u32,
    joining: Joining<'_>,
    mode: AttachMode,
) -> Result<Joined, DispatcherError> {
    let object = fs::read(object_path()?).map_err(io_error(OBJECT))?;
    let _lock = lock()?;
    let running = running(ifindex, iface)?;
    let modes: &[u32] = match (running.as_ref().map(|r| r.generic), mode) {
        (Some(true), _) | (None, AttachMode::Generic) => &[netlink::SKB_MODE],
        (Some(false), _) | (None, AttachMode::Native) => &[netlink::DRV_MODE],
        (None, AttachMode::Auto) => &[netlink::DRV_MODE, netlink::SKB_MODE],
    };
    let mut replaced = false;
    let mut members: Vec<Member<'_>> = Vec::new();
    let old = running.map(|r| {
        for (component, program) in r.components {
            if component.name == joining.name {
                replaced = true;
            } else {
                members.push(Member::Other(component, Box::new(program)));
            }
        }
        (r.prog, r.id)
    });
    if members.len() >= SLOTS {
        return Err(DispatcherError::Full {
            iface: iface.into(),
        });
    }
    members.push(Member::Ours(joining));
    let swapped = swap(&object, ifindex, members, old.as_ref(), modes)?;
    Ok(Joined {
        dispatcher_id: swapped.dispatcher_id,
        program_id: swapped.ours.unwrap_or(0),
        replaced,
        generic: swapped.generic,
    })
}

/// Takes program `program_id` out of `iface`'s dispatcher: the others go
/// on in a new dispatcher, or, when it was the only one, the dispatcher
/// is detached. Nothing to do when it is not there.
pub fn leave(iface: &str, ifindex: u32, program_id: u32) -> Result<(), DispatcherError> {
    let _lock = lock()?;
    let Some(running) = running(ifindex, iface).ok().flatten() else {
        return Ok(());
    };
    if !running.components.iter().any(|(c, _)| c.id == program_id) {
        return Ok(());
    }
    let members: Vec<Member<'_>> = running
        .components
        .into_iter()
        .filter(|(c, _)| c.id != program_id)
        .map(|(c, p)| Member::Other(c, Box::new(p)))
        .collect();
    let mode = if running.generic {
        netlink::SKB_MODE
    } else {
        netlink::DRV_MODE
    };
    if members.is_empty() {
        netlink::set(ifindex, None, mode, Some(running.prog.as_fd()))
            .map_err(io_error(format!("detaching the dispatcher from {iface}")))?;
        unpin(&dispatcher_dir(ifindex, running.id));
        info!(
            iface,
            "left the dispatcher, the last of its programs: detached it"
        );
        return Ok(());
    }
    let object = fs::read(object_path()?).map_err(io_error(OBJECT))?;
    swap(
        &object,
        ifindex,
        members,
        Some(&(running.prog, running.id)),
        &[mode],
    )?;
    info!(iface, "left the dispatcher; its other programs run on");
    Ok(())
}

/// The ids of the components named `name` on `ifindex`.
pub fn components_named(ifindex: u32, name: &str) -> Vec<u32> {
    match programs(ifindex) {
        Ok(Programs::Dispatcher { components, .. }) => components
            .into_iter()
            .filter(|c| c.name == name)
            .map(|c| c.id)
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether program `program_id` is a component of what runs on `ifindex`.
pub fn holds(ifindex: u32, program_id: u32) -> bool {
    matches!(programs(ifindex), Ok(Programs::Dispatcher { components, .. })
        if components.iter().any(|c| c.id == program_id))
}

/// Removes the pins of the dispatchers that held program `program_id`
/// on interface `ifindex` once that interface is gone (deleted, or
/// created again under another index): the dispatcher went with it, but
/// its pinned links hold it, and its components, in memory. Only the
/// directories holding `program_id` are touched: an index names
/// interfaces in other network namespaces too.
pub fn forget(ifindex: u32, program_id: u32) {
    if netlink::attached(ifindex).is_ok_and(|a| a.is_some()) {
        return;
    }
    let Ok(_lock) = lock() else {
        return;
    };
    let prefix = format!("dispatch-{ifindex}-");
    let Ok(entries) = fs::read_dir(bpffs_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let holds_ours = (0..SLOTS).any(|slot| {
            ProgramInfo::from_pin(entry.path().join(format!("prog{slot}-prog")))
                .is_ok_and(|info| info.id() == program_id)
        });
        if holds_ours {
            unpin(&entry.path());
        }
    }
}

/// Removes a dispatcher's pins (which unlinks its components from it).
fn unpin(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let _ = fs::remove_file(entry.path());
        }
    }
    let _ = fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_has_libxdp_s_layout() {
        assert_eq!(std::mem::size_of::<Conf>(), 124);
    }
}
