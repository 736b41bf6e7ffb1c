"""The lab's nftables table: one `bridge` family table per lab, one pair of chains per node.

    table bridge fabricscope_<h6>
      chain pre   hook prerouting   iifname <port I> jump node<I>_tx   (frames node I sends)
      chain post  hook postrouting  oifname <port I> jump node<I>_rx   (frames sent to node I)
      chain node<I>_tx, node<I>_rx  empty, or the node's fault rules

Faults only flush and refill a node's own two chains, atomically (`nft -f -`), so
other nodes' counters keep counting.
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


def create_table_script(table: str, ports: list[str]) -> str:
    # "table X; delete table X; table X {...}" replaces a leftover table atomically
    lines = [f"table {FAMILY} {table}", f"delete table {FAMILY} {table}",
             f"table {FAMILY} {table} {{"]
    for i in range(len(ports)):
        lines += [f"  chain node{i}_tx {{ }}", f"  chain node{i}_rx {{ }}"]
    lines.append("  chain pre { type filter hook prerouting priority -200; policy accept;")
    lines += [f'    iifname "{p}" jump node{i}_tx' for i, p in enumerate(ports)]
    lines.append("  }")
    lines.append("  chain post { type filter hook postrouting priority 200; policy accept;")
    lines += [f'    oifname "{p}" jump node{i}_rx' for i, p in enumerate(ports)]
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
    lines = [f"flush chain {FAMILY} {table} node{index}_tx",
             f"flush chain {FAMILY} {table} node{index}_rx"]
    if loss_pct:
        thr = loss_threshold(loss_pct)
        for chain in (("tx", "rx") if direction == "both" else (direction,)):
            lines.append(f"add rule {FAMILY} {table} node{index}_{chain} numgen random mod 10000 "
                         f'< {thr} counter drop comment "loss {loss_pct:g}%"')
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
