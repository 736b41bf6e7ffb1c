"""Faults: on a node's switch port, on a ToR's uplink, on a node's CPU, on the storage.

loss(lab, i, pct, direction="both")
    Drops pct% of frames on node i's switch port, chosen independently per frame
    with `numgen random mod 10000 < pct*100` in the lab's bridge-family table:
    direction "tx" drops frames node i sends (entering the bridge from its port:
    node i's kernel retransmits), "rx" frames the bridge sends to node i, "both"
    (default) each direction independently. pct 0 removes the loss.
shape(lab, i, rate, burst, limit=None, latency=None)
    Replaces the root qdisc of node i's switch port (egress toward node i, where a
    real ToR queues an incast) with TBF: rate, burst; queue limit in bytes, or
    derived from latency (default 2 ms worth at the rate: a shallow switch buffer).
delay(lab, i, delay)
    Every frame node i's switch port sends toward node i waits `delay` ('5ms') on its
    way, and none is dropped for it (fabricscope.lab.delay_stage: a TC redirect through
    a user-space stage, as the kernel has no netem); a latency that rose, without
    loss or a queue that overflows. 0 removes it.
cpu(lab, i, pct)
    Node i's training ranks get pct % of one CPU (1 <= pct <= 100 x CPUs): the
    CFS quota of the node's cgroup (fabricscope.lab.cgroups), pct ms of every 100 ms. Only
    ranks join that cgroup, so the node's agent is not slowed: a CPU straggler.
loss_uplink(lab, tor, pct, direction="both") / shape_uplink(lab, tor, rate, burst,
        limit=None, latency=None, direction="up")
    The same on ToR `tor`'s uplink to the spine (labs with --tors 2 or more):
    "up" acts on frames leaving the ToR toward the spine (the ToR-side veth end's
    egress, where a rack's traffic aggregates), "down" on frames the spine sends
    toward the ToR (the spine-side end's egress), "both" on each.
storage(lab, rate=None, delay=None)
    Slows the lab's data server (fabricscope.lab.storage_fault): the payload of every request
    paced at `rate`, and `delay` before every reply; the running server picks it
    up at its next request. Neither given: the storage is fast again.
clear(lab, i=None, uplink=None)
    Removes node i's faults, or uplink `uplink`'s, or with neither every fault of
    the lab (every node, every uplink, the storage); a port or uplink goes back to
    the lab's link-rate TBF when the lab is shaped, else to no qdisc.
drops(lab, i) -> {"tx": packets, "rx": packets}; uplink_drops(lab, tor) -> {"up", "down"}
    What the loss rules dropped so far (nft counters).
port_qdisc(lab, i), uplink_qdisc(lab, tor, direction="up") -> the root qdisc and its counters.

Each fault is recorded in the lab's state file (`Lab.faults` per node,
`Lab.uplink_faults` per ToR, `Lab.storage_fault`), so `lab list` shows it, `clear`
knows what to restore and the data server sees its own.
"""

from __future__ import annotations

import contextlib
import os

from fabricscope.errors import UserError
from fabricscope.lab import cgroups, nft, tc
from fabricscope.lab.model import LabTor
from fabricscope.lab.storage_fault import StorageFault
from fabricscope.lab.topology import Lab, load, require_root, state_lock
from fabricscope.lab.units import parse_rate, parse_size, parse_time

DIRECTIONS = ("both", "tx", "rx")
UPLINK_DIRECTIONS = ("up", "down", "both")


@contextlib.contextmanager
def _editing(lab: Lab | str):
    """The lab's state fresh from its file, under the state lock; saved after the
    block, and the caller's Lab object updated to match."""
    require_root("lab faults")
    with state_lock():
        fresh = load(lab if isinstance(lab, str) else lab.name)
        yield fresh
        fresh.save()
    if isinstance(lab, Lab):
        lab.faults, lab.uplink_faults = fresh.faults, fresh.uplink_faults
        lab.storage_fault = fresh.storage_fault


def _loss_pct(pct) -> float:
    try:
        pct = float(pct)
    except (TypeError, ValueError):
        raise UserError(f"loss {pct!r} is not a number",
                        "give a percentage, e.g. 2 or 0.5") from None
    if not 0 <= pct <= 100:
        raise UserError(f"loss {pct:g}% is out of range", "give a percentage between 0 and 100")
    if 0 < pct < 0.01:
        raise UserError(f"loss {pct:g}% is below the 0.01% resolution", "give at least 0.01")
    return pct


def _direction(direction: str, allowed: tuple[str, ...]) -> str:
    if direction not in allowed:
        raise UserError(f"direction {direction!r} is not valid", f"give {', '.join(allowed)}")
    return direction


def _tbf(rate, burst, limit, latency) -> dict:
    return tc.tbf_params(parse_rate(rate), parse_size(burst),
                         parse_size(limit) if limit is not None else None,
                         parse_time(latency) if latency is not None else None)


def _record(faults: dict, key, kind: str, value) -> None:
    """faults[key][kind] = value (None removes it; an empty entry goes away)."""
    entry = faults.setdefault(key, {})
    if value is None:
        entry.pop(kind, None)
    else:
        entry[kind] = value
    if not entry:
        faults.pop(key)


# -- a node's switch port and CPU -------------------------------------------------------

def loss(lab: Lab | str, node_index: int, pct: float, direction: str = "both") -> None:
    """Drop pct percent (0-100, fractional allowed) of node_index's frames; 0 removes."""
    pct = _loss_pct(pct)
    _direction(direction, DIRECTIONS)
    with _editing(lab) as fresh:
        fresh.node(node_index)
        _require_table(fresh)
        nft.run(nft.node_rules_script(fresh.nft_table, node_index, pct, direction))
        _record(fresh.faults, node_index, "loss",
                {"pct": pct, "direction": direction} if pct else None)


def shape(lab: Lab | str, node_index: int, rate, burst, limit=None, latency=None) -> dict:
    """Put TBF(rate, burst, limit|latency) on node_index's switch port; returns the parameters."""
    params = _tbf(rate, burst, limit, latency)
    from pyroute2 import IPRoute
    with _editing(lab) as fresh, IPRoute() as ipr:
        node = fresh.node(node_index)
        tc.set_tbf(ipr, _link_index(ipr, fresh, node.port), params)
        _record(fresh.faults, node_index, "shape", params)
    return params


def delay(lab: Lab | str, node_index: int, delay) -> float:
    """Delay every frame toward node_index by `delay` ('5ms'; 0 removes); returns the
    delay in seconds. The stage runs in the lab's cgroup, so `lab down` ends it."""
    seconds = 0.0 if delay in (0, "0") else parse_time(delay)
    with _editing(lab) as fresh:
        node = fresh.node(node_index)
        _stop_delay(fresh, node_index)
        if seconds:
            pid = _start_delay(fresh, node.port, seconds)
            _record(fresh.faults, node_index, "delay", {"delay_s": seconds, "pid": pid})
    return seconds


def _start_delay(lab: Lab, port: str, seconds: float) -> int:
    """Start the port's delay stage and wait for its "ready" (frames go through it)."""
    import subprocess
    import sys
    h = cgroups.detect()
    join = cgroups.joiner(h.lab_dir(lab.name)) if h and os.path.isdir(h.lab_dir(lab.name)) \
        else None
    from fabricscope.lab import naming
    log_path = os.path.join(naming.lab_dir(lab.name), f"delay-{port}.log")
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "fabricscope.lab.delay_stage", port,
                                 f"{seconds * 1000:g}"], stdout=subprocess.PIPE,
                                stderr=log_file, text=True, preexec_fn=join,
                                start_new_session=True)
    with proc.stdout:
        line = proc.stdout.readline()          # "ready", or nothing when it failed
    if line.strip() != "ready":
        proc.wait()
        with open(log_path) as fh:
            err = (fh.read().strip().splitlines() or ["no output"])[-1]
        raise UserError(f"the delay stage on {port} did not start: {err}",
                        "check that BCC (python3-bpfcc) and /dev/net/tun are available")
    return proc.pid


def _stop_delay(lab: Lab, node_index: int) -> None:
    """End node_index's delay stage, if any (it removes its filter as it exits)."""
    from fabricscope.lab import nsops
    from fabricscope.lab.delay_stage import remove_filter
    fault = lab.faults.get(node_index, {}).get("delay")
    if fault:
        if _is_delay_stage(fault["pid"]):       # not a pid the system gave out again
            nsops.end_pids([fault["pid"]], f"the delay stage of node{node_index}")
        remove_filter(lab.nodes[node_index].port)
        _record(lab.faults, node_index, "delay", None)


def _is_delay_stage(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"fabricscope.lab.delay_stage" in fh.read()
    except OSError:
        return False


def cpu(lab: Lab | str, node_index: int, pct: float) -> dict:
    """Give node_index's training ranks pct % of one CPU; returns the recorded fault."""
    quota = cgroups.quota_us(pct, os.cpu_count() or 1)
    with _editing(lab) as fresh:
        cgroups.set_quota(_cgroup(fresh, node_index), quota)
        fault = {"pct": float(pct), "quota_us": quota, "period_us": cgroups.PERIOD_US}
        _record(fresh.faults, node_index, "cpu", fault)
    return fault


def _cgroup(lab: Lab, node_index: int) -> str:
    node = lab.node(node_index)
    if not node.cgroup or not os.path.isdir(node.cgroup):
        raise UserError(f"node {node_index} of lab {lab.name!r} has no CPU cgroup (the host "
                        "has no cgroup hierarchy with the cpu controller, or it was removed)",
                        "mount the cpu controller (cgroup v1 `cpu` or v2), then recreate the lab")
    return node.cgroup


# -- a ToR's uplink -----------------------------------------------------------------------

def _uplink_ends(tor: LabTor, direction: str) -> list[str]:
    """The veth ends whose egress carries `direction` (up: ToR -> spine)."""
    return {"up": [tor.uplink], "down": [tor.spine_port],
            "both": [tor.uplink, tor.spine_port]}[direction]


def loss_uplink(lab: Lab | str, tor: str, pct: float, direction: str = "both") -> None:
    """Drop pct percent of the frames crossing `tor`'s uplink in `direction`; 0 removes."""
    pct = _loss_pct(pct)
    _direction(direction, UPLINK_DIRECTIONS)
    with _editing(lab) as fresh:
        rack = fresh.uplink(tor)
        _require_table(fresh)
        nft.run(nft.uplink_rules_script(fresh.nft_table, rack.name, pct, direction))
        _record(fresh.uplink_faults, rack.name, "loss",
                {"pct": pct, "direction": direction} if pct else None)


def shape_uplink(lab: Lab | str, tor: str, rate, burst, limit=None, latency=None,
                 direction: str = "up") -> dict:
    """TBF on `tor`'s uplink in `direction` (the other direction goes back to the
    lab's default); returns the parameters, with the direction."""
    params = _tbf(rate, burst, limit, latency)
    _direction(direction, UPLINK_DIRECTIONS)
    from pyroute2 import IPRoute
    with _editing(lab) as fresh, IPRoute() as ipr:
        rack = fresh.uplink(tor)
        shaped = _uplink_ends(rack, direction)
        for end in _uplink_ends(rack, "both"):
            index = _link_index(ipr, fresh, end)
            if end in shaped:
                tc.set_tbf(ipr, index, params)
            else:
                tc.reset_root(ipr, index, _link_tbf(fresh))
        params = {**params, "direction": direction}
        _record(fresh.uplink_faults, rack.name, "shape", params)
    return params


# -- the storage --------------------------------------------------------------------------

def storage(lab: Lab | str, rate=None, delay=None) -> StorageFault:
    """Slow the lab's data server: payload at `rate` ('20mbit'), `delay` ('50ms')
    before each reply; with neither, remove the fault. Returns the fault now set."""
    fault = StorageFault.parse(rate, delay)
    with _editing(lab) as fresh:
        fresh.storage_fault = fault.to_dict()
    return fault


# -- clearing and reading back ------------------------------------------------------------

def clear(lab: Lab | str, node_index: int | None = None, uplink: str | None = None) -> None:
    """Remove the faults of node_index, or of uplink `uplink`, or with neither every
    fault of the lab (nodes, uplinks, storage)."""
    from pyroute2 import IPRoute
    with _editing(lab) as fresh, IPRoute() as ipr:
        everything = node_index is None and uplink is None
        if node_index is not None:
            nodes = [fresh.node(node_index).index]
        else:
            nodes = list(range(len(fresh.nodes))) if everything else []
        racks = ([fresh.uplink(uplink)] if uplink is not None
                 else [t for t in fresh.tors if t.uplink] if everything else [])
        _require_table(fresh)
        nft.run("".join([nft.node_rules_script(fresh.nft_table, i, None, "both") for i in nodes]
                        + [nft.uplink_rules_script(fresh.nft_table, t.name, None, "both")
                           for t in racks]))
        default = _link_tbf(fresh)
        for i in nodes:
            _stop_delay(fresh, i)
            tc.reset_root(ipr, _link_index(ipr, fresh, fresh.nodes[i].port), default)
            if "cpu" in fresh.faults.get(i, {}) and os.path.isdir(fresh.nodes[i].cgroup):
                cgroups.set_quota(fresh.nodes[i].cgroup, None)
            fresh.faults.pop(i, None)
        for rack in racks:
            for end in _uplink_ends(rack, "both"):
                tc.reset_root(ipr, _link_index(ipr, fresh, end), default)
            fresh.uplink_faults.pop(rack.name, None)
        if everything:
            fresh.storage_fault = {}


def drops(lab: Lab | str, node_index: int) -> dict:
    """Frames dropped so far by node_index's loss rules: {"tx": n, "rx": n}."""
    fresh = load(lab if isinstance(lab, str) else lab.name)
    fresh.node(node_index)
    return {d: nft.chain_drops(fresh.nft_table, f"node{node_index}_{d}") for d in ("tx", "rx")}


def uplink_drops(lab: Lab | str, tor: str) -> dict:
    """Frames dropped so far by `tor`'s uplink loss rules: {"up": n, "down": n}."""
    fresh = load(lab if isinstance(lab, str) else lab.name)
    rack = fresh.uplink(tor)
    return {d: nft.chain_drops(fresh.nft_table, f"{rack.name}_{d}") for d in ("up", "down")}


def port_qdisc(lab: Lab | str, node_index: int) -> dict:
    """The root qdisc on node_index's switch port, read back over netlink."""
    fresh = load(lab if isinstance(lab, str) else lab.name)
    return _qdisc(fresh, fresh.node(node_index).port)


def uplink_qdisc(lab: Lab | str, tor: str, direction: str = "up") -> dict:
    """The root qdisc (with its counters) of the uplink end carrying `direction`."""
    fresh = load(lab if isinstance(lab, str) else lab.name)
    _direction(direction, ("up", "down"))
    return _qdisc(fresh, _uplink_ends(fresh.uplink(tor), direction)[0])


def _qdisc(lab: Lab, ifname: str) -> dict:
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        return tc.root_qdisc(ipr, _link_index(ipr, lab, ifname))


def _link_tbf(lab: Lab) -> dict | None:
    return tc.tbf_params(lab.link_rate_bps) if lab.link_shaped and lab.link_rate_bps else None


def _link_index(ipr, lab: Lab, ifname: str) -> int:
    idx = ipr.link_lookup(ifname=ifname)
    if not idx:
        raise UserError(f"link {ifname} of lab {lab.name!r} is missing",
                        f"recreate the lab with `fabricscope lab up --name {lab.name} ...`")
    return idx[0]


def _require_table(lab: Lab) -> None:
    if (nft.FAMILY, lab.nft_table) not in nft.tables():
        raise UserError(f"nft table {lab.nft_table} of lab {lab.name!r} is missing",
                        f"recreate the lab with `fabricscope lab up --name {lab.name} ...`")
