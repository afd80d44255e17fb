//! The eBPF object embedded in the binary, and loading it into the kernel:
//! the one place a loader is set up (capacities, adopted pins), after which
//! the program's maps are opened once into typed handles ([`Maps`]).

use std::path::PathBuf;

use aya::{
    programs::{ProgramError, Xdp},
    Ebpf, EbpfLoader,
};
use limiter_common::{
    maps::{self, MapSpec, Sizing},
    names, DEFAULT_MAX_SOURCES,
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
    #[error("the kernel refused the XDP program: {0}")]
    Program(#[from] ProgramError),
    #[error("{0}")]
    Maps(#[from] MapsError),
}

/// Knobs applied before the object is loaded.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Capacity of the exact tier (`WINDOWS`: sources with a window).
    pub max_sources: u32,
    /// Capacity of the per-CPU state (`SOURCES`: hot sources); `None`:
    /// `max_sources` (every source may be hot, as with the tiers off).
    pub max_hot_sources: Option<u32>,
    /// Maps taken from a pin instead of created, by name (a map not pinned
    /// at its path yet is created and pinned there): how the daemon adopts
    /// the state of an earlier one.
    pub pins: Vec<(&'static str, PathBuf)>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            max_sources: DEFAULT_MAX_SOURCES,
            max_hot_sources: None,
            pins: Vec::new(),
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
}

/// Creates (or adopts) the maps and loads (verifies) the XDP program;
/// nothing is attached yet.
pub fn load(options: &LoadOptions) -> Result<Program, LoadError> {
    let mut loader = EbpfLoader::new();
    for spec in &maps::ALL {
        if spec.sizing != Sizing::Fixed {
            if let Some(entries) = options.expected_max_entries(spec) {
                loader.map_max_entries(spec.name, entries);
            }
        }
    }
    for (name, path) in &options.pins {
        loader.map_pin_path(name, path.as_path());
    }
    let mut ebpf = loader.load(EBPF_OBJECT)?;
    xdp_in(&mut ebpf)
        .ok_or(LoadError::MissingProgram(names::PROGRAM))?
        .load()?;
    let maps = Maps::take(&mut ebpf)?;
    Ok(Program { ebpf, maps })
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
