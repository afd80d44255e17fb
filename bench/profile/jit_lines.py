#!/usr/bin/env python3
"""Where a `bench xdp` case spends its time in the limiter's program, by
source line: `perf record` of the bench, with each sample in the JIT'd
program mapped to its source line through the kernel's own line table
(`jited_line_info` of BPF_OBJ_GET_INFO_BY_FD and the program's BTF).
Needs root and perf; no libbfd (Debian's perf and bpftool have none, so
they cannot annotate BPF themselves).

    cargo build --release -p limiter-bench --bin bench-xdp
    python3 bench/profile/jit_lines.py under_limit [target/release/bench-xdp]
    python3 bench/profile/jit_lines.py --running 5 [CPU]

`--running SECONDS`: the newest `xdp_limiter` program already loaded (a
daemon's, during a `bench e2e` cell), every CPU (or only CPU) sampled
for that long.

A sample lands on the instruction after a slow one (a map helper's return
is charged to the line that called it). Shares are of the samples inside
the limiter's program; helpers and the rest of the kernel are listed by
symbol below them, as shares of all samples.
"""
import bisect
import collections
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

NR_BPF = 321  # x86_64
PROG_GET_NEXT_ID, PROG_GET_FD_BY_ID, OBJ_GET_INFO_BY_FD, BTF_GET_FD_BY_ID = 11, 13, 15, 19
INFO_LEN = 240
libc = ctypes.CDLL(None, use_errno=True)


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 128)
    r = libc.syscall(NR_BPF, cmd, buf, 128)
    if r < 0:
        raise OSError(ctypes.get_errno(), f"bpf({cmd})")
    return r, buf.raw


def info(fd, raw):
    buf = ctypes.create_string_buffer(bytes(raw), len(raw))
    bpf(OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", fd, len(raw), ctypes.addressof(buf)))
    return bytearray(buf.raw)


def newest_program(name):
    """The fd of the newest loaded program called `name`, or None."""
    found, prog_id = None, 0
    while True:
        try:
            _, raw = bpf(PROG_GET_NEXT_ID, struct.pack("<III", prog_id, 0, 0))
        except OSError:
            return found
        prog_id = struct.unpack_from("<I", raw, 4)[0]
        try:
            fd, _ = bpf(PROG_GET_FD_BY_ID, struct.pack("<III", prog_id, 0, 0))
        except OSError:
            continue
        got = info(fd, bytearray(INFO_LEN))
        if got[64:80].split(b"\0")[0].decode() == name:
            if found is not None:
                os.close(found)
            found = fd
        else:
            os.close(fd)


def line_table(fd):
    """Every JIT'd function's range and the source line at each address."""
    first = info(fd, bytearray(INFO_LEN))
    nks, nfl = struct.unpack_from("<II", first, 104)
    btf_id = struct.unpack_from("<I", first, 128)[0]
    nli = struct.unpack_from("<I", first, 148)[0]
    njli, lrs, jlrs = struct.unpack_from("<III", first, 168)
    bufs = [ctypes.create_string_buffer(max(n, 1)) for n in (8 * nks, 4 * nfl, lrs * nli, jlrs * njli)]
    raw = bytearray(INFO_LEN)
    struct.pack_into("<II", raw, 104, nks, nfl)
    struct.pack_into("<QQ", raw, 112, ctypes.addressof(bufs[0]), ctypes.addressof(bufs[1]))
    struct.pack_into("<I", raw, 148, nli)
    struct.pack_into("<QQ", raw, 152, ctypes.addressof(bufs[2]), ctypes.addressof(bufs[3]))
    struct.pack_into("<III", raw, 168, njli, lrs, jlrs)
    info(fd, raw)
    starts = struct.unpack_from(f"<{nks}Q", bufs[0].raw)
    lens = struct.unpack_from(f"<{nfl}I", bufs[1].raw)
    btf_fd, _ = bpf(BTF_GET_FD_BY_ID, struct.pack("<III", btf_id, 0, 0))
    size = struct.unpack_from("<I", info(btf_fd, bytearray(32)), 8)[0]
    btf = ctypes.create_string_buffer(size)
    raw = bytearray(32)
    struct.pack_into("<QI", raw, 0, ctypes.addressof(btf), size)
    info(btf_fd, raw)
    hdr_len, _, _, str_off, str_len = struct.unpack_from("<IIIII", btf.raw, 4)
    strings = btf.raw[hdr_len + str_off : hdr_len + str_off + str_len]

    def text(off):
        return strings[off : strings.index(b"\0", off)].decode(errors="replace")

    lines = []
    for i in range(nli):
        _, file_off, line_off, line_col = struct.unpack_from("<IIII", bufs[2].raw, i * lrs)
        addr = struct.unpack_from("<Q", bufs[3].raw, i * jlrs)[0]
        where = f"{os.path.basename(text(file_off))}:{line_col >> 10}"
        lines.append((addr, where, text(line_off).strip()[:80]))
    lines.sort()
    return list(zip(starts, lens)), lines


def main():
    data = tempfile.mktemp(suffix=".perf")
    if sys.argv[1] == "--running":
        case = "running"
        fd = newest_program("xdp_limiter")
        if fd is None:
            sys.exit("no xdp_limiter program is loaded")
        functions, lines = line_table(fd)
        cpus = ["-C", sys.argv[3]] if len(sys.argv) > 3 else ["-a"]
        subprocess.run(
            ["perf", "record", "-q", "-e", "cpu-clock", *cpus, "-o", data, "--", "sleep", sys.argv[2]],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
    else:
        case = sys.argv[1]
        bench = sys.argv[2] if len(sys.argv) > 2 else "target/release/bench-xdp"
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-e", "cpu-clock", "-o", data, "--", bench, case],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        fd = None
        while fd is None and perf.poll() is None:
            time.sleep(0.02)
            fd = newest_program("xdp_limiter")
        if fd is None:
            sys.exit("the bench ended before its program could be read")
        functions, lines = line_table(fd)
        perf.wait()
    script = subprocess.run(
        ["perf", "script", "-i", data, "-F", "ip,sym"], capture_output=True, text=True
    ).stdout
    os.unlink(data)
    addrs = [a for a, _, _ in lines]
    by_line, by_symbol = collections.Counter(), collections.Counter()
    inside = total = 0
    for sample in script.splitlines():
        fields = sample.split()
        if not fields:
            continue
        total += 1
        by_symbol[fields[1] if len(fields) > 1 else "?"] += 1
        ip = int(fields[0], 16)
        if not any(start <= ip < start + n for start, n in functions):
            continue
        inside += 1
        _, where, src = lines[bisect.bisect_right(addrs, ip) - 1]
        by_line[(where, src)] += 1
    print(json.dumps({"case": case, "samples": total, "in_program": inside}))
    for (where, src), n in by_line.most_common(40):
        print(f"{100 * n / max(inside, 1):5.1f}%  {where:24} {src}")
    print("-- by symbol, of all samples")
    for symbol, n in by_symbol.most_common(15):
        print(f"{100 * n / total:5.1f}%  {symbol}")


if __name__ == "__main__":
    main()
