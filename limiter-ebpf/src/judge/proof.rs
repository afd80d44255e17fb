//! Proof before state: while `WINDOWS` is full, a TCP source without a
//! window gets one without a ticket only from a frame that proves its
//! address: the handshake's last ACK, whose acknowledgement number is the
//! SYN cookie the kernel sent to that address and port in its SYN-ACK,
//! checked against the kernel's own cookie secret
//! (`bpf_tcp_raw_check_syncookie_ipv4`/`_ipv6`, Linux 6.0). A spoofer
//! never receives our SYN-ACKs, so it cannot take that room. Its SYNs,
//! which a new client needs to start, pass while the source reads at most
//! `sketch::UNPROVEN_SYNS` frames over two epochs; nothing else of an
//! unproven source passes past its cheap frames. docs/architecture.md,
//! "Full maps", has the design and its bounds.

use aya_ebpf::{
    bindings::{iphdr, ipv6hdr, tcphdr},
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

use core::ptr::{read_volatile, write_volatile};

use super::window::{pressure, LIMIT_PROVEN, LIMIT_SYN_PASSES, PRESSURE_WINDOWS};
use crate::maps::FRAME_CLAIMS;

/// The frame being judged, as far as its proof needs it.
#[derive(Clone, Copy)]
pub(super) struct Frame<'a> {
    pub ctx: &'a XdpContext,
    pub packet: &'a Packet,
}

/// Notes what `frame` may claim at `now` should its source find no
/// window and no ticket (read by `limit`: [`claims`]), its sketch reading
/// not known yet ([`note_reading`] adds it): a SYN may pass
/// (`LIMIT_SYN_PASSES`, within its bound); while the tickets were found
/// all taken within the last 61 s, an ACK that proves its source (a
/// valid SYN cookie) gets its window without a ticket (`LIMIT_PROVEN`).
/// Called first in the judge, and written to `FRAME_CLAIMS`, not
/// returned: nothing the judge branches on, so the verifier walks the
/// judge once whatever the frame claims (the claims carried in `limit`'s
/// flags, or a global function given the context, took 6.1's verifier
/// past its million instructions).
#[inline(always)]
pub(super) fn note(frame: Frame, now: u64) {
    let packet = frame.packet;
    let tcp_at = u32::from(packet.tcp_at);
    let claims = match claim(packet.protocol, packet.tcp_flags, tcp_at) {
        Claim::Syn => LIMIT_SYN_PASSES,
        Claim::Ack
            if now < pressure(PRESSURE_WINDOWS) && syncookie_valid(frame.ctx, packet, tcp_at) =>
        {
            LIMIT_PROVEN
        }
        _ => 0,
    };
    if let Some(noted) = FRAME_CLAIMS.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array, used by this frame
        // alone.
        unsafe {
            write_volatile(&mut (*noted)[0], claims);
            write_volatile(&mut (*noted)[1], u32::MAX);
        }
    }
}

/// Notes the frame's source reading `total` frames over two epochs in the
/// sketch, marks taken off (`sketch::Seen::unmarked`): what bounds its
/// SYNs without a window.
#[inline(always)]
pub(super) fn note_reading(total: u32) {
    if let Some(noted) = FRAME_CLAIMS.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array, used by this frame
        // alone.
        unsafe { write_volatile(&mut (*noted)[1], total) };
    }
}

/// What the frame being judged may claim (`LIMIT_PROVEN`, or
/// `LIMIT_SYN_PASSES` if its SYN is within `UNPROVEN_SYNS`), as noted.
#[inline(always)]
pub(super) fn claims() -> u32 {
    let Some(noted) = FRAME_CLAIMS.get_ptr(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot of a per-CPU array, written for this frame.
    let (claims, total) = unsafe { (read_volatile(&(*noted)[0]), read_volatile(&(*noted)[1])) };
    if claims & LIMIT_SYN_PASSES != 0 && !syn_passes(total) {
        claims & !LIMIT_SYN_PASSES
    } else {
        claims
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
/// (marks taken off: `sketch::unmarked`) passes while the source has no
/// window.
#[inline(always)]
pub(super) const fn syn_passes(total: u32) -> bool {
    total <= sketch::UNPROVEN_SYNS
}

/// Whether `packet` (parsed from `ctx`, its TCP header at `tcp_at`) is a
/// TCP segment whose acknowledgement number is a valid SYN cookie for its
/// addresses and ports: its source received our SYN-ACK.
#[inline(always)]
fn syncookie_valid(ctx: &XdpContext, packet: &Packet, tcp_at: u32) -> bool {
    let start = ctx.data();
    let end = ctx.data_end();
    // Bounded for the verifier: the IP header lies in the first 64 bytes
    // (behind at most two VLAN tags), the TCP header in the first 512.
    let ip_at = packet.ip_at() & 0x3f;
    let tcp_at = (tcp_at & 0x1ff) as usize;
    if start + tcp_at + TcpHdr::LEN > end {
        return false;
    }
    let th = (start + tcp_at) as *mut tcphdr;
    let checked = if packet.source.family() == AddressFamily::V4 {
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
