//! Programs of the end-to-end benchmark (`cargo xtask bench e2e`); the
//! daemon never loads them.
//!
//! - `xdp_generate`: the traffic generator. Run through BPF_PROG_TEST_RUN
//!   with `BPF_F_TEST_XDP_LIVE_FRAMES` on the sending veth, it writes a
//!   whole frame per run (source picked per `limiter_bench_common::traffic`) and
//!   returns XDP_TX, which transmits it to the receiving peer.
//! - `xdp_drop_all`: drops every frame, the cost floor of any XDP filter.
//! - `xdp_pass`: passes every frame: the service scenario's trivial native
//!   program (what attaching native XDP alone does to a veth receiver).
//! - `xdp_count_drop`: parses like the limiter, bumps one per-CPU LRU
//!   counter per source and drops: the floor of any XDP filter that keeps
//!   per-source state (the `bench xdp` baseline, dropping).
//! - `e2e_sink`: a socket filter on the receiving UDP socket that counts
//!   each datagram by its stamp and then discards it, so what the filter
//!   under test let through is counted the same way for every tool.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action,
    helpers::bpf_ktime_get_ns,
    macros::{map, socket_filter, xdp},
    maps::{Array, LruPerCpuHashMap, PerCpuArray},
    programs::{SkBuffContext, XdpContext},
};
use limiter_bench_common::traffic::{
    pace, pick, sink_slot, write_frame, GenConfig, GenState, FRAME_LEN, SINK_SLOTS, SINK_UNKNOWN,
    STAMP_LEN,
};
use limiter_bench_ebpf::count;
use limiter_common::{Counter, SourceKey, DEFAULT_MAX_SOURCES};

#[map(name = "GEN_CONFIG")]
static GEN_CONFIG: Array<GenConfig> = Array::with_max_entries(1, 0);

#[map(name = "GEN_STATE")]
static GEN_STATE: PerCpuArray<GenState> = PerCpuArray::with_max_entries(1, 0);

/// Per-source counters of `xdp_count_drop` (userspace sets the size).
#[map(name = "COUNT_SOURCES")]
static COUNT_SOURCES: LruPerCpuHashMap<SourceKey, Counter> =
    LruPerCpuHashMap::with_max_entries(DEFAULT_MAX_SOURCES, 0);

#[map(name = "SINK")]
static SINK: PerCpuArray<u64> = PerCpuArray::with_max_entries(SINK_SLOTS, 0);

#[xdp]
pub fn xdp_generate(ctx: XdpContext) -> u32 {
    try_generate(&ctx).unwrap_or(xdp_action::XDP_ABORTED)
}

fn try_generate(ctx: &XdpContext) -> Option<u32> {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + FRAME_LEN > end {
        return None;
    }
    let config = GEN_CONFIG.get(0)?;
    let state = GEN_STATE.get_ptr_mut(0)?;
    // SAFETY: the bounds check above covers FRAME_LEN bytes of packet data
    // (byte arrays need no alignment); the state is this CPU's slot of a
    // per-CPU map value, used by nothing else while the program runs.
    let (frame, state) = unsafe { (&mut *(start as *mut [u8; FRAME_LEN]), &mut *state) };
    if config.interval_ns != 0 {
        // SAFETY: a helper call without arguments.
        let now = unsafe { bpf_ktime_get_ns() };
        if !pace(config, state, now) {
            // Not due yet: the frame goes back to the pool unsent.
            return Some(xdp_action::XDP_DROP);
        }
    }
    let pick = pick(config, state);
    write_frame(frame, config, &pick);
    Some(xdp_action::XDP_TX)
}

#[xdp]
pub fn xdp_drop_all(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_DROP
}

#[xdp]
pub fn xdp_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[xdp]
pub fn xdp_count_drop(ctx: XdpContext) -> u32 {
    count::count_source(&ctx, &COUNT_SOURCES);
    xdp_action::XDP_DROP
}

/// Counts the datagram (its data starts at the UDP header) and returns 0:
/// the kernel discards it, so the socket never fills.
#[socket_filter]
pub fn e2e_sink(ctx: SkBuffContext) -> i64 {
    let slot = match ctx.load::<[u8; STAMP_LEN]>(8) {
        Ok(stamp) => sink_slot(&stamp),
        Err(_) => SINK_UNKNOWN,
    };
    if let Some(count) = SINK.get_ptr_mut(slot) {
        // SAFETY: this CPU's slot of a per-CPU array value.
        unsafe { *count += 1 };
    }
    0
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
