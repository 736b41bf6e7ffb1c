"""Facts of NCCL_DEBUG lines into records (nccl_log_coll, nccl_log_comm, nccl_topology,
nccl_net, nccl_log_setting, nccl_warn; fabricscope/measurements/collectives.py).

Every record carries the line prefix's host and pid as tags and its [dev] as a
field, and the launcher's name and rank when a launcher's prefix gave them. A
version line printed without NCCL's prefix has no host: its tags say `-` (and
the pid is Ray's when Ray's prefix gave one).
"""

from __future__ import annotations

from fabricscope.agent.probes.nccl import logparse_facts as f
from fabricscope.agent.probes.nccl.logparse_prefix import INT64_MAX, INT64_MIN, Garbled, Launcher, LogLine
from fabricscope import busbw
from fabricscope.records import Record

IBV_WC_STATUS = ("SUCCESS LOC_LEN_ERR LOC_QP_OP_ERR LOC_EEC_OP_ERR LOC_PROT_ERR WR_FLUSH_ERR "
                 "MW_BIND_ERR BAD_RESP_ERR LOC_ACCESS_ERR REM_INV_REQ_ERR REM_ACCESS_ERR "
                 "REM_OP_ERR RETRY_EXC_ERR RNR_RETRY_EXC_ERR LOC_RDD_VIOL_ERR REM_INV_RD_REQ_ERR "
                 "REM_ABORT_ERR INV_EECN_ERR INV_EEC_STATE_ERR FATAL_ERR RESP_TIMEOUT_ERR "
                 "GENERAL_ERR").split()
"""enum ibv_wc_status (rdma-core verbs.h)"""


def ibv_wc_status_name(code: int) -> str:
    return "IBV_WC_" + IBV_WC_STATUS[code] if 0 <= code < len(IBV_WC_STATUS) else f"ibv_wc{code}"


def _hex(value: int) -> str:
    return f"0x{value:x}"


def _dir(values) -> str:
    return "/".join(str(v) for v in values)


def _drop_none(fields: dict) -> dict:
    return {k: v for k, v in fields.items() if v is not None}


def _topology(fact) -> tuple[str, dict, dict]:
    if isinstance(fact, f.Channel):
        tags = {"kind": "channel", "transport": fact.transport, "direction": str(fact.direction)}
        fields = {"channel": fact.channel, "conn": fact.conn, "src_rank": fact.src_rank,
                  "src_dev": fact.src_dev, "src_bus_id": fact.src_bus_id,
                  "dst_rank": fact.dst_rank, "dst_dev": fact.dst_dev,
                  "dst_bus_id": fact.dst_bus_id, "via": fact.via, "net": fact.net,
                  "net_dev": fact.net_dev, "proxy_rank": fact.proxy_rank,
                  "gdrdma": fact.gdrdma, "shared": fact.shared}
        return "nccl_topology", tags, fields
    if isinstance(fact, f.RingOrder):
        fields = {"channel": fact.channel, "nchannels": fact.nchannels,
                  "order": " ".join(str(r) for r in fact.order),
                  "nranks": None if fact.truncated else len(fact.order)}
        return "nccl_topology", {"kind": "ring_order"}, fields
    if isinstance(fact, f.Ring):
        return "nccl_topology", {"kind": "ring"}, {"channel": fact.channel, "prev": fact.prev,
                                                   "rank": fact.rank, "next": fact.next}
    kind = "tree" if fact.half is f.TreeHalf.BOTH else f"tree_{fact.half}"
    return "nccl_topology", {"kind": kind}, {"channel": fact.channel, "up": fact.up,
                                             "rank": fact.rank, "down": _dir(fact.down)}


def _comm(fact) -> tuple[str, dict, dict]:
    if isinstance(fact, f.CommShape):
        return "nccl_log_comm", {"event": "shape", "comm": fact.comm}, {
            "rank": fact.rank, "nranks": fact.nranks, "nnodes": fact.nnodes,
            "local_ranks": fact.local_ranks, "local_rank": fact.local_rank, "mnnvl": fact.mnnvl}
    tags = {"event": str(fact.event), "comm": fact.comm}
    if fact.comm_id is not None:
        tags["comm_id"] = _hex(fact.comm_id)    # as the nccl probe writes it
    return "nccl_log_comm", tags, {
        "rank": fact.rank, "nranks": fact.nranks, "cuda_dev": fact.cuda_dev,
        "nvml_dev": fact.nvml_dev, "bus_id": fact.bus_id, "func": fact.func,
        "parent": fact.parent, "color": fact.color, "key": fact.key}


def _net(fact) -> tuple[str, dict, dict]:
    if isinstance(fact, f.Network):
        return "nccl_net", {"kind": "network"}, {"network": fact.name}
    if isinstance(fact, f.SocketThreads):
        return "nccl_net", {"kind": "socket_threads"}, {
            "threads": fact.threads, "sockets_per_thread": fact.sockets_per_thread}
    devs = " ".join(f"[{d.index}]{d.name}:{d.port}/{d.link}" if d.address is None
                    else f"[{d.index}]{d.name}:{d.address}" for d in fact.devices)
    nics = len({d.index if d.group is None else ("g", d.group) for d in fact.devices})
    return "nccl_net", {"kind": f"{fact.net}_devices"}, {
        "devices": devs, "ndevices": len(fact.devices), "nics": nics, "oob": fact.oob,
        "relaxed_ordering": fact.relaxed_ordering}


def _setting(fact) -> tuple[str, dict, dict]:
    m = "nccl_log_setting"
    if isinstance(fact, f.Version):
        return m, {"kind": "version"}, {"version": fact.version, "cuda": fact.cuda}
    if isinstance(fact, f.EnvSetting):
        return m, {"kind": "env", "name": fact.name}, {"value": fact.value}
    if isinstance(fact, f.Affinity):
        return m, {"kind": "affinity"}, {"gpu": fact.gpu, "mask": fact.mask}
    if isinstance(fact, f.Thresholds):
        return m, {"kind": "thresholds"}, {
            "tree_ll": fact.tree[0], "tree_ll128": fact.tree[1], "tree_simple": fact.tree[2],
            "ring_ll": fact.ring[0], "ring_ll128": fact.ring[1], "ring_simple": fact.ring[2],
            "collnet": _dir(fact.collnet)}
    if isinstance(fact, f.ChannelCounts):
        return m, {"kind": "channel_counts"}, {
            "coll_channels": fact.coll, "collnet_channels": fact.collnet,
            "nvls_channels": fact.nvls, "p2p_channels": fact.p2p,
            "p2p_channels_per_peer": fact.p2p_per_peer}
    return m, {"kind": "nvls_support"}, {"nvls_available": fact.available, "gpu": fact.dev}


def _coll(fact: f.Coll, ll: LogLine) -> tuple[str, dict, dict]:
    fields: dict = {"op_count": fact.op_count, "count": fact.count, "root": fact.root,
                    "stream": fact.stream, "tid": ll.tid, "nranks": fact.nranks}
    size = busbw.datatype_size(fact.datatype)
    if size is not None:
        fields["bytes"] = fact.count * size
        if fact.op in busbw.OPS and (fact.nranks is None or fact.nranks >= 1):
            fields["size_bytes"] = busbw.message_bytes(fact.op, fact.count, size, fact.nranks)
    tags = {"op": fact.op, "datatype": busbw.datatype_name(fact.datatype),
            "redop": busbw.redop_name(fact.redop), "comm": fact.comm}
    return "nccl_log_coll", tags, fields


def _warn(fact, ll: LogLine) -> tuple[str, dict, dict]:
    if isinstance(fact, f.ErrorTrace):
        tags = {"level": "INFO", "file": fact.file, "func": fact.func}
        return "nccl_warn", tags, {"message": ll.message, "line": fact.line, "code": fact.code,
                                   "status": busbw.result_name(fact.code), "tid": ll.tid,
                                   "thread": fact.thread}
    tags = {"level": "WARN", "file": fact.file, "func": fact.func}
    fields: dict = {"message": fact.message, "line": fact.line, "tid": ll.tid}
    if fact.status is not None:
        fields.update(code=fact.status, status=ibv_wc_status_name(fact.status))
    if (c := fact.completion) is not None:
        fields.update(peer=c.peer, peer_port=c.peer_port, opcode=c.opcode, len=c.length,
                      vendor_err=c.vendor_err, request=str(c.request) if c.request else None,
                      local_gid=c.local_gid, remote_gid=c.remote_gid, hca=c.hca)
    return "nccl_warn", tags, fields


_TOPOLOGY = (f.Channel, f.RingOrder, f.Ring, f.Tree)
_COMM = (f.Comm, f.CommShape)
_NET = (f.Network, f.SocketThreads, f.NetDevices)
_SETTING = (f.Version, f.EnvSetting, f.Affinity, f.Thresholds, f.ChannelCounts, f.NvlsSupport)


def _parts(fact, ll: LogLine) -> tuple[str, dict, dict]:
    if isinstance(fact, _TOPOLOGY):
        return _topology(fact)
    if isinstance(fact, _COMM):
        return _comm(fact)
    if isinstance(fact, _NET):
        return _net(fact)
    if isinstance(fact, _SETTING):
        return _setting(fact)
    if isinstance(fact, f.Coll):
        return _coll(fact, ll)
    return _warn(fact, ll)


def _launcher_fields(launcher: Launcher | None) -> dict:
    if launcher is None:
        return {}
    return {"launcher": str(launcher.kind), "launcher_rank": launcher.rank,
            "launcher_ip": launcher.ip}


def to_record(fact, ll: LogLine | None, launcher: Launcher | None, now_ns: int) -> Record:
    """One record for one fact; `ll` is None for a version line without NCCL's prefix."""
    if ll is None:
        measurement, tags, fields = _setting(fact)
        pid = launcher.pid if launcher is not None and launcher.pid is not None else None
        base_tags = {"host": "-", "pid": str(pid) if pid is not None else "-"}
        time_ns = now_ns
    else:
        measurement, tags, fields = _parts(fact, ll)
        base_tags = {"host": ll.host, "pid": str(ll.pid)}
        fields["dev"] = ll.cuda_dev
        time_ns = ll.time_ns or now_ns
    fields = _drop_none({**fields, **_launcher_fields(launcher)})
    for name, value in fields.items():          # derived sizes (count x element) too
        if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
            raise Garbled(f"{name} {value} outside int64")
    return Record(measurement, time_ns, {**base_tags, **_drop_none(tags)}, fields)
