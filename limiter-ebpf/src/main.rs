//! The xdp-limiter XDP program.
//!
//! Entry point `xdp_limiter` delegates to `try_limit`: parse the frame
//! (`parse.rs`, the crate's library), judge it (`judge/`), count the
//! outcome. Non-IP and malformed frames pass untouched and are counted as
//! such.
#![no_std]
#![no_main]
// BPF compare-and-swap is only reachable through the atomic intrinsics:
// the BPF target declares no CAS support to `core::sync::atomic`.
#![feature(core_intrinsics)]
// An empty-effect register move hides values from the optimiser where the
// verifier needs arithmetic, not branches (`shared::SharedWindow::opaque`).
#![feature(asm_experimental_arch)]
#![allow(internal_features)]

mod judge;
mod maps;
mod shared;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use limiter_common::Outcome;
use limiter_ebpf::parse::{self, ParseError};

// Inlined into the entry point the macro generates: as a function of its
// own it would get the packet pointers as plain integers, which the
// verifier refuses to dereference.
#[xdp]
#[inline(always)]
pub fn xdp_limiter(ctx: XdpContext) -> u32 {
    let len = (ctx.data_end() - ctx.data()) as u64;
    match try_limit(&ctx, len) {
        Ok(action) => action,
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
    let verdict = judge::judge(ctx, &packet, len);
    maps::count(verdict.outcome, len);
    Ok(verdict.action)
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable in a verified program: the BPF target aborts on panic and
    // the verifier rejects code that could fault.
    loop {}
}
