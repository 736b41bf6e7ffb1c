"""Network lines of NCCL_DEBUG=INFO, and WARN / error-trace lines, into facts.

Format strings by release (NVIDIA/nccl, and the rdma-sharp plugin's ib_plugin.c):
- init.cc / net.cc: "Using network %s" (plugin names may hold spaces: AWS Libfabric).
- transport/net_ib.cc, net_ib/init.cc: "NET/IB : Using%s %s; OOB %s:%s" with " [%d]%s:%d/%s"
  per device (IB or RoCE; 2.30 adds ":rail" or "::plane" after the port; the sharp
  plugin "/SHARP"; its fused NICs print "[0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE}"),
  "[RO]" when relaxed ordering is on, and "NET/IB : No device found.".
- net_socket.cc: "NET/Socket : Using [%d]%s:%s ..." and "NET/Socket: Using %d threads and
  %d sockets per thread"; bootstrap.cc: "Bootstrap : Using %s:%s" ([%d] before 2.12).
- net_ib completion WARNs: "Got completion from peer %s with error %d, opcode %d, len
  %d, vendor err %d (%s) localGid %s remoteGid %s" (< 2.20), "... with status=%d
  opcode=%d len=%u vendor err %u (%s) localGid %s remoteGids%s hca %s" (2.20+), and
  "with status=IBV_WC_..(%d) opcode=IBV_WC_..(%d) vendor_err=%u" (newest).
- include/checks.h: INFO "%s:%d (%s) -> %d" (older: "%s:%d -> %d"), with the thread's
  name after it in the proxy and async threads.
"""

from __future__ import annotations

import re

from fabricscope.agent.probes.nccl.logparse_facts import (
    ErrorTrace, IbCompletion, IbRequest, NetDevice, NetDevices, NetKind, Network, SocketThreads,
    Warn)
from fabricscope.agent.probes.nccl.logparse_prefix import Garbled, LogLine, to_int

_NETWORK = re.compile(r"^Using network (?P<net>\S.*)$")
_SOCK_THREADS = re.compile(
    r"^NET/Socket ?: Using (?P<t>\d+) threads and (?P<s>\d+) sockets per thread$")
_IB_DEVS = re.compile(r"^NET/IB ?: Using(?P<devs>.*?) *(?P<ro>\[RO\])? *(?:;(?: OOB (?P<oob>.*))?)?$")
_IB_NONE = re.compile(r"^NET/IB ?: No device found\.?$")
_IB_GROUP = re.compile(r"\[(?P<g>\d+)\]=\{(?P<inner>[^{}]*)\}")
_IB_DEV = re.compile(r"\[(?P<i>\d+)\] ?(?P<name>[^\s:\[\]{},]+):(?P<port>\d+)(?::[^/\s]*)?"
                     r"/(?P<link>\w+)(?P<sharp>/SHARP)?,?")
_SOCK_DEVS = re.compile(r"^(?P<what>NET/Socket|Bootstrap) ?: Using(?P<devs>(?: +\S+)*)$")
_ADDR_DEV = re.compile(r"(?:\[(?P<i>\d+)\])?(?P<name>[^\s:\[\]]+):(?P<addr>\S+)")
_TRACE = re.compile(r"^(?P<file>[\w./-]+\.\w+):(?P<line>\d+)(?: \((?P<func>[^)]*)\))? "
                    r"-> (?P<code>\d+)(?P<rest>.*)$")
_COMPLETION = re.compile(r"Got completion from peer (?P<peer>\S*?)(?:<(?P<port>\d+)>)? with ")
_STATUS = re.compile(r"with (?:status=(?:IBV_WC_\w+\()?(?P<code>\d+)\)?|error (?P<old>\d+))")
_FIELDS = {
    "opcode": re.compile(r"opcode[= ](?:\w+\()?(?P<v>\d+)"),
    "length": re.compile(r"\blen[= ](?P<v>\d+)"),
    "vendor_err": re.compile(r"vendor[ _]err[= ](?P<v>\d+)"),
}
_TEXT_FIELDS = {
    "local_gid": re.compile(r"localGid (?P<v>[^\s,]+)"),
    "remote_gid": re.compile(r"remoteGids? ?(?P<v>[^\s,]+)"),
    "hca": re.compile(r"\bhca (?P<v>\S+)"),
}
_REQUEST = re.compile(r"\((?P<v>Send|Recv|Flush|IPut|Unused)\)")


def network(msg: str) -> list | None:
    if m := _NETWORK.match(msg):
        return [Network(m.group("net").strip())]
    if m := _SOCK_THREADS.match(msg):
        return [SocketThreads(to_int(m.group("t")), to_int(m.group("s")))]
    if _IB_NONE.match(msg):
        return [NetDevices(NetKind.IB, ())]
    if m := _IB_DEVS.match(msg):
        oob = (m.group("oob") or "").strip()
        return [NetDevices(NetKind.IB, _ib_devices(m.group("devs")), m.group("ro") is not None,
                           oob if oob.strip(":") else None)]
    if m := _SOCK_DEVS.match(msg):
        net = NetKind.SOCKET if m.group("what") == "NET/Socket" else NetKind.BOOTSTRAP
        return [NetDevices(net, _addr_devices(m.group("devs")))]
    return None


def _ib_devices(text: str) -> tuple[NetDevice, ...]:
    out: list[NetDevice] = []
    for g in _IB_GROUP.finditer(text):
        out += _ib_items(g.group("inner"), to_int(g.group("g")))
    out += _ib_items(_IB_GROUP.sub("", text), None)
    return tuple(sorted(out, key=lambda d: d.index))


def _ib_items(text: str, group: int | None) -> list[NetDevice]:
    if _IB_DEV.sub("", text).strip():
        raise Garbled("NET/IB device list")
    return [NetDevice(to_int(m.group("i")), m.group("name"), to_int(m.group("port")),
                      m.group("link"), group=group, sharp=m.group("sharp") is not None)
            for m in _IB_DEV.finditer(text)]


def _addr_devices(text: str) -> tuple[NetDevice, ...]:
    out = []
    for n, token in enumerate(text.split()):
        m = _ADDR_DEV.fullmatch(token)
        if not m:
            raise Garbled("socket device list")
        out.append(NetDevice(to_int(m.group("i")) if m.group("i") else n, m.group("name"),
                             address=m.group("addr")))
    return tuple(out)


def error_trace(msg: str) -> list | None:
    m = _TRACE.match(msg)
    if not m:
        return None
    thread = m.group("rest").strip() or None
    return [ErrorTrace(m.group("file"), to_int(m.group("line")), m.group("func"),
                       to_int(m.group("code")), thread)]


def warn(ll: LogLine) -> list:
    msg = ll.message
    completion = _completion(msg)
    status = completion.status if completion else None
    if status is None and (m := _STATUS.search(msg)):
        status = to_int(m.group("code") or m.group("old"))
    return [Warn(ll.file or "-", ll.line or 0, ll.func, msg, completion, status)]


def _completion(msg: str) -> IbCompletion | None:
    m = _COMPLETION.search(msg)
    s = _STATUS.search(msg)
    if not m or not s:
        return None
    rest = msg[m.end() - len("with "):]
    ints = {name: to_int(f.group("v")) for name, rx in _FIELDS.items() if (f := rx.search(rest))}
    texts = {name: f.group("v") for name, rx in _TEXT_FIELDS.items() if (f := rx.search(rest))}
    req = _REQUEST.search(rest)
    return IbCompletion(m.group("peer"), to_int(m.group("port")) if m.group("port") else None,
                        to_int(s.group("code") or s.group("old")), **ints, **texts,
                        request=IbRequest(req.group("v")) if req else None)
