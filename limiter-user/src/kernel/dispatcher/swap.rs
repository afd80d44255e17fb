//! Building a dispatcher of a set of components and swapping it onto
//! the interface: the new dispatcher loaded with its configuration set,
//! every component linked into its slot and pinned, then attached in
//! place of the old one (or where there is none).

use std::{fs, io, os::fd::AsFd, path::Path};

use aya::{
    programs::{links::FdLink, Extension, ProgramError, ProgramFd, Xdp},
    EbpfLoader,
};

use super::{
    bpf_error, dispatcher_dir, io_error, netlink, unpin, Component, Conf, DispatcherError, Joining,
    DISPATCHER, MAGIC, OBJECT, STUB_RETURN, VERSION, XDP_PASS,
};

pub(super) enum Member<'a> {
    Other(Component, Box<Extension>),
    Ours(Joining<'a>),
}

impl Member<'_> {
    fn priority(&self) -> u32 {
        match self {
            Member::Other(c, _) => c.priority,
            Member::Ours(j) => j.priority,
        }
    }
    fn name(&self) -> &str {
        match self {
            Member::Other(c, _) => &c.name,
            Member::Ours(j) => j.name,
        }
    }
}

pub(super) struct Swapped {
    pub(super) dispatcher_id: u32,
    pub(super) ours: Option<u32>,
    /// Attached in generic (skb) mode.
    pub(super) generic: bool,
}

/// Builds a dispatcher of `members` (in priority order, then by name, as
/// libxdp sorts), links and pins them, and attaches it to `ifindex` in
/// place of `old` (or where nothing is attached).
pub(super) fn swap(
    object: &[u8],
    ifindex: u32,
    mut members: Vec<Member<'_>>,
    old: Option<&(ProgramFd, u32)>,
    modes: &[u32],
) -> Result<Swapped, DispatcherError> {
    members.sort_by(|a, b| {
        a.priority()
            .cmp(&b.priority())
            .then_with(|| a.name().cmp(b.name()))
    });
    let mut conf = Conf {
        magic: MAGIC,
        version: VERSION,
        slots_used: members.len() as u8,
        ..Conf::default()
    };
    for (slot, member) in members.iter().enumerate() {
        let (chain, flags) = match member {
            Member::Other(c, _) => (c.chain_actions, c.flags),
            Member::Ours(_) => (1 << XDP_PASS, 0),
        };
        conf.chain_call_actions[slot] = chain | 1 << STUB_RETURN;
        conf.run_prios[slot] = member.priority();
        conf.program_flags[slot] = flags;
    }
    let mut ebpf = EbpfLoader::new()
        .override_global("conf", &conf, true)
        .load(object)
        .map_err(|e| DispatcherError::Bpf(format!("libxdp's {OBJECT}: {e}")))?;
    let dispatcher: &mut Xdp = ebpf
        .program_mut(DISPATCHER)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| DispatcherError::Bpf(format!("{OBJECT} has no program {DISPATCHER}")))?;
    dispatcher
        .load()
        .map_err(bpf_error("loading the dispatcher"))?;
    let fd = dispatcher.fd().map_err(bpf_error("the dispatcher"))?;
    let id = dispatcher.info().map_err(bpf_error("the dispatcher"))?.id();
    let dir = dispatcher_dir(ifindex, id);
    let result = link_all(&mut members, fd, &dir).and_then(|ours| {
        let mut attached = Err(io::Error::from(io::ErrorKind::InvalidInput));
        // In the first mode that works (native, then generic, for `auto`).
        for mode in modes {
            let flags = if old.is_some() {
                *mode
            } else {
                mode | netlink::UPDATE_IF_NOEXIST
            };
            let expected = old.map(|(prog, _)| prog.as_fd());
            attached = netlink::set(ifindex, Some(fd.as_fd()), flags, expected).map(|()| *mode);
            if attached.is_ok() {
                break;
            }
        }
        let mode = attached.map_err(io_error("attaching the dispatcher"))?;
        Ok((ours, mode == netlink::SKB_MODE))
    });
    match result {
        Ok((ours, generic)) => {
            if let Some((_, old_id)) = old {
                unpin(&dispatcher_dir(ifindex, *old_id));
            }
            Ok(Swapped {
                dispatcher_id: id,
                ours,
                generic,
            })
        }
        Err(e) => {
            unpin(&dir);
            Err(e)
        }
    }
}

/// Links every member into the dispatcher `fd` (slot N: `progN`) and pins
/// its link and program in `dir`; xdp-limiter's program id.
fn link_all(
    members: &mut [Member<'_>],
    fd: &ProgramFd,
    dir: &Path,
) -> Result<Option<u32>, DispatcherError> {
    fs::create_dir_all(dir).map_err(io_error(dir.display().to_string()))?;
    let mut ours = None;
    for (slot, member) in members.iter_mut().enumerate() {
        let stub = format!("prog{slot}");
        let program: &mut Extension = match member {
            Member::Other(_, program) => program,
            Member::Ours(joining) => {
                // Loaded (verified) against the first dispatcher it joins.
                if joining.program.fd().is_err() {
                    let target = fd
                        .try_clone()
                        .map_err(|e| DispatcherError::Bpf(e.to_string()))?;
                    load_ours(joining.program, target, &stub)?;
                }
                ours = Some(
                    joining
                        .program
                        .info()
                        .map_err(bpf_error("xdp-limiter"))?
                        .id(),
                );
                joining.program
            }
        };
        let link = program
            .attach_to_program(fd, &stub)
            .map_err(bpf_error("linking a component into the dispatcher"))?;
        let link = program
            .take_link(link)
            .map_err(bpf_error("a component's link"))?;
        let link: FdLink = link.into();
        let pin = dir.join(format!("{stub}-link"));
        link.pin(&pin)
            .map_err(|e| DispatcherError::Bpf(format!("{}: {e}", pin.display())))?;
        let pin = dir.join(format!("{stub}-prog"));
        program
            .pin(&pin)
            .map_err(|e| DispatcherError::Bpf(format!("{}: {e}", pin.display())))?;
    }
    Ok(ours)
}

/// Loads xdp-limiter's program as an extension of `stub` in `target`.
fn load_ours(
    program: &mut Extension,
    target: ProgramFd,
    stub: &str,
) -> Result<(), DispatcherError> {
    match program.load(target, stub) {
        Ok(()) => Ok(()),
        Err(ProgramError::LoadError {
            io_error,
            verifier_log,
        }) => {
            let log = verifier_log.to_string();
            // A kernel without BPF trampolines refuses any extension
            // before verifying it: an empty log.
            if log.trim().is_empty() {
                Err(DispatcherError::Unsupported {
                    kernel: crate::kernel::kernel_release(),
                    error: io_error,
                })
            } else {
                Err(DispatcherError::Refused(Box::new(
                    crate::kernel::Refusal::new(
                        crate::kernel::kernel_release(),
                        limiter_common::names::PROGRAM,
                        io_error,
                        log,
                    ),
                )))
            }
        }
        Err(e) => Err(DispatcherError::Bpf(format!(
            "loading xdp-limiter as a component: {e}"
        ))),
    }
}
