//! Traffic of the end-to-end benchmark (`cargo xtask bench e2e`), shared by
//! its kernel programs (`bench/ebpf/src/bin/bench_traffic.rs`) and the
//! userspace driver (`e2e/traffic.rs`): the generator's configuration, how
//! it picks a source for each frame, the frame it writes, and the stamp in
//! the payload that the receiving sink counts by. Nothing here is part of
//! the limiter.
//!
//! Each frame is a UDP datagram of [`FRAME_LEN`] bytes from one of three
//! classes: *light* sources (many, each under the limit), *heavy* sources
//! (few, far over it) and *random* sources (a new address nearly every
//! frame: a spoofed flood). A source is IPv4 or IPv6 for good, decided by a
//! hash of its index, so per-source counts mean the same in every tool.
//!
//! With [`GenConfig::tcp_syn`] set the generator sends TCP SYNs instead
//! (IPv4 only, no stamp): the spoofed SYN flood of the end-to-end
//! benchmark's service scenario, aimed at a real server's listening port.
//! With [`GenConfig::random_bits`] at 16 the random sources all come
//! from one IPv4 /16, [`RANDOM_PREFIX16`]: a spoofed flood that a per-source
//! limit cannot hold (each address sends little) but a limit on the
//! prefix as a whole can.

/// Length of every generated frame (Ethernet header included): the same for
/// IPv4 and IPv6, so both cost the same to move.
pub const FRAME_LEN: usize = 78;
/// Bytes of payload stamp: magic, class, index.
pub const STAMP_LEN: usize = 12;
/// Identifies a benchmark frame ("XLTB").
pub const STAMP_MAGIC: u32 = 0x584c_5442;

/// Frame classes, as stamped in the payload.
pub const CLASS_LIGHT: u8 = 0;
pub const CLASS_HEAVY: u8 = 1;
pub const CLASS_RANDOM: u8 = 2;
/// Number of classes.
pub const CLASSES: usize = 3;

/// At most this many light sources (their index fits the address plan).
pub const MAX_LIGHT: u32 = 1 << 16;
/// At most this many heavy sources (each has its own sink counter).
pub const MAX_HEAVY: u32 = 1024;

/// The one /16 of the random sources under [`GenConfig::random_bits`] 16
/// (the first /16 of their usual 10.128.0.0/9; light and heavy sources
/// are outside it).
pub const RANDOM_PREFIX16: [u8; 2] = [10, 128];
/// [`GenConfig::random_bits`] for [`RANDOM_PREFIX16`]'s one /16.
pub const PREFIX16_BITS: u8 = 16;

/// Shares are fractions in units of 1/65536.
pub const SHARE_ONE: u32 = 1 << 16;

/// Sink counter slots (`SINK` map): light total, random total, frames
/// without a valid stamp, then one per heavy source.
pub const SINK_LIGHT: u32 = 0;
pub const SINK_RANDOM: u32 = 1;
pub const SINK_UNKNOWN: u32 = 2;
pub const SINK_HEAVY_BASE: u32 = 3;
pub const SINK_SLOTS: u32 = SINK_HEAVY_BASE + MAX_HEAVY;

/// Names in the benchmark object.
pub mod names {
    /// XDP generator, run with `BPF_F_TEST_XDP_LIVE_FRAMES`.
    pub const GENERATOR: &str = "xdp_generate";
    /// XDP program that drops every frame: the cost floor.
    pub const DROP_ALL: &str = "xdp_drop_all";
    /// XDP program that passes every frame: what attaching any native XDP
    /// program costs a veth receiver, before the program does anything.
    pub const PASS: &str = "xdp_pass";
    /// XDP program that counts per source and drops: the floor of any
    /// per-source state.
    pub const COUNT_DROP: &str = "xdp_count_drop";
    /// Its per-source counters (per-CPU LRU hash).
    pub const COUNT_SOURCES: &str = "COUNT_SOURCES";
    /// Socket filter counting what reached the receiving socket.
    pub const SINK_PROGRAM: &str = "e2e_sink";
    /// `GenConfig` (array of one).
    pub const GEN_CONFIG: &str = "GEN_CONFIG";
    /// `GenState` (per-CPU array of one).
    pub const GEN_STATE: &str = "GEN_STATE";
    /// Per-slot frame counts at the sink (per-CPU array of u64).
    pub const SINK: &str = "SINK";
}

/// What the generator sends, set by userspace before a run.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenConfig {
    /// At most one frame per this many ns (0: unpaced). Pacing is done in
    /// the program because one BPF_PROG_TEST_RUN call must cover many
    /// frames: each call sets up a page pool, which costs milliseconds.
    pub interval_ns: u64,
    /// Number of light and heavy sources (0 disables the class).
    pub light_sources: u32,
    pub heavy_sources: u32,
    /// Share of frames from heavy sources and from random sources; the
    /// rest come from light sources (1/65536 units).
    pub heavy_share: u32,
    pub random_share: u32,
    /// Share of sources that are IPv6 (1/65536 units).
    pub ipv6_share: u32,
    pub src_port: u16,
    pub dst_port: u16,
    pub dst_v4: [u8; 4],
    pub dst_v6: [u8; 16],
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// Nonzero: every frame is an IPv4 TCP SYN to `dst_v4:dst_port` (a
    /// SYN flood; `ipv6_share` is ignored), not a stamped UDP datagram.
    pub tcp_syn: u8,
    /// Nonzero: random sources are IPv4 only and drawn from the first
    /// `2^random_bits` addresses of 10.128.0.0/9 (16: one /16,
    /// [`RANDOM_PREFIX16`]; 18: a /14, four times the limiter's default
    /// windows; at most 23), not spread over the /9 and IPv6
    /// (`ipv6_share` still applies to the light and heavy sources).
    pub random_bits: u8,
    /// Explicit padding, so no byte of the struct is uninitialised.
    pub reserved: [u8; 6],
}

/// The generator's per-CPU state and counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenState {
    /// When the next frame is due (kernel monotonic ns), when paced.
    pub next_due_ns: u64,
    /// Frames generated so far (drives the pseudo-random choices).
    pub seq: u64,
    /// Next light and heavy source (round robin, so each source of a
    /// class sends the same number of frames).
    pub next_light: u32,
    pub next_heavy: u32,
    /// Frames handed to XDP_TX per class.
    pub sent: [u64; CLASSES],
    /// Time the pacing forgot (stalls longer than [`MAX_LAG_NS`]), so that
    /// a shortfall from the rate can be told apart from a pacing error.
    pub stalled_ns: u64,
}

/// A pacing stall longer than this (the generator was preempted, or
/// between two test-run calls) is forgotten rather than made up in a burst
/// that the veth ring (256 frames) could not hold.
pub const MAX_LAG_NS: u64 = 100_000;

/// Whether a frame may go at `now_ns` under `config.interval_ns`; advances
/// the schedule when it may.
#[inline(always)]
pub fn pace(config: &GenConfig, state: &mut GenState, now_ns: u64) -> bool {
    let interval = config.interval_ns;
    if interval == 0 {
        return true;
    }
    let due = state.next_due_ns;
    if now_ns < due {
        return false;
    }
    state.next_due_ns = if now_ns - due > MAX_LAG_NS {
        if due != 0 {
            // (0: the first frame ever, no stall.)
            state.stalled_ns += now_ns - due;
        }
        now_ns + interval
    } else {
        due + interval
    };
    true
}

/// One frame's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    pub class: u8,
    /// Source index within its class; random bits for random sources.
    pub index: u32,
    pub ipv6: bool,
}

/// SplitMix64's finaliser: a cheap, well-mixed hash for the choices.
#[inline(always)]
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether light or heavy source `index` is an IPv6 source.
#[inline(always)]
pub fn source_is_ipv6(class: u8, index: u32, ipv6_share: u32) -> bool {
    let h = mix(((class as u64) << 32) | index as u64);
    ((h >> 40) as u32 & (SHARE_ONE - 1)) < ipv6_share
}

/// Picks the source of frame number `state.seq` and advances the state.
#[inline(always)]
pub fn pick(config: &GenConfig, state: &mut GenState) -> Pick {
    let r = mix(state.seq);
    state.seq += 1;
    let share = (r & 0xffff) as u32;
    let pick = if share < config.heavy_share && config.heavy_sources > 0 {
        let index = state.next_heavy;
        state.next_heavy = if index + 1 >= config.heavy_sources {
            0
        } else {
            index + 1
        };
        Pick {
            class: CLASS_HEAVY,
            index,
            ipv6: source_is_ipv6(CLASS_HEAVY, index, config.ipv6_share),
        }
    } else if share < config.heavy_share + config.random_share || config.light_sources == 0 {
        if config.random_bits != 0 {
            // `random_bits` random bits: `source_v4` puts them under
            // 10.128.0.0/9's first /(32 - bits).
            let bits = (config.random_bits as u32).min(23);
            Pick {
                class: CLASS_RANDOM,
                index: (r >> 16) as u32 & ((1u32 << bits) - 1),
                ipv6: false,
            }
        } else {
            Pick {
                class: CLASS_RANDOM,
                index: (r >> 16) as u32,
                ipv6: ((r >> 48) as u32) < config.ipv6_share,
            }
        }
    } else {
        let index = state.next_light;
        state.next_light = if index + 1 >= config.light_sources {
            0
        } else {
            index + 1
        };
        Pick {
            class: CLASS_LIGHT,
            index,
            ipv6: source_is_ipv6(CLASS_LIGHT, index, config.ipv6_share),
        }
    };
    let slot = (pick.class as usize).min(CLASSES - 1);
    state.sent[slot] += 1;
    pick
}

/// The IPv4 source of a pick: light 10.1.0.0/16, heavy 10.2.0.0/16,
/// random 10.128.0.0/9 (an index under 65,536, as
/// [`GenConfig::random_bits`] 16 draws: 10.128.0.0/16).
#[inline(always)]
pub fn source_v4(pick: &Pick) -> [u8; 4] {
    let i = pick.index;
    match pick.class {
        CLASS_LIGHT => [10, 1, (i >> 8) as u8, i as u8],
        CLASS_HEAVY => [10, 2, (i >> 8) as u8, i as u8],
        _ => [10, 0x80 | (i >> 16) as u8, (i >> 8) as u8, i as u8],
    }
}

/// The IPv6 source of a pick, one per /64 (the limiter's default IPv6
/// key): 2001:db8:CC.I.II.I::1, class byte then index bytes; random
/// sources fill the /64 with random bits.
#[inline(always)]
pub fn source_v6(pick: &Pick) -> [u8; 16] {
    let i = pick.index;
    let class = match pick.class {
        CLASS_LIGHT => 1,
        CLASS_HEAVY => 2,
        _ => 0x80 | (i >> 24) as u8 & 0x7f,
    };
    [
        0x20,
        0x01,
        0x0d,
        0xb8,
        class,
        (i >> 16) as u8,
        (i >> 8) as u8,
        i as u8,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        1,
    ]
}

/// One's-complement sum of big-endian 16-bit words, not yet folded.
#[inline(always)]
fn sum_words(bytes: &[u8]) -> u32 {
    let mut sum = 0u32;
    let mut i = 0;
    while i + 1 < bytes.len() {
        sum += u16::from_be_bytes([bytes[i], bytes[i + 1]]) as u32;
        i += 2;
    }
    sum
}

#[inline(always)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

#[inline(always)]
fn put16(frame: &mut [u8; FRAME_LEN], at: usize, value: u16) {
    let [hi, lo] = value.to_be_bytes();
    frame[at] = hi;
    frame[at + 1] = lo;
}

/// Writes the whole frame for `pick`: Ethernet, IPv4 or IPv6, UDP with the
/// stamp, zero padding; the IPv4 header checksum and (IPv6, where it is
/// mandatory) the UDP checksum are valid, so the receiver's stack accepts
/// every frame.
#[inline(always)]
pub fn write_frame(frame: &mut [u8; FRAME_LEN], config: &GenConfig, pick: &Pick) {
    frame[0..6].copy_from_slice(&config.dst_mac);
    frame[6..12].copy_from_slice(&config.src_mac);
    if config.tcp_syn != 0 {
        write_ipv4_syn(frame, config, pick);
    } else if pick.ipv6 {
        write_ipv6(frame, config, pick);
    } else {
        write_ipv4(frame, config, pick);
    }
}

/// Offsets of the UDP header after an IPv4 and an IPv6 header.
const L4_V4: usize = 14 + 20;
const L4_V6: usize = 14 + 40;

fn write_ipv4(frame: &mut [u8; FRAME_LEN], config: &GenConfig, pick: &Pick) {
    put16(frame, 12, 0x0800);
    frame[14] = 0x45;
    frame[15] = 0;
    put16(frame, 16, (FRAME_LEN - 14) as u16);
    put16(frame, 18, 0); // id
    put16(frame, 20, 0x4000); // don't fragment
    frame[22] = 64; // ttl
    frame[23] = 17; // UDP
    put16(frame, 24, 0);
    frame[26..30].copy_from_slice(&source_v4(pick));
    frame[30..34].copy_from_slice(&config.dst_v4);
    let csum = fold(sum_words(&frame[14..34]));
    put16(frame, 24, csum);
    // The UDP checksum stays 0: optional over IPv4, and not computed.
    write_udp::<L4_V4>(frame, config, pick);
}

fn write_ipv6(frame: &mut [u8; FRAME_LEN], config: &GenConfig, pick: &Pick) {
    let udp_len = (FRAME_LEN - L4_V6) as u16;
    put16(frame, 12, 0x86dd);
    // Version 6, no traffic class or flow label.
    frame[14..18].copy_from_slice(&[0x60, 0, 0, 0]);
    put16(frame, 18, udp_len);
    frame[20] = 17; // next header: UDP
    frame[21] = 64; // hop limit
    frame[22..38].copy_from_slice(&source_v6(pick));
    frame[38..54].copy_from_slice(&config.dst_v6);
    write_udp::<L4_V6>(frame, config, pick);
    // Mandatory over IPv6: pseudo-header (addresses, length, next header)
    // plus the datagram (its checksum field still 0, the padding 0).
    let sum = sum_words(&frame[22..54])
        + udp_len as u32
        + 17
        + sum_words(&frame[L4_V6..L4_V6 + 8 + STAMP_LEN]);
    let csum = match fold(sum) {
        0 => 0xffff,
        c => c,
    };
    put16(frame, L4_V6 + 6, csum);
}

/// Length of the SYN's IPv4 datagram: a 20-byte IPv4 header and a 20-byte
/// TCP header without options. The rest of the frame is Ethernet padding,
/// which the receiver's stack trims by the IPv4 total length.
const SYN_IP_LEN: usize = 40;

/// An IPv4 TCP SYN from the pick's address (its IPv4 form, even for an
/// IPv6 pick) to `dst_v4:dst_port`, with a source port and sequence number
/// from the pick's bits and valid IPv4 and TCP checksums, so the server's
/// stack takes it to the listening socket as a connection attempt.
fn write_ipv4_syn(frame: &mut [u8; FRAME_LEN], config: &GenConfig, pick: &Pick) {
    put16(frame, 12, 0x0800);
    frame[14] = 0x45;
    frame[15] = 0;
    put16(frame, 16, SYN_IP_LEN as u16);
    put16(frame, 18, 0); // id
    put16(frame, 20, 0x4000); // don't fragment
    frame[22] = 64; // ttl
    frame[23] = 6; // TCP
    put16(frame, 24, 0);
    frame[26..30].copy_from_slice(&source_v4(pick));
    frame[30..34].copy_from_slice(&config.dst_v4);
    let csum = fold(sum_words(&frame[14..34]));
    put16(frame, 24, csum);
    let i = pick.index;
    // Ephemeral-looking source ports (1024 and up) and a sequence number
    // that differ from frame to frame, as a flooding tool's do.
    put16(
        frame,
        L4_V4,
        1024 | ((i as u16 & 0x7fff) ^ (i >> 17) as u16),
    );
    put16(frame, L4_V4 + 2, config.dst_port);
    let seq = i.wrapping_mul(0x9e37_79b9);
    frame[L4_V4 + 4..L4_V4 + 8].copy_from_slice(&seq.to_be_bytes());
    frame[L4_V4 + 8..L4_V4 + 12].fill(0); // ack
    frame[L4_V4 + 12] = 5 << 4; // data offset: 5 words, no options
    frame[L4_V4 + 13] = 0x02; // SYN
    put16(frame, L4_V4 + 14, 64_240); // window
    put16(frame, L4_V4 + 16, 0); // checksum, below
    put16(frame, L4_V4 + 18, 0); // urgent pointer
    frame[14 + SYN_IP_LEN..].fill(0);
    // Pseudo-header (addresses, protocol, TCP length) plus the header.
    let tcp_len = (SYN_IP_LEN - 20) as u32;
    let sum = sum_words(&frame[26..34]) + 6 + tcp_len + sum_words(&frame[L4_V4..L4_V4 + 20]);
    put16(frame, L4_V4 + 16, fold(sum));
}

/// The UDP header at `L4`, the stamp, and zero padding to the frame end.
#[inline(always)]
fn write_udp<const L4: usize>(frame: &mut [u8; FRAME_LEN], config: &GenConfig, pick: &Pick) {
    put16(frame, L4, config.src_port);
    put16(frame, L4 + 2, config.dst_port);
    put16(frame, L4 + 4, (FRAME_LEN - L4) as u16);
    put16(frame, L4 + 6, 0);
    let stamp = &mut frame[L4 + 8..L4 + 8 + STAMP_LEN];
    stamp[0..4].copy_from_slice(&STAMP_MAGIC.to_be_bytes());
    stamp[4..8].copy_from_slice(&[pick.class, 0, 0, 0]);
    stamp[8..12].copy_from_slice(&pick.index.to_be_bytes());
    frame[L4 + 8 + STAMP_LEN..].fill(0);
}

/// Reads the stamp of a datagram payload: the sink slot it counts in.
#[inline(always)]
pub fn sink_slot(stamp: &[u8; STAMP_LEN]) -> u32 {
    let magic = u32::from_be_bytes([stamp[0], stamp[1], stamp[2], stamp[3]]);
    if magic != STAMP_MAGIC {
        return SINK_UNKNOWN;
    }
    let index = u32::from_be_bytes([stamp[8], stamp[9], stamp[10], stamp[11]]);
    match stamp[4] {
        CLASS_LIGHT => SINK_LIGHT,
        CLASS_RANDOM => SINK_RANDOM,
        CLASS_HEAVY if index < MAX_HEAVY => SINK_HEAVY_BASE + index,
        _ => SINK_UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> GenConfig {
        GenConfig {
            light_sources: 100,
            heavy_sources: 4,
            heavy_share: SHARE_ONE / 2,
            random_share: SHARE_ONE / 4,
            ipv6_share: SHARE_ONE / 4,
            ..GenConfig::default()
        }
    }

    #[test]
    fn no_implicit_padding() {
        assert_eq!(
            core::mem::size_of::<GenConfig>(),
            8 + 5 * 4 + 2 * 2 + 4 + 16 + 12 + 8
        );
        assert_eq!(
            core::mem::size_of::<GenState>(),
            8 + 8 + 8 + 8 * CLASSES + 8
        );
    }

    #[test]
    fn shares_and_round_robin_hold() {
        let config = config();
        let mut state = GenState::default();
        let mut heavy = [0u32; 4];
        for _ in 0..65_536 {
            let pick = pick(&config, &mut state);
            if pick.class == CLASS_HEAVY {
                heavy[pick.index as usize] += 1;
            }
        }
        let [light, heavy_total, random] = state.sent;
        assert_eq!(light + heavy_total + random, 65_536);
        // Within 2% of the configured shares.
        assert!(
            (heavy_total as i64 - 32_768).abs() < 1_311,
            "{:?}",
            state.sent
        );
        assert!((random as i64 - 16_384).abs() < 1_311, "{:?}", state.sent);
        let (min, max) = (heavy.iter().min().unwrap(), heavy.iter().max().unwrap());
        assert!(max - min <= 1, "round robin: {heavy:?}");
    }

    #[test]
    fn pacing_keeps_the_interval_and_forgets_stalls() {
        let config = GenConfig {
            interval_ns: 1_000,
            ..GenConfig::default()
        };
        let mut state = GenState::default();
        let sent = (0..100_000u64)
            .filter(|t| pace(&config, &mut state, 1_000_000 + t * 100))
            .count();
        // 10 ms at one frame per µs.
        assert!((9_999..=10_001).contains(&sent), "{sent}");
        assert_eq!(state.stalled_ns, 0, "no stall yet");
        // After a 1 s stall, no burst: one frame, then the interval again;
        // the stall is on record.
        let later = 2_000_000_000;
        let due = state.next_due_ns;
        assert!(pace(&config, &mut state, later));
        assert_eq!(state.stalled_ns, later - due);
        assert!(!pace(&config, &mut state, later + 10));
        assert!(pace(&config, &mut state, later + 1_000));
        let unpaced = GenConfig::default();
        assert!(pace(&unpaced, &mut state, 0));
    }

    #[test]
    fn stamp_round_trips_into_sink_slots() {
        let config = config();
        for pick in [
            Pick {
                class: CLASS_HEAVY,
                index: 3,
                ipv6: true,
            },
            Pick {
                class: CLASS_LIGHT,
                index: 77,
                ipv6: false,
            },
        ] {
            let mut frame = [0xaa; FRAME_LEN];
            write_frame(&mut frame, &config, &pick);
            let at = if pick.ipv6 { L4_V6 + 8 } else { L4_V4 + 8 };
            let stamp: [u8; STAMP_LEN] = frame[at..at + STAMP_LEN].try_into().unwrap();
            let expected = match pick.class {
                CLASS_HEAVY => SINK_HEAVY_BASE + 3,
                _ => SINK_LIGHT,
            };
            assert_eq!(sink_slot(&stamp), expected);
        }
        assert_eq!(sink_slot(&[0; STAMP_LEN]), SINK_UNKNOWN);
    }

    /// The one's-complement sum of a correct checksum's range, folded,
    /// is zero.
    fn verifies(sum: u32) -> bool {
        fold(sum) == 0
    }

    #[test]
    fn syn_frames_are_valid_ipv4_tcp_syns_from_random_sources() {
        let config = GenConfig {
            tcp_syn: 1,
            dst_port: 80,
            dst_v4: [198, 18, 0, 1],
            ipv6_share: SHARE_ONE,
            ..GenConfig::default()
        };
        let mut state = GenState::default();
        let mut sources = [[0u8; 4]; 64];
        for source in sources.iter_mut() {
            let pick = pick(&config, &mut state);
            assert_eq!(pick.class, CLASS_RANDOM, "no light or heavy sources");
            let mut frame = [0xaa; FRAME_LEN];
            write_frame(&mut frame, &config, &pick);
            assert_eq!(&frame[12..14], &[0x08, 0x00], "IPv4 even for an IPv6 pick");
            assert_eq!(frame[23], 6);
            assert_eq!(u16::from_be_bytes([frame[16], frame[17]]), 40);
            assert!(verifies(sum_words(&frame[14..34])), "IPv4 header checksum");
            let tcp_sum = sum_words(&frame[26..34]) + 6 + 20 + sum_words(&frame[34..54]);
            assert!(verifies(tcp_sum), "TCP checksum");
            assert_eq!(u16::from_be_bytes([frame[36], frame[37]]), 80);
            assert_eq!(frame[47], 0x02, "SYN only");
            assert!(u16::from_be_bytes([frame[34], frame[35]]) >= 1024);
            assert!(frame[54..].iter().all(|&b| b == 0), "zero padding");
            source.copy_from_slice(&frame[26..30]);
            assert_eq!(source[0], 10);
            assert!(source[1] >= 0x80, "random sources are 10.128.0.0/9");
        }
        sources.sort();
        let distinct = 1 + sources.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(distinct >= 60, "{distinct} distinct sources of 64");
    }

    #[test]
    fn prefix16_random_sources_are_ipv4_from_one_slash16() {
        let config = GenConfig {
            random_bits: 16,
            ..config()
        };
        let mut state = GenState::default();
        let mut seen = [false; 1 << 16];
        let mut random = 0;
        for _ in 0..65_536 {
            let pick = pick(&config, &mut state);
            let mut frame = [0xaa; FRAME_LEN];
            write_frame(&mut frame, &config, &pick);
            let v4 = frame[12..14] == [0x08, 0x00];
            let source = &frame[26..30];
            match pick.class {
                CLASS_RANDOM => {
                    random += 1;
                    assert!(v4 && !pick.ipv6, "random sources are IPv4 only");
                    assert_eq!(source[..2], RANDOM_PREFIX16, "{source:?}");
                    seen[u16::from_be_bytes([source[2], source[3]]) as usize] = true;
                }
                // Light and heavy sources keep their prefixes (and their
                // IPv6 share), outside the flooded /16.
                _ if v4 => assert_ne!(source[..2], RANDOM_PREFIX16),
                _ => {}
            }
        }
        assert!(random > 15_000, "{random} random frames");
        let distinct = seen.iter().filter(|&&s| s).count();
        // About 1 - 1/e of the /16 for as many draws as it has addresses,
        // here a quarter as many draws.
        assert!(distinct > 12_000, "{distinct} distinct sources");
    }

    #[test]
    fn random_bits_18_draw_ipv4_sources_from_one_slash14() {
        let config = GenConfig {
            random_bits: 18,
            heavy_share: 0,
            random_share: SHARE_ONE,
            ..config()
        };
        let mut state = GenState::default();
        let mut seen = [0u64; (1 << 18) / 64];
        for _ in 0..100_000 {
            let pick = pick(&config, &mut state);
            assert_eq!(pick.class, CLASS_RANDOM);
            assert!(!pick.ipv6, "random sources are IPv4 only");
            let source = source_v4(&pick);
            assert_eq!(source[0], 10);
            assert!(
                (0x80..0x84).contains(&source[1]),
                "{source:?} outside 10.128.0.0/14"
            );
            let i = u32::from_be_bytes(source) as usize & ((1 << 18) - 1);
            seen[i / 64] |= 1 << (i % 64);
        }
        // 100,000 draws of 262,144 addresses: about 262,144 x (1 - e^-0.38)
        // = 84,600 distinct.
        let distinct: u32 = seen.iter().map(|w| w.count_ones()).sum();
        assert!(distinct > 80_000, "{distinct} distinct sources");
    }
}
