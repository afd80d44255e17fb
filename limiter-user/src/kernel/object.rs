//! The eBPF object embedded in the binary, and loading it into the kernel:
//! the one place a loader is set up (capacities, adopted pins), after which
//! the program's maps are opened once into typed handles ([`Maps`]).

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::{
    programs::{Extension, ProgramError, Xdp},
    Ebpf, EbpfLoader, VerifierLogLevel,
};
use limiter_common::{
    lists::DEFAULT_MAX_LIST_PREFIXES,
    maps::{self, MapSpec, Sizing},
    names, DEFAULT_MAX_HOT_SOURCES, DEFAULT_MAX_SOURCES,
};

use super::{Maps, MapsError};

/// The compiled XDP program (built by build.rs from `limiter-ebpf`).
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter-ebpf.o"));

/// Errors from loading the program into the kernel.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot create the BPF maps or parse the object: {0}")]
    Object(#[from] aya::EbpfError),
    #[error("the object has no XDP program named `{0}`")]
    MissingProgram(&'static str),
    #[error("{0}")]
    Refused(Box<Refusal>),
    #[error("the kernel refused the XDP program: {0}")]
    Program(ProgramError),
    #[error("{0}")]
    Maps(#[from] MapsError),
}

/// The oldest kernel the program is known to load and work on: tested in
/// the kernel lane (`cargo xtask test --kernel 6.1`), not inferred from
/// feature dates.
pub const OLDEST_TESTED_KERNEL: &str = "6.1 (Debian 12's 6.1.0-50)";

/// The kernel's verifier refused a program: what to tell the operator in
/// one message, with the whole log kept for `--verbose`.
#[derive(Debug)]
pub struct Refusal {
    /// `uname -r` of the refusing kernel.
    pub kernel: String,
    /// The program refused.
    pub program: String,
    /// The function being verified when it was refused, when the log
    /// names one.
    pub function: Option<String>,
    /// The verifier's last line that is not a statistic.
    pub reason: String,
    /// What the `bpf(BPF_PROG_LOAD)` call returned.
    pub error: std::io::Error,
    /// The verifier's log, as the kernel gave it (statistics level).
    pub log: String,
}

impl Refusal {
    /// Reads `log`, the verifier's output for a refused `program`.
    pub fn new(kernel: String, program: &str, error: std::io::Error, log: String) -> Self {
        let lines: Vec<&str> = log
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let is_statistic = |line: &&str| {
            ["verification time", "stack depth", "processed "]
                .iter()
                .any(|prefix| line.starts_with(prefix))
        };
        let reason = lines
            .iter()
            .rev()
            .find(|line| !is_statistic(line))
            .map_or_else(|| "no reason given".to_string(), |line| line.to_string());
        // "Validating limit() func#2..." (older kernels), or
        // "Func#3 ('limit') ..." (newer ones), whichever comes last.
        let function = lines.iter().rev().find_map(|line| {
            if let Some(rest) = line.strip_prefix("Validating ") {
                return rest.split("()").next().map(str::to_string);
            }
            let start = line.find("('")? + 2;
            let end = start + line[start..].find("')")?;
            line.starts_with("Func#")
                .then(|| line[start..end].to_string())
        });
        Self {
            kernel,
            program: program.to_string(),
            function,
            reason,
            error,
            log,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this kernel ({}) refused the XDP program `{}`",
            self.kernel, self.program
        )?;
        if let Some(function) = &self.function {
            write!(f, " in function `{function}`")?;
        }
        write!(
            f,
            ": {} ({}); the oldest kernel it is known to work on is {} (--verbose prints the verifier's log)",
            self.reason, self.error, OLDEST_TESTED_KERNEL
        )
    }
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// What the verifier spent on a program that it accepted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verified {
    /// Instructions the verifier processed, over all the program's
    /// functions (`bpf_prog_info.verified_insns`; the kernel's limit is
    /// 1,000,000).
    pub instructions: u32,
    /// How long the load took (the verifier, nearly all of it).
    pub load_time: Duration,
}

/// Knobs applied before the object is loaded.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Capacity of the exact tier (`WINDOWS`: sources with a window).
    pub max_sources: u32,
    /// Capacity of the per-CPU state (`SOURCES`: hot sources); `None`:
    /// `max_sources`. The default is the daemon's (`daemon.max_hot_sources`).
    pub max_hot_sources: Option<u32>,
    /// Prefixes of one family across all lists (`daemon.max_list_prefixes`):
    /// the list tries hold twice as many (`LISTS_V4`).
    pub max_list_prefixes: u32,
    /// Maps taken from a pin instead of created, by name (a map not pinned
    /// at its path yet is created and pinned there): how the daemon adopts
    /// the state of an earlier one.
    pub pins: Vec<(&'static str, PathBuf)>,
    /// Load the program as a component of libxdp's dispatcher at this run
    /// priority (an extension, verified when it joins one) rather than as
    /// XDP.
    pub component: Option<u32>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            max_sources: DEFAULT_MAX_SOURCES,
            max_hot_sources: Some(DEFAULT_MAX_HOT_SOURCES),
            max_list_prefixes: DEFAULT_MAX_LIST_PREFIXES,
            pins: Vec::new(),
            component: None,
        }
    }
}

impl LoadOptions {
    /// The capacity a map of `spec` has once loaded with these options
    /// (`None`: whatever it has, see `MapSpec::expected_max_entries`).
    pub fn expected_max_entries(&self, spec: &MapSpec) -> Option<u32> {
        spec.expected_max_entries(
            self.max_sources,
            self.max_hot_sources.unwrap_or(self.max_sources),
        )
    }
}

/// The limiter's XDP program, loaded (verified) but not attached, with its
/// maps.
pub struct Program {
    /// Holds the program; its maps were moved into `maps`.
    ebpf: Ebpf,
    pub maps: Maps,
    /// What its verification took.
    pub verified: Verified,
}

/// Creates (or adopts) the maps and loads (verifies) the XDP program;
/// nothing is attached yet. A component's program is verified when it
/// joins a dispatcher (the kernel checks it against the slot it fills).
pub fn load(options: &LoadOptions) -> Result<Program, LoadError> {
    let mut loader = EbpfLoader::new();
    for spec in &maps::ALL {
        if spec.sizing != Sizing::Fixed {
            let entries = match spec.sizing {
                Sizing::Lists => Some(options.max_list_prefixes.saturating_mul(2)),
                _ => options.expected_max_entries(spec),
            };
            if let Some(entries) = entries {
                loader.map_max_entries(spec.name, entries);
            }
        }
    }
    for (name, path) in &options.pins {
        loader.map_pin_path(name, path.as_path());
    }
    let (mut ebpf, verified) = if options.component.is_some() {
        loader.extension(names::PROGRAM);
        loader.verifier_log_level(VerifierLogLevel::STATS);
        let ebpf = loader.load(EBPF_OBJECT)?;
        (ebpf, Verified::default())
    } else {
        load_xdp(&mut loader, EBPF_OBJECT, names::PROGRAM)?
    };
    let mut maps = Maps::take(&mut ebpf)?;
    // The tickets' ring is as long as there are tickets, all shared until
    // rules are pushed.
    maps.set_ticket_rooms(options.max_sources, 0)?;
    Ok(Program {
        ebpf,
        maps,
        verified,
    })
}

/// Loads `object` with `loader` and its XDP program `program` through the
/// verifier: the one place a refusal is read (also for test objects).
///
/// The verifier logs statistics only. On a refusal aya loads the program
/// once more to collect the log; at the default (per-instruction) level a
/// refused million-instruction program fills the buffer, and aya retries
/// with ten times the buffer, each retry a whole verification (minutes
/// on a small machine), for a screen of log nobody reads.
pub fn load_xdp(
    loader: &mut EbpfLoader<'_>,
    object: &[u8],
    program: &'static str,
) -> Result<(Ebpf, Verified), LoadError> {
    loader.verifier_log_level(VerifierLogLevel::STATS);
    let mut ebpf = loader.load(object)?;
    let xdp: &mut Xdp = ebpf
        .program_mut(program)
        .and_then(|p| p.try_into().ok())
        .ok_or(LoadError::MissingProgram(program))?;
    let started = Instant::now();
    match xdp.load() {
        Ok(()) => {}
        Err(ProgramError::LoadError {
            io_error,
            verifier_log,
        }) => {
            return Err(LoadError::Refused(Box::new(Refusal::new(
                kernel_release(),
                program,
                io_error,
                verifier_log.to_string(),
            ))))
        }
        Err(e) => return Err(LoadError::Program(e)),
    }
    let load_time = started.elapsed();
    let instructions = xdp
        .info()
        .ok()
        .and_then(|info| info.verified_instruction_count())
        .unwrap_or(0);
    Ok((
        ebpf,
        Verified {
            instructions,
            load_time,
        },
    ))
}

/// The limiter's XDP program inside a loaded object.
fn xdp_in(ebpf: &mut Ebpf) -> Option<&mut Xdp> {
    ebpf.program_mut(names::PROGRAM)?.try_into().ok()
}

impl Program {
    /// The XDP program, to attach or to run through BPF_PROG_TEST_RUN.
    pub fn xdp(&mut self) -> &mut Xdp {
        // `load` returned this program only after loading it as XDP.
        xdp_in(&mut self.ebpf).expect("checked by load")
    }

    /// The program as a component of libxdp's dispatcher, when it was
    /// loaded as one (`LoadOptions::component`).
    pub fn component(&mut self) -> Option<&mut Extension> {
        self.ebpf.program_mut(names::PROGRAM)?.try_into().ok()
    }

    /// The XDP program and its maps at once (tests run the one from
    /// threads that read the other).
    #[cfg(feature = "test-util")]
    pub fn parts(&mut self) -> (&Xdp, &Maps) {
        (xdp_in(&mut self.ebpf).expect("checked by load"), &self.maps)
    }

    /// The kernel's id of the loaded program (0 if the kernel does not say).
    pub fn id(&self) -> u32 {
        self.ebpf
            .program(names::PROGRAM)
            .and_then(|p| p.info().ok())
            .map_or(0, |info| info.id())
    }

    /// Maps of the object: those opened into [`Maps`] and the kernel's
    /// own scratch maps left in the object.
    pub fn map_count(&self) -> usize {
        self.ebpf.maps().count() + Maps::COUNT
    }

    /// Run time and count of the program, when `kernel.bpf_stats_enabled`
    /// is on.
    pub fn run_stats(&self) -> Option<(u64, u64)> {
        let info = self.ebpf.program(names::PROGRAM)?.info().ok()?;
        let runs = info.run_count();
        (runs > 0).then(|| (info.run_time().as_nanos() as u64, runs))
    }
}
