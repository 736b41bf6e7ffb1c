"""Microburst generator with ground truth: builds tests/kernel/burstgen.c and runs it.

    ip netns exec NS python tests/kernel/burstgen.py --dst 198.19.7.2 --rate 1gbit \
        --frame 4042 --bursts 1000,200,1000,200 --gap-ms 30 [--tap IFNAME] [--cpu N]

The generator is C (busy-wait pacing on CLOCK_MONOTONIC, SCHED_FIFO, pinned), so
the frames' timing does not depend on the Python interpreter; its docstring says
what each JSON line holds. build() compiles it once with the machine's gcc into
.cache/burstgen/ (ignored by git), under a name keyed by the source's and flags'
hash, and returns the executable's path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("burstgen.c")
CACHE = SOURCE.parents[2] / ".cache" / "burstgen"
CFLAGS = ["-O2", "-Wall", "-Wextra"]


def build() -> str:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode()).hexdigest()[:16]
    exe = CACHE / f"burstgen-{digest}"
    if not exe.exists():
        if shutil.which("gcc") is None:
            raise RuntimeError("gcc is not installed (scripts/setup.sh installs it); "
                               "tests/kernel/burstgen.c is compiled at run time")
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_name(f"{exe.name}.{os.getpid()}.tmp")   # concurrent builds: one wins
        out = subprocess.run(["gcc", *CFLAGS, "-o", str(tmp), str(SOURCE)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"gcc failed on {SOURCE}:\n{out.stderr}")
        os.replace(tmp, exe)
        for old in CACHE.glob("burstgen-*"):     # builds of earlier sources
            if old != exe and not old.name.endswith(".tmp"):
                old.unlink(missing_ok=True)
    return str(exe)


if __name__ == "__main__":
    exe = build()
    os.execv(exe, [exe, *sys.argv[1:]])
