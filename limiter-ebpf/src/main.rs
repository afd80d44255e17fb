//! The xdp-limiter XDP program.
//!
//! Entry point `xdp_limiter` delegates to `try_limit`, which parses the
//! frame and counts it per source and per outcome. Non-IP and malformed
//! frames pass untouched and are counted as such.
#![no_std]
#![no_main]

mod maps;
mod parse;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use limiter_common::{Counter, Outcome};

use crate::parse::ParseError;

#[xdp]
pub fn xdp_limiter(ctx: XdpContext) -> u32 {
    let len = (ctx.data_end() - ctx.data()) as u64;
    match try_limit(&ctx, len) {
        Ok(verdict) => verdict,
        Err(ParseError::NonIp) => {
            maps::count(Outcome::NonIp, len);
            xdp_action::XDP_PASS
        }
        Err(ParseError::Malformed) => {
            maps::count(Outcome::Malformed, len);
            xdp_action::XDP_PASS
        }
    }
}

#[inline(always)]
fn try_limit(ctx: &XdpContext, len: u64) -> Result<u32, ParseError> {
    let packet = parse::parse(ctx)?;
    match maps::SOURCES.get_ptr_mut(packet.source) {
        Some(counter) => {
            // SAFETY: this CPU's slot of a per-CPU map value; XDP runs with
            // migration disabled, so nothing else writes it meanwhile.
            unsafe { (*counter).add(len) };
        }
        None => {
            let first = Counter {
                packets: 1,
                bytes: len,
            };
            // BPF_NOEXIST: if another CPU created the entry first, fall
            // back to counting in our slot of it.
            if maps::SOURCES
                .insert(packet.source, first, BPF_NOEXIST)
                .is_ok()
            {
                maps::count(Outcome::NewSource, len);
            } else if let Some(counter) = maps::SOURCES.get_ptr_mut(packet.source) {
                // SAFETY: as above.
                unsafe { (*counter).add(len) };
            } else {
                maps::count(Outcome::InsertFailure, len);
            }
        }
    }
    maps::count(Outcome::Passed, len);
    Ok(xdp_action::XDP_PASS)
}

/// `bpf_map_update_elem` flag: create only.
const BPF_NOEXIST: u64 = 1;

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable in a verified program: the BPF target aborts on panic and
    // the verifier rejects code that could fault.
    loop {}
}
