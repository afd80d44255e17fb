//! What the verifier spends on each function of the program: `check
//! --functions`.
//!
//! The kernel reports a program's processed instructions as one figure
//! (`verified_insns`). The split by function is only in the verifier's log
//! at its most verbose level, which prints every instruction it processes;
//! aya keeps no log of a program it loaded. So this loads the program once
//! more, by hand from the same object: aya-obj parses and relocates it
//! against maps aya created, and one `BPF_PROG_LOAD` asks for that log
//! (hundreds of megabytes on 6.1). Each processed instruction, and each
//! visit the verifier pruned (`from A to B: safe`, counted as processed
//! too), is then charged to the function whose range holds it
//! (`func#N @start`): global
//! functions are verified on their own, static ones (the compiler's
//! `memset`) inline with their callers.

use std::{
    collections::HashSet,
    ffi::CString,
    os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
};

use aya::{
    maps::{Map, MapData},
    EbpfLoader,
};
use aya_obj::{
    btf::BtfFeatures,
    generated::{bpf_attr, bpf_cmd, bpf_prog_type},
    Object,
};

use super::EBPF_OBJECT;

/// The log buffer: the verifier of 6.18 writes about 300 MB for the
/// program at this level; the kernel takes at most 1 GiB - 1.
const LOG_BYTES: usize = 1 << 30;

/// Why the split could not be had.
#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    #[error("parsing the program's object: {0}")]
    Parse(String),
    #[error("creating the program's maps: {0}")]
    Maps(#[from] aya::EbpfError),
    #[error("the object has no program `{0}`")]
    MissingProgram(String),
    #[error("loading the program's BTF: {0}")]
    Btf(std::io::Error),
    #[error("the verifier refused the program ({error}); its last line: {last}")]
    Refused { error: std::io::Error, last: String },
}

/// One function's share of the processed instructions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionCost {
    /// `func#N` in the verifier's numbering (0: the program's entry).
    pub index: usize,
    /// Its name where the log gives it (the entry point and global
    /// functions), else `func#N`.
    pub name: String,
    /// Its first instruction.
    pub start: usize,
    /// Instructions the verifier processed inside it.
    pub instructions: u64,
}

/// Loads `program` of the embedded object with the verifier's full log and
/// splits its processed instructions by function.
pub fn per_function(program: &str) -> Result<Vec<FunctionCost>, VerifierError> {
    // The maps, created by aya as for the product (default capacities):
    // the relocations need their descriptors.
    let ebpf = EbpfLoader::new().load(EBPF_OBJECT)?;
    let mut fds = Vec::new();
    for (name, map) in ebpf.maps() {
        if let Some(data) = map_data(map) {
            fds.push((name.to_string(), data.fd().as_fd().as_raw_fd()));
        }
    }
    let mut object = Object::parse(EBPF_OBJECT).map_err(|e| VerifierError::Parse(e.to_string()))?;
    // Every kernel the program loads on (6.1 and later) has every BTF
    // feature, so nothing is sanitized away.
    let features = BtfFeatures::new(true, true, true, true, true, true, true, true);
    let btf_fd = match object
        .fixup_and_sanitize_btf(&features)
        .map_err(|e| VerifierError::Parse(e.to_string()))?
    {
        Some(btf) => Some(load_btf(&btf.to_bytes())?),
        None => None,
    };
    let text_sections: HashSet<usize> = object
        .functions
        .keys()
        .map(|(section, _)| *section)
        .collect();
    let maps: Vec<(String, RawFd, aya_obj::Map)> = fds
        .into_iter()
        .filter_map(|(name, fd)| Some((name.clone(), fd, object.maps.get(&name)?.clone())))
        .collect();
    object
        .relocate_maps(
            maps.iter().map(|(name, fd, map)| (name.as_str(), *fd, map)),
            &text_sections,
        )
        .map_err(|e| VerifierError::Parse(e.to_string()))?;
    object
        .relocate_calls(&text_sections)
        .map_err(|e| VerifierError::Parse(e.to_string()))?;
    let entry = object
        .programs
        .get(program)
        .ok_or_else(|| VerifierError::MissingProgram(program.into()))?;
    let function = object
        .functions
        .get(&entry.function_key())
        .ok_or_else(|| VerifierError::MissingProgram(program.into()))?;
    let license = entry.license.clone();
    let mut log = vec![0u8; LOG_BYTES];
    let loaded = load_program(program, function, &license, btf_fd.as_ref(), &mut log);
    let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    match loaded {
        Ok(_fd) => Ok(split(&text, program)),
        Err(error) => Err(VerifierError::Refused {
            error,
            last: text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .to_string(),
        }),
    }
}

/// The data of a map of one of the kinds the program uses (`None` for
/// any other kind).
pub fn map_data(map: &Map) -> Option<&MapData> {
    match map {
        Map::Array(data)
        | Map::PerCpuArray(data)
        | Map::LpmTrie(data)
        | Map::HashMap(data)
        | Map::LruHashMap(data)
        | Map::PerCpuLruHashMap(data)
        | Map::RingBuf(data) => Some(data),
        _ => None,
    }
}

/// Charges each processed instruction of a level-2 `log` to its function.
pub fn split(log: &str, program: &str) -> Vec<FunctionCost> {
    let mut functions: Vec<FunctionCost> = Vec::new();
    let mut counts: Vec<u64> = Vec::new();
    for line in log.lines() {
        // "func#2 @3060": the functions and their first instructions.
        if let Some(rest) = line.strip_prefix("func#") {
            if let Some((index, start)) = rest.split_once(" @") {
                if let (Ok(index), Ok(start)) = (index.parse(), start.trim().parse()) {
                    functions.push(FunctionCost {
                        index,
                        name: if index == 0 {
                            program.to_string()
                        } else {
                            format!("func#{index}")
                        },
                        start,
                        instructions: 0,
                    });
                    counts.push(0);
                }
            }
            continue;
        }
        // "Validating limit() func#2...": a global function's name.
        if let Some(rest) = line.strip_prefix("Validating ") {
            if let Some((name, index)) = rest.split_once("() func#") {
                let index: usize = index.trim_end_matches('.').parse().unwrap_or(usize::MAX);
                if let Some(f) = functions.iter_mut().find(|f| f.index == index) {
                    f.name = name.to_string();
                }
            }
            continue;
        }
        // "3127: (bf) r1 = r6": one processed instruction. "from 13 to 15:
        // safe" and "15: safe": a visit the verifier counted as processed
        // and then pruned (an equivalent state was already safe there).
        let insn = if let Some(visit) = line.strip_suffix(": safe") {
            let target = visit.rsplit(" to ").next().unwrap_or(visit);
            match target.trim().parse::<usize>() {
                Ok(insn) => insn,
                Err(_) => continue,
            }
        } else {
            let Some((insn, rest)) = line.split_once(": (") else {
                continue;
            };
            let Ok(insn) = insn.parse::<usize>() else {
                continue;
            };
            if !rest.starts_with(|c: char| c.is_ascii_hexdigit()) {
                continue;
            }
            insn
        };
        if let Some(at) = functions.iter().rposition(|f| f.start <= insn) {
            counts[at] += 1;
        }
    }
    for (f, n) in functions.iter_mut().zip(counts) {
        f.instructions = n;
    }
    functions
}

/// `BPF_BTF_LOAD`.
fn load_btf(raw: &[u8]) -> Result<OwnedFd, VerifierError> {
    // SAFETY: a zeroed bpf_attr is the documented "no options" value.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the BTF_LOAD member of the union; `raw` outlives the call.
    let u = unsafe { &mut attr.__bindgen_anon_7 };
    u.btf = raw.as_ptr() as u64;
    u.btf_size = raw.len() as u32;
    // SAFETY: BPF_BTF_LOAD returns a new descriptor or -1.
    unsafe { sys_bpf_fd(bpf_cmd::BPF_BTF_LOAD, &mut attr) }.map_err(VerifierError::Btf)
}

/// `BPF_PROG_LOAD` of an XDP program with the verifier's log at level 2
/// and statistics into `log`.
fn load_program(
    name: &str,
    function: &aya_obj::Function,
    license: &CString,
    btf_fd: Option<&OwnedFd>,
    log: &mut [u8],
) -> std::io::Result<OwnedFd> {
    let func_info = function.func_info.func_info_bytes();
    let line_info = function.line_info.line_info_bytes();
    // SAFETY: a zeroed bpf_attr is the documented "no options" value.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the PROG_LOAD member of the union; every buffer it points to
    // (instructions, license, infos, log) outlives the call.
    let u = unsafe { &mut attr.__bindgen_anon_3 };
    for (dst, src) in u.prog_name.iter_mut().zip(name.bytes().take(15)) {
        *dst = src as _;
    }
    u.prog_type = bpf_prog_type::BPF_PROG_TYPE_XDP as u32;
    u.insns = function.instructions.as_ptr() as u64;
    u.insn_cnt = function.instructions.len() as u32;
    u.license = license.as_ptr() as u64;
    if let Some(fd) = btf_fd {
        u.prog_btf_fd = fd.as_raw_fd() as u32;
        if function.func_info_rec_size > 0 {
            u.func_info = func_info.as_ptr() as u64;
            u.func_info_cnt = function.func_info.len() as u32;
            u.func_info_rec_size = function.func_info_rec_size as u32;
        }
        if function.line_info_rec_size > 0 {
            u.line_info = line_info.as_ptr() as u64;
            u.line_info_cnt = function.line_info.len() as u32;
            u.line_info_rec_size = function.line_info_rec_size as u32;
        }
    }
    // Level 2 (every processed instruction) and statistics.
    u.log_level = 2 | 4;
    u.log_buf = log.as_mut_ptr() as u64;
    u.log_size = (log.len() - 1) as u32;
    // SAFETY: BPF_PROG_LOAD returns a new descriptor or -1.
    unsafe { sys_bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr) }
}

/// The bpf(2) system call for a command that returns a new descriptor.
///
/// # Safety
/// `cmd` must return a new file descriptor on success, and every pointer
/// in `attr` must be valid for the call.
unsafe fn sys_bpf_fd(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<OwnedFd> {
    // SAFETY: the caller's guarantees; the size is the attr's.
    let ret = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_bpf,
            cmd as nix::libc::c_long,
            attr as *mut bpf_attr,
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processed_instructions_are_charged_to_the_function_that_holds_them() {
        let log = "\
func#0 @0
func#1 @10
func#2 @12
Validating limit() func#2...
12: R1=ctx() R10=fp0
12: (bf) r6 = r1
13: (85) call bpf_ktime_get_coarse_ns#160
from 13 to 15: safe
0: (bf) r6 = r1
; let x = 1;
1: (b7) r0 = 1
10: (bf) r1 = r6
11: (95) exit
verification time 12 usec
processed 6 insns (limit 1000000)
";
        let split = split(log, "xdp_limiter");
        let got: Vec<(&str, usize, u64)> = split
            .iter()
            .map(|f| (f.name.as_str(), f.start, f.instructions))
            .collect();
        assert_eq!(
            got,
            vec![("xdp_limiter", 0, 2), ("func#1", 10, 2), ("limit", 12, 3)]
        );
    }
}
