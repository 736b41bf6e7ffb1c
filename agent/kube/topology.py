"""The topology file (fabricscope/topology.py) from the nodes' labels.

Kubernetes has no standard rack label; Kueue's topology-aware scheduling names
its levels by node labels from the widest down (e.g. `cloud.google.com/gce-
topology-block`, `cloud.google.com/gce-topology-subblock`, then
`kubernetes.io/hostname`), and clusters label racks or zones their own way
(`topology.kubernetes.io/zone`). Given those label keys from the widest level down
to the one a ToR serves, a node's ToR is the values of its labels joined with '.'
(a rack name is unique only inside its block). A node lacking one of them is left
out and named on stderr.

    kubectl get nodes -o json | python -m fabricscope.agent.kube.topology \
        --level cloud.google.com/gce-topology-block \
        --level cloud.google.com/gce-topology-subblock -o topology.yaml

Node names are metadata.name: give each agent the same name (config `node`, from
the downward API's spec.nodeName).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fabricscope.errors import UserError
from fabricscope.topology import Topology, write_topology


def topology_from_nodes(node_list: object, levels: list[str]) -> tuple[Topology, list[str]]:
    """A NodeList (decoded JSON) -> (Topology, names of nodes left out)."""
    if not levels:
        raise UserError("no topology level given", "name the node labels with --level KEY")
    if not isinstance(node_list, dict) or not isinstance(node_list.get("items"), list):
        raise UserError("input is not a NodeList", "pipe `kubectl get nodes -o json` into it")
    placed: dict[str, str] = {}
    left_out: list[str] = []
    for item in node_list["items"]:
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            left_out.append("<unnamed>")
            continue
        labels = meta.get("labels") or {}
        values = [labels.get(key) for key in levels]
        if not all(isinstance(v, str) and v for v in values):
            left_out.append(name)
            continue
        placed[name] = ".".join(values)
    tors = tuple(dict.fromkeys(sorted(placed.values())))
    if not tors:
        raise UserError(f"no node carries every label of {', '.join(levels)}",
                        "check the label keys with `kubectl get nodes --show-labels`")
    return Topology(tors=tors, nodes=dict(sorted(placed.items()))), left_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fabricscope.agent.kube.topology",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("nodes", nargs="?", default="-",
                        help="`kubectl get nodes -o json` output (default: stdin)")
    parser.add_argument("--level", action="append", default=[], metavar="LABEL",
                        help="node label of a topology level, widest first (repeat)")
    parser.add_argument("-o", "--output", default="-", help="topology file (default: stdout)")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.nodes == "-" else Path(args.nodes).read_text()
        topology, left_out = topology_from_nodes(json.loads(text), args.level)
    except (OSError, ValueError) as exc:
        print(f"fabricscope: error: cannot read nodes {args.nodes}: {exc}; fix: pipe "
              "`kubectl get nodes -o json` into it", file=sys.stderr)
        return 2
    except UserError as exc:
        print(exc.one_line(), file=sys.stderr)
        return 2
    if left_out:
        print(f"left out (missing a level label): {', '.join(left_out)}", file=sys.stderr)
    if args.output == "-":
        sys.stdout.write(topology.to_yaml())
    else:
        write_topology(topology, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
