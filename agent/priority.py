"""The agent's CPU priority: lowered once its probes are attached (config `nice`,
`cpu_policy`), so the training it watches keeps the CPU, except for the few threads
that must act while an event lasts (a starting rank's identity, read while it
lives) and wake briefly."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("fabricscope.agent")

#: native thread ids lower_priority leaves at the priority they started with
_KEPT: set[int] = set()


def keep_priority(native_id: int) -> None:
    """lower_priority leaves this thread as it is (a started thread's native_id);
    the thread must wake rarely and briefly, as the training loses what it takes."""
    _KEPT.add(native_id)


def release_priority(native_id: int) -> None:
    """The thread has ended: its id may name another thread later."""
    _KEPT.discard(native_id)


def lower_priority(nice: int, policy: str = "normal") -> None:
    """Drop every thread of the agent to `nice`, or to SCHED_IDLE for policy "idle"
    (Linux priorities are per thread; threads started later inherit their creator's),
    but the threads `keep_priority` named. After attach: BCC compiles at full speed."""
    if policy == "idle":
        def lower(tid: int) -> None:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        how = "as SCHED_IDLE from here on (config cpu_policy)"
    elif nice > 0:
        def lower(tid: int) -> None:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        how = f"at nice {nice} from here on (config nice)"
    else:
        return
    for tid in os.listdir("/proc/self/task"):
        if int(tid) in _KEPT:
            continue
        try:
            lower(int(tid))
        except OSError:      # a thread that just exited
            pass
    log.info("agent runs %s", how)
