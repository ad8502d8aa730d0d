"""How far a sink's compacted floor may pass its oldest epochs (pure logic)."""

from __future__ import annotations

import pytest

from twophase.protocol.maintain.compaction import Candidate, _passable

C, A, P = "COMMITTED", "ABORTED", "PRECOMMITTED"


@pytest.mark.parametrize(
    ("rows", "gone", "floor"),
    [
        ([], [], None),
        ([(0, C, True, False), (1, C, True, False)], [0, 1], 1),
        # a dead letter keeps its epoch's record; an aborted epoch keeps its own: both passed
        ([(0, C, True, True), (1, A, True, False), (2, C, True, False)], [2], 2),
        # a young (or unpurged) epoch stops the floor, and so does a PRECOMMITTED one
        ([(0, C, True, False), (1, C, False, False), (2, C, True, False)], [0], 0),
        ([(3, P, False, False), (4, C, True, False)], [], None),
    ],
)
def test_the_floor_passes_the_oldest_settled_epochs_in_order(
    rows: list[Candidate], gone: list[int], floor: int | None
) -> None:
    assert _passable(rows) == (gone, floor)
