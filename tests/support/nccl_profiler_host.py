"""A stand-in for NCCL driving the profiler plugin (no GPU, no NCCL here).

Loads the real plugin library with ctypes, takes the `ncclProfiler_vN` struct NCCL would
dlsym, and calls it the way NCCL's sources do (src/plugin/profiler.cc and
src/plugin/profiler/profiler_vN.cc): init with that version's arguments, a Group, the
Coll/P2p task started and stopped at enqueue (before the proxy runs), then on the
"proxy thread" the ProxyOps of each channel and peer, their ProxySteps with their state
transitions (transSize in the args from v4 on, on ProxyOp states before), NetPlugin QP
events under a step, KernelCh events with GPU timer stamps (v4+), and the stops.
Descriptors are ctypes mirrors of NVIDIA's layouts, their sizes checked against the
numbers the C header pins.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

PROFILER_DIR = Path(__file__).resolve().parents[2] / "profiler"
SOURCES = ("abi.c", "events.c", "lifecycle.c", "pool.c", "ring.c")

COLL, P2P, PROXY_OP, PROXY_STEP, KERNEL_CH, NET_PLUGIN = 2, 4, 8, 16, 64, 128
GROUP, PROXY_CTRL, COLL_API = 1, 32, 512
SEND_GPU_WAIT, SEND_WAIT, RECV_WAIT, RECV_FLUSH_WAIT, RECV_GPU_WAIT = 8, 9, 10, 11, 12
SEND_PEER_WAIT_V4, KERNEL_CH_STOP, OP_SEND_TRANSMITTED, OP_RECV_RECEIVED = 20, 22, 2, 5
NET_TYPE_IB_V1 = (1 << 16) | 1

p, u8, i32, u32, u64, sz = (ctypes.c_void_p, ctypes.c_uint8, ctypes.c_int, ctypes.c_uint32,
                            ctypes.c_uint64, ctypes.c_size_t)
s, b = ctypes.c_char_p, ctypes.c_bool


def _struct(name, fields):
    return type(name, (ctypes.Structure,), {"_fields_": fields})


def _union(name, members):
    return type(name, (ctypes.Union,), {"_fields_": members})


PROXY_OP_T = _struct("ProxyOp", [("pid", i32), ("channelId", u8), ("peer", i32), ("nSteps", i32),
                                 ("chunkSize", i32), ("isSend", i32)])
STEP_T = _struct("Step", [("step", i32)])
NET_T = _struct("Net", [("id", ctypes.c_int64), ("data", p)])
V1_COLL = _struct("V1Coll", [("name", s), ("commHash", u64), ("seqNumber", u64), ("func", u8),
                             ("sendBuff", p), ("recvBuff", p), ("count", sz), ("root", i32),
                             ("datatype", u8), ("op", u32), ("trafficBytes", sz),
                             ("nMaxChannels", u8), ("nWarps", u8), ("algo", u8), ("proto", u8),
                             ("isCollnet", i32), ("isNvls", i32)])
V1_P2P = _struct("V1P2p", [("name", s), ("commHash", u64), ("func", u8), ("buff", p),
                           ("datatype", u8), ("count", sz), ("peer", i32)])
V2_COLL = _struct("V2Coll", [("name", s), ("commHash", u64), ("seqNumber", u64), ("func", s),
                             ("sendBuff", p), ("recvBuff", p), ("count", sz), ("root", i32),
                             ("datatype", s), ("trafficBytes", sz), ("nMaxChannels", u8),
                             ("nWarps", u8), ("algo", s), ("proto", s)])
V3_COLL = _struct("V3Coll", [f for f in V2_COLL._fields_ if f[0] != "trafficBytes"])
V2_P2P = _struct("V2P2p", [("name", s), ("commHash", u64), ("func", s), ("buff", p),
                           ("datatype", s), ("count", sz), ("peer", i32)])
V4_COLL = _struct("V4Coll", [("seqNumber", u64), ("func", s), ("sendBuff", p), ("recvBuff", p),
                             ("count", sz), ("root", i32), ("datatype", s), ("nChannels", u8),
                             ("nWarps", u8), ("algo", s), ("proto", s)])
V4_P2P = _struct("V4P2p", [("func", s), ("buff", p), ("datatype", s), ("count", sz),
                           ("peer", i32), ("nChannels", u8)])
V4_KCH = _struct("V4Kch", [("channelId", u8), ("pTimer", u64)])
V5_COLL = _struct("V5Coll", V4_COLL._fields_ + [("parentGroup", p)])
V5_P2P = _struct("V5P2p", V4_P2P._fields_ + [("parentGroup", p)])
V5_API = [("groupApi", _struct("GroupApi", [("graphCaptured", b), ("groupDepth", i32)])),
          ("collApi", _struct("CollApi", [("func", s), ("count", sz), ("datatype", s),
                                          ("root", i32), ("stream", p), ("graphCaptured", b)])),
          ("p2pApi", _struct("P2pApi", [("func", s), ("count", sz), ("datatype", s),
                                        ("stream", p), ("graphCaptured", b)])),
          ("kernelLaunch", _struct("KernelLaunch", [("stream", p)]))]
CE_COLL = _struct("CeColl", [("seqNumber", u64), ("func", s), ("sendBuff", p), ("recvBuff", p),
                             ("count", sz), ("root", i32), ("datatype", s),
                             ("syncStrategy", s), ("intraBatchSync", b), ("batchSize", u32),
                             ("numBatches", u32), ("ceSeqNum", u32), ("stream", p)])

_V5_MEMBERS = V5_API + [("coll", V5_COLL), ("p2p", V5_P2P), ("proxyOp", PROXY_OP_T),
                        ("proxyStep", STEP_T), ("kernelCh", V4_KCH), ("netPlugin", NET_T)]
UNIONS = {
    1: [("coll", V1_COLL), ("p2p", V1_P2P), ("proxyOp", PROXY_OP_T), ("proxyStep", STEP_T)],
    2: [("coll", V2_COLL), ("p2p", V2_P2P), ("proxyOp", PROXY_OP_T), ("proxyStep", STEP_T)],
    3: [("coll", V3_COLL), ("p2p", V2_P2P), ("proxyOp", PROXY_OP_T), ("proxyStep", STEP_T),
        ("kernelCh", _struct("V3Kch", [("channelId", u8)])), ("netPlugin", NET_T)],
    4: [("coll", V4_COLL), ("p2p", V4_P2P), ("proxyOp", PROXY_OP_T), ("proxyStep", STEP_T),
        ("kernelCh", V4_KCH), ("netPlugin", NET_T)],
    5: _V5_MEMBERS,
    6: _V5_MEMBERS + [("ceColl", CE_COLL)],
}
DESCR = {v: _struct(f"DescrV{v}", [("type", u8 if v < 5 else u64), ("parentObj", p),
                                   ("rank", i32), ("u", _union(f"UV{v}", m))])
         for v, m in UNIONS.items()}
ARGS_V1 = _union("ArgsV1", [("proxyOp", _struct("A1", [("transSize", sz), ("steps", i32)])),
                            ("proxyCtrl", _struct("A1c", [("appendedProxyOps", i32)]))])
ARGS_V4 = _union("ArgsV4", [("transSize", sz), ("pTimer", u64)])
IB_QP = _struct("IbDescr", [("type", u8), ("qp", _struct("IbQp", [
    ("device", i32), ("wr_id", u64), ("opcode", i32), ("qpNum", i32), ("length", sz)]))])

#: sizes NVIDIA's headers give on LP64 (pinned by _Static_assert in profiler/fs_nccl_abi.h)
C_SIZES = {"descr_v1": 120, "descr_v2": 128, "descr_v3": 120, "descr_v4": 104, "descr_v5": 112,
           "descr_v6": 112, "args_v1": 16, "args_v4": 8, "ib_qp": 40}


def mirror_sizes() -> dict[str, int]:
    out = {f"descr_v{v}": ctypes.sizeof(d) for v, d in DESCR.items()}
    return {**out, "args_v1": ctypes.sizeof(ARGS_V1), "args_v4": ctypes.sizeof(ARGS_V4),
            "ib_qp": ctypes.sizeof(IB_QP)}


def build_plugin(out_dir: Path) -> Path:
    """Compiles the plugin from profiler/ with gcc (what `make profiler` does)."""
    out = Path(out_dir) / "libnccl-profiler-fabricscope.so"
    cmd = ["gcc", "-O2", "-std=gnu11", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra",
           "-Werror", "-shared", "-o", str(out), *[str(PROFILER_DIR / f) for f in SOURCES]]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def _signatures(version: int):
    descr, args = ctypes.POINTER(DESCR[version]), ctypes.POINTER(ARGS_V1 if version < 4 else ARGS_V4)
    if version < 4:
        init = ctypes.CFUNCTYPE(i32, ctypes.POINTER(p), ctypes.POINTER(i32))
    elif version == 4:
        init = ctypes.CFUNCTYPE(i32, ctypes.POINTER(p), ctypes.POINTER(i32), s, u64, i32, i32, i32, p)
    else:
        init = ctypes.CFUNCTYPE(i32, ctypes.POINTER(p), u64, ctypes.POINTER(i32), s, i32, i32, i32, p)
    return _struct(f"PluginV{version}", [
        ("name", s), ("init", init),
        ("startEvent", ctypes.CFUNCTYPE(i32, p, ctypes.POINTER(p), descr)),
        ("stopEvent", ctypes.CFUNCTYPE(i32, p)),
        ("recordEventState", ctypes.CFUNCTYPE(i32, p, i32, args)),
        ("finalize", ctypes.CFUNCTYPE(i32, p))])


class NcclHost:
    """One process's NCCL, profiling through one ABI version. Each instance loads its own
    copy of the library (its pool and ring are per load), writing rings into ring_dir."""

    _loads = 0

    def __init__(self, library: Path, version: int, ring_dir: Path, pool: int = 1024,
                 records: int = 1024):
        os.environ["FABRICSCOPE_NCCLPROF_DIR"] = str(ring_dir)
        os.environ["FABRICSCOPE_NCCLPROF_POOL"] = str(pool)
        os.environ["FABRICSCOPE_NCCLPROF_RECORDS"] = str(records)
        NcclHost._loads += 1
        copy = Path(ring_dir) / f"plugin-{NcclHost._loads}.so"
        shutil.copy(library, copy)
        self.lib = ctypes.CDLL(str(copy), mode=os.RTLD_LOCAL)
        self.version = version
        self.api = _signatures(version).in_dll(self.lib, f"ncclProfiler_v{version}")
        self.ring_path = Path(ring_dir) / f"fabricscope-ncclprof-{os.getpid()}.ring"
        self._keep: list = []       # strings and net descriptors NCCL would keep alive

    def init(self, comm_hash=0x1234ABCD, nnodes=2, nranks=16, rank=3) -> tuple[int, int]:
        ctx, mask = p(), i32(0)
        if self.version < 4:
            rc = self.api.init(ctypes.byref(ctx), ctypes.byref(mask))
        elif self.version == 4:
            rc = self.api.init(ctypes.byref(ctx), ctypes.byref(mask), b"comm", comm_hash,
                               nnodes, nranks, rank, None)
        else:
            rc = self.api.init(ctypes.byref(ctx), comm_hash, ctypes.byref(mask), b"comm",
                               nnodes, nranks, rank, None)
        assert rc == 0
        return ctx.value, mask.value

    def start(self, ctx, type_: int, parent=None, rank=3, **members) -> int | None:
        d = DESCR[self.version]()
        d.type, d.parentObj, d.rank = type_, parent, rank
        for path, value in members.items():
            target, *rest = path.split("__")
            obj = getattr(d.u, target)
            for part in rest[:-1]:
                obj = getattr(obj, part)
            if isinstance(value, str):
                value = value.encode()
                self._keep.append(value)
            setattr(obj, rest[-1], value)
        handle = p()
        assert self.api.startEvent(ctx, ctypes.byref(handle), ctypes.byref(d)) == 0
        return handle.value

    def state(self, handle, state: int, size: int = 0, ptimer: int = 0) -> None:
        if self.version < 4:
            a = ARGS_V1()
            a.proxyOp.transSize = size
        else:
            a = ARGS_V4()
            if state == KERNEL_CH_STOP:
                a.pTimer = ptimer
            else:
                a.transSize = size
        assert self.api.recordEventState(handle, state, ctypes.byref(a)) == 0

    def stop(self, handle) -> None:
        assert self.api.stopEvent(handle) == 0

    def finalize(self, ctx) -> None:
        assert self.api.finalize(ctx) == 0

    def ib_qp(self, qp_num: int, length: int) -> int:
        d = IB_QP(type=1)
        d.qp.wr_id, d.qp.qpNum, d.qp.length = 7, qp_num, length
        self._keep.append(d)
        return ctypes.addressof(d)


def pool_in_use(host: NcclHost) -> int:
    fn = host.lib.fabricscope_ncclprof_pool_in_use
    fn.restype = u32
    return fn()


def collective(host: NcclHost, ctx, *, seq=0, channels=2, peers=(1,), steps=4, chunk=65536,
               gpu0=1_000_000, count=1 << 20, net=True) -> dict:
    """One AllReduce (float32, RING, SIMPLE) in NCCL's order: Group, task started and
    stopped at enqueue, then per channel a KernelCh and per peer a send and a receive
    ProxyOp with their steps, then the kernel's end."""
    v = host.version
    group = host.start(ctx, GROUP)
    parent = host.start(ctx, COLL_API, collApi__func="AllReduce") if v >= 5 else group
    if v == 1:
        fields = dict(coll__commHash=0xC0FFEE, coll__func=4, coll__datatype=7, coll__algo=1,
                      coll__proto=2, coll__nMaxChannels=channels)
    else:
        fields = dict(coll__func="AllReduce", coll__datatype="ncclFloat32", coll__algo="RING",
                      coll__proto="SIMPLE")
        fields.update({"coll__nMaxChannels" if v < 4 else "coll__nChannels": channels})
        if v < 4:
            fields["coll__commHash"] = 0xC0FFEE
    if v >= 5:
        fields["coll__parentGroup"] = group
    coll = host.start(ctx, COLL, parent, coll__seqNumber=seq, coll__count=count,
                      coll__nWarps=16, **fields)
    host.stop(coll)
    host.stop(group)
    kernels = [host.start(ctx, KERNEL_CH, coll, kernelCh__channelId=c,
                          **({"kernelCh__pTimer": gpu0 + c} if v >= 4 else {}))
               if v >= 3 else None for c in range(channels)]
    for c in range(channels):
        for peer in peers:
            for is_send in (1, 0):
                _proxy_op(host, ctx, coll, c, peer, is_send, steps, chunk, net)
    for c, k in enumerate(kernels):
        if k is not None:
            if v >= 4:
                host.state(k, KERNEL_CH_STOP, ptimer=gpu0 + 5000 + c)
            host.stop(k)
    return {"coll": coll, "group": group}


def _proxy_op(host, ctx, coll, channel, peer, is_send, steps, chunk, net):
    op = host.start(ctx, PROXY_OP, coll, proxyOp__pid=os.getpid(), proxyOp__channelId=channel,
                    proxyOp__peer=peer, proxyOp__nSteps=steps, proxyOp__chunkSize=chunk,
                    proxyOp__isSend=is_send)
    states = ((SEND_GPU_WAIT, SEND_PEER_WAIT_V4, SEND_WAIT) if is_send else
              (RECV_WAIT, RECV_FLUSH_WAIT, RECV_GPU_WAIT))
    for step in range(steps):
        h = host.start(ctx, PROXY_STEP, op, proxyStep__step=step)
        for st in states:
            host.state(h, st, size=chunk)
            if net and st == SEND_WAIT and host.version >= 3:
                ev = host.start(ctx, NET_PLUGIN, h, netPlugin__id=NET_TYPE_IB_V1,
                                netPlugin__data=host.ib_qp(0x1A2, chunk))
                host.stop(ev)
        host.stop(h)
    if host.version < 4:
        host.state(op, OP_SEND_TRANSMITTED if is_send else OP_RECV_RECEIVED, size=steps * chunk)
    host.stop(op)
