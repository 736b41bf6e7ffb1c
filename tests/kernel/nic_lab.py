"""Test helpers for the nic probe: the testbed of bench/iperf3_overhead.py.

netns_pair(mtu): two fresh namespaces joined by one veth, addresses .1/.2 of a
random 198.19.X.0/24, IPv6 off, static neighbours, removed on any exit.
running(prefix, *flags): `python -m fabricscope.agent.probes.nic.standalone` under `prefix`
(e.g. pair.exec(ns); [] for the host's namespace), its JSON lines collected.
burstgen(): the path of tests/kernel/burstgen.c's executable, built once per source
hash; BURSTGEN: the script that builds and runs it (`PYTHON BURSTGEN --dst ...`).
"""

from fabricscope.bench.iperf3_overhead import (PYTHON, ROOT, Pair, Runner, iperf3_server, netns_pair,
                                   running, sh)
from tests.kernel.burstgen import build as burstgen

BURSTGEN = str(ROOT / "tests" / "kernel" / "burstgen.py")

__all__ = ["BURSTGEN", "PYTHON", "ROOT", "Pair", "Runner", "burstgen", "iperf3_server",
           "netns_pair", "running", "sh"]
