"""TBF qdiscs on lab interfaces over netlink (pyroute2), and reading them back.

TBF's netlink parameters carry the rate as a 32-bit byte count per second, so a
shaped rate is at most MAX_TBF_RATE_BPS (~34.4 Gbit/s); pyroute2 does not speak
TCA_TBF_RATE64. Faster than that a veth is not anyway on most hosts.
"""

from __future__ import annotations

from fabricscope.errors import UserError

MAX_TBF_RATE_BPS = (2**32 - 1) * 8
MIN_BURST = 1514          # one full Ethernet frame at MTU 1500: smaller never sends a frame
ROOT_HANDLE = 0x10000     # "1:"


def tbf_params(rate_bps: int, burst: int | None = None, limit: int | None = None,
               latency_s: float | None = None) -> dict:
    """Checked TBF parameters in bytes: {'rate_bps', 'burst', 'limit'}.

    burst defaults to 1 ms at the rate (at least 10 full frames); limit defaults to
    burst plus `latency_s` (default 2 ms: a shallow switch buffer) worth of bytes."""
    if rate_bps > MAX_TBF_RATE_BPS:
        raise UserError(f"rate {rate_bps} bit/s is above TBF's limit of {MAX_TBF_RATE_BPS} bit/s",
                        "give a rate of at most 34gbit")
    if burst is None:
        burst = max(10 * MIN_BURST, rate_bps // 8 // 1000)
    if burst < MIN_BURST:
        raise UserError(f"burst {burst} bytes is below one full frame ({MIN_BURST} bytes)",
                        "give --burst 1514b or more, e.g. 32kb")
    if limit is None:
        limit = burst + int(rate_bps / 8 * (0.002 if latency_s is None else latency_s))
    if limit < burst:
        raise UserError(f"queue limit {limit} bytes is below the burst ({burst} bytes)",
                        "give a larger --limit or --latency")
    return {"rate_bps": int(rate_bps), "burst": int(burst), "limit": int(limit)}


def set_tbf(ipr, index: int, params: dict) -> None:
    """Install (or replace) TBF as the root qdisc of link `index`."""
    ipr.tc("replace", "tbf", index, handle=ROOT_HANDLE, rate=params["rate_bps"] // 8,
           burst=params["burst"], limit=params["limit"])


def clear_root(ipr, index: int) -> None:
    """Remove the root qdisc of link `index` (veth falls back to noqueue); no-op if none."""
    from pyroute2 import NetlinkError
    try:
        ipr.tc("del", index=index, root=True)
    except NetlinkError as exc:
        if exc.code not in (2, 22):      # ENOENT / EINVAL: no qdisc of ours to delete
            raise


def reset_root(ipr, index: int, link_tbf: dict | None) -> None:
    """Back to the lab's default: the link-rate TBF (link_tbf) or no qdisc (None)."""
    if link_tbf:
        set_tbf(ipr, index, link_tbf)
    else:
        clear_root(ipr, index)


def root_qdisc(ipr, index: int) -> dict:
    """The root qdisc of link `index`: {'kind', 'bytes', 'packets', 'drops', 'overlimits'}
    (the qdisc's own counters, since it was installed) and, for TBF, 'rate_bps',
    'limit' and 'buffer_ticks'."""
    for msg in ipr.get_qdiscs(index=index):
        if msg["parent"] != 0xFFFFFFFF:
            continue
        kind = msg.get_attr("TCA_KIND")
        out = {"kind": kind, **_counters(msg)}
        if kind == "tbf":
            parms = msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
            out.update(rate_bps=parms["rate"] * 8, limit=parms["limit"],
                       buffer_ticks=parms["buffer"])
        return out
    return {"kind": None}


def _counters(msg) -> dict:
    stats = msg.get_attr("TCA_STATS2")
    basic = (stats.get_attr("TCA_STATS_BASIC") if stats else None) or {}
    queue = (stats.get_attr("TCA_STATS_QUEUE") if stats else None) or {}
    return {"bytes": basic.get("bytes", 0), "packets": basic.get("packets", 0),
            "drops": queue.get("drops", 0), "overlimits": queue.get("overlimits", 0)}
