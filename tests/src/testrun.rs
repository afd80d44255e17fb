//! The real XDP program run through BPF_PROG_TEST_RUN, on a chosen CPU, with
//! its maps read back.
//!
//! Each [`Harness`] loads its own copy of the program and maps, so tests
//! running in parallel never see each other's counters.

use std::{
    collections::BTreeMap,
    thread,
    time::{Duration, Instant},
};

use aya::programs::{ProgramError, TestRun, TestRunOptions, TestRunResult, Xdp};
use limiter_common::{
    rules::rules_base, Counter, LimitEvent, Outcome, Rule, Scope, SourceKey, SourceTraffic,
};
use limiter_user::{
    kernel::{self, push, read, LoadOptions, Maps, Program},
    rules::RuleSet,
};
use nix::{sched::CpuSet, unistd::Pid};

pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;

/// A loaded copy of the limiter program.
pub struct Harness {
    program: Program,
}

impl Harness {
    /// Loads the embedded program through the kernel verifier.
    pub fn load() -> Self {
        Self::load_with(&LoadOptions::default())
    }

    pub fn load_with(options: &LoadOptions) -> Self {
        let program = kernel::load(options)
            .unwrap_or_else(|e| panic!("loading the XDP program (needs root and BPF): {e}"));
        Self { program }
    }

    /// Loads the program with the maps named in `pinned` taken from their
    /// pins instead of created (as the daemon adopts its pinned maps): a
    /// test can substitute a map of another type or size.
    pub fn load_adopting(pinned: &[(&'static str, &std::path::Path)]) -> Self {
        Self::load_with(&LoadOptions {
            pins: pinned
                .iter()
                .map(|(name, path)| (*name, path.to_path_buf()))
                .collect(),
            ..LoadOptions::default()
        })
    }

    /// Rule `i` of the first generation pushed (0: the default), as the
    /// kernel reads it from `RULES`.
    pub fn first_rule(&self, i: u32) -> Rule {
        self.maps()
            .rule(rules_base(1) + i)
            .expect("the rule in RULES")
    }

    /// Makes rule `i` of the first generation cluster-scoped in `RULES`,
    /// as a push of a cluster rule writes it (`kernel::cluster::kernel_ready`
    /// included), so kernel tests need nothing of the configuration side;
    /// the rule as written.
    pub fn make_cluster_scoped(&mut self, i: u32) -> Rule {
        let mut rule = self.first_rule(i);
        rule.set_scope(Scope::Cluster);
        kernel::cluster::kernel_ready(&mut rule);
        self.maps_mut()
            .rules
            .set(rules_base(1) + i, rule, 0)
            .expect("writing the cluster-scoped rule");
        rule
    }

    /// The events waiting in the ring buffer, parsed as the daemon does.
    pub fn drain_events(&mut self) -> Vec<LimitEvent> {
        let ring = self.maps_mut().events.as_mut().expect("EVENTS");
        let mut events = Vec::new();
        while let Some(item) = ring.next() {
            events.push(limiter_user::daemon::events::parse(&item).expect("an event"));
        }
        events
    }

    /// The program's maps.
    pub fn maps(&self) -> &Maps {
        &self.program.maps
    }

    pub fn maps_mut(&mut self) -> &mut Maps {
        &mut self.program.maps
    }

    /// The XDP program, for running from several threads at once.
    pub fn program(&mut self) -> &Xdp {
        self.program.xdp()
    }

    /// The XDP program and the maps at once, for threads that run the one
    /// and read the other.
    pub fn parts(&mut self) -> (&Xdp, &Maps) {
        self.program.parts()
    }

    /// The XDP program, to attach.
    pub fn program_mut(&mut self) -> &mut Xdp {
        self.program.xdp()
    }

    /// Runs `frame` `n` times on `cpu`, one run at a time from one pinned
    /// thread (a thread per run took milliseconds each under emulation);
    /// returns how many were passed and how many dropped (any other
    /// verdict panics).
    pub fn offer(&mut self, cpu: usize, frame: &[u8], n: u64) -> (u64, u64) {
        self.on_cpu(cpu, |program| {
            let (mut passed, mut dropped) = (0, 0);
            for i in 0..n {
                match run_once(program, frame) {
                    XDP_PASS => passed += 1,
                    XDP_DROP => dropped += 1,
                    other => panic!("frame {i}: unexpected verdict {other}"),
                }
            }
            (passed, dropped)
        })
    }

    /// Runs the program once on `frame` from a thread pinned to `cpu` (the
    /// kernel runs the test on the caller's CPU, which picks the per-CPU
    /// slots it touches) and returns the verdict.
    pub fn run_on_cpu(&mut self, cpu: usize, frame: &[u8]) -> u32 {
        self.run_repeated_on_cpu(cpu, frame, 1).0
    }

    /// As [`run_on_cpu`](Self::run_on_cpu), `repeat` times in one syscall;
    /// returns the verdict and the kernel's average nanoseconds per run.
    pub fn run_repeated_on_cpu(&mut self, cpu: usize, frame: &[u8], repeat: u32) -> (u32, u64) {
        self.on_cpu(cpu, |program| {
            let result = test_run(program, frame, repeat)
                .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN on CPU {cpu}: {e}"));
            (result.return_value, result.duration.as_nanos() as u64)
        })
    }

    /// Runs every frame of `frames` once, in order, from one thread pinned
    /// to `cpu`; their verdicts.
    pub fn run_all(&mut self, cpu: usize, frames: &[Vec<u8>]) -> Vec<u32> {
        self.on_cpu(cpu, |program| {
            frames
                .iter()
                .map(|frame| run_once(program, frame))
                .collect()
        })
    }

    /// `runs` with the program, on a thread pinned to `cpu`.
    fn on_cpu<T: Send>(&mut self, cpu: usize, runs: impl FnOnce(&Xdp) -> T + Send) -> T {
        let program = self.program.xdp();
        thread::scope(|scope| {
            scope
                .spawn(|| {
                    pin_current_thread(cpu);
                    runs(program)
                })
                .join()
                .expect("test-run thread panicked")
        })
    }

    /// Per-CPU counters of one source; `None` if it is not tracked.
    pub fn source(&self, key: &SourceKey) -> Option<Vec<Counter>> {
        self.sources().remove(key)
    }

    /// Every tracked source with its per-CPU offered frames since creation.
    pub fn sources(&self) -> BTreeMap<SourceKey, Vec<Counter>> {
        self.traffic()
            .into_iter()
            .map(|(key, per_cpu)| (key, per_cpu.iter().map(|t| t.total).collect()))
            .collect()
    }

    /// Every tracked source with its per-CPU `SourceTraffic`.
    pub fn traffic(&self) -> BTreeMap<SourceKey, Vec<SourceTraffic>> {
        read::sources(self.maps()).expect("reading SOURCES")
    }

    /// Validates and pushes a rule set; returns the new generation.
    pub fn push(&mut self, set: &RuleSet) -> u32 {
        push::push(self.maps_mut(), set).unwrap_or_else(|e| panic!("push: {e}"))
    }

    /// The counter of `outcome` summed over CPUs.
    pub fn outcome_total(&self, outcome: Outcome) -> Counter {
        let all = read::outcomes(self.maps()).expect("reading STATS");
        read::total(&all[outcome.name()])
    }

    /// Asserts that the outcome counters (summed over CPUs) are exactly
    /// `expected` and every other outcome is zero.
    #[track_caller]
    pub fn assert_outcomes(&self, expected: &[(Outcome, Counter)]) {
        for outcome in Outcome::ALL {
            let want = expected
                .iter()
                .find(|(o, _)| *o == outcome)
                .map(|(_, c)| *c)
                .unwrap_or_default();
            assert_eq!(
                self.outcome_total(outcome),
                want,
                "outcome `{}`",
                outcome.name()
            );
        }
    }
}

/// How a paced sender keeps its rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pacing {
    /// Behind schedule, send at once until caught up (a flood keeps its
    /// average rate through scheduling hiccups).
    CatchUp,
    /// Behind schedule, skip the missed slots (never above the rate over
    /// any interval, as a well-behaved sender).
    Skip,
}

/// The kernel's clock for the limiter: CLOCK_MONOTONIC_COARSE (what
/// `bpf_ktime_get_coarse_ns` reads), so tests place frames in windows
/// exactly as the kernel does.
pub fn coarse_now() -> Duration {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .expect("CLOCK_MONOTONIC_COARSE");
    Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32)
}

/// A common start for paced senders: the precise clock for pacing, the
/// kernel's coarse clock for placing frames in windows.
#[derive(Clone, Copy, Debug)]
pub struct Start {
    pub instant: Instant,
    pub coarse: Duration,
}

impl Start {
    pub fn now() -> Self {
        Self {
            instant: Instant::now(),
            coarse: coarse_now(),
        }
    }
}

/// What a paced sender saw.
#[derive(Debug, Default)]
pub struct Paced {
    /// Offsets from the common start (kernel clock) of the frames passed.
    pub passed_at: Vec<Duration>,
    pub offered: u64,
    pub dropped: u64,
}

/// Offers `frame` at `pps` for `duration` (from `start`) on a thread
/// pinned to `cpu`, one BPF_PROG_TEST_RUN per frame, in real time.
pub fn paced(
    program: &Xdp,
    cpu: usize,
    frame: &[u8],
    pps: u64,
    start: Start,
    duration: Duration,
    pacing: Pacing,
) -> Paced {
    let end = start.instant + duration;
    paced_while(program, cpu, frame, pps, start, pacing, |now| now < end)
}

/// [`paced`] on CPUs 0 and 1 at once, each at `pps`, from one `start`: a
/// flood that crosses CPUs. Asserts that both CPUs got some frames
/// through (else the run says nothing about sharing across CPUs) and
/// returns each CPU's run and every passed frame's offset, both CPUs'.
pub fn paced_on_both_cpus(
    program: &Xdp,
    frame: &[u8],
    pps: u64,
    duration: Duration,
) -> ([Paced; 2], Vec<Duration>) {
    assert!(online_cpus() >= 2, "this test needs two CPUs");
    let start = Start::now();
    let runs = thread::scope(|scope| {
        let on = |cpu| {
            scope.spawn(move || paced(program, cpu, frame, pps, start, duration, Pacing::CatchUp))
        };
        let (a, b) = (on(0), on(1));
        [a.join().unwrap(), b.join().unwrap()]
    });
    assert!(
        runs.iter().all(|run| !run.passed_at.is_empty()),
        "both CPUs got some through"
    );
    let mut passed_at = runs[0].passed_at.clone();
    passed_at.extend(&runs[1].passed_at);
    (runs, passed_at)
}

/// As [`paced`], for as long as `go(now)` holds: a sender that lasts as
/// long as something else does (another thread's flood), however long
/// that takes on a loaded machine.
pub fn paced_while(
    program: &Xdp,
    cpu: usize,
    frame: &[u8],
    pps: u64,
    start: Start,
    pacing: Pacing,
    go: impl Fn(Instant) -> bool + Sync,
) -> Paced {
    paced_until(program, cpu, frame, pps, start, pacing, |now, _| go(now))
}

/// As [`paced`], until `frames` frames were offered: on a loaded machine a
/// sender that skips the slots it missed (`Pacing::Skip`) offers fewer
/// frames a second, so a fixed duration may offer too few to say
/// anything; this lasts as long as it takes (at most `deadline`, past
/// which the machine is too starved to run the test, and it panics).
pub fn paced_frames(
    program: &Xdp,
    cpu: usize,
    frame: &[u8],
    pps: u64,
    frames: u64,
    deadline: Duration,
) -> Paced {
    let start = Start::now();
    let end = start.instant + deadline;
    let run = paced_until(program, cpu, frame, pps, start, Pacing::Skip, |now, out| {
        out.offered < frames && now < end
    });
    assert!(
        run.offered >= frames,
        "offered only {} of {frames} frames in {deadline:?}: the machine starved the sender",
        run.offered
    );
    run
}

/// The sender of [`paced`] and [`paced_while`], for as long as
/// `go(now, sent so far)` holds.
fn paced_until(
    program: &Xdp,
    cpu: usize,
    frame: &[u8],
    pps: u64,
    start: Start,
    pacing: Pacing,
    go: impl Fn(Instant, &Paced) -> bool + Sync,
) -> Paced {
    thread::scope(|scope| {
        scope
            .spawn(|| {
                pin_current_thread(cpu);
                let interval = Duration::from_nanos(1_000_000_000 / pps);
                let mut out = Paced::default();
                let mut next = start.instant;
                loop {
                    let mut now = Instant::now();
                    while now < next {
                        std::hint::spin_loop();
                        now = Instant::now();
                    }
                    if !go(now, &out) {
                        return out;
                    }
                    let verdict = test_run(program, frame, 1)
                        .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN on CPU {cpu}: {e}"))
                        .return_value;
                    out.offered += 1;
                    match verdict {
                        XDP_PASS => out
                            .passed_at
                            .push(coarse_now().saturating_sub(start.coarse)),
                        XDP_DROP => out.dropped += 1,
                        other => panic!("unexpected verdict {other}"),
                    }
                    next += interval;
                    if pacing == Pacing::Skip && next < now {
                        next = now + interval;
                    }
                }
            })
            .join()
            .expect("sender thread panicked")
    })
}

/// One frame of a schedule: when it is due (from the schedule's start)
/// and which of the schedule's frames it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Due {
    pub at: Duration,
    pub frame: usize,
}

/// What became of one scheduled frame: its verdict, and the kernel's
/// clock just before and just after its run (the program read a time
/// between the two; they differ only when a clock tick fell inside the
/// run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ran {
    pub verdict: u32,
    pub before: Duration,
    pub after: Duration,
}

/// Runs `schedule` (sorted by `at`) in real time from `start` on a thread
/// pinned to `cpu`: each frame once, in order, when it is due and no
/// sooner after its sender's last run began than the schedule spaces the
/// two. A runner that falls behind (a slow or emulated machine) so delays
/// its senders and never bunches one's late frames: each keeps its pace.
/// Returns what became of each, in schedule order.
pub fn run_schedule(
    program: &Xdp,
    cpu: usize,
    start: Instant,
    frames: &[Vec<u8>],
    schedule: &[Due],
) -> Vec<Ran> {
    on_cpu(cpu, || {
        // Each sender's last frame: when it was due and when its run began.
        let mut last: Vec<Option<(Duration, Instant)>> = vec![None; frames.len()];
        schedule
            .iter()
            .map(|due| {
                let mut at = start + due.at;
                if let Some((was_due, began)) = last[due.frame] {
                    at = at.max(began + due.at.saturating_sub(was_due));
                }
                while Instant::now() < at {
                    std::hint::spin_loop();
                }
                last[due.frame] = Some((due.at, Instant::now()));
                let before = coarse_now();
                let verdict = verdict(program, &frames[due.frame]);
                Ran {
                    verdict,
                    before,
                    after: coarse_now(),
                }
            })
            .collect()
    })
}

/// Runs `work` on a thread pinned to `cpu` and returns what it returned:
/// for loops of millions of [`verdict`] calls (a flood of varied frames),
/// which would spend most of their time starting threads if each frame
/// took its own, as [`Harness::run_on_cpu`] does.
pub fn on_cpu<T: Send>(cpu: usize, work: impl FnOnce() -> T + Send) -> T {
    thread::scope(|scope| {
        scope
            .spawn(|| {
                pin_current_thread(cpu);
                work()
            })
            .join()
            .expect("pinned thread panicked")
    })
}

/// The verdict of one `BPF_PROG_TEST_RUN` of `program` on `frame`, on the
/// calling thread's CPU (see [`on_cpu`]); a failed run panics.
pub fn verdict(program: &Xdp, frame: &[u8]) -> u32 {
    test_run(program, frame, 1)
        .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN of {} bytes: {e}", frame.len()))
        .return_value
}

/// One `BPF_PROG_TEST_RUN` of `program` on `frame`, run `repeat` times in
/// the kernel, on the calling thread's CPU.
pub fn test_run(program: &Xdp, frame: &[u8], repeat: u32) -> Result<TestRunResult, ProgramError> {
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(frame);
    opts.repeat = repeat;
    program.test_run(opts)
}

/// Admitted frames per window of `window` counted from a sender's start
/// (`Paced::passed_at`), for the first `windows` windows.
pub fn per_window(passed_at: &[Duration], window: Duration, windows: usize) -> Vec<u64> {
    let mut counts = vec![0; windows];
    for at in passed_at {
        let k = (at.as_nanos() / window.as_nanos()) as usize;
        if k < windows {
            counts[k] += 1;
        }
    }
    counts
}

/// `packets` frames of `len` bytes each.
pub fn frames(packets: u64, len: usize) -> Counter {
    Counter {
        packets,
        bytes: packets * len as u64,
    }
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu).unwrap_or_else(|e| panic!("CPU {cpu}: {e}"));
    nix::sched::sched_setaffinity(Pid::from_raw(0), &set)
        .unwrap_or_else(|e| panic!("pinning to CPU {cpu}: {e}"));
}

/// Number of CPUs this machine has online (the per-CPU tests need two).
pub fn online_cpus() -> usize {
    aya::util::online_cpus()
        .map(|cpus| cpus.len())
        .unwrap_or_else(|(what, e)| panic!("{what}: {e}"))
}

/// One run of `program` on `frame`; its verdict.
fn run_once(program: &Xdp, frame: &[u8]) -> u32 {
    test_run(program, frame, 1)
        .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN of {} bytes: {e}", frame.len()))
        .return_value
}
