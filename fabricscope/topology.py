"""Which top-of-rack switch (ToR) each node hangs off: the topology file.

In production the file is generated from the nodes' labels (Kubernetes has no
standard rack label; e.g. `topology.kubernetes.io/rack`, or the levels Kueue's
topology-aware scheduling names); the lab writes the same format at `lab up`
(`<lab dir>/topology.yaml`). The collector reads it (config `topology_file`) to
place findings on a ToR or an uplink. Node names are the agents' node names.

    # fabricscope topology: which top-of-rack switch each node hangs off
    # (production: generated from node labels, e.g. topology.kubernetes.io/rack)
    tors: [tor0, tor1]
    nodes:
      node0: {tor: tor0}
      node1: {tor: tor1}

Every node names a ToR of `tors`; a ToR may have no node yet. A bad file is a
UserError of one line that names the file and what is wrong in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fabricscope.errors import UserError

HEADER = ("# fabricscope topology: which top-of-rack switch each node hangs off\n"
          "# (production: generated from node labels, e.g. topology.kubernetes.io/rack)\n")
EXAMPLE = "tors: [tor0]\nnodes:\n  node0: {tor: tor0}"


@dataclass(frozen=True)
class Topology:
    """node name -> ToR name, and the ToRs in order."""

    tors: tuple[str, ...]
    nodes: dict[str, str] = field(default_factory=dict)     # node -> its ToR

    def tor_of(self, node: str) -> str | None:
        """The ToR of `node`, None for a node the file does not name."""
        return self.nodes.get(node)

    def nodes_of(self, tor: str) -> tuple[str, ...]:
        """The nodes on `tor`, in file order."""
        return tuple(n for n, t in self.nodes.items() if t == tor)

    def to_yaml(self) -> str:
        """The file's text (what load_topology reads back)."""
        body = {"tors": list(self.tors), "nodes": {n: {"tor": t} for n, t in self.nodes.items()}}
        # flow style for the leaves gives `tors: [tor0, tor1]` and `node0: {tor: tor0}`,
        # and yaml quotes any name that would otherwise read back as a number or a bool
        return HEADER + yaml.safe_dump(body, default_flow_style=None, sort_keys=False)


def write_topology(topology: Topology, path: str | Path) -> None:
    """Write the file atomically (a reader never sees half of it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(topology.to_yaml())
    tmp.replace(path)


def load_topology(path: str | Path) -> Topology:
    """Read and check a topology file; UserError (one line) when it is missing or bad."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserError(f"cannot read topology file {path}: {exc.strerror}",
                        "give the path of a readable topology file (topology_file)") from None
    return parse_topology(text, str(path))


def parse_topology(text: str, source: str = "topology file") -> Topology:
    def bad(what: str) -> UserError:
        return UserError(f"{source}: {what}",
                         f"write it as: {EXAMPLE.replace(chr(10), '; ')}")

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise bad(f"not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise bad("the file must be a mapping with `tors` and `nodes`")
    unknown = sorted(str(k) for k in data if k not in ("tors", "nodes"))
    if unknown:
        raise bad(f"unknown key {unknown[0]!r}")
    tors = data.get("tors")
    if not isinstance(tors, list) or not tors:
        raise bad("`tors` must be a non-empty list of ToR names")
    for tor in tors:
        _check_name(tor, "ToR", bad)
    if len(set(tors)) != len(tors):
        raise bad(f"ToR {next(t for t in tors if tors.count(t) > 1)!r} is listed twice")
    nodes = data.get("nodes") or {}
    if not isinstance(nodes, dict):
        raise bad("`nodes` must map each node name to {tor: NAME}")
    placed = {}
    for node, entry in nodes.items():
        _check_name(node, "node", bad)
        if not isinstance(entry, dict) or set(entry) != {"tor"}:
            raise bad(f"node {node!r} must be given as {{tor: NAME}}")
        if entry["tor"] not in tors:
            raise bad(f"node {node!r} hangs off {entry['tor']!r}, which `tors` does not list")
        placed[node] = entry["tor"]
    return Topology(tors=tuple(tors), nodes=placed)


def _check_name(value, what: str, bad) -> None:
    if not isinstance(value, str) or not value.strip():
        raise bad(f"{what} name {value!r} is not a string (quote it)")
