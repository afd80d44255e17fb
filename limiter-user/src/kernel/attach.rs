//! One protected interface: the program loaded against the interface's
//! pinned maps (adopting what an earlier daemon pinned, so its counters
//! continue), attached by a pinned XDP link, kept attached when the
//! interface is deleted and re-created, and detached.
//!
//! A new daemon loads the program against the pinned maps and swaps it onto
//! the pinned link with `bpf_link_update`, so there is no moment without
//! protection.

use std::{fs, path::Path, path::PathBuf};

use aya::programs::{
    links::{FdLink, PinnedLink},
    xdp::{XdpLink, XdpLinkId},
    Xdp, XdpMode,
};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::{
    dispatcher::{self, DispatcherError, Joining},
    object::{self, LoadOptions, Program},
    pins::{self, PinError},
};
use crate::{config::AttachMode, fault};
use limiter_common::names;

/// Why an interface could not be protected.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("no such interface: {0}")]
    NoInterface(String),
    #[error("loading BPF programs needs root (uid 0; capabilities alone are not supported)")]
    NotRoot,
    #[error(transparent)]
    Pins(#[from] PinError),
    #[error("loading the XDP program: {0}")]
    Load(String),
    #[error(
        "{iface} already has an XDP program that xdp-limiter did not attach; \
         remove it first (ip link set dev {iface} xdp off), or, if it is libxdp's \
         dispatcher (xdp-loader status {iface}), join it: attach = \"dispatcher\""
    )]
    Busy { iface: String },
    #[error("joining {iface}'s XDP dispatcher: {source}")]
    Dispatcher {
        iface: String,
        #[source]
        source: DispatcherError,
    },
    #[error("attaching to {iface} in {mode} mode: {message}")]
    Attach {
        iface: String,
        mode: Attachment,
        message: String,
    },
}

/// How an instance's program is attached (what `status` shows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attachment {
    /// Loaded, not attached yet.
    #[default]
    Loaded,
    /// Native (driver) mode.
    Native,
    /// Generic (skb) mode.
    Generic,
    /// Swapped onto the link an earlier daemon pinned (its mode).
    Adopted,
    /// A component of libxdp's dispatcher (`attach = "dispatcher"`).
    Dispatcher,
}

impl Attachment {
    /// Its name, as `status` and the logs show it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Attachment::Loaded => "loaded",
            Attachment::Native => "native",
            Attachment::Generic => "generic",
            Attachment::Adopted => "adopted",
            Attachment::Dispatcher => "dispatcher",
        }
    }
}

impl std::fmt::Display for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so that widths in tables apply.
        f.pad(self.as_str())
    }
}

/// A protected interface (once attached).
pub struct Instance {
    pub iface: String,
    pub program: Program,
    /// How the program is attached; `Loaded` until [`Instance::attach`].
    pub attachment: Attachment,
    /// A pinned link was there when this instance was loaded: something
    /// protected the interface before this process.
    found_link: bool,
    dir: PathBuf,
    /// Times the program was attached afresh because its link had lost its
    /// interface (deleted and re-created), at adoption or while running.
    pub reattachments: u64,
    /// What the last [`Instance::check_link`] found.
    pub link: LinkCheck,
    /// The run priority when the program is a component of libxdp's
    /// dispatcher rather than attached by a link of its own.
    component: Option<u32>,
    /// The interface index whose dispatcher the component joined.
    joined: Option<u32>,
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

impl LinkCheck {
    /// The program is attached to the interface of its name.
    pub fn is_attached(self) -> bool {
        matches!(self, LinkCheck::Attached | LinkCheck::Reattached)
    }
}

/// The index of the interface the XDP link pinned at `path` is attached
/// to: 0 once that interface is gone (the link is defunct); `None` when
/// nothing is pinned there or the kernel does not say. Read from the
/// link's `/proc/self/fdinfo` entry (`ifindex:`), found by its link id.
fn pinned_link_ifindex(path: &Path) -> Option<u32> {
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
    /// Loads the program for `iface` against its pinned maps (adopting
    /// existing ones, creating and pinning the others). Nothing is attached
    /// yet: the caller pushes the rules into the maps first, then calls
    /// [`Instance::attach`], so a fresh attach enforces from its first frame.
    pub fn load(iface: &str, pin_dir: &Path, options: LoadOptions) -> Result<Self, AttachError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(AttachError::NotRoot);
        }
        nix::net::if_::if_nametoindex(iface).map_err(|_| AttachError::NoInterface(iface.into()))?;
        pins::ensure_bpffs(pin_dir)?;
        let dir = pins::iface_dir(pin_dir, iface);
        pins::check_adoptable(pin_dir, &dir)?;
        pins::drop_incompatible_pins(&dir, &options);
        let maps_dir = pins::maps_dir(&dir);
        pins::create_private_dir(&maps_dir)?;
        let component = options.component;
        let found_link = match component {
            Some(_) => ifindex_of(iface).is_ok_and(|ifindex| {
                !dispatcher::components_named(ifindex, names::PROGRAM).is_empty()
            }),
            None => dir.join("link").exists(),
        };
        let program = object::load(&LoadOptions {
            pins: pins::map_pins(&maps_dir),
            ..options
        })
        .map_err(|e| AttachError::Load(e.to_string()))?;
        fault::stop_at(fault::Step::Loaded);
        Ok(Instance {
            iface: iface.into(),
            program,
            attachment: Attachment::Loaded,
            found_link,
            dir,
            reattachments: 0,
            link: LinkCheck::Attached,
            component,
            joined: None,
        })
    }

    /// Joins the interface's dispatcher (or creates one there), replacing
    /// an earlier xdp-limiter's component: one atomic swap, no moment
    /// without protection.
    fn join(&mut self, mode: AttachMode, priority: u32) -> Result<(), AttachError> {
        let iface = self.iface.clone();
        let ifindex = ifindex_of(&iface)?;
        let program = self
            .program
            .component()
            .ok_or_else(|| AttachError::Load("the program was not loaded as a component".into()))?;
        let joined = dispatcher::join(
            &iface,
            ifindex,
            Joining {
                program,
                name: names::PROGRAM,
                priority,
            },
            mode,
        )
        .map_err(|source| AttachError::Dispatcher {
            iface: iface.clone(),
            source,
        })?;
        if let Some(info) = self.program.component().and_then(|p| p.info().ok()) {
            self.program.verified.instructions = info.verified_instruction_count().unwrap_or(0);
        }
        if let Some(old) = self.joined.filter(|old| *old != ifindex) {
            dispatcher::forget(old, self.program.id());
        }
        self.joined = Some(ifindex);
        self.attachment = Attachment::Dispatcher;
        self.link = LinkCheck::Attached;
        info!(
            iface,
            dispatcher = joined.dispatcher_id,
            program = joined.program_id,
            priority,
            replaced = joined.replaced,
            generic = joined.generic,
            "joined the interface's XDP dispatcher"
        );
        Ok(())
    }

    /// Attaches the loaded program: onto the pinned link if there is one
    /// (one `bpf_link_update`: no moment without protection), else freshly
    /// in `mode`, pinning the new link.
    pub fn attach(&mut self, mode: AttachMode) -> Result<(), AttachError> {
        fault::stop_at(fault::Step::Attach);
        if let Some(priority) = self.component {
            return self.join(mode, priority);
        }
        let iface = self.iface.as_str();
        let program = self.program.xdp();
        let link_path = self.dir.join("link");
        let current = nix::net::if_::if_nametoindex(iface)
            .map_err(|_| AttachError::NoInterface(iface.into()))?;
        let pinned = PinnedLink::from_pin(&link_path).ok();
        let defunct = pinned.is_some()
            && pinned_link_ifindex(&link_path).is_some_and(|linked| linked != current);
        self.attachment = match pinned {
            Some(pinned) if !defunct => {
                let link = XdpLink::try_from(FdLink::from(pinned)).map_err(|e| {
                    AttachError::Load(format!("pinned link {}: {e}", link_path.display()))
                })?;
                program
                    .attach_to_link(link)
                    .map_err(|e| AttachError::Attach {
                        iface: iface.into(),
                        mode: Attachment::Adopted,
                        message: e.to_string(),
                    })?;
                info!(
                    iface,
                    "adopted the pinned link: program replaced atomically, counters kept"
                );
                Attachment::Adopted
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
        if let Some(priority) = self.component {
            if self.joined == Some(current) {
                self.link = if dispatcher::holds(current, self.program.id()) {
                    LinkCheck::Attached
                } else {
                    LinkCheck::Unpinned
                };
            } else {
                self.join(mode, priority)?;
                self.reattachments += 1;
                self.link = LinkCheck::Reattached;
            }
            return Ok(self.link);
        }
        if !link_path.exists() {
            self.link = LinkCheck::Unpinned;
            return Ok(self.link);
        }
        match pinned_link_ifindex(&link_path) {
            Some(linked) if linked != current => {
                let _ = fs::remove_file(&link_path);
                let program = self.program.xdp();
                self.attachment = attach_and_pin(program, &self.iface, mode, &link_path)?;
                self.reattachments += 1;
                self.link = LinkCheck::Reattached;
            }
            _ => self.link = LinkCheck::Attached,
        }
        Ok(self.link)
    }

    /// Whether a pinned link protected the interface before this process
    /// loaded this instance (it is adopted, or about to be).
    pub fn adopted(&self) -> bool {
        self.found_link
    }

    /// Stops protecting: removes the pinned link (which detaches the
    /// program) and the pinned maps.
    pub fn detach(mut self) -> Result<(), PinError> {
        let dir = self.dir.clone();
        if let Some(ifindex) = self.joined {
            let id = self.program.id();
            if let Err(e) = dispatcher::leave(&self.iface, ifindex, id) {
                warn!(iface = %self.iface, error = %e, "leaving the XDP dispatcher failed");
            }
            dispatcher::forget(ifindex, id);
            self.joined = None;
        }
        drop(self.program);
        pins::remove_pins(&dir)
    }

    /// Leaves everything pinned: the interface stays protected.
    pub fn keep(self) {
        info!(iface = %self.iface, pins = %self.dir.display(), "leaving the program attached");
    }
}

fn ifindex_of(iface: &str) -> Result<u32, AttachError> {
    nix::net::if_::if_nametoindex(iface).map_err(|_| AttachError::NoInterface(iface.into()))
}

/// Attaches `program` to `iface` afresh and pins the new link at
/// `link_path`; how it got attached.
fn attach_and_pin(
    program: &mut Xdp,
    iface: &str,
    mode: AttachMode,
    link_path: &Path,
) -> Result<Attachment, AttachError> {
    let (link_id, attached) = attach_fresh(program, iface, mode)?;
    let link = program
        .take_link(link_id)
        .map_err(|e| AttachError::Load(e.to_string()))?;
    let fd_link = FdLink::try_from(link).map_err(|e| AttachError::Load(e.to_string()))?;
    fd_link.pin(link_path).map_err(|e| PinError::Io {
        path: link_path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(attached)
}

fn attach_fresh(
    program: &mut Xdp,
    iface: &str,
    mode: AttachMode,
) -> Result<(XdpLinkId, Attachment), AttachError> {
    let busy = |message: &str| {
        message.contains("File exists") || message.contains("Device or resource busy")
    };
    let attach = |program: &mut Xdp, attachment: Attachment| {
        let xdp_mode = match attachment {
            Attachment::Generic => XdpMode::Skb,
            _ => XdpMode::Driver,
        };
        program
            .attach(iface, xdp_mode)
            .map(|id| (id, attachment))
            .map_err(|e| {
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
                        mode: attachment,
                        message,
                    }
                }
            })
    };
    match mode {
        AttachMode::Native => attach(program, Attachment::Native),
        AttachMode::Generic => attach(program, Attachment::Generic),
        AttachMode::Auto => match attach(program, Attachment::Native) {
            Err(native @ AttachError::Attach { .. }) => {
                warn!(iface, error = %native, "native XDP is not available; falling back to generic mode (slower)");
                attach(program, Attachment::Generic)
            }
            attached => attached,
        },
    }
}
