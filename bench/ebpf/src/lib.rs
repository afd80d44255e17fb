//! What the benchmarks' eBPF programs (`src/bin/`) share: [`count`], one
//! per-CPU counter per source, parsed with the product's parser. None of
//! it is part of xdp-limiter; `limiter-bench-objects` builds the programs
//! and embeds them for the benchmark drivers.
#![no_std]

pub mod count;
