"""A real `fabricscope agent --output jsonl` in one lab node's namespace, for kernel
tests that read what the agent printed: started, awaited until its probes are
attached, always stopped by pid (SIGTERM: its last poll drains and flushes)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

from fabricscope.lab.stack import await_condition
from fabricscope.records import Record
from fabricscope.services import terminate

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def jsonl_agent(lab, node, tmp: Path, *args: str, attached: str = "running probes:"):
    """Yields the Popen; records() reads what it printed so far. `attached`: the log
    text that says the probes are attached. After the block, the Popen's stopped_rc is
    the exit code its stop returned (0: it drained and flushed)."""
    from fabricscope.lab import exec_argv, exec_env
    out, err = tmp / "agent.jsonl", tmp / "agent.log"
    argv = exec_argv(node, [sys.executable, "-m", "fabricscope", "agent", "--output", "jsonl",
                            "--metrics-port", "0", *args])
    with open(out, "wb") as fo, open(err, "wb") as fe:
        agent = subprocess.Popen(argv, stdout=fo, stderr=fe, env=exec_env(lab, node),
                                 cwd=str(ROOT))
    agent.out_path, agent.err_path = out, err
    try:
        await_condition(lambda: attached in err.read_text() or agent.poll() is not None,
                        120, "the agent to attach")
        assert agent.poll() is None, err.read_text()[-2000:]
        yield agent
    finally:
        agent.stopped_rc = terminate(agent, 30)


def records(path: Path) -> list[Record]:
    return [Record.from_json(line) for line in path.read_text().splitlines()
            if line.strip().startswith("{")]
