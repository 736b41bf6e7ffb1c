"""What an NCCL_DEBUG line says, as typed facts (one line gives zero or more).

Each fact is a frozen dataclass whose `kind` names it; logparse_records turns
facts into records. Ranks and devices NCCL prints as -1 ("none") stay -1.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FactKind(StrEnum):
    VERSION = "version"
    ENV = "env"
    NETWORK = "network"
    NET_DEVICES = "net_devices"
    SOCKET_THREADS = "socket_threads"
    COMM = "comm"
    COMM_SHAPE = "comm_shape"
    RING_ORDER = "ring_order"
    RING = "ring"
    TREE = "tree"
    CHANNEL = "channel"
    AFFINITY = "affinity"
    THRESHOLDS = "thresholds"
    CHANNEL_COUNTS = "channel_counts"
    NVLS_SUPPORT = "nvls_support"
    COLL = "coll"
    WARN = "warn"
    ERROR_TRACE = "error_trace"


class NetKind(StrEnum):
    """Which list of network devices a line gives."""
    IB = "ib"                  # NET/IB : Using ...
    SOCKET = "socket"          # NET/Socket : Using ...
    BOOTSTRAP = "bootstrap"    # Bootstrap : Using ...


class CommEvent(StrEnum):
    INIT_START = "init_start"
    INIT_COMPLETE = "init_complete"
    DESTROY_COMPLETE = "destroy_complete"
    ABORT_COMPLETE = "abort_complete"


class TreeHalf(StrEnum):
    """NCCL >= 2.8 prints one tree per channel; 2.7 printed its up and down trees."""
    BOTH = "both"
    UP = "up"
    DOWN = "down"


class Direction(StrEnum):
    SEND = "send"
    RECEIVE = "receive"
    NONE = "-"


class IbRequest(StrEnum):
    """reqTypeStr of net_ib: what the failed work request was."""
    SEND = "Send"
    RECV = "Recv"
    FLUSH = "Flush"
    IPUT = "IPut"
    UNUSED = "Unused"


@dataclass(frozen=True)
class Version:
    kind = FactKind.VERSION
    version: str               # 2.18.5 (with NCCL_SUFFIX when one was built in)
    cuda: str | None           # 12.2


@dataclass(frozen=True)
class EnvSetting:
    kind = FactKind.ENV
    name: str                  # NCCL_IB_HCA
    value: str                 # as NCCL printed it, without param.cc's closing period


@dataclass(frozen=True)
class Network:
    kind = FactKind.NETWORK
    name: str                  # IB, Socket, IBext_v8, AWS Libfabric


@dataclass(frozen=True)
class NetDevice:
    index: int                 # [N] in NCCL's list
    name: str                  # mlx5_0, eth0
    port: int | None = None    # IB port
    link: str | None = None    # IB or RoCE
    address: str | None = None # socket devices: 10.1.0.11<0>
    group: int | None = None   # fused (virtual) NIC this device belongs to: [G]={...}
    sharp: bool = False        # /SHARP (the rdma-sharp plugin)


@dataclass(frozen=True)
class NetDevices:
    kind = FactKind.NET_DEVICES
    net: NetKind
    devices: tuple[NetDevice, ...]
    relaxed_ordering: bool | None = None   # IB: [RO]
    oob: str | None = None                 # IB: out-of-band interface:address


@dataclass(frozen=True)
class SocketThreads:
    kind = FactKind.SOCKET_THREADS
    threads: int
    sockets_per_thread: int


@dataclass(frozen=True)
class Comm:
    """A communicator's Init START/COMPLETE or Destroy/Abort COMPLETE line."""
    kind = FactKind.COMM
    event: CommEvent
    comm: str
    rank: int
    nranks: int
    cuda_dev: int
    bus_id: str
    nvml_dev: int | None = None
    comm_id: int | None = None     # 64-bit hash, 0 .. 2^64-1
    func: str | None = None
    parent: str | None = None
    color: int | None = None
    key: int | None = None


@dataclass(frozen=True)
class CommShape:
    """init.cc (>= 2.19): comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL %d"""
    kind = FactKind.COMM_SHAPE
    comm: str
    rank: int
    nranks: int
    nnodes: int
    local_ranks: int
    local_rank: int
    mnnvl: int


@dataclass(frozen=True)
class RingOrder:
    kind = FactKind.RING_ORDER
    channel: int
    nchannels: int
    order: tuple[int, ...]
    truncated: bool            # NCCL ended the line with "..." (over its buffer)


@dataclass(frozen=True)
class Ring:
    kind = FactKind.RING
    channel: int
    prev: int
    rank: int
    next: int


@dataclass(frozen=True)
class Tree:
    kind = FactKind.TREE
    channel: int
    half: TreeHalf
    up: int
    rank: int
    down: tuple[int, int, int]


@dataclass(frozen=True)
class Channel:
    """One connection: Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA"""
    kind = FactKind.CHANNEL
    channel: int
    conn: int | None
    src_rank: int
    dst_rank: int
    src_dev: int | None        # NCCL >= 2.18 prints devices in brackets ...
    dst_dev: int | None
    src_bus_id: str | None     # ... older ones the GPU's PCI bus id, in hex
    dst_bus_id: str | None
    direction: Direction
    transport: str             # NET, P2P, SHM, ...
    via: str                   # NET/IB/0/GDRDMA
    net: str | None = None     # NET only: IB, Socket, AWS Libfabric, IBext_v8
    net_dev: int | None = None
    proxy_rank: int | None = None   # NET/IB/1(1): the PXN proxy
    gdrdma: bool | None = None      # NET only: GPUDirect RDMA
    shared: bool | None = None      # NET only: shared buffers


@dataclass(frozen=True)
class Affinity:
    kind = FactKind.AFFINITY
    gpu: int
    mask: str                  # CPU mask as NCCL prints it (comma separated hex words)


@dataclass(frozen=True)
class Thresholds:
    """threadThresholds tree LL/LL128/Simple | ring LL/LL128/Simple | collnet ..."""
    kind = FactKind.THRESHOLDS
    tree: tuple[int, int, int]
    ring: tuple[int, int, int]
    collnet: tuple[int, ...]   # 2.7-2.17: LL/LL128/Simple; later: direct, chain (Simple)


@dataclass(frozen=True)
class ChannelCounts:
    kind = FactKind.CHANNEL_COUNTS
    coll: int
    p2p: int
    p2p_per_peer: int
    collnet: int | None = None
    nvls: int | None = None


@dataclass(frozen=True)
class NvlsSupport:
    kind = FactKind.NVLS_SUPPORT
    available: bool
    dev: int


@dataclass(frozen=True)
class Coll:
    kind = FactKind.COLL
    op: str
    op_count: int
    sendbuff: str
    recvbuff: str
    count: int
    datatype: int
    redop: int
    root: int
    comm: str
    nranks: int | None
    stream: str


@dataclass(frozen=True)
class IbCompletion:
    """net_ib: Got completion from peer ADDR<PORT> with status/error ..."""
    peer: str                  # IPv4, IPv6 (with %scope) or whatever the socket printed
    peer_port: int | None
    status: int
    opcode: int | None = None
    length: int | None = None
    vendor_err: int | None = None
    request: IbRequest | None = None
    local_gid: str | None = None
    remote_gid: str | None = None
    hca: str | None = None


@dataclass(frozen=True)
class Warn:
    kind = FactKind.WARN
    file: str
    line: int
    func: str | None
    message: str
    completion: IbCompletion | None = None
    status: int | None = None  # ibv_wc_status of an IB completion error


@dataclass(frozen=True)
class ErrorTrace:
    """checks.h: file:line (func) -> code, printed while an error propagates"""
    kind = FactKind.ERROR_TRACE
    file: str
    line: int
    func: str | None
    code: int
    thread: str | None = None  # [Proxy Thread], [Async thread], ...
