//! A test object, not a benchmark: an XDP program that every kernel's
//! verifier refuses as too large, for the test of the limiter's refusal
//! message (`tests/tests/refusal.rs`). Never attached.
//!
//! Thirty unknown words each choose one of two constants for a bit of
//! `index`; the test of `index` at the end is decided on every path, so
//! the verifier tracks it exactly and no two of the 2^30 paths are the
//! same state: it walks them until its limit of a million instructions.
#![no_std]
#![no_main]

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::xdp_action,
    macros::{map, xdp},
    maps::Array,
    programs::XdpContext,
};

#[map(name = "OVERSIZED_WORDS")]
static WORDS: Array<u64> = Array::with_max_entries(32, 0);

#[xdp]
pub fn oversized(_ctx: XdpContext) -> u32 {
    let mut index = 0u32;
    let mut bit = 0u32;
    while bit < 30 {
        let word = match WORDS.get_ptr(bit) {
            // SAFETY: an aligned element of an array map.
            Some(word) => unsafe { read_volatile(word) },
            None => 0,
        };
        index = index * 2 + u32::from(word > 7);
        bit += 1;
    }
    if index == 0x1234_5678 {
        xdp_action::XDP_DROP
    } else {
        xdp_action::XDP_PASS
    }
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
