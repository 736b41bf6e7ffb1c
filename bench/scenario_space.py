"""The diagnosis scenario space: every run drawn from its own seed.

A scenario is a lab (3-6 nodes on 1-3 ToRs, one of two model sizes), a training
job, and zero, one or two faults that go on at a drawn step:

    healthy    nothing
    loss       random loss, 0.5-5 %, at a node's switch port, a ToR's uplink (frames
               leaving the rack) or the spine's side of it (frames entering the rack)
    shape      a shallow TBF (100-500 Mbit/s, burst 8-64 kB) at one of the same places
    cpu        a CFS quota (10-60 % of one CPU) on one rank
    storage    the data server paced at 5-50 Mbit/s
    two        two of the above at once, on different places
    cleared    one of the network faults, cleared halfway (compare must see it)

Places name what a user would replace or retune: a node's port, or the link
between a ToR and the spine (both of its directions are that one link).

Two seed ranges keep the development set apart from the evaluation set
(docs/DIAGNOSIS.md): run i of a set is drawn from `SET_BASE[set] + i` alone, so
a set's runs are the same however many of them one asks for, and adding runs to
the development set never touches the evaluation set. Every sixth run is healthy.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field


class FaultKind(str, enum.Enum):
    LOSS = "loss"
    SHAPE = "shape"
    CPU = "cpu"
    STORAGE = "storage"
    DELAY = "delay"            # every frame toward the node(s) waits (lab.delay_stage)


class Element(str, enum.Enum):
    """Where a network fault sits: the port toward a node, or one direction of a
    ToR's link to the spine."""
    PORT = "port"
    UPLINK = "uplink"          # ToR -> spine (the ToR-side end's egress)
    DOWNLINK = "downlink"      # spine -> ToR (the spine-side end's egress)


class SetName(str, enum.Enum):
    DEV = "dev"
    EVAL = "eval"


#: the first seed of each set; run i is drawn from SET_BASE + i (sets of up to 10,000)
SET_BASE = {SetName.DEV: 10_000, SetName.EVAL: 90_000}
HEALTHY_EVERY = 6
MODEL_SIZES_MB = (4, 8)
LOSS_PCT = (0.5, 5.0)
RATE_MBIT = (100, 500)
BURST_KB = (8, 64)
QUOTA_PCT = (10, 60)
STORAGE_MBIT = (5, 50)
ONSET_STEPS = (12, 18)        # the job's baseline (2 warm-up + 8 steps) is in by step 10
FAULT_STEPS = 16
CLEARED_STEPS = 24            # compare's windows: 8 blocks of 3 steps a side at least
KINDS = ("loss", "shape", "cpu", "storage", "two", "cleared")


@dataclass(frozen=True)
class LabShape:
    nodes: int
    tors: int
    model_mb: int

    def tor_of(self, node: int) -> str:
        from fabricscope.lab.naming import tor_blocks
        return next(f"tor{k}" for k, block in enumerate(tor_blocks(self.nodes, self.tors))
                    if node in block)


#: Fault.target of a fault on every node's port alike
EVERY_NODE = "every node"


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    element: Element | None = None       # network faults only
    target: str = ""                     # "node2", "tor1"; "" for the storage
    value: float = 0.0                   # %, Mbit/s, % of a CPU, Mbit/s
    burst_kb: int = 0                    # shape only

    @property
    def node_index(self) -> int:
        return int(self.target.removeprefix("node"))

    @property
    def every_node(self) -> bool:
        """A fault on every node's port alike (target EVERY_NODE)."""
        return self.target == EVERY_NODE

    def expected_place(self) -> dict:
        """The keys of the finding's place that must match."""
        if self.kind is FaultKind.STORAGE or self.every_node:
            return {}
        if self.element in (Element.UPLINK, Element.DOWNLINK):
            return {"tor": self.target}
        return {"node": self.target}

    def expected_cause(self) -> str:
        return {FaultKind.LOSS: "lossy_link", FaultKind.SHAPE: "buffer_saturation",
                FaultKind.CPU: "straggler_compute", FaultKind.STORAGE: "input_stall",
                FaultKind.DELAY: "latency_bound"}[self.kind]

    def describe(self) -> str:
        where = f" at every node's {self.element.value}" if self.every_node else \
            f" at {self.target}'s {self.element.value}" if self.element else \
            f" on {self.target}" if self.target else ""
        value = {FaultKind.LOSS: f"{self.value:g} %", FaultKind.SHAPE:
                 f"{self.value:g} Mbit/s burst {self.burst_kb} kB",
                 FaultKind.CPU: f"{self.value:g} % of a CPU",
                 FaultKind.STORAGE: f"{self.value:g} Mbit/s",
                 FaultKind.DELAY: f"{self.value:g} ms"}[self.kind]
        return f"{self.kind.value} {value}{where}"


@dataclass(frozen=True)
class Drawn:
    """One run of the space: its seed, lab and job, its faults and when they act."""
    seed: int
    kind: str                                # healthy or one of KINDS
    lab: LabShape
    faults: tuple[Fault, ...] = ()
    onset_step: int = 14
    fault_steps: int = FAULT_STEPS
    cleared: bool = False
    params: dict = field(default_factory=dict, compare=False)

    def describe(self) -> str:
        faults = "; ".join(f.describe() for f in self.faults) or "no fault"
        return (f"seed {self.seed}: {self.kind}, {self.lab.nodes} nodes on {self.lab.tors} "
                f"ToR(s), model {self.lab.model_mb} MB, {faults}, onset after step "
                f"{self.onset_step}" + (", cleared after "
                                        f"{self.fault_steps} steps" if self.cleared else ""))


def seeds(set_name: SetName, runs: int, first: int = 0) -> list[int]:
    return [SET_BASE[set_name] + i for i in range(first, first + runs)]


def draw(seed: int) -> Drawn:
    """The run of `seed`: its kind (every HEALTHY_EVERY-th healthy), lab and faults."""
    rng = random.Random(seed)
    nodes = rng.randint(3, 6)
    lab = LabShape(nodes, rng.randint(1, min(3, nodes)), rng.choice(MODEL_SIZES_MB))
    onset = rng.randint(*ONSET_STEPS)
    if seed % HEALTHY_EVERY == 0:
        return Drawn(seed, "healthy", lab, onset_step=onset)
    kind = rng.choice(KINDS)
    if kind == "two":
        first = _fault(rng, lab, rng.choice(("loss", "shape")))
        second = _fault(rng, lab, rng.choice(("cpu", "storage", "loss")), avoid=first)
        return Drawn(seed, kind, lab, (first, second), onset)
    if kind == "cleared":
        return Drawn(seed, kind, lab, (_fault(rng, lab, rng.choice(("loss", "shape"))),),
                     onset, fault_steps=CLEARED_STEPS, cleared=True)
    return Drawn(seed, kind, lab, (_fault(rng, lab, kind),), onset)


def _fault(rng: random.Random, lab: LabShape, kind: str, avoid: Fault | None = None) -> Fault:
    if kind == "cpu":
        node = rng.choice([i for i in range(lab.nodes)
                           if avoid is None or avoid.target != f"node{i}"])
        return Fault(FaultKind.CPU, None, f"node{node}", rng.randint(*QUOTA_PCT))
    if kind == "storage":
        return Fault(FaultKind.STORAGE, None, "", rng.randint(*STORAGE_MBIT))
    elements = [Element.PORT] + ([Element.UPLINK, Element.DOWNLINK] if lab.tors > 1 else [])
    while True:
        element = rng.choice(elements)
        target = f"node{rng.randrange(lab.nodes)}" if element is Element.PORT else \
            f"tor{rng.randrange(lab.tors)}"
        if avoid is None or not _shares_place(avoid, element, target, lab):
            break
    if kind == "loss":
        return Fault(FaultKind.LOSS, element, target, round(rng.uniform(*LOSS_PCT), 1))
    return Fault(FaultKind.SHAPE, element, target, rng.randint(*RATE_MBIT),
                 rng.randint(*BURST_KB))


def _shares_place(a: Fault, element: Element, target: str, lab: LabShape) -> bool:
    """Two faults of one run sit on different places (a port and its own ToR's link
    are different places)."""
    if a.element is None:
        return False
    return (a.element is Element.PORT) == (element is Element.PORT) and a.target == target
