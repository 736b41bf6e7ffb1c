"""Batched BPF map reads (BPF_MAP_LOOKUP_BATCH) through the bpf() syscall.

BCC reads a map one key per syscall; the NIC flow table and counters hold
thousands of entries, so the probe reads a whole key range in one call (kernel
5.6+) and decodes the bytes with numpy. The NIC bin rings are not read through
bpf() at all: map_array() maps the array into memory. Layout of the syscall's attribute (uapi
linux/bpf.h, `union bpf_attr`, the `batch` member):

    u64 in_batch   u64 out_batch   u64 keys   u64 values
    u32 count      u32 map_fd      u64 elem_flags   u64 flags

For arrays the batch token is the previous key (a u32 index); for hash maps an
opaque u32 bucket cursor. A per-CPU map returns, per key, one value per possible
CPU, each rounded up to 8 bytes.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import platform
from pathlib import Path

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_MAP_LOOKUP_BATCH = 24


class _BatchAttr(ctypes.Structure):
    _fields_ = [("in_batch", ctypes.c_uint64), ("out_batch", ctypes.c_uint64),
                ("keys", ctypes.c_uint64), ("values", ctypes.c_uint64),
                ("count", ctypes.c_uint32), ("map_fd", ctypes.c_uint32),
                ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class BatchUnsupported(OSError):
    """The kernel has no batch lookup for this map type (before 5.6)."""


_POSSIBLE = Path("/sys/devices/system/cpu/possible")


def _possible_ranges(path: Path) -> list[tuple[int, int]]:
    """The CPU id ranges of a cpulist such as "0-3,8-11" (inclusive)."""
    out = []
    for part in path.read_text().strip().split(","):
        lo, _, hi = part.partition("-")
        out.append((int(lo), int(hi or lo)))
    return out


def possible_cpus(path: Path = _POSSIBLE) -> int:
    """Number of possible CPUs: how many values a per-CPU map returns per key."""
    return sum(hi - lo + 1 for lo, hi in _possible_ranges(path))


def cpu_id_limit(path: Path = _POSSIBLE) -> int:
    """Highest possible CPU id + 1: what bpf_get_smp_processor_id() stays below."""
    return max(hi for _, hi in _possible_ranges(path)) + 1


def map_array(map_fd: int, nbytes: int) -> mmap.mmap:
    """Map a BPF_F_MMAPABLE array's values (nbytes of them) read-only into memory."""
    return mmap.mmap(map_fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)


def percpu_stride(value_size: int) -> int:
    return (value_size + 7) & ~7


@functools.lru_cache(maxsize=None)
def _libc() -> ctypes.CDLL:
    """libc, loaded once: dlopen on every call cost more than the syscalls it makes."""
    return ctypes.CDLL(None, use_errno=True)


def _syscall(attr: _BatchAttr) -> int:
    """Returns 0, or the errno (ENOENT: the map was read to its end)."""
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        raise BatchUnsupported(errno.ENOSYS, f"bpf() syscall number unknown on {platform.machine()}")
    libc = _libc()
    rc = libc.syscall(nr, BPF_MAP_LOOKUP_BATCH, ctypes.byref(attr), ctypes.sizeof(attr))
    return 0 if rc == 0 else ctypes.get_errno()


def read_array_range(map_fd: int, start: int, count: int, value_bytes: int) -> bytearray:
    """Values of array keys [start, start + count) as one buffer of count * value_bytes.

    value_bytes: the value size as the syscall writes it (per-CPU: stride * CPUs)."""
    keys = (ctypes.c_uint32 * max(count, 1))()
    values = bytearray(count * value_bytes)
    vbuf = (ctypes.c_char * len(values)).from_buffer(values)
    token_in = ctypes.c_uint32(start - 1)
    token_out = ctypes.c_uint32(0)
    done = 0
    while done < count:
        attr = _BatchAttr(in_batch=ctypes.addressof(token_in) if start + done > 0 else 0,
                          out_batch=ctypes.addressof(token_out),
                          keys=ctypes.addressof(keys) + done * 4,
                          values=ctypes.addressof(vbuf) + done * value_bytes,
                          count=count - done, map_fd=map_fd)
        err = _syscall(attr)
        done += attr.count
        if err in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP) and attr.count == 0:
            raise BatchUnsupported(err, "BPF_MAP_LOOKUP_BATCH: " + os.strerror(err))
        if err and err != errno.ENOENT:
            raise OSError(err, "BPF_MAP_LOOKUP_BATCH: " + os.strerror(err))
        if err == errno.ENOENT or attr.count == 0:
            break
        token_in.value = token_out.value
    if done != count:
        raise OSError(errno.ERANGE, f"array read of {count} keys from {start} returned {done}")
    return values


def read_hash(map_fd: int, key_size: int, value_bytes: int, max_entries: int
              ) -> tuple[bytearray, bytearray, int]:
    """Every entry of a hash map: (keys buffer, values buffer, number of entries).

    One pass; entries added or deleted meanwhile may be missed or seen once more
    (the kernel walks buckets), which the flow deltas tolerate."""
    cap = max(max_entries, 1)
    keys = bytearray(cap * key_size)
    values = bytearray(cap * value_bytes)
    kbuf = (ctypes.c_char * len(keys)).from_buffer(keys)
    vbuf = (ctypes.c_char * len(values)).from_buffer(values)
    token_in, token_out = ctypes.c_uint64(0), ctypes.c_uint64(0)
    first, done = True, 0
    while done < cap:
        attr = _BatchAttr(in_batch=0 if first else ctypes.addressof(token_in),
                          out_batch=ctypes.addressof(token_out),
                          keys=ctypes.addressof(kbuf) + done * key_size,
                          values=ctypes.addressof(vbuf) + done * value_bytes,
                          count=cap - done, map_fd=map_fd)
        err = _syscall(attr)
        done += attr.count
        if err == errno.ENOENT:
            break
        if err in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP) and first:
            raise BatchUnsupported(err, "BPF_MAP_LOOKUP_BATCH: " + os.strerror(err))
        if err:
            raise OSError(err, "BPF_MAP_LOOKUP_BATCH: " + os.strerror(err))
        first = False
        token_in.value = token_out.value
    return keys, values, done


BPF_PROG_TEST_RUN = 10


class _TestRunAttr(ctypes.Structure):
    """The `test` member of union bpf_attr through ctx_in/ctx_out (5.3+), then padding."""

    _fields_ = [("prog_fd", ctypes.c_uint32), ("retval", ctypes.c_uint32),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("data_in", ctypes.c_uint64), ("data_out", ctypes.c_uint64),
                ("repeat", ctypes.c_uint32), ("duration", ctypes.c_uint32),
                ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_uint64), ("ctx_out", ctypes.c_uint64),
                ("pad", ctypes.c_uint8 * 64)]


def _test_run(attr: _TestRunAttr) -> None:
    nr = _SYS_BPF.get(platform.machine())
    if nr is None or _libc().syscall(nr, BPF_PROG_TEST_RUN, ctypes.byref(attr),
                                     ctypes.sizeof(attr)) != 0:
        err = ctypes.get_errno() if nr is not None else errno.ENOSYS
        raise OSError(err, "BPF_PROG_TEST_RUN: " + os.strerror(err))


def prog_test_run(prog_fd: int, frame: bytes, repeat: int = 1) -> tuple[int, int]:
    """Run a TC program on `frame` in the kernel (BPF_PROG_TEST_RUN; the skb sits on the
    loopback device of the caller's namespace). Returns (return value, mean ns per run)."""
    data = ctypes.create_string_buffer(frame, len(frame))
    attr = _TestRunAttr(prog_fd=prog_fd, data_size_in=len(frame),
                        data_in=ctypes.addressof(data), repeat=repeat)
    _test_run(attr)
    return ctypes.c_int32(attr.retval).value, attr.duration


def raw_tp_test_run(prog_fd: int, args: list[int]) -> int:
    """Run a raw tracepoint program once with these arguments (ctx->args[]), on this
    CPU (BPF_PROG_TEST_RUN, 5.10+). Returns its return value."""
    ctx = (ctypes.c_uint64 * len(args))(*args)
    attr = _TestRunAttr(prog_fd=prog_fd, ctx_size_in=ctypes.sizeof(ctx),
                        ctx_in=ctypes.addressof(ctx))
    _test_run(attr)
    return ctypes.c_int32(attr.retval).value


BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_GET_FD_BY_ID = 13
_PROG_INFO_SIZE = 256
_NAME_OFFSET = 64           # struct bpf_prog_info: name[16] (uapi, 4.15+)


def _prog_info(prog_fd: int) -> bytes | None:
    """struct bpf_prog_info of a loaded program (BPF_OBJ_GET_INFO_BY_FD), None on failure."""
    nr = _SYS_BPF.get(platform.machine())
    info = ctypes.create_string_buffer(_PROG_INFO_SIZE)
    attr = (ctypes.c_uint32 * 4)(prog_fd, _PROG_INFO_SIZE, 0, 0)
    ctypes.memmove(ctypes.addressof(attr) + 8, ctypes.byref(ctypes.c_uint64(
        ctypes.addressof(info))), 8)
    if nr is None or _libc().syscall(nr, BPF_OBJ_GET_INFO_BY_FD, attr, ctypes.sizeof(attr)) != 0:
        return None
    return info.raw


def prog_name_by_id(prog_id: int) -> str:
    """The kernel's name (first 15 characters) of the loaded program with this id, "?"
    when it went away or cannot be opened (needs root)."""
    nr = _SYS_BPF.get(platform.machine())
    attr = (ctypes.c_uint32 * 3)(prog_id, 0, 0)          # prog_id, next_id, open_flags
    fd = -1 if nr is None else _libc().syscall(nr, BPF_PROG_GET_FD_BY_ID, attr,
                                               ctypes.sizeof(attr))
    if fd < 0:
        return "?"
    try:
        info = _prog_info(fd)
    finally:
        os.close(fd)
    if info is None:
        return "?"
    return info[_NAME_OFFSET:_NAME_OFFSET + 16].split(b"\0")[0].decode() or "?"
