"""fabricscope.commpeers: Send/Recv peers numbered as training ranks, from what the
rows tell of their communicators, or unknown; never guessed."""

from __future__ import annotations

import dataclasses

from fabricscope.commpeers import Membership, number_peers
from fabricscope.jobclass import JobClass, Observation, classify
from tests.unit.test_jobclass import pipeline


def two_pipelines(comm=None):
    """Pipeline and data parallel together on four ranks: stages 0-1 of the first
    pipeline are ranks 0 and 1, of the second ranks 2 and 3, each pipeline its own
    communicator of two (peers in its numbering: 0 and 1); an NCCL-style id per
    communicator where comm(pipeline index) gives one."""
    rows = []
    for index, base in enumerate((0, 2)):
        for o in pipeline(2):
            rows.append((dataclasses.replace(o, rank=base + o.rank),
                         Membership(comm(index) if comm else None, o.rank, 2)))
    return rows


def test_a_comm_with_an_id_maps_its_members_ranks_to_their_training_ranks():
    got, unknown = number_peers(two_pipelines(lambda i: f"c{i}"))
    assert unknown == 0
    assert {(o.rank, o.peer) for o in got} == {(0, 1), (1, 0), (2, 3), (3, 2)}


def test_a_gloo_sub_group_without_an_id_leaves_its_peers_unknown():
    """Ranks 2 and 3 are 0 and 1 of their group: taking the group's numbering for the
    training ranks would link rank 2 to rank 1. The world has four ranks, so even the
    first pipeline's group (whose numbering happens to agree) is a sub-group."""
    rows = two_pipelines()
    got, unknown = number_peers(rows)
    assert unknown == len(rows) and all(o.peer is None for o in got)
    # each rank still says whom of its group it sends to and receives from: a pipeline
    # in training, both ways on every link
    assert classify(got).job_class is JobClass.PIPELINE


def test_the_world_group_keeps_its_peers():
    rows = [(o, Membership(None, o.rank, 3)) for o in pipeline(3)]
    got, unknown = number_peers(rows)
    assert unknown == 0 and got == [o for o, _ in rows]
    assert classify(got).job_class is JobClass.PIPELINE


def test_a_peer_whose_member_has_no_row_in_the_window_is_unknown():
    rows = [(Observation("Send", 1, 0, 10, rank=5, peer=1), Membership("c", 0, 2))]
    assert number_peers(rows) == ([Observation("Send", 1, 0, 10, rank=5, peer=None,
                                               comm_peer=1)], 1)


def test_rows_that_tell_nothing_of_their_communicator_keep_their_peers():
    rows = [(Observation("Send", 1, 0, 10, rank=2, peer=0), Membership()),
            (Observation("Recv", 1, 0, 10, rank=0, peer=2), Membership(None, 0, None))]
    assert number_peers(rows) == ([o for o, _ in rows], 0)
