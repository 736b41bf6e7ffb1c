"""A lab for the length of a block: the demo, the benches and the tests use it.

    from fabricscope.lab.running import running_lab
    with running_lab(nodes=3) as lab:          # or running_lab("name", 3)
        ...

up() on entry; down() on exit, also when the body raises, on KeyboardInterrupt,
and on SIGTERM (when entered in the main thread with SIGTERM at its default, it
turns SIGTERM into KeyboardInterrupt for the duration).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading

from fabricscope.lab.topology import down, down_orphans, up


def unique_name(prefix: str = "t") -> str:
    """A fresh, valid lab name: <prefix><pid><4 hex>."""
    return f"{prefix}{os.getpid()}{secrets.token_hex(2)}"[:32]


_OWNER_PID = [0]


def unwind_on_sigterm():
    """Make SIGTERM raise KeyboardInterrupt in this process, so finally blocks and
    fixtures tear down as on Ctrl-C. Returns the handler it replaced."""
    _OWNER_PID[0] = os.getpid()
    return signal.signal(signal.SIGTERM, _sigterm)


def _sigterm(signum, frame):
    # Only the process that entered running_lab unwinds (and tears down). A forked
    # child (pyroute2 forks helpers for netns sockets, and stops them with SIGTERM)
    # inherits this handler and must die as with the default action instead of
    # running the parent's finally blocks.
    if os.getpid() != _OWNER_PID[0]:
        os._exit(128 + signum)
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def running_lab(name: str | None = None, nodes: int = 2, link_rate=None, shape_links: bool = True,
                wire_frames: bool = False, tors: int = 1):
    """up(name or a fresh unique name, nodes, ...) for the block; down() always."""
    name = name or unique_name()
    swapped = False
    previous = None
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        previous = unwind_on_sigterm()
        swapped = True
    try:
        try:
            down_orphans()          # labs of test runs that died where no teardown ran
            lab = up(name, nodes, link_rate=link_rate, shape_links=shape_links,
                     wire_frames=wire_frames, owner_pid=os.getpid(), tors=tors)
            yield lab
        finally:
            down(name)
    finally:
        if swapped:
            signal.signal(signal.SIGTERM, previous)
