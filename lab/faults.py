"""Faults on a node's switch port: random loss (nftables) and a shallow shaper (TBF).

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
clear(lab, i=None)
    Removes node i's faults (every node's when i is None); the port goes back to
    the lab's link-rate TBF when the lab is shaped, else to no qdisc.
drops(lab, i) -> {"tx": packets, "rx": packets}
    What the loss rules of node i dropped so far (nft counters).

Each fault is recorded in the lab's state file (`Lab.faults`), so `lab list`
shows it and `clear` knows what to restore.
"""

from __future__ import annotations

from fabricscope.errors import UserError
from lab import nft, tc
from lab.topology import Lab, load, require_root, state_lock
from lab.units import parse_rate, parse_size, parse_time

DIRECTIONS = ("both", "tx", "rx")


def _fresh(lab: Lab | str) -> Lab:
    return load(lab if isinstance(lab, str) else lab.name)


def _sync(lab: Lab | str, fresh: Lab) -> None:
    if isinstance(lab, Lab):
        lab.faults = fresh.faults


def loss(lab: Lab | str, node_index: int, pct: float, direction: str = "both") -> None:
    """Drop pct percent (0-100, fractional allowed) of node_index's frames; 0 removes."""
    require_root("lab faults")
    try:
        pct = float(pct)
    except (TypeError, ValueError):
        raise UserError(f"loss {pct!r} is not a number",
                        "give a percentage, e.g. 2 or 0.5") from None
    if not 0 <= pct <= 100:
        raise UserError(f"loss {pct:g}% is out of range", "give a percentage between 0 and 100")
    if 0 < pct < 0.01:
        raise UserError(f"loss {pct:g}% is below the 0.01% resolution", "give at least 0.01")
    if direction not in DIRECTIONS:
        raise UserError(f"direction {direction!r} is not valid", "give both, tx or rx")
    with state_lock():
        fresh = _fresh(lab)
        fresh.node(node_index)
        _require_table(fresh)
        nft.run(nft.node_rules_script(fresh.nft_table, node_index, pct, direction))
        entry = fresh.faults.setdefault(node_index, {})
        if pct:
            entry["loss"] = {"pct": pct, "direction": direction}
        else:
            entry.pop("loss", None)
        if not entry:
            fresh.faults.pop(node_index)
        fresh.save()
    _sync(lab, fresh)


def shape(lab: Lab | str, node_index: int, rate, burst, limit=None, latency=None) -> dict:
    """Put TBF(rate, burst, limit|latency) on node_index's switch port; returns the parameters."""
    require_root("lab faults")
    rate_bps = parse_rate(rate)
    params = tc.tbf_params(rate_bps, parse_size(burst),
                           parse_size(limit) if limit is not None else None,
                           parse_time(latency) if latency is not None else None)
    from pyroute2 import IPRoute
    with state_lock():
        fresh = _fresh(lab)
        node = fresh.node(node_index)
        with IPRoute() as ipr:
            tc.set_tbf(ipr, _port_index(ipr, fresh, node.port), params)
        fresh.faults.setdefault(node_index, {})["shape"] = params
        fresh.save()
    _sync(lab, fresh)
    return params


def clear(lab: Lab | str, node_index: int | None = None) -> None:
    """Remove the faults of node_index, or of every node when None."""
    require_root("lab faults")
    from pyroute2 import IPRoute
    with state_lock():
        fresh = _fresh(lab)
        indices = range(len(fresh.nodes)) if node_index is None else [fresh.node(node_index).index]
        _require_table(fresh)
        nft.run("".join(nft.node_rules_script(fresh.nft_table, i, None, "both") for i in indices))
        with IPRoute() as ipr:
            for i in indices:
                port = _port_index(ipr, fresh, fresh.nodes[i].port)
                if fresh.link_shaped and fresh.link_rate_bps:
                    tc.set_tbf(ipr, port, tc.tbf_params(fresh.link_rate_bps))
                else:
                    tc.clear_root(ipr, port)
                fresh.faults.pop(i, None)
        fresh.save()
    _sync(lab, fresh)


def drops(lab: Lab | str, node_index: int) -> dict:
    """Frames dropped so far by node_index's loss rules: {"tx": n, "rx": n}."""
    fresh = _fresh(lab)
    fresh.node(node_index)
    return {d: nft.chain_drops(fresh.nft_table, f"node{node_index}_{d}") for d in ("tx", "rx")}


def port_qdisc(lab: Lab | str, node_index: int) -> dict:
    """The root qdisc on node_index's switch port, read back over netlink."""
    from pyroute2 import IPRoute
    fresh = _fresh(lab)
    node = fresh.node(node_index)
    with IPRoute() as ipr:
        return tc.root_qdisc(ipr, _port_index(ipr, fresh, node.port))


def _port_index(ipr, lab: Lab, port: str) -> int:
    idx = ipr.link_lookup(ifname=port)
    if not idx:
        raise UserError(f"switch port {port} of lab {lab.name!r} is missing",
                        f"recreate the lab with `fabricscope lab up --name {lab.name} ...`")
    return idx[0]


def _require_table(lab: Lab) -> None:
    if (nft.FAMILY, lab.nft_table) not in nft.tables():
        raise UserError(f"nft table {lab.nft_table} of lab {lab.name!r} is missing",
                        f"recreate the lab with `fabricscope lab up --name {lab.name} ...`")
