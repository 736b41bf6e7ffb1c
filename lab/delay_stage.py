"""A delay stage: every frame a switch port sends toward its node waits a fixed time.

The lab's kernel has neither netem nor fq (no EDT pacing), so no qdisc can delay a
frame without dropping others. This stage does it in user space, as netem would in
the kernel: a TC program at the port's egress redirects each frame to a TAP device
that this process owns; the process reads it (virtio-net header and all, so a
segmentation-offload frame of up to 64 KiB stays one read), holds it for the
delay, and writes it back; the TAP's ingress program marks it and redirects it to
the port's egress again, where the mark lets it pass to the node. Frames keep
their order (one FIFO, one fixed delay), nothing is dropped while the process
keeps up (the TAP's queue holds TAP_QUEUE frames; its drops are counted on the
TAP, tx_dropped), and the delay is a lower bound: a busy host can only add to it.

    python -m fabricscope.lab.delay_stage PORT DELAY_MS

prints "ready" once frames go through it, and on SIGTERM detaches and exits.
fabricscope.lab.faults.delay starts and stops it.
"""

from __future__ import annotations

import collections
import fcntl
import math
import os
import select
import signal
import struct
import sys
import time

#: the mark a frame the stage wrote back carries at the port (no other part of the lab
#: marks frames); the port's program clears it and lets the frame go
DELAYED_MARK = 0x6FD1
#: clsact priority of the port's filter (the agent's filters use 0x1000 and up)
FILTER_PRIO = 0x7FD1
#: frames the TAP may hold before the process reads them (the kernel's ring)
TAP_QUEUE = 20000

TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN = 0x01, 0x02, 0x04, 0x08
FRAME_MAX = 65536 + 64          # a GSO frame and its virtio-net header

PROGRAMS = r"""
#include <uapi/linux/pkt_cls.h>
int to_stage(struct __sk_buff *skb) {
    if (skb->mark == DELAYED_MARK) {
        skb->mark = 0;
        return TC_ACT_OK;
    }
    return bpf_redirect(STAGE_IFINDEX, 0);
}
int from_stage(struct __sk_buff *skb) {
    skb->mark = DELAYED_MARK;
    return bpf_redirect(PORT_IFINDEX, 0);
}
"""

EGRESS, INGRESS = "ffff:fff3", "ffff:fff2"


def stage_name(port: str) -> str:
    """The TAP's name for a port (IFNAMSIZ: 15 characters at most)."""
    return ("dl" + port)[:15]


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(),
                                           IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
    fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN)
    return fd


def attach(ipr, port_index: int, tap_index: int):
    """Load both programs and attach them (port egress, TAP ingress); the BPF object."""
    from bcc import BPF
    bpf = BPF(text=PROGRAMS, cflags=[f"-DDELAYED_MARK={DELAYED_MARK}",
                                     f"-DSTAGE_IFINDEX={tap_index}",
                                     f"-DPORT_IFINDEX={port_index}"])
    for index, fn_name, parent in ((tap_index, b"from_stage", INGRESS),
                                   (port_index, b"to_stage", EGRESS)):
        fn = bpf.load_func(fn_name, BPF.SCHED_CLS)
        try:
            ipr.tc("add", "clsact", index)
        except Exception as exc:        # the port may have its clsact already
            if getattr(exc, "code", None) != 17:        # EEXIST
                raise
        ipr.tc("add-filter", "bpf", index, ":1", fd=fn.fd, name=fn.name, parent=parent,
               classid=1, direct_action=True, prio=FILTER_PRIO)
    return bpf


def detach(ipr, port_index: int) -> None:
    """Remove the port's filter: without its stage, it would send frames nowhere."""
    try:
        ipr.tc("del-filter", "bpf", port_index, ":1", parent=EGRESS, prio=FILTER_PRIO)
    except Exception as exc:
        if getattr(exc, "code", None) not in (2, 19, 22):   # gone already, or the port
            raise


def remove_filter(port: str) -> None:
    """detach() by the port's name (a stage that was killed left its filter)."""
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=port)
        if index:
            detach(ipr, index[0])


def run(port: str, delay_s: float) -> int:
    from pyroute2 import IPRoute
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    name = stage_name(port)
    fd = open_tap(name)
    with open(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6", "w") as f:
        f.write("1")                    # the TAP sends nothing of its own to the node
    with IPRoute() as ipr:
        (port_index,) = ipr.link_lookup(ifname=port) or [None]
        (tap_index,) = ipr.link_lookup(ifname=name)
        if port_index is None:
            print(f"no interface {port}", file=sys.stderr)
            return 2
        ipr.link("set", index=tap_index, txqlen=TAP_QUEUE, state="up")
        bpf = attach(ipr, port_index, tap_index)
        try:
            print("ready", flush=True)
            _forward(fd, port, delay_s, stop)
        finally:
            detach(ipr, port_index)
            bpf.cleanup()
            os.close(fd)
    return 0


def _forward(fd: int, port: str, delay_s: float, stop: list) -> None:
    """Read every frame as it comes, write each back once it has waited delay_s."""
    held: collections.deque = collections.deque()
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    while not stop:
        now = time.monotonic()
        wait_ms = -1 if not held else max(0, math.ceil((held[0][0] - now) * 1000))
        try:
            ready = poll.poll(min(wait_ms, 200) if wait_ms >= 0 else 200)
        except InterruptedError:
            continue
        if not ready and not held and not os.path.exists(f"/sys/class/net/{port}"):
            return                      # the lab went down under it
        if ready:
            while True:
                try:
                    frame = os.read(fd, FRAME_MAX)
                except BlockingIOError:
                    break
                held.append((time.monotonic() + delay_s, frame))
        now = time.monotonic()
        while held and held[0][0] <= now:
            try:
                os.write(fd, held[0][1])
            except BlockingIOError:
                break
            held.popleft()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m fabricscope.lab.delay_stage PORT DELAY_MS", file=sys.stderr)
        return 2
    return run(argv[0], float(argv[1]) / 1000.0)


if __name__ == "__main__":
    sys.exit(main())
