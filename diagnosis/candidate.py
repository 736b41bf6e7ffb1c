"""What a detector proposes in one evaluation; the engine turns candidates into
findings (opening, updating and closing them, diagnosis/engine.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fabricscope.diagnosis.causes import Cause
from fabricscope.diagnosis.finding import Advice, Evidence, finding_key
from fabricscope.diagnosis.localize import Hops


@dataclass
class Candidate:
    cause: Cause
    severity: str
    place: dict
    summary: str
    bad_from_ns: int                  # earliest evidence of it in this evaluation
    bad_until_ns: int                 # end of its latest evidence
    evidence: list[Evidence] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)
    step_seconds_added: float = 0.0
    share_of_step: float = 0.0
    explained_share: float = 0.0
    retransmit_amplification: float | None = None
    victims: list[dict] = field(default_factory=list)
    facts: dict = field(default_factory=dict)      # numbers the advice rules read
    #: network causes: the fabric elements each bad hop it was placed by implicates
    #: (diagnosis/localize.Located.hops), by which the engine tells when one finding's
    #: place explains all of another's hops
    hops: Hops = Hops()
    #: its cause is the one the open finding at its place was named with, held against
    #: this evaluation's reading (PlaceMemory.same_cause): it says the fault goes on,
    #: and its account, written for the other cause, is not the finding's
    held: bool = False

    @property
    def key(self) -> tuple:
        return finding_key(self.cause, self.place)


@dataclass(frozen=True)
class RuledOut:
    cause: Cause
    why: str
