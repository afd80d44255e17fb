//! The frame parser of the xdp-limiter XDP program, as a library: pure
//! (no maps, no state), so the product program (`src/main.rs`) and the
//! benchmark's reference programs (`limiter-bench-ebpf`) parse with the
//! same code and their costs compare like for like.
#![no_std]

pub mod parse;
