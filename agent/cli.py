"""`fabricscope agent`: the per-node agent (eBPF probes + training markers -> collector)."""

from __future__ import annotations

import argparse

EPILOG = """\
examples:
  sudo fabricscope agent --collector 198.18.0.254:9470
  sudo fabricscope agent --output jsonl --metrics-port 0          # print records, ship nothing
  sudo ip netns exec node1 fabricscope agent --node node1 --collector 198.18.0.254:9470
  fabricscope agent --probes markers --output jsonl                 # no root needed

Runs as root when a BPF probe is enabled (it mounts tracefs and links kernel
headers itself). Logs go to stderr; one line names the /metrics port.
Configuration: docs/config.md (flags > FABRICSCOPE_AGENT_* > YAML > defaults).
"""


def register(subparsers) -> None:
    from fabricscope.agent.config import AgentConfig
    from fabricscope.config import add_arguments

    parser = subparsers.add_parser(
        "agent", help="run the per-node agent", description=__doc__.split(":", 1)[1].strip(),
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, AgentConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fabricscope.agent.config import AgentConfig
    from fabricscope.agent.main import run_agent
    from fabricscope.config import load

    return run_agent(load(AgentConfig, "agent", args))
