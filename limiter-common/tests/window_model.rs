//! Property tests of the sliding-window arithmetic against an exact model:
//! the list of admitted timestamps. Arrival patterns: steady, bursty,
//! flooding, and adversarial bursts placed at bucket edges.
//!
//! The properties run from a fixed seed, so the suite decides the same on
//! every run (`PROPTEST_RNG_SEED` and `PROPTEST_CASES` explore others); a
//! case a random seed once found is kept below as its own test.

use std::collections::{BTreeMap, VecDeque};

use limiter_common::window::{
    bytes_in, count_leased, estimate, give_back_packet, position, slot_of, try_admit,
    try_admit_cached, Admission, AtomicRing, SlotRead, WindowCache, WindowParams, BYTES, PACKETS,
    UNLIMITED, WEIGHT_ONE,
};
use proptest::{prelude::*, test_runner::RngSeed};

const SECOND: u64 = 1_000_000_000;

/// The fixed seed of every property below (see the module comment).
const SEED: u64 = 0x5eed_0f0b;

/// `cases` cases from the fixed seed, unless the environment asks for
/// other ones; no regression files (the seed replays a failure).
fn config(cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(SEED);
    }
    config
}

/// Which admission path the model drives.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// `try_admit`: the reference, reading every slot per frame.
    Direct,
    /// `try_admit_cached` with a per-CPU cache and refusal hold, as the
    /// kernel does it.
    Cached,
    /// As `Cached`, with leases of allowance (as the kernel does for rules
    /// without a byte limit), sized as userspace sizes them for 2 CPUs.
    Leased,
}

/// The limiter under test next to an exact log of what it admitted.
struct Model {
    path: Path,
    cache: WindowCache,
    hold_until_ns: u64,
    lease: u64,
    lease_left: u64,
    /// Frames admitted from the lease, not yet counted in the window.
    lease_owed: u64,
    ring: AtomicRing,
    params: WindowParams,
    window_ns: u64,
    /// Admitted (time, len), oldest first, trimmed to the last window.
    log: VecDeque<(u64, u64)>,
    /// Sum of the lengths in `log`.
    log_bytes: u64,
    /// Admitted packets and bytes per bucket index.
    per_bucket: BTreeMap<u64, (u64, u64)>,
    admitted: u64,
}

impl Model {
    fn new(path: Path, window_ns: u64, buckets: u32, packets: u64, bytes: u64) -> Self {
        let bucket_ns = window_ns / u64::from(buckets);
        Self {
            path,
            cache: WindowCache::default(),
            hold_until_ns: 0,
            lease: match path {
                Path::Leased if bytes == UNLIMITED => {
                    (packets / (2 * (u64::from(buckets) + 1) * 128)).max(1)
                }
                _ => 1,
            },
            lease_left: 0,
            lease_owed: 0,
            ring: Default::default(),
            params: WindowParams {
                bucket_ns,
                buckets,
                allowance_packets: packets,
                allowance_bytes: bytes,
            },
            // The window the limiter measures: K whole buckets (up to K-1
            // ns shorter than asked when W is not a multiple of K).
            window_ns: bucket_ns * u64::from(buckets),
            log: VecDeque::new(),
            log_bytes: 0,
            per_bucket: BTreeMap::new(),
            admitted: 0,
        }
    }

    /// Offers a frame; checks the bound after it; returns the verdict.
    fn offer(&mut self, t: u64, len: u64) -> bool {
        let admitted = match self.path {
            Path::Direct => try_admit(&self.ring, &self.params, t, len),
            Path::Cached | Path::Leased => self.offer_cached(t, len),
        };
        if admitted {
            self.log.push_back((t, len));
            self.log_bytes += len;
            let bucket = t / self.params.bucket_ns;
            let entry = self.per_bucket.entry(bucket).or_default();
            entry.0 += 1;
            entry.1 += len;
            self.admitted += 1;
        }
        while let Some((_, len)) = self.log.front().filter(|(ts, _)| *ts + self.window_ns <= t) {
            self.log_bytes -= len;
            self.log.pop_front();
        }
        self.check_bound(t);
        admitted
    }

    /// The kernel's path: hold, cache refresh, cached admission.
    fn offer_cached(&mut self, t: u64, len: u64) -> bool {
        if t < self.hold_until_ns {
            return false;
        }
        if self.lease_left > 0 && self.cache.covers(t, self.params.bucket_ns) {
            self.lease_left -= 1;
            self.lease_owed += 1;
            return true;
        }
        // The kernel's next look at the window counts what the lease
        // admitted, in the bucket it was admitted in.
        if self.lease_owed > 0 {
            count_leased(&self.ring, self.cache.bucket, self.lease_owed);
            self.lease_owed = 0;
        }
        if !self.cache.covers(t, self.params.bucket_ns) {
            self.cache = WindowCache::refresh(&self.ring, &self.params, t);
            self.lease_left = 0;
        }
        match try_admit_cached(&self.ring, &self.cache, &self.params, t, len, self.lease) {
            Admission::Admitted { granted, .. } => {
                self.lease_left = granted - 1;
                true
            }
            Admission::Refused { hold_until_ns } => {
                self.hold_until_ns = hold_until_ns;
                false
            }
        }
    }

    /// Exact packets and bytes admitted in `(t - W, t]`.
    fn exact(&self) -> (u64, u64) {
        (self.log.len() as u64, self.log_bytes)
    }

    /// What was admitted in the bucket that is the oldest at `t`.
    fn oldest_bucket(&self, t: u64) -> (u64, u64) {
        let bucket = t / self.params.bucket_ns;
        let oldest = bucket.wrapping_sub(u64::from(self.params.buckets));
        self.per_bucket.get(&oldest).copied().unwrap_or_default()
    }

    /// The documented bound: true count <= allowance + c[i-K], and the
    /// estimate is off from the truth by at most c[i-K].
    fn check_bound(&self, t: u64) {
        let (packets, bytes) = self.exact();
        let (oldest_packets, oldest_bytes) = self.oldest_bucket(t);
        if self.params.allowance_packets != UNLIMITED {
            assert!(
                packets <= self.params.allowance_packets + oldest_packets,
                "t={t}: {packets} packets in window > allowance {} + oldest bucket {oldest_packets}",
                self.params.allowance_packets
            );
        }
        if self.params.allowance_bytes != UNLIMITED {
            assert!(
                bytes <= self.params.allowance_bytes + oldest_bytes,
                "t={t}: {bytes} bytes in window > allowance {} + oldest bucket {oldest_bytes}",
                self.params.allowance_bytes
            );
        }
        let at = position(t, self.params.bucket_ns);
        let current =
            self.ring[slot_of(at.bucket)][PACKETS].load(std::sync::atomic::Ordering::Relaxed);
        let est = estimate(&self.ring, at, self.params.buckets, current).packets;
        let exact_fp = packets * WEIGHT_ONE;
        // Leased frames are counted after they are used: one lease's may
        // be outstanding.
        let leased = self.lease - 1;
        let slack = (oldest_packets + 1 + leased) * WEIGHT_ONE;
        assert!(
            est.abs_diff(exact_fp) <= slack,
            "t={t}: estimate {} vs exact {packets} beyond oldest bucket {oldest_packets}",
            est as f64 / WEIGHT_ONE as f64
        );
    }
}

/// A tiny deterministic generator for jitter inside one property case.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound.max(1)
    }
}

/// Caps a rate so a case offers at most `max_events` frames over
/// `windows` windows (long windows otherwise make cases slow), keeping at
/// least 100 frames per window so 1% stays meaningful.
fn capped_rate(pps: u64, window_ns: u64, windows: u64, max_events: u64) -> u64 {
    let seconds = (window_ns / SECOND).max(1);
    pps.min(max_events / (windows * seconds))
        .max(100 / seconds + 1)
}

fn path() -> impl Strategy<Value = Path> {
    prop_oneof![Just(Path::Direct), Just(Path::Cached), Just(Path::Leased)]
}

fn window_ns() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(SECOND),
        Just(2 * SECOND),
        Just(10 * SECOND),
        Just(60 * SECOND)
    ]
}

proptest! {
    #![proptest_config(config(48))]

    /// A sender paced at no more than 95% of the rate (it may fall behind,
    /// never catch up in a burst) is never refused.
    #[test]
    fn steady_sender_under_its_rate_is_never_refused(
        path in path(),
        window in window_ns(),
        buckets in 1u32..=15,
        pps in 20u64..2_000,
        share in 50u64..=95,
        start in 0u64..10 * SECOND,
        seed in any::<u64>(),
    ) {
        let pps = capped_rate(pps, window, 3, 60_000);
        let allowance = pps * window / SECOND;
        let mut model = Model::new(path, window, buckets, allowance, UNLIMITED);
        let interval = SECOND * 100 / (pps * share);
        let mut rng = Lcg(seed);
        let mut t = start;
        let end = start + 3 * window;
        while t < end {
            prop_assert!(model.offer(t, 100), "refused at t={} (interval {interval})", t - start);
            // Jitter only delays: at most 95% of the rate in any interval.
            t += interval + rng.next(interval / 4 + 1);
        }
    }

    /// A flood far over the rate is admitted at its allowance per window,
    /// within 1%: the first window's allowance at once, then the same again
    /// in every following window (counted in windows aligned to the start
    /// of the flood, where the sliding window releases it). This accuracy
    /// is claimed for 8 or more buckets per window (the default is 10);
    /// coarser buckets keep only the bound checked by the other properties.
    #[test]
    fn flood_is_admitted_at_its_allowance_per_window(
        path in path(),
        window in window_ns(),
        buckets in 8u32..=15,
        pps in 100u64..1_000,
        factor in 5u64..=20,
        start in 0u64..10 * SECOND,
        seed in any::<u64>(),
    ) {
        let pps = capped_rate(pps * factor, window, 4, 200_000) / factor;
        let allowance = pps * window / SECOND;
        let mut model = Model::new(path, window, buckets, allowance, UNLIMITED);
        let window = model.window_ns;
        let interval = SECOND / (pps * factor);
        let mut rng = Lcg(seed);
        let mut t = start;
        let mut per_window = [0u64; 4];
        while t < start + 4 * window {
            if model.offer(t, 64) {
                per_window[((t - start) / window) as usize] += 1;
            }
            t += interval / 2 + rng.next(interval);
        }
        let tolerance = allowance / 100 + 1;
        for (k, admitted) in per_window.iter().enumerate() {
            prop_assert!(
                admitted.abs_diff(allowance) <= tolerance,
                "window {k}: {admitted} admitted, allowance {allowance}: {per_window:?}"
            );
        }
    }

    /// Random bursts (many frames at one instant, random gaps, random
    /// sizes) against packet and byte limits: the bound holds at every step.
    #[test]
    fn bursty_senders_stay_within_the_bound(
        path in path(),
        window in window_ns(),
        buckets in 1u32..=15,
        allowance in 10u64..500,
        byte_allowance in 5_000u64..500_000,
        bursts in proptest::collection::vec((0u64..3 * SECOND, 1u64..200, 60u64..1_500), 1..40),
    ) {
        let mut model = Model::new(path, window, buckets, allowance, byte_allowance);
        let mut t = 0;
        for (gap, size, len) in bursts {
            t += gap;
            for _ in 0..size {
                model.offer(t, len);
            }
        }
    }

    /// Bursts placed exactly at bucket edges (the last and first ns of a
    /// bucket), the adversary's best shot at the weighting: the bound holds.
    #[test]
    fn bursts_at_bucket_edges_stay_within_the_bound(
        path in path(),
        window in window_ns(),
        buckets in 1u32..=15,
        allowance in 10u64..300,
        edges in proptest::collection::vec((1u64..40, any::<bool>(), 1u64..400), 1..30),
    ) {
        let mut model = Model::new(path, window, buckets, allowance, UNLIMITED);
        let bucket_ns = window / u64::from(buckets);
        let mut bucket = 100;
        for (advance, before_edge, size) in edges {
            bucket += advance;
            let t = if before_edge { bucket * bucket_ns - 1 } else { bucket * bucket_ns };
            for _ in 0..size {
                model.offer(t, 64);
            }
        }
    }
}

/// The fixed-window failure: a full allowance just before a boundary and
/// another just after it. A fixed window admits both (2x); the sliding
/// window admits the second only as the first leaves the window.
#[test]
fn no_doubling_across_a_window_boundary() {
    for (buckets, path) in [1, 4, 10, 15]
        .into_iter()
        .flat_map(|k| [(k, Path::Direct), (k, Path::Cached)])
    {
        let window = SECOND;
        let allowance = 1_000;
        let mut model = Model::new(path, window, buckets, allowance, UNLIMITED);
        let boundary = 50 * window;
        let first = (0..2 * allowance)
            .filter(|_| model.offer(boundary - 1_000, 64))
            .count() as u64;
        assert_eq!(
            first, allowance,
            "K={buckets}: the first burst gets the allowance"
        );
        let second = (0..2 * allowance)
            .filter(|_| model.offer(boundary + 1_000, 64))
            .count();
        assert_eq!(
            second, 0,
            "K={buckets}: nothing more right after the boundary"
        );
    }
}

/// Packets are exact under concurrency: threads racing on one ring never
/// admit more than the allowance in one instant.
#[test]
fn concurrent_admission_never_exceeds_the_allowance() {
    let ring = AtomicRing::default();
    let params = WindowParams {
        bucket_ns: SECOND / 10,
        buckets: 10,
        allowance_packets: 10_000,
        allowance_bytes: UNLIMITED,
    };
    let t = 42 * SECOND;
    let admitted: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    (0..20_000)
                        .filter(|_| try_admit(&ring, &params, t, 64))
                        .count() as u64
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert!(admitted <= 10_000, "admitted {admitted} > allowance");
    assert!(admitted >= 9_990, "contention refused too much: {admitted}");
}

/// Bytes are exact under concurrency too, on both paths: threads racing
/// on one ring with a byte limit never count more bytes than the byte
/// allowance, and every admitted frame's bytes are counted.
#[test]
fn concurrent_byte_admission_never_exceeds_or_undercounts() {
    for cached in [false, true] {
        let ring = AtomicRing::default();
        let params = WindowParams {
            bucket_ns: SECOND / 10,
            buckets: 10,
            allowance_packets: UNLIMITED,
            allowance_bytes: 100 * 1500,
        };
        let t = 42 * SECOND + 3;
        let cache = WindowCache::refresh(&ring, &params, t);
        let admitted: u64 = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        (0..20_000)
                            .filter(|_| {
                                if cached {
                                    matches!(
                                        try_admit_cached(&ring, &cache, &params, t, 1500, 1),
                                        Admission::Admitted { .. }
                                    )
                                } else {
                                    try_admit(&ring, &params, t, 1500)
                                }
                            })
                            .count() as u64
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let at = position(t, params.bucket_ns);
        let counted = bytes_in(ring.load(slot_of(at.bucket), BYTES), at.bucket);
        assert!(
            admitted <= 100,
            "cached={cached}: admitted {admitted} > 100 frames"
        );
        assert!(
            admitted >= 99,
            "cached={cached}: contention refused too much: {admitted}"
        );
        assert!(
            counted >= admitted * 1500 && counted <= 100 * 1500,
            "cached={cached}: {counted} bytes counted for {admitted} frames"
        );
    }
}

proptest! {
    #![proptest_config(config(48))]

    /// The kernel's cached path decides like the reference (see
    /// [`paths_agree`]).
    #[test]
    fn cached_path_matches_the_reference(
        window in window_ns(),
        buckets in 1u32..=15,
        allowance in 10u64..2_000,
        arrivals in proptest::collection::vec((0u64..SECOND / 20, 1u64..20), 1..300),
    ) {
        let (direct, cached, slack) = paths_agree(window, buckets, allowance, &arrivals);
        prop_assert!(
            direct.abs_diff(cached) <= slack,
            "direct {direct} vs cached {cached} (slack {slack})"
        );
    }
}

/// The frames the reference and the cached path admit of the same
/// arrivals (gap before each burst, burst size), and how far apart they
/// may be. Both keep every window's bound (`Model::offer` checks it after
/// each frame), but they round the oldest bucket's weight differently (the
/// cached path per quarter of its weight, and its refusal hold early), so
/// they may decide a frame differently now and then, and from there on
/// admit different patterns: each window may differ by about a rounding
/// (1% of the allowance plus two frames), so a run may differ by that
/// times the windows it spans.
fn paths_agree(
    window: u64,
    buckets: u32,
    allowance: u64,
    arrivals: &[(u64, u64)],
) -> (u64, u64, u64) {
    let mut direct = Model::new(Path::Direct, window, buckets, allowance, UNLIMITED);
    let mut cached = Model::new(Path::Cached, window, buckets, allowance, UNLIMITED);
    let start = 7 * SECOND;
    let mut t = start;
    for &(gap, burst) in arrivals {
        t += gap;
        for _ in 0..burst {
            direct.offer(t, 64);
            cached.offer(t, 64);
        }
    }
    let windows = (t - start).div_ceil(direct.window_ns) + 1;
    let slack = (allowance / 100 + 2) * windows;
    (direct.admitted, cached.admitted, slack)
}

/// A case a random seed found: the two paths admit the same in each of
/// five whole windows (194, 194, 194, 193, 193), though from the fourth on
/// in other buckets (a frame decided differently shifts what each admits
/// next), and 4 against 11 in the sixth, partial one: 972 against 979
/// frames, more than one window's rounding (3) but within one per window
/// spanned.
#[test]
fn paths_that_part_ways_stay_within_a_rounding_per_window() {
    let arrivals: &[(u64, u64)] = &[
        (29373773, 10),
        (27287786, 11),
        (24233766, 10),
        (9092453, 14),
        (1052434, 12),
        (4122698, 15),
        (34079768, 19),
        (48375248, 16),
        (42905890, 16),
        (30191662, 13),
        (32599333, 19),
        (46633462, 13),
        (40973951, 7),
        (45433543, 11),
        (45137988, 19),
        (31794808, 5),
        (39851778, 15),
        (43345060, 11),
        (39732996, 13),
        (11158404, 19),
        (3651023, 16),
        (20849595, 4),
        (26496515, 2),
        (7411023, 15),
        (11773946, 11),
        (31995875, 1),
        (28187861, 5),
        (34742584, 4),
        (29625479, 13),
        (20860646, 12),
        (3319054, 2),
        (24847439, 14),
        (15397688, 16),
        (28511403, 13),
        (4688577, 10),
        (21749579, 6),
        (13169754, 3),
        (4367316, 19),
        (38152090, 12),
        (8310243, 2),
        (25731491, 9),
        (41979157, 4),
        (32277979, 8),
        (41838105, 3),
        (19480767, 7),
        (21877067, 16),
        (25628827, 15),
        (15809559, 8),
        (43103888, 5),
        (17529094, 10),
        (36445355, 5),
        (32000913, 10),
        (36755926, 19),
        (33731566, 15),
        (11010975, 17),
        (11109546, 11),
        (36927401, 16),
        (11298488, 17),
        (42849430, 13),
        (6848563, 15),
        (23744210, 2),
        (45577897, 14),
        (20310599, 1),
        (49074461, 15),
        (19157434, 6),
        (42707119, 15),
        (18674758, 17),
        (34027261, 8),
        (45826397, 1),
        (12219934, 17),
        (11569200, 8),
        (32532786, 14),
        (41954453, 5),
        (22674150, 3),
        (19455818, 2),
        (7734269, 11),
        (918337, 14),
        (35960200, 7),
        (13894390, 1),
        (21981279, 18),
        (2029792, 9),
        (33283577, 10),
        (5562051, 17),
        (6116921, 15),
        (6564914, 4),
        (20682220, 8),
        (32511360, 16),
        (5756628, 16),
        (2934306, 9),
        (12346554, 13),
        (19099791, 12),
        (34576627, 8),
        (26111639, 7),
        (34234708, 1),
        (8487599, 13),
        (31359385, 9),
        (15373920, 11),
        (43257787, 11),
        (14016086, 7),
        (35484752, 13),
        (39885803, 18),
        (1048591, 3),
        (19900954, 16),
        (14251962, 13),
        (46447436, 2),
        (23501390, 6),
        (48507190, 4),
        (4953911, 8),
        (34398840, 5),
        (9736114, 1),
        (49658168, 4),
        (30450948, 12),
        (10960672, 15),
        (30779050, 6),
        (42719037, 11),
        (29825425, 16),
        (38072125, 6),
        (23381380, 18),
        (40099766, 19),
        (45963623, 1),
        (28234458, 16),
        (32557365, 12),
        (46193423, 13),
        (20120547, 6),
        (48444881, 18),
        (11187835, 10),
        (38976908, 9),
        (23204009, 14),
        (42006615, 6),
        (22240849, 11),
        (45876990, 2),
        (29265177, 19),
        (11069789, 11),
        (35317726, 2),
        (34371262, 18),
        (11642163, 3),
        (8046268, 13),
        (22876665, 2),
        (17325063, 12),
        (41390314, 7),
        (12452697, 19),
        (27988676, 9),
        (37017606, 16),
        (39510008, 4),
        (44118063, 9),
        (16978005, 11),
        (37055180, 15),
        (38813009, 19),
        (36530741, 12),
        (28539967, 7),
        (23435259, 13),
        (4686288, 2),
        (24334111, 2),
        (16152767, 18),
        (35205425, 5),
        (11925600, 13),
        (27134705, 1),
        (11576053, 11),
        (41179574, 2),
        (2076402, 16),
        (11963382, 11),
        (38871868, 9),
        (33126480, 2),
        (36888073, 19),
        (1842938, 14),
        (45580510, 3),
        (33119060, 15),
        (2555710, 7),
        (27011544, 9),
        (33172338, 16),
        (12197908, 9),
        (17477621, 13),
        (29982021, 3),
        (24260008, 16),
        (34559098, 14),
        (15131195, 5),
        (13241219, 15),
        (28345088, 3),
        (15189991, 17),
        (610599, 1),
        (43600396, 9),
        (29321380, 13),
        (37375118, 15),
        (20409879, 15),
        (22696354, 17),
        (45335613, 16),
        (22646793, 14),
        (17734323, 18),
        (33319591, 10),
        (30776433, 15),
        (34135495, 15),
        (7491249, 19),
        (8160410, 13),
        (4903654, 10),
        (15979898, 16),
        (21362674, 16),
        (42830795, 19),
        (10448331, 19),
        (30417969, 12),
        (11475855, 19),
    ];
    let (direct, cached, slack) = paths_agree(SECOND, 4, 194, arrivals);
    assert_eq!((direct, cached), (972, 979), "the case as found");
    assert!(direct.abs_diff(cached) <= slack, "slack {slack}");
}

/// Several windows over one sender, judged as the kernel judges a rule's
/// levels: a frame the source's own window holds is refused without
/// looking; otherwise each further window in turn admits it (counting it)
/// or refuses it, and only a frame every further window admitted reaches
/// the source's own window, which, refusing it, makes them give it back.
/// `levels` are (window, allowance) pairs.
struct Levels {
    own: Model,
    levels: Vec<Model>,
}

impl Levels {
    fn new(own: (u64, u64), levels: &[(u64, u64)]) -> Self {
        let model = |(window, allowance): (u64, u64)| {
            Model::new(Path::Cached, window, 10, allowance, UNLIMITED)
        };
        Self {
            own: model(own),
            levels: levels.iter().copied().map(model).collect(),
        }
    }

    /// Offers a frame at `t`; whether every window admitted it. Each
    /// window checks its own bound (`Model::offer`).
    fn offer(&mut self, t: u64) -> bool {
        if t < self.own.hold_until_ns {
            return false;
        }
        for level in &mut self.levels {
            if !level.offer(t, 64) {
                return false;
            }
        }
        if self.own.offer(t, 64) {
            return true;
        }
        // Refused by its own window: the levels give the frame back.
        for level in &mut self.levels {
            level.give_back(t);
        }
        false
    }
}

impl Model {
    /// Takes back the frame it admitted last, at `t` (`give_back_packet`),
    /// from its ring and its log.
    fn give_back(&mut self, t: u64) {
        let bucket = t / self.params.bucket_ns;
        give_back_packet(&self.ring, bucket);
        if self.log.back().is_some_and(|(at, _)| *at == t) {
            let (_, len) = self.log.pop_back().expect("a frame");
            self.log_bytes -= len;
            if let Some(entry) = self.per_bucket.get_mut(&bucket) {
                entry.0 -= 1;
                entry.1 -= len;
            }
            self.admitted -= 1;
        }
        self.check_bound(t);
    }
}

proptest! {
    #![proptest_config(config(32))]

    /// A flood through a short and a long window (the rule's own window and
    /// a further level, either way round): each window keeps its bound, and
    /// over every long window the flood gets what the tighter of the two
    /// allows there (within 3 % when one is clearly the tighter): the
    /// frames one window refuses do not use up the other.
    #[test]
    fn several_windows_each_hold_and_the_tighter_one_binds(
        short_ms in prop_oneof![Just(100u64), Just(250), Just(500)],
        long_s in 1u64..=2,
        // At least 100 frames a window, so that a few percent mean
        // something.
        short_pps in 1_000u64..3_000,
        long_pps in 100u64..3_000,
        own_is_long in any::<bool>(),
        factor in 3u64..=5,
        start in 0u64..10 * SECOND,
        seed in any::<u64>(),
    ) {
        let (short, long) = (short_ms * SECOND / 1000, long_s * SECOND);
        let short_allowance = short_pps * short / SECOND;
        let long_allowance = long_pps * long / SECOND;
        let (own, level) = if own_is_long {
            ((long, long_allowance), (short, short_allowance))
        } else {
            ((short, short_allowance), (long, long_allowance))
        };
        let mut judge = Levels::new(own, &[level]);
        let rate = short_pps.max(long_pps) * factor;
        let interval = SECOND / rate;
        let mut rng = Lcg(seed);
        let mut t = start;
        let mut per_long = [0u64; 3];
        while t < start + 3 * long {
            if judge.offer(t) {
                per_long[((t - start) / long) as usize] += 1;
            }
            t += interval / 2 + rng.next(interval);
        }
        let scaled_short = short_allowance * (long / short);
        let expected = long_allowance.min(scaled_short);
        // One window clearly tighter (by 1.5x): it alone binds, within 3 %.
        // Both about as tight: each refuses in turn, and each estimate may
        // be off by up to one of its buckets' counts (a tenth: 10 buckets),
        // on the side of admitting less.
        let clear = 2 * long_allowance.max(scaled_short) >= 3 * expected;
        let slack = if clear { expected * 3 / 100 } else { expected * 15 / 100 };
        for (k, admitted) in per_long.iter().enumerate() {
            prop_assert!(
                *admitted <= expected + expected / 10 + 2,
                "long window {k}: {admitted}, the tighter allows {expected}: {per_long:?}"
            );
            prop_assert!(
                *admitted + slack + 2 >= expected,
                "long window {k}: {admitted}, the tighter allows {expected}: {per_long:?}"
            );
        }
    }
}
