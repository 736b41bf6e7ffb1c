"""Point-to-point peers numbered as training ranks.

    observations, unnumbered = number_peers(rows)   # rows: (Observation, Membership)

A Send's or Recv's peer is a rank in its communicator (gloo's process group, NCCL's
comm), while a row's rank is the process's training rank. The two numberings agree
only in the world group: a pipeline that runs within a sub-group (pipeline and data
parallel together) names stage 1 of its group "1" whatever its training rank. The
models that follow links between stages (a training pipeline sends both ways on each
link, fabricscope.jobclass; each stage's peers, fabricscope.stagemodel) need one
numbering, so each peer is translated here or, where the evidence cannot say, left
unknown (None) and counted, never guessed (the communicator's number stays in
`comm_peer`: a rank's own rows still say which of its peers it sends to and
receives from):

* a communicator with an id shared by its members (NCCL's comm hash): every member's
  rows carry its communicator rank and its training rank, so the members seen in the
  window map one to the other; a peer none of whose rows is in the window stays
  unknown;
* one without (gloo names no process group): the identity holds in the world group,
  known where the communicator has as many ranks as the job (the most of any
  communicator's nranks, the highest training rank seen + 1, and the ranks seen) and
  the process is its own rank in it; any other peer stays unknown;
* a row without its communicator rank (or, with no id, its size: an older agent)
  keeps its peer as it came.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fabricscope.jobclass import Observation


@dataclass(frozen=True)
class Membership:
    """The communicator a row's operation ran on, as the row tells it."""

    comm: str | None = None        # an id its members share (NCCL's comm hash)
    comm_rank: int | None = None   # the process's rank in it
    nranks: int | None = None      # its size


def number_peers(rows: list[tuple[Observation, Membership]]) \
        -> tuple[list[Observation], int]:
    """The observations with each peer a training rank or None, and how many peers
    were set to None (see the module's rules)."""
    members: dict[str, dict[int, int]] = {}
    ranks = {o.rank for o, _ in rows if o.rank is not None}
    world = max([len(ranks), max(ranks, default=-1) + 1,
                 *(m.nranks for _, m in rows if m.nranks is not None)])
    for o, m in rows:
        if m.comm is not None and m.comm_rank is not None and o.rank is not None:
            members.setdefault(m.comm, {})[m.comm_rank] = o.rank
    out, unknown = [], 0
    for o, m in rows:
        if o.peer is None or m.comm_rank is None or (m.comm is None and m.nranks is None):
            out.append(o)
            continue
        if m.comm is not None:
            peer = members.get(m.comm, {}).get(o.peer)
        else:
            peer = o.peer if m.nranks == world and m.comm_rank == o.rank else None
        unknown += peer is None
        out.append(o if peer == o.peer else dataclasses.replace(o, peer=peer, comm_peer=o.peer))
    return out, unknown
