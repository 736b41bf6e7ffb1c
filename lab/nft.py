"""The lab's nftables table: one `bridge` family table per lab, one pair of chains
per node and per uplink.

    table bridge fabricscope_<h6>
      chain pre   hook prerouting   iifname <port I> jump node<I>_tx   (frames node I sends)
      chain post  hook postrouting  oifname <port I> jump node<I>_rx   (frames sent to node I)
                                    oifname <ToR-side end of K's uplink> jump tor<K>_up
                                    oifname <spine-side end of K's uplink> jump tor<K>_down
      chain node<I>_tx, node<I>_rx, tor<K>_up, tor<K>_down   empty, or the fault's rules

A bridge-family hook sees the frames of every bridge of the root namespace, so one
table covers the ToRs and the spine: `tor<K>_up` sees the frames ToR K forwards
toward the spine, `tor<K>_down` those the spine forwards toward ToR K. Faults
only flush and refill their own chains, atomically (`nft -f -`), so the others'
counters keep counting.
"""

from __future__ import annotations

import json
import subprocess

from fabricscope.errors import UserError

FAMILY = "bridge"


def run(script: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True)
    except FileNotFoundError:
        raise UserError("the nft command is missing", "install nftables (make setup)") from None
    if check and proc.returncode != 0:
        raise RuntimeError(f"nft failed: {proc.stderr.strip()}\nscript:\n{script}")
    return proc


def list_json(*args: str) -> list:
    proc = subprocess.run(["nft", "-j", "list", *args], text=True, capture_output=True)
    if proc.returncode != 0:
        return []
    return json.loads(proc.stdout).get("nftables", [])


def tables() -> list[tuple[str, str]]:
    """(family, name) of every nftables table on the host's root namespace."""
    return [(t["table"]["family"], t["table"]["name"])
            for t in list_json("tables") if "table" in t]


def create_table_script(table: str, ports: list[str],
                        uplinks: list[tuple[str, str, str]] = ()) -> str:
    """The lab's table; ports: node I's switch port at index I; uplinks: (ToR name,
    ToR-side end, spine-side end) per ToR with an uplink."""
    # "table X; delete table X; table X {...}" replaces a leftover table atomically
    lines = [f"table {FAMILY} {table}", f"delete table {FAMILY} {table}",
             f"table {FAMILY} {table} {{"]
    for i in range(len(ports)):
        lines += [f"  chain node{i}_tx {{ }}", f"  chain node{i}_rx {{ }}"]
    for tor, _, _ in uplinks:
        lines += [f"  chain {tor}_up {{ }}", f"  chain {tor}_down {{ }}"]
    lines.append("  chain pre { type filter hook prerouting priority -200; policy accept;")
    lines += [f'    iifname "{p}" jump node{i}_tx' for i, p in enumerate(ports)]
    lines.append("  }")
    lines.append("  chain post { type filter hook postrouting priority 200; policy accept;")
    lines += [f'    oifname "{p}" jump node{i}_rx' for i, p in enumerate(ports)]
    for tor, tor_end, spine_end in uplinks:
        lines += [f'    oifname "{tor_end}" jump {tor}_up',
                  f'    oifname "{spine_end}" jump {tor}_down']
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def delete_table(table: str) -> bool:
    """Delete the table if present; True when it was there."""
    proc = subprocess.run(["nft", "delete", "table", FAMILY, table], text=True, capture_output=True)
    return proc.returncode == 0


def loss_threshold(pct: float) -> int:
    """Loss percent -> threshold out of 10000 for `numgen random mod 10000 < T`."""
    return int(round(pct * 100))


def node_rules_script(table: str, index: int, loss_pct: float | None, direction: str) -> str:
    """Flush node `index`'s chains and, with a loss, refill them (direction: both, tx, rx)."""
    chains = ("tx", "rx") if direction == "both" else (direction,)
    return rules_script(table, [f"node{index}_tx", f"node{index}_rx"],
                        [f"node{index}_{c}" for c in chains] if loss_pct else [], loss_pct)


def uplink_rules_script(table: str, tor: str, loss_pct: float | None, direction: str) -> str:
    """Flush ToR `tor`'s uplink chains and, with a loss, refill them (both, up, down)."""
    chains = ("up", "down") if direction == "both" else (direction,)
    return rules_script(table, [f"{tor}_up", f"{tor}_down"],
                        [f"{tor}_{c}" for c in chains] if loss_pct else [], loss_pct)


def rules_script(table: str, flush: list[str], lossy: list[str], loss_pct: float | None) -> str:
    """Flush the chains `flush`, then give each of `lossy` a random-drop rule."""
    lines = [f"flush chain {FAMILY} {table} {chain}" for chain in flush]
    for chain in lossy:
        lines.append(f"add rule {FAMILY} {table} {chain} numgen random mod 10000 "
                     f'< {loss_threshold(loss_pct)} counter drop comment "loss {loss_pct:g}%"')
    return "\n".join(lines) + "\n"


def chain_drops(table: str, chain: str) -> int:
    """Packets dropped so far by the counters of one chain (0 when none)."""
    total = 0
    for item in list_json("chain", FAMILY, table, chain):
        rule = item.get("rule")
        if not rule:
            continue
        for expr in rule.get("expr", []):
            if "counter" in expr:
                total += expr["counter"].get("packets", 0)
    return total
