//! Batched reads and writes of hash maps through the raw `bpf(2)` commands
//! `BPF_MAP_LOOKUP_BATCH` and `BPF_MAP_UPDATE_BATCH` (aya 0.14 wraps
//! neither). Reading a million per-CPU entries one key at a time costs two
//! syscalls per key; a batch of 4096 costs one.

use std::{
    io,
    mem::{size_of, MaybeUninit},
    os::fd::{AsFd, AsRawFd, BorrowedFd},
};

use aya::{maps::MapData, Pod};

use super::sys::{bpf, BPF_MAP_LOOKUP_BATCH, BPF_MAP_UPDATE_BATCH};

/// Entries per batch.
pub const BATCH: usize = 4096;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// The fd of a map, for the batch commands.
pub fn fd(map: &MapData) -> BorrowedFd<'_> {
    map.fd().as_fd()
}

/// Bytes the kernel uses per CPU for a value of `V` in per-CPU maps.
const fn per_cpu_stride<V>() -> usize {
    size_of::<V>().div_ceil(8) * 8
}

/// Calls `each(key, per_cpu_values)` for every entry of a per-CPU hash
/// map with `cpus` possible CPUs, `BATCH` entries per syscall. Returns the
/// number of entries seen.
pub fn for_each_per_cpu<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    cpus: usize,
    each: impl FnMut(&K, &[V]),
) -> io::Result<usize> {
    read_per_cpu(fd, cpus, Resume::Start, usize::MAX, each).map(|(seen, _)| seen)
}

/// Where a resumable read stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Resume {
    /// From the start of the map.
    #[default]
    Start,
    /// From this batch token (a bucket index for hash maps).
    At(u64),
}

/// As [`for_each_per_cpu`], from `from`, stopping once at least `budget`
/// entries were read. Returns how many were read and where to go on
/// (`None`: the end of the map was reached).
pub(crate) fn read_per_cpu<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    cpus: usize,
    from: Resume,
    budget: usize,
    each: impl FnMut(&K, &[V]),
) -> io::Result<(usize, Option<Resume>)> {
    assert_eq!(
        per_cpu_stride::<V>(),
        size_of::<V>(),
        "values must be 8-byte multiples"
    );
    lookup_batches(fd, cpus, BATCH, from, budget, each)
}

/// Calls `each(key, value)` for the entries of a hash map that is not
/// per-CPU, `batch` entries per syscall, from `from`, stopping once at
/// least `budget` entries were read. Returns how many were read and where
/// to go on (`None`: the end of the map was reached).
///
/// The kernel's batch token is a bucket index, so a walk visits each
/// bucket once whatever is deleted or added meanwhile: unlike
/// `BPF_MAP_GET_NEXT_KEY`, which starts again from the first bucket when
/// the key it is given was deleted, it cannot go round forever on a map
/// that a flood churns. `batch` must exceed the longest bucket (the kernel
/// answers ENOSPC otherwise); [`BATCH`] does by far.
pub fn read<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    batch: usize,
    from: Resume,
    budget: usize,
    mut each: impl FnMut(&K, &V),
) -> io::Result<(usize, Option<Resume>)> {
    lookup_batches(fd, 1, batch, from, budget, |key, values: &[V]| {
        each(key, &values[0])
    })
}

/// `BPF_MAP_LOOKUP_BATCH` from `from` until the end of the map or at
/// least `budget` entries, `batch` per syscall, each key with its
/// `values_per_key` values (the CPUs of a per-CPU map, else one).
fn lookup_batches<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    values_per_key: usize,
    batch: usize,
    from: Resume,
    budget: usize,
    mut each: impl FnMut(&K, &[V]),
) -> io::Result<(usize, Option<Resume>)> {
    let mut keys: Vec<MaybeUninit<K>> = Vec::with_capacity(batch);
    let mut values: Vec<MaybeUninit<V>> = Vec::with_capacity(batch * values_per_key);
    let mut token = [match from {
        Resume::Start => 0,
        Resume::At(t) => t,
    }];
    let mut next = [0u64; 1];
    let mut first = from == Resume::Start;
    let mut seen = 0;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { token.as_mut_ptr() as u64 },
            out_batch: next.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: batch as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is `bpf_attr.batch`; `keys` and `values` have room
        // for `count` entries (`count * values_per_key` values), the batch
        // tokens are one u64 each.
        let done = match unsafe { bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) } {
            Ok(_) => false,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(e) => return Err(e),
        };
        let count = (attr.count as usize).min(batch);
        // SAFETY: the kernel initialised `count` keys and
        // `count * values_per_key` values (`count` never exceeds what was
        // asked for).
        let (keys_done, values_done) = unsafe {
            (
                std::slice::from_raw_parts(keys.as_ptr().cast::<K>(), count),
                std::slice::from_raw_parts(values.as_ptr().cast::<V>(), count * values_per_key),
            )
        };
        for (key, per_key) in keys_done
            .iter()
            .zip(values_done.chunks_exact(values_per_key))
        {
            each(key, per_key);
        }
        seen += count;
        if done {
            return Ok((seen, None));
        }
        token = next;
        first = false;
        if seen >= budget {
            return Ok((seen, Some(Resume::At(token[0]))));
        }
    }
}

/// Writes `entries` (key, value) into a hash map that is not per-CPU,
/// `BATCH` per syscall. On an error, how many entries were written before
/// it (in order), and the error.
pub fn update<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    entries: &[(K, V)],
) -> Result<(), (usize, io::Error)> {
    let mut written = 0;
    for chunk in entries.chunks(BATCH) {
        let keys: Vec<K> = chunk.iter().map(|(k, _)| *k).collect();
        let values: Vec<V> = chunk.iter().map(|(_, v)| *v).collect();
        update_chunk(fd, &keys, &values).map_err(|(done, e)| (written + done, e))?;
        written += chunk.len();
    }
    Ok(())
}

/// Writes `entries` (key, one value per CPU) into a per-CPU hash map,
/// `BATCH` per syscall.
#[cfg(any(test, feature = "test-util"))]
pub fn update_per_cpu<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    cpus: usize,
    entries: &[(K, Vec<V>)],
) -> io::Result<()> {
    assert_eq!(
        per_cpu_stride::<V>(),
        size_of::<V>(),
        "values must be 8-byte multiples"
    );
    for chunk in entries.chunks(BATCH) {
        let keys: Vec<K> = chunk.iter().map(|(k, _)| *k).collect();
        let values: Vec<V> = chunk
            .iter()
            .flat_map(|(_, v)| {
                assert_eq!(v.len(), cpus, "one value per CPU");
                v.iter().copied()
            })
            .collect();
        update_chunk(fd, &keys, &values).map_err(|(_, e)| e)?;
    }
    Ok(())
}

/// One `BPF_MAP_UPDATE_BATCH` of `keys` with `values` (one per key, or one
/// per key and CPU for a per-CPU map). On an error, how many the kernel
/// wrote before it, and the error.
fn update_chunk<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> Result<(), (usize, io::Error)> {
    assert!(
        !keys.is_empty() && values.len().is_multiple_of(keys.len()),
        "whole values per key"
    );
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: keys.len() as u32,
        map_fd: fd.as_raw_fd() as u32,
        ..BatchAttr::default()
    };
    // SAFETY: `attr` is `bpf_attr.batch`; `keys` holds `count` keys and
    // `values` their values (one per CPU for a per-CPU map, as the map's
    // value size times CPUs), which the kernel reads; on an error it
    // writes back into `count` how many it processed.
    unsafe { bpf(BPF_MAP_UPDATE_BATCH, &mut attr) }
        .map(|_| ())
        .map_err(|e| ((attr.count as usize).min(keys.len()), e))
}
