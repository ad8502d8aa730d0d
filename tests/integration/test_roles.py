"""The public face's two roles against the real staging store and InfluxDB: a stager
that travels by pickle to another process stages there, the committer commits,
detects a replay, recovers and records the run's end."""

from __future__ import annotations

import pickle
import subprocess
import sys
import uuid

import pytest

from tests.staging import M, lines
from tests.support import REPO, influx_count, two_phase
from twophase import DriverCommitter, EpochState, ExecutorStager, TwoPhaseConfig
from twophase.config import StagingConfig, TargetConfig
from twophase.model import CommitMessage

# Another process unpickles the stager, stages, and pickles the message back: what a
# Spark task does with the stager a driver ships it.
_EXECUTOR = """
import pickle, sys
stager, sink, epoch, points, run = pickle.loads(sys.stdin.buffer.read())
message = stager.stage(sink, epoch, points, partition_id=1, run_id=run)
sys.stdout.buffer.write(pickle.dumps(message))
"""


def _staged_elsewhere(
    stager: ExecutorStager, sink: str, epoch: int, points: list[str], run: str
) -> CommitMessage:
    sent = pickle.dumps((stager, sink, epoch, points, run))
    done = subprocess.run(
        [sys.executable, "-c", _EXECUTOR], input=sent, capture_output=True, check=True, cwd=REPO
    )
    message = pickle.loads(done.stdout)
    assert isinstance(message, CommitMessage)
    return message


def test_a_stager_shipped_to_another_process_stages_and_the_committer_commits(
    staging: StagingConfig, influx: TargetConfig
) -> None:
    sink, run = f"roles-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    with DriverCommitter.open(TwoPhaseConfig(staging, influx)) as committer:
        lease = committer.claim(sink, run, "q")
        message = _staged_elsewhere(committer.stager(), sink, 0, lines(0, 30), run)
        outcome = committer.commit(lease, 0, [message])
        assert (outcome.state, outcome.replay) == (EpochState.COMMITTED, False)
        assert influx_count(influx, M) == 30
        again = committer.stager().stage(sink, 0, lines(0, 30, value_offset=1.0))
        replay = committer.commit(lease, 0, [again])
        assert (replay.state, replay.replay) == (EpochState.COMMITTED, True)
        assert influx_count(influx, M) == 30  # the replay's values were never sent
        assert committer.end(lease) is True
        assert committer.end(lease, failed=True) is False  # the first end stands


def test_recover_promotes_what_a_run_left_decided(
    staging: StagingConfig, influx: TargetConfig
) -> None:
    sink = f"roles-{uuid.uuid4().hex[:8]}"
    config = TwoPhaseConfig(staging, influx)
    with two_phase(staging, influx) as tp:  # a run that decides epoch 0, then stops
        lease = tp.begin_run(sink, "r1", "q")
        message = tp.stager.stage(sink, 0, lines(0, 10))
        assert tp.ledger.decide(lease, 0, [message]).state == EpochState.PRECOMMITTED
    assert influx_count(influx, M) == 0
    with DriverCommitter.open(config) as committer:
        assert committer.recover(lease) == (0,)
        assert committer.recover(lease) == ()  # nothing left: promoted once
    assert influx_count(influx, M) == 10


def test_the_protocols_parts_are_a_former_name() -> None:
    import twophase

    assert "TwoPhase" not in twophase.__all__
    with pytest.warns(DeprecationWarning, match="use DriverCommitter"):
        parts = twophase.TwoPhase
    assert parts.__name__ == "TwoPhase"
