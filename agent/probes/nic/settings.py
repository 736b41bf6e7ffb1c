"""The NIC probe's settings, checked once from AgentConfig, and link speeds.

Line rate (for utilization and bursts), per interface, first that applies:
1. config `link_speed_bps` entry `IF=RATE` for that interface;
2. the kernel's /sys/class/net/IF/speed (Mbit/s; -1 or EINVAL when unknown), trusted
   only for a link with hardware under it: a `device` link in sysfs (a PCI, virtio or
   other bus device bound to a driver), or a bond or VLAN (uevent DEVTYPE) whose lower
   links all have one (bonding sums its slaves' speeds, a VLAN reports its real
   device's). Virtual devices (veth, bridge, tun/tap, dummy, ifb, loopback) have no
   line rate: veth and bridges report 10000 and tun 10 whatever they carry;
3. a bare config entry `RATE` (the line rate of every link without one of its own);
4. none: the speed is unknown. Records then leave out the speed, utilization, hot
   bins and bursts (all relative to a line rate) rather than quote a share of a
   guess; the peak rate (busiest bin) and `link_speed_source` = unknown remain.
RATE is bit/s with tc-style units (100mbit, 25gbit) or a bare number.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from pathlib import Path

from fabricscope.errors import UserError

BIN_US_RANGE = (10, 10_000)
#: drains are expected every poll_interval_s; the ring holds this many intervals
RING_MARGIN = 4
MIN_RING_SLOTS = 1024
#: refuse rings larger than this (a region per CPU: slots x rings x 24 B x CPUs)
MAX_RING_BYTES = 512 << 20
#: above this the rings get fewer slots and the agent polls more often than configured
#: (what 2 NICs on 128 CPUs take at 0.2 s, the poll interval of earlier versions)
RING_BUDGET_BYTES = 128 << 20
BIN_BYTES = 24
_IFNAME = re.compile(r"^[^\s/=]{1,15}$")
_RATE = re.compile(r"^([0-9]+(?:\.[0-9]*)?)\s*(|bit|kbit|mbit|gbit|tbit)$", re.IGNORECASE)
_RATE_SCALE = {"": 1, "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


def parse_rate(text: str, where: str) -> int:
    """'25gbit' -> 25_000_000_000; a bare number is bit/s."""
    match = _RATE.match(text.strip())
    value = float(match.group(1)) * _RATE_SCALE[match.group(2).lower()] if match else 0
    if value < 1:
        raise UserError(f"{where}: {text!r} is not a link speed",
                        "give bit/s with a unit, e.g. 25gbit or eth0=100mbit")
    return int(value)


class SpeedSource(str, enum.Enum):
    """Where an interface's line rate came from (nic_window `link_speed_source`)."""

    CONFIG = "config"              # link_speed_bps IF=RATE
    KERNEL = "kernel"              # sysfs speed of a link with hardware under it
    CONFIG_DEFAULT = "config_default"  # link_speed_bps bare RATE
    UNKNOWN = "unknown"            # a virtual link, or hardware that reports none


@dataclass(frozen=True)
class LineRate:
    bps: int | None                # None: unknown
    source: SpeedSource


#: uevent DEVTYPEs whose speed the kernel derives from the links under them
STACKED_DEVTYPES = frozenset({"bond", "vlan"})
MAX_STACK_DEPTH = 4                # bond of VLANs of ...: deeper stacks are not trusted


@dataclass(frozen=True)
class LinkSpeeds:
    overrides: dict[str, int] = field(default_factory=dict)
    default_bps: int | None = None
    sysfs: Path = Path("/sys/class/net")

    @classmethod
    def parse(cls, entries: list[str]) -> "LinkSpeeds":
        overrides: dict[str, int] = {}
        default = None
        for entry in entries:
            name, eq, rate = entry.partition("=")
            if not eq:
                if default is not None:
                    raise UserError(f"link_speed_bps: two defaults ({entry!r})",
                                    "give at most one bare RATE; others as IF=RATE")
                default = parse_rate(entry, "link_speed_bps")
                continue
            if not _IFNAME.match(name.strip()):
                raise UserError(f"link_speed_bps: {name!r} is not an interface name",
                                "write IF=RATE, e.g. eth0=25gbit")
            overrides[name.strip()] = parse_rate(rate, f"link_speed_bps {name.strip()}")
        return cls(overrides, default)

    def kernel_bps(self, ifname: str) -> int | None:
        """The speed sysfs reports, whether or not it means anything (see has_hardware)."""
        try:
            mbit = int((self.sysfs / ifname / "speed").read_text().strip())
        except (OSError, ValueError):   # EINVAL when down or unknown; no file for some links
            return None
        return mbit * 1_000_000 if 0 < mbit < 0xFFFFFFFF else None

    def has_hardware(self, ifname: str, depth: int = 0) -> bool:
        """Is there a device under the link whose speed is a line rate: its own bus
        device, or for a bond or VLAN, lower links that all have one."""
        link = self.sysfs / ifname
        if (link / "device").exists():
            return True
        if depth >= MAX_STACK_DEPTH or _devtype(link) not in STACKED_DEVTYPES:
            return False
        lowers = [p.name[len("lower_"):] for p in _listdir(link) if p.name.startswith("lower_")]
        return bool(lowers) and all(self.has_hardware(n, depth + 1) for n in lowers)

    def line_rate(self, ifname: str) -> LineRate:
        if ifname in self.overrides:
            return LineRate(self.overrides[ifname], SpeedSource.CONFIG)
        if self.has_hardware(ifname):
            kernel = self.kernel_bps(ifname)
            if kernel:
                return LineRate(kernel, SpeedSource.KERNEL)
        if self.default_bps:
            return LineRate(self.default_bps, SpeedSource.CONFIG_DEFAULT)
        return LineRate(None, SpeedSource.UNKNOWN)

    def speed_bps(self, ifname: str) -> int | None:
        return self.line_rate(ifname).bps


def _devtype(link: Path) -> str:
    try:
        for line in (link / "uevent").read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "DEVTYPE":
                return value.strip()
    except OSError:
        pass
    return ""


def _listdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def ring_slots(bin_ns: int, poll_interval_s: float) -> int:
    """Power of two holding RING_MARGIN drain intervals: 100 us, 0.2 s -> 8192."""
    need = max(MIN_RING_SLOTS, int(RING_MARGIN * poll_interval_s * 1e9 / bin_ns) + 1)
    return 1 << (need - 1).bit_length()


def slots_within(budget: int, n_ifaces: int, cpus: int) -> int:
    """The most slots (a power of two, at least MIN_RING_SLOTS) whose rings fit `budget`."""
    most = budget // (2 * n_ifaces * BIN_BYTES * cpus)
    return max(MIN_RING_SLOTS, 1 << max(0, most.bit_length() - 1))


@dataclass(frozen=True)
class NicSettings:
    interfaces: tuple[str, ...]
    bin_ns: int
    window_ns: int
    threshold: float
    speeds: LinkSpeeds
    max_flows: int
    ring_slots: int
    bursts_per_window: int = 16

    @property
    def bins_per_window(self) -> int:
        return self.window_ns // self.bin_ns

    def ring_bytes(self, n_ifaces: int, cpus: int) -> int:
        return self.ring_slots * 2 * n_ifaces * BIN_BYTES * cpus


def from_config(cfg) -> NicSettings:
    """Check the nic fields of an AgentConfig; UserError names the first bad one."""
    lo, hi = BIN_US_RANGE
    if not lo <= cfg.nic_bin_us <= hi:
        raise UserError(f"nic_bin_us {cfg.nic_bin_us} is outside {lo}..{hi}",
                        "give e.g. --nic-bin-us 100")
    bin_ns = cfg.nic_bin_us * 1000
    window_ns = round(cfg.nic_window_s * 1e9)
    if window_ns < bin_ns or window_ns % bin_ns:
        raise UserError(f"nic_window_s {cfg.nic_window_s} is not a multiple of the "
                        f"{cfg.nic_bin_us} us bin", "give e.g. --nic-window-s 1")
    if window_ns > 3600 * 10**9:
        raise UserError(f"nic_window_s {cfg.nic_window_s} is longer than an hour",
                        "give e.g. --nic-window-s 1")
    if not 0 < cfg.nic_burst_threshold <= 1:
        raise UserError(f"nic_burst_threshold {cfg.nic_burst_threshold} is not in (0, 1]",
                        "give a fraction of the link speed, e.g. 0.5")
    if not 16 <= cfg.nic_max_flows <= 1 << 22:
        raise UserError(f"nic_max_flows {cfg.nic_max_flows} is outside 16..4194304",
                        "give e.g. --nic-max-flows 8192")
    if not 0 <= cfg.nic_bursts_per_window <= 100_000:
        raise UserError(f"nic_bursts_per_window {cfg.nic_bursts_per_window} is outside "
                        "0..100000", "give e.g. --nic-bursts-per-window 16")
    for name in cfg.interfaces:
        if not _IFNAME.match(name):
            raise UserError(f"interfaces: {name!r} is not an interface name",
                            "list names as `ip link` shows them, e.g. eth0,eth1")
    return NicSettings(tuple(dict.fromkeys(cfg.interfaces)), bin_ns, window_ns,
                       float(cfg.nic_burst_threshold), LinkSpeeds.parse(cfg.link_speed_bps),
                       int(cfg.nic_max_flows), ring_slots(bin_ns, cfg.poll_interval_s),
                       int(cfg.nic_bursts_per_window))
