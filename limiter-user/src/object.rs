//! The eBPF object embedded in the binary, and loading it into the kernel.

use aya::{
    programs::{ProgramError, Xdp},
    Ebpf, EbpfLoader,
};
use limiter_common::{names, DEFAULT_MAX_SOURCES};

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
}

/// Knobs applied before the object is loaded.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Capacity of the per-source state maps (`SOURCES` and `WINDOWS`).
    pub max_sources: u32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            max_sources: DEFAULT_MAX_SOURCES,
        }
    }
}

/// Creates the maps and loads (verifies) the XDP program; nothing is
/// attached yet.
pub fn load(options: &LoadOptions) -> Result<Ebpf, LoadError> {
    let mut ebpf = EbpfLoader::new()
        .map_max_entries(names::SOURCES, options.max_sources)
        .map_max_entries(names::WINDOWS, options.max_sources)
        .load(EBPF_OBJECT)?;
    xdp_program(&mut ebpf)?.load()?;
    Ok(ebpf)
}

/// The limiter's XDP program inside a loaded object.
pub fn xdp_program(ebpf: &mut Ebpf) -> Result<&mut Xdp, LoadError> {
    let program = ebpf
        .program_mut(names::PROGRAM)
        .ok_or(LoadError::MissingProgram(names::PROGRAM))?;
    program
        .try_into()
        .map_err(|_| LoadError::MissingProgram(names::PROGRAM))
}
