//! What the benchmarks' kernel programs (`limiter-bench-ebpf`) and their
//! userspace drivers (`limiter-bench`) share: the live-frames generator's
//! configuration and state, how it picks sources, paces and writes frames,
//! and the stamp the receiving sink counts by ([`traffic`]). Nothing here
//! is part of xdp-limiter, so the product's shared types
//! (`limiter-common`) and their `aya::Pod` impls stay the product's own.
//!
//! `#![no_std]`, as it runs in the kernel; with the `user` feature the
//! types that cross a BPF map implement `aya::Pod`.
#![no_std]

pub mod traffic;

#[cfg(feature = "user")]
mod user {
    use core::mem::size_of;

    use crate::traffic::{GenConfig, GenState};

    // The claim the impls below rest on: neither type has padding, so
    // none of their bytes is uninitialised.
    const _: () = assert!(size_of::<GenConfig>() == 72 && size_of::<GenState>() == 56);

    // SAFETY: #[repr(C)] structs of integers and byte arrays whose fields
    // leave no padding (asserted above): every bit pattern is valid and no
    // byte is uninitialised.
    unsafe impl aya::Pod for GenConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for GenState {}
}
