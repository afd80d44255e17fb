//! Raw `bpf(2)` commands that aya 0.14 does not wrap: batched map access
//! (`batch`), and opening a pinned link to detach it (`pins`).

use std::{
    ffi::CString,
    io,
    mem::size_of,
    os::{
        fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

const BPF_OBJ_GET: libc::c_long = 7;
pub(super) const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
pub(super) const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_LINK_DETACH: libc::c_long = 34;

/// Runs `bpf(cmd, attr)`; the kernel's non-negative return value.
///
/// # Safety
///
/// `attr` must be the member of `union bpf_attr` that `cmd` reads, fully
/// initialised, and every pointer in it valid for what the kernel reads
/// and writes through it.
pub(super) unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<libc::c_long> {
    // SAFETY: as the caller promises; the size passed is the member's.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut A,
            size_of::<A>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The `obj_get` member of `union bpf_attr`.
#[repr(C)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// The `link_detach` member of `union bpf_attr`.
#[repr(C)]
struct LinkDetachAttr {
    link_fd: u32,
}

/// Opens the BPF object pinned at `path` (`BPF_OBJ_GET`).
pub(super) fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let name = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = ObjGetAttr {
        pathname: name.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    // SAFETY: `obj_get`, whose one pointer is a NUL-terminated path that
    // lives until the call returns.
    let fd = unsafe { bpf(BPF_OBJ_GET, &mut attr) }?;
    // SAFETY: on success the kernel returned a new fd that nothing else
    // owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Detaches a link from its hook now (`BPF_LINK_DETACH`, kernel 5.9): an
/// XDP program leaves its interface before this returns, whoever still
/// holds a reference to the link (otherwise the link, and the program on
/// the interface, live until the last reference goes; bpffs drops an
/// unlinked pin's only after an RCU grace period).
pub(super) fn link_detach(link: impl AsFd) -> io::Result<()> {
    let mut attr = LinkDetachAttr {
        link_fd: link.as_fd().as_raw_fd() as u32,
    };
    // SAFETY: `link_detach` holds one fd and no pointers.
    unsafe { bpf(BPF_LINK_DETACH, &mut attr) }.map(drop)
}
