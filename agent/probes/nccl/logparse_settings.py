"""Settings lines of NCCL_DEBUG=INFO into facts: version, environment, affinity,
thread thresholds, channel counts, NVLS support.

Format strings (NVIDIA/nccl):
- init.cc VERSION_STRING "NCCL version %d.%d.%d%s+cuda%d.%d": an INFO line, or (older
  releases, rank 0) a bare printf line without NCCL's prefix.
- misc/param.cc "%s set by environment to %lld." (numeric parameters end in a period);
  socket.cc, net_ib.cc, tuning.cc, ... "NCCL_X set by environment to %s".
- graph/topo.cc "Setting affinity for GPU %d to %s".
- graph/tuning.cc "threadThresholds %ld/%ld/%ld | %ld/%ld/%ld | %ld/%ld/%ld" (2.7-2.17)
  and "... | %ld | %ld" (2.18+: CollNet direct, chain).
- init.cc "%d coll channels, %d p2p channels, %d p2p channels per peer", with
  "%d nvls channels, " (2.17) and "%d collnet channels, " (2.19+) between.
- transport/nvls.cc "NVLS multicast support is %savailable on dev %d".
"""

from __future__ import annotations

import re

from fabricscope.agent.probes.nccl.logparse_facts import (
    Affinity, ChannelCounts, EnvSetting, NvlsSupport, Thresholds, Version)
from fabricscope.agent.probes.nccl.logparse_prefix import Garbled, to_int

VERSION = re.compile(r"(?:^|(?<=[\s:>\])|]))NCCL version (?P<v>\d+\.\d+\.\d+[^\s+]*)"
                     r"(?:\+cuda(?P<cuda>\d+\.\d+))?(?:\s.*)?$")
_ENV = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*) set by environment to (?P<value>.*)$")
_AFFINITY = re.compile(r"^Setting affinity for GPU (?P<gpu>-?\d+) to (?P<mask>[0-9a-fA-F,]+)$")
_THRESHOLDS = re.compile(r"^threadThresholds (?P<tree>-?\d+/-?\d+/-?\d+) \| "
                         r"(?P<ring>-?\d+/-?\d+/-?\d+) \| (?P<rest>[-\d/| ]+)$")
_COUNTS = re.compile(r"^(?P<coll>\d+) coll channels, (?:(?P<collnet>\d+) collnet channels, )?"
                     r"(?:(?P<nvls>\d+) nvls channels, )?(?P<p2p>\d+) p2p channels, "
                     r"(?P<per>\d+) p2p channels per peer$")
_NVLS = re.compile(r"^NVLS multicast support is (?P<not>not )?available on dev (?P<dev>-?\d+)$")


def version(m: re.Match) -> list:
    return [Version(m.group("v"), m.group("cuda"))]


def setting(msg: str) -> list | None:
    if m := VERSION.match(msg):
        return version(m)
    if m := _ENV.match(msg):
        value = m.group("value").strip()
        return [EnvSetting(m.group("name"), value[:-1] if value.endswith(".") else value)]
    if m := _AFFINITY.match(msg):
        return [Affinity(to_int(m.group("gpu")), m.group("mask").lower())]
    if msg.startswith("threadThresholds "):
        return [_thresholds(msg)]
    if m := _COUNTS.match(msg):
        return [ChannelCounts(to_int(m.group("coll")), to_int(m.group("p2p")),
                              to_int(m.group("per")), _opt(m.group("collnet")),
                              _opt(m.group("nvls")))]
    if m := _NVLS.match(msg):
        return [NvlsSupport(m.group("not") is None, to_int(m.group("dev")))]
    return None


def _opt(text: str | None) -> int | None:
    return to_int(text) if text is not None else None


def _thresholds(msg: str) -> Thresholds:
    m = _THRESHOLDS.match(msg)
    if not m:
        raise Garbled("threadThresholds line")
    tree, ring = (tuple(to_int(v) for v in m.group(g).split("/")) for g in ("tree", "ring"))
    rest = tuple(to_int(v) for v in re.split(r"[/| ]+", m.group("rest").strip()) if v)
    return Thresholds(tree, ring, rest)   # type: ignore[arg-type]
