//! The benchmark's kernel programs driven from userspace: the live-frames
//! generator on the sending veth, the counting sink on the receiving socket
//! and the drop-everything floor (`bench/ebpf/src/bin/bench_traffic.rs`).

use std::{
    net::UdpSocket,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, Map, MapData, PerCpuArray, PerCpuValues},
    programs::{
        xdp::{XdpLinkId, XdpMode},
        SocketFilter, TestRun, TestRunAttrs, TestRunOptions, Xdp,
    },
    Ebpf, EbpfLoader,
};
use limiter_bench_common::traffic::{
    names, GenConfig, GenState, CLASSES, FRAME_LEN, MAX_HEAVY, MAX_LIGHT, SHARE_ONE,
    SINK_HEAVY_BASE, SINK_LIGHT, SINK_RANDOM, SINK_SLOTS, SINK_UNKNOWN,
};
use limiter_bench_objects::BENCH_TRAFFIC_OBJECT;

use super::{
    lab::{self, Lab, RX_V4, RX_V6, SINK_PORT},
    scenario::TABLE_SIZE,
};

/// What the generator sends.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    /// Light sources: many, each far under the limit.
    pub light_sources: u32,
    /// Heavy sources: few, each far over the limit.
    pub heavy_sources: u32,
    /// Shares of frames (0..1) from heavy and from random sources; light
    /// sources send the rest.
    pub heavy_share: f64,
    pub random_share: f64,
    /// Share of sources (0..1) that are IPv6.
    pub ipv6_share: f64,
    /// Nonzero: the random sources are IPv4 only and drawn from the
    /// first `2^random_bits` addresses of 10.128.0.0/9 (`PREFIX16_BITS`:
    /// one /16, `limiter_bench_common::traffic::RANDOM_PREFIX16`), not
    /// spread over the /9 and IPv6 (`GenConfig::random_bits`).
    pub random_bits: u8,
}

impl Mix {
    /// Every frame from a random source, drawn as `random_bits` says.
    pub const fn random_only(random_bits: u8) -> Self {
        Self {
            light_sources: 0,
            heavy_sources: 0,
            heavy_share: 0.0,
            random_share: 1.0,
            ipv6_share: 0.0,
            random_bits,
        }
    }
}

/// Offered load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    /// Frames per second, paced.
    Fixed(u64),
    /// As fast as the generator's CPU goes.
    Unpaced,
}

/// Each BPF_PROG_TEST_RUN call sets up and tears down a page pool, which
/// takes 15-30 ms here (mostly waiting), so a call runs the program many
/// times: about this long, adapting the repeat count to the measured
/// speed. It is also how soon `stop` is noticed.
const CALL_TARGET: Duration = Duration::from_millis(100);
/// Generator threads on the generator's CPU: while one waits in a call's
/// set-up or tear-down the other sends, so the traffic has no gaps. The
/// pacing state is per CPU and a batch runs with bottom halves off, so
/// the two share one schedule.
pub const GENERATOR_THREADS: usize = 2;
/// Frames per live-frames batch (one transmit flush each): well under the
/// veth ring (256).
const BATCH: u32 = 64;

/// A share (0..1) in the generator's 1/65536 units.
pub fn share(value: f64) -> u32 {
    assert!((0.0..=1.0).contains(&value), "share {value} outside 0..1");
    (value * SHARE_ONE as f64).round() as u32
}

/// The loaded benchmark object: generator, sink (attached to the lab's
/// socket) and the drop-all program.
pub struct Programs {
    ebpf: Ebpf,
    /// Kept open: the sink filter lives on it.
    _sink_socket: UdpSocket,
    /// The XDP program attached to the receiving veth, if any.
    attached: Option<(&'static str, XdpLinkId)>,
}

/// Frames counted at the sink (all CPUs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SinkCounts {
    pub light: u64,
    pub random: u64,
    /// Datagrams without a valid stamp (should stay 0).
    pub unknown: u64,
    pub heavy: Vec<u64>,
}

impl SinkCounts {
    pub fn total(&self) -> u64 {
        self.light + self.random + self.unknown + self.heavy.iter().sum::<u64>()
    }

    /// `self - earlier`, slot by slot.
    pub fn since(&self, earlier: &SinkCounts) -> SinkCounts {
        SinkCounts {
            light: self.light - earlier.light,
            random: self.random - earlier.random,
            unknown: self.unknown - earlier.unknown,
            heavy: self
                .heavy
                .iter()
                .zip(&earlier.heavy)
                .map(|(now, then)| now - then)
                .collect(),
        }
    }
}

impl Programs {
    /// Loads (verifies) the three programs, attaches the sink to a new
    /// socket in `rx` and configures the generator for `mix`.
    pub fn load(lab: &Lab, mix: &Mix) -> Self {
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(names::COUNT_SOURCES, TABLE_SIZE)
            .load(BENCH_TRAFFIC_OBJECT)
            .expect("load the bench object");
        for name in [
            names::GENERATOR,
            names::DROP_ALL,
            names::PASS,
            names::COUNT_DROP,
        ] {
            let program: &mut Xdp = ebpf
                .program_mut(name)
                .unwrap_or_else(|| panic!("{name} missing"))
                .try_into()
                .expect("an XDP program");
            program
                .load()
                .unwrap_or_else(|e| panic!("verifier refused {name}: {e:?}"));
        }
        let socket = lab.sink_socket();
        let sink: &mut SocketFilter = ebpf
            .program_mut(names::SINK_PROGRAM)
            .expect("sink missing")
            .try_into()
            .expect("a socket filter");
        sink.load().expect("verifier refused the sink");
        sink.attach(&socket).expect("attach the sink filter");
        let mut programs = Self {
            ebpf,
            _sink_socket: socket,
            attached: None,
        };
        programs.set_mix(lab, mix);
        programs
    }

    /// Sets the offered load of the next [`generate`](Self::generate).
    pub fn set_rate(&mut self, rate: Rate) {
        let mut config = self.config();
        config.interval_ns = match rate {
            Rate::Fixed(pps) => 1_000_000_000 / pps.max(1),
            Rate::Unpaced => 0,
        };
        self.write_config(config);
    }

    fn config(&self) -> GenConfig {
        let map: Array<&MapData, GenConfig> = self
            .ebpf
            .map(names::GEN_CONFIG)
            .expect("GEN_CONFIG")
            .try_into()
            .expect("array");
        map.get(&0, 0).expect("read GEN_CONFIG")
    }

    fn write_config(&mut self, config: GenConfig) {
        let mut map: Array<&mut MapData, GenConfig> = self
            .ebpf
            .map_mut(names::GEN_CONFIG)
            .expect("GEN_CONFIG")
            .try_into()
            .expect("array");
        map.set(0, config, 0).expect("write GEN_CONFIG");
    }

    /// Sets what the generator sends (the rate stays).
    pub fn set_mix(&mut self, lab: &Lab, mix: &Mix) {
        assert!(mix.light_sources <= MAX_LIGHT && mix.heavy_sources <= MAX_HEAVY);
        assert!(mix.heavy_share + mix.random_share <= 1.0);
        let config = GenConfig {
            interval_ns: self.config().interval_ns,
            light_sources: mix.light_sources,
            heavy_sources: mix.heavy_sources,
            heavy_share: share(mix.heavy_share),
            random_share: share(mix.random_share),
            ipv6_share: share(mix.ipv6_share),
            src_port: 40_000,
            dst_port: SINK_PORT,
            dst_v4: RX_V4.octets(),
            dst_v6: RX_V6.octets(),
            src_mac: lab.tx_mac,
            dst_mac: lab.rx_mac,
            tcp_syn: 0,
            random_bits: mix.random_bits,
            reserved: [0; 6],
        };
        self.write_config(config);
    }

    /// Makes the generator send a spoofed SYN flood instead: every frame
    /// an IPv4 TCP SYN from a random address in 10.128.0.0/9 (drawn as
    /// `random_bits` says: [`Mix::random_bits`]) to [`RX_V4`]`:port` (the
    /// rate stays).
    pub fn set_syn_flood(&mut self, lab: &Lab, port: u16, random_bits: u8) {
        self.set_mix(lab, &Mix::random_only(random_bits));
        let mut config = self.config();
        config.dst_port = port;
        config.tcp_syn = 1;
        self.write_config(config);
    }

    /// Attaches one of the object's XDP floors (`names::DROP_ALL`,
    /// `names::PASS`, `names::COUNT_DROP`) to the receiving veth, native
    /// mode.
    pub fn attach_floor(&mut self, lab: &Lab, name: &'static str) {
        assert!(self.attached.is_none(), "one XDP program per lab");
        let program: &mut Xdp = self
            .ebpf
            .program_mut(name)
            .expect("present")
            .try_into()
            .expect("XDP");
        let link = lab
            .rx
            .enter(|| program.attach(lab::RX_IF, XdpMode::Driver))
            .unwrap_or_else(|e| panic!("attach {name}: {e}"));
        self.attached = Some((name, link));
    }

    /// Frames handed to XDP_TX so far, per class (light, heavy, random),
    /// and the time the pacing forgot to stalls (ns).
    pub fn sent(&self) -> ([u64; CLASSES], u64) {
        let map: PerCpuArray<&MapData, GenState> = self
            .ebpf
            .map(names::GEN_STATE)
            .expect("GEN_STATE")
            .try_into()
            .expect("per-CPU array");
        let values: PerCpuValues<GenState> = map.get(&0, 0).expect("read GEN_STATE");
        let mut sent = [0; CLASSES];
        let mut stalled_ns = 0;
        for state in values.iter() {
            for (total, class) in sent.iter_mut().zip(state.sent) {
                *total += class;
            }
            stalled_ns += state.stalled_ns;
        }
        (sent, stalled_ns)
    }

    /// What the sink has counted so far.
    pub fn sink(&self, heavy_sources: u32) -> SinkCounts {
        let map: PerCpuArray<&MapData, u64> = self
            .ebpf
            .map(names::SINK)
            .expect("SINK")
            .try_into()
            .expect("per-CPU array");
        let slot = |index: u32| -> u64 {
            assert!(index < SINK_SLOTS);
            map.get(&index, 0).expect("read SINK").iter().sum()
        };
        SinkCounts {
            light: slot(SINK_LIGHT),
            random: slot(SINK_RANDOM),
            unknown: slot(SINK_UNKNOWN),
            heavy: (0..heavy_sources)
                .map(|i| slot(SINK_HEAVY_BASE + i))
                .collect(),
        }
    }

    /// Sends at the [`set_rate`](Self::set_rate) load until `stop` is set,
    /// from [`GENERATOR_THREADS`] threads that enter `tx` and share
    /// [`lab::GEN_CPU`].
    pub fn generate(&self, lab: &Lab, stop: &AtomicBool) {
        self.generate_at(lab, stop, Priority::Normal);
    }

    /// [`generate`](Self::generate) with the sending threads at `priority`.
    pub fn generate_at(&self, lab: &Lab, stop: &AtomicBool, priority: Priority) {
        std::thread::scope(|scope| {
            for _ in 0..GENERATOR_THREADS {
                scope.spawn(|| self.generate_one(lab, stop, priority));
            }
        });
    }

    /// A second handle on the generator's configuration, for changing the
    /// destination port while [`generate`](Self::generate) runs (which
    /// holds `self` borrowed).
    pub fn port_switch(&self) -> PortSwitch {
        let Some(Map::Array(data)) = self.ebpf.map(names::GEN_CONFIG) else {
            panic!("GEN_CONFIG is not an array");
        };
        let id = data.info().expect("GEN_CONFIG info").id();
        let data = MapData::from_id(id).expect("open GEN_CONFIG again");
        PortSwitch {
            map: Array::try_from(Map::Array(data)).expect("array"),
        }
    }

    fn generate_one(&self, lab: &Lab, stop: &AtomicBool, priority: Priority) {
        let path = format!("/run/netns/{}", lab.tx.name());
        let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("enter tx");
        lab::pin(0, lab::GEN_CPU);
        if priority == Priority::Lowest {
            lowest_priority();
        }
        let program: &Xdp = self
            .ebpf
            .program(names::GENERATOR)
            .expect("present")
            .try_into()
            .expect("XDP");
        // The template is rewritten whole by the program on every run.
        let frame = [0u8; FRAME_LEN];
        let ctx = xdp_md(lab.tx_ifindex);
        let mut repeat: u32 = 1 << 16;
        while !stop.load(Ordering::Relaxed) {
            let mut opts = TestRunOptions::new();
            opts.data_in = Some(&frame);
            opts.ctx_in = Some(&ctx);
            opts.repeat = repeat;
            opts.attrs = TestRunAttrs::new().xdp_live_frames(BATCH);
            let started = Instant::now();
            program
                .test_run(opts)
                .unwrap_or_else(|e| panic!("live-frames run: {e:?}"));
            let took = started.elapsed().as_secs_f64().max(1e-6);
            let next = repeat as f64 * CALL_TARGET.as_secs_f64() / took;
            repeat = next.clamp(4_096.0, 64_000_000.0) as u32;
        }
    }
}

impl Drop for Programs {
    fn drop(&mut self) {
        // The namespace going takes the link with it; detaching first just
        // keeps the order tidy when the lab outlives the programs.
        if let Some((name, link)) = self.attached.take() {
            if let Some(program) = self.ebpf.program_mut(name) {
                let program: Result<&mut Xdp, _> = program.try_into();
                if let Ok(program) = program {
                    let _ = program.detach(link);
                }
            }
        }
    }
}

/// Scheduling priority of the generator's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// As any other task: the benchmark's measurements.
    Normal,
    /// Nice 19. A paced generator spins between due frames and so takes
    /// its whole CPU whatever the rate; a long run on a shared machine
    /// lets every other task go first (stalls are on record, see
    /// [`Programs::sent`]).
    Lowest,
}

/// Sets the calling thread's nice value to 19.
fn lowest_priority() {
    let tid = nix::unistd::gettid().as_raw();
    // SAFETY: setpriority(2) takes plain integers and touches no memory of
    // ours; on Linux PRIO_PROCESS with a thread id applies to that thread.
    let rc = unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid as nix::libc::id_t, 19) };
    assert_eq!(rc, 0, "setpriority: {}", std::io::Error::last_os_error());
}

/// Changes the generator's destination port while it runs (see
/// [`Programs::port_switch`]).
pub struct PortSwitch {
    map: Array<MapData, GenConfig>,
}

impl PortSwitch {
    /// Frames from now on go to UDP `port` (the sink counts only those
    /// to [`SINK_PORT`]). The generator reads its configuration frame by
    /// frame; only this field changes, so a frame sees the old port or
    /// the new one.
    pub fn set(&mut self, port: u16) {
        let mut config = self.map.get(&0, 0).expect("read GEN_CONFIG");
        config.dst_port = port;
        self.map.set(0, config, 0).expect("write GEN_CONFIG");
    }
}

/// `struct xdp_md` for the test run: the frame is `[0, FRAME_LEN)` and
/// arrives on `ifindex`, which XDP_TX then transmits on.
fn xdp_md(ifindex: u32) -> [u8; 24] {
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(FRAME_LEN as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
    ctx
}
