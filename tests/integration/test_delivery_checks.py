"""The crash matrices' delivery checks (tests/integration/deliveries.py) fail where they
must: epochs of the crash driver's points sent to the real InfluxDB through a recording
fault proxy, one of them a second time where the protocol allows none, or sent again
in part, or out of its order; and a kill that landed elsewhere than said."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from devkit.faultproxy import Recorded
from tests.integration.deliveries import (
    WHOLE,
    Landing,
    Recording,
    check_deliveries,
    points,
    settled,
)
from twophase.targets import make_writer

EPOCHS = 4
BATCH = 40


def bodies(epoch: int) -> list[list[bytes]]:
    """An epoch's points in 40-point requests, in order."""
    lines = points(epoch)
    return [lines[i : i + BATCH] for i in range(0, len(lines), BATCH)]


def sent(recording: Recording, requests: Sequence[list[bytes]]) -> list[Recorded]:
    """``requests`` written through the proxy, one request each, and what it recorded
    of them."""
    start = len(recording.proxy.recorded())
    writer = make_writer(recording.target)
    try:
        for body in requests:
            writer.write(b"\n".join(body))
    finally:
        writer.close()
    return settled(recording.proxy)[start:]


def test_each_epoch_once_passes(recording: Recording) -> None:
    before = sent(recording, [b for e in (0, 1) for b in bodies(e)])
    after = sent(recording, [b for e in (2, 3) for b in bodies(e)])
    Landing(2, 0).check(before)
    check_deliveries(before, after, EPOCHS, resend=None)


# (what the killed run sent, what its restart sent, the epoch allowed again, the failure)
FAULTS = {
    "an epoch sent again with no re-send allowed": (
        [(0, None), (1, None)],
        [(1, None), (2, None), (3, None)],
        None,
        "epoch 1 sent before the kill and again after it",
    ),
    "another epoch sent again than the one allowed": (
        [(0, None), (1, slice(0, 2))],
        [(0, None), (1, None), (2, None), (3, None)],
        1,
        "epoch 0 sent before the kill and again after it",
    ),
    "the allowed epoch resumed, not sent again whole": (
        [(0, None), (1, slice(0, 2))],
        [(1, slice(2, None)), (2, None), (3, None)],
        1,
        "epoch 1 re-sent after the restart: 80 point(s) missing",
    ),
    "the allowed epoch sent again out of its order": (
        [(0, None), (1, slice(0, 2))],
        [(1, slice(None, None, -1)), (2, None), (3, None)],
        1,
        "epoch 1 re-sent after the restart: its points out of their order",
    ),
    "a request of an epoch sent twice in one run": (
        [(0, None), (0, slice(3, 4)), (1, None)],
        [(2, None), (3, None)],
        None,
        "epoch 0 delivered: 40 point(s) twice",
    ),
}


def _requests(plan: Sequence[tuple[int, slice | None]]) -> list[list[bytes]]:
    return [b for epoch, part in plan for b in bodies(epoch)[part or slice(None)]]


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_delivery_the_protocol_does_not_allow_fails_the_check(
    fault: str, recording: Recording
) -> None:
    first, then, resend, failure = FAULTS[fault]
    before = sent(recording, _requests(first))
    after = sent(recording, _requests(then))
    with pytest.raises(AssertionError, match=re.escape(failure)):
        check_deliveries(before, after, EPOCHS, resend)


def test_a_kill_elsewhere_than_said_fails_the_landing(recording: Recording) -> None:
    before = sent(recording, [*bodies(0), *bodies(1)[:2]])
    Landing(1, 2 * BATCH).check(before)  # where it landed
    for elsewhere in (Landing(1, 3 * BATCH), Landing(1, 0), Landing(2, 0), Landing(1, 0, BATCH)):
        with pytest.raises(AssertionError):
            elsewhere.check(before)
    Landing(1, 1, WHOLE - 1).check(before)  # "inside epoch 1"
