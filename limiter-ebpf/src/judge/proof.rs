//! Proof before state: while `WINDOWS` is full, a TCP source without a
//! window gets one (in `PROVEN`) only from a frame that proves its
//! address: the handshake's last ACK, whose acknowledgement number is the
//! SYN cookie the kernel sent to that address and port in its SYN-ACK,
//! checked against the kernel's own cookie secret
//! (`bpf_tcp_raw_check_syncookie_ipv4`/`_ipv6`, Linux 6.0). A spoofer
//! never receives our SYN-ACKs, so it cannot fill `PROVEN`. Its SYNs,
//! which a new client needs to start, pass while the source reads at most
//! `sketch::UNPROVEN_SYNS` frames over two epochs; nothing else of an
//! unproven source passes past its cheap frames. docs/architecture.md,
//! "Full maps", has the design and its bounds.

use aya_ebpf::{
    bindings::{iphdr, ipv6hdr, tcphdr, xdp_md},
    helpers::{bpf_tcp_raw_check_syncookie_ipv4, bpf_tcp_raw_check_syncookie_ipv6},
    programs::XdpContext,
};
use limiter_common::{
    rules::{IPPROTO_TCP, TCP_FLAG_ACK, TCP_FLAG_SYN},
    sketch, AddressFamily,
};
use limiter_ebpf::parse::Packet;
use network_types::{
    ip::{Ipv4Hdr, Ipv6Hdr},
    tcp::TcpHdr,
};

use super::window::{pressure, LIMIT_PROVEN, LIMIT_SYN_PASSES, PRESSURE_WINDOWS};

/// The frame being judged, as far as its proof needs it.
#[derive(Clone, Copy)]
pub(super) struct Frame<'a> {
    pub ctx: &'a XdpContext,
    pub packet: &'a Packet,
}

/// `limit`'s flags for `frame`, of a source reading `total` frames over
/// two epochs in the sketch, at `now`: what it may claim should its source
/// have no window and no ticket be left for one ([`proof_flags`]).
#[inline(always)]
pub(super) fn flags(frame: Frame, total: u32, now: u64) -> u32 {
    let packet = frame.packet;
    let v6 = u64::from(packet.source.family() == AddressFamily::V6);
    let packed = u64::from(packet.protocol)
        | u64::from(packet.tcp_flags) << 8
        | u64::from(packet.tcp_at) << 16
        | (packet.ip_at() as u64 & 0xffff) << 32
        | v6 << 48;
    proof_flags(frame.ctx.ctx, packed, total, now)
}

/// [`flags`]' body: for the frame of `ctx` (its protocol, TCP flags, TCP
/// and IP header offsets and family packed in `packed`): while the
/// tickets of `UNPROVEN` were found all taken within the last
/// `PRESSURE_NS`, an ACK that proves its source (a valid SYN cookie) gets
/// its window without a ticket (`LIMIT_PROVEN`); a SYN of a source
/// reading at most [`sketch::UNPROVEN_SYNS`] passes uncounted
/// (`LIMIT_SYN_PASSES`; no window: nothing to count it in). The cookie is
/// checked only under that pressure, and before `limit`: one call of
/// `limit` whatever the frame claims.
///
/// A global BPF function: the verifier checks it once on its own, and
/// its callers meet one unknown answer, not one state per claim.
#[no_mangle]
#[inline(never)]
pub extern "C" fn proof_flags(ctx: *mut xdp_md, packed: u64, total: u32, now: u64) -> u32 {
    let protocol = (packed & 0xff) as u8;
    let tcp_flags = (packed >> 8 & 0xff) as u8;
    let tcp_at = (packed >> 16 & 0xffff) as u32;
    let ip_at = (packed >> 32 & 0xffff) as u32;
    let v6 = (packed >> 48 & 1) as u32;
    match claim(protocol, tcp_flags, tcp_at) {
        Claim::Syn if syn_passes(total) => LIMIT_SYN_PASSES,
        Claim::Ack
            if now < pressure(PRESSURE_WINDOWS) && syncookie_valid(ctx, ip_at, tcp_at, v6) =>
        {
            LIMIT_PROVEN
        }
        _ => 0,
    }
}

/// What a TCP frame may do for a source without a window.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Claim {
    /// Nothing: not TCP, or neither a SYN nor an ACK.
    None,
    /// A SYN (no ACK): how a client starts.
    Syn,
    /// An ACK (no SYN): perhaps the handshake's last, with a cookie.
    Ack,
}

/// What a frame of `protocol` with `tcp_flags`, its TCP header at
/// `tcp_at` (0: none), may claim while its source has no window.
#[inline(always)]
fn claim(protocol: u8, tcp_flags: u8, tcp_at: u32) -> Claim {
    if protocol != IPPROTO_TCP || tcp_at == 0 {
        return Claim::None;
    }
    match tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK) {
        TCP_FLAG_SYN => Claim::Syn,
        TCP_FLAG_ACK => Claim::Ack,
        _ => Claim::None,
    }
}

/// Whether a SYN of a source reading `total` frames over two epochs
/// passes while the source has no window.
#[inline(always)]
pub(super) const fn syn_passes(total: u32) -> bool {
    total <= sketch::UNPROVEN_SYNS
}

/// Whether the frame of `ctx` holds, at `ip_at` and `tcp_at`, an IP
/// (IPv6 if `v6` is non-zero) and a TCP header whose acknowledgement
/// number is a valid SYN cookie for them: 1, else 0.
///
#[inline(always)]
fn syncookie_valid(ctx: *mut xdp_md, ip_at: u32, tcp_at: u32, v6: u32) -> bool {
    // SAFETY: the context argument of the global function `proof_flags`:
    // the program's own (the verifier checks the type; it may be null:
    // checked).
    let Some(md) = (unsafe { ctx.as_ref() }) else {
        return false;
    };
    let start = md.data as usize;
    let end = md.data_end as usize;
    // Bounded for the verifier: the IP header lies in the first 64 bytes
    // (behind at most two VLAN tags), the TCP header in the first 512.
    let ip_at = (ip_at & 0x3f) as usize;
    let tcp_at = (tcp_at & 0x1ff) as usize;
    if start + tcp_at + TcpHdr::LEN > end {
        return false;
    }
    let th = (start + tcp_at) as *mut tcphdr;
    let checked = if v6 == 0 {
        if start + ip_at + Ipv4Hdr::LEN > end {
            return false;
        }
        // SAFETY: both headers lie inside the frame (checked above); the
        // helper only reads them.
        unsafe { bpf_tcp_raw_check_syncookie_ipv4((start + ip_at) as *mut iphdr, th) }
    } else {
        if start + ip_at + Ipv6Hdr::LEN > end {
            return false;
        }
        // SAFETY: as above.
        unsafe { bpf_tcp_raw_check_syncookie_ipv6((start + ip_at) as *mut ipv6hdr, th) }
    };
    checked == 0
}
