"""Two caught-up targets share one read of each epoch: every staged chunk read from
PostgreSQL once; each target still holds exactly the epoch, fails on its own without
stopping the other, and has its own dead letters and counts."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from devkit.faultproxy import CUT
from tests.integration.cli_helpers import sql
from tests.integration.fanout_helpers import (
    Pair,
    dead_letter_targets,
    deliveries,
    target_rows,
    two_targets,
    write_points,
)
from tests.staging import M, epoch_row, lines, stage
from tests.support import influx_count, two_phase
from twophase.config import NamedTarget, StagingConfig
from twophase.errors import PermanentError
from twophase.model import EpochState, Lease, StagedChunk
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.deliver.reader import StagedReader

SINK = "shared"
PARTS, PER_PART = 20, 6  # a chunk per part: more chunks than the shared buffer holds
BATCH = 10  # points a request: an epoch is 12 requests, read through the cursor


@pytest.fixture
def pair(influx_url: str) -> Iterator[Pair]:
    with two_targets(influx_url) as pair:
        small = {
            n: dataclasses.replace(c, batch_points=BATCH) for n, c in (("a", pair.a), ("b", pair.b))
        }
        targets = tuple(NamedTarget(name, config) for name, config in small.items())
        yield dataclasses.replace(pair, config=dataclasses.replace(pair.config, targets=targets))


@pytest.fixture
def fan(staging: StagingConfig, pair: Pair) -> Iterator[Any]:
    with two_phase(staging, pair.config) as tp:
        yield tp


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The chunks each read of the staging store gave, one entry a read."""
    counts: list[int] = []
    lock = threading.Lock()
    chunks_of = StagedReader.chunks_of

    def counted(
        self: StagedReader, write_ids: Sequence[str], *, small: bool = False
    ) -> Iterator[tuple[int, StagedChunk]]:
        with lock:
            number = len(counts)
            counts.append(0)
        for item in chunks_of(self, write_ids, small=small):
            counts[number] += 1
            yield item

    monkeypatch.setattr(StagedReader, "chunks_of", counted)
    return counts


def epoch_points(epoch: int, extra: Sequence[str] = ()) -> list[list[str]]:
    parts = [lines(epoch, PER_PART, host=f"p{i}") for i in range(PARTS)]
    parts[-1] = [*parts[-1], *extra]
    return parts


def staged_chunks(url: str, epoch: int) -> int:
    rows = sql(
        url,
        "SELECT count(*) FROM twophase_staged_chunks c JOIN twophase_writes w"
        " USING (write_id) WHERE w.sink_id = %s AND w.epoch = %s",
        SINK,
        epoch,
    )
    return int(rows[0][0])


def counts(url: str, target: str) -> list[tuple[int, int, int]]:
    rows = sql(
        url,
        "SELECT epoch, delivered, rejected FROM twophase_target_deliveries"
        " WHERE sink_id = %s AND target = %s ORDER BY epoch",
        SINK,
        target,
    )
    return [(e, d, r) for e, d, r in rows]


def commit(tp: TwoPhase, lease: Lease, epoch: int, extra: Sequence[str] = ()) -> Any:
    messages = stage(tp, SINK, epoch, epoch_points(epoch, extra), run=lease.run_id)
    return tp.committer.commit(lease, epoch, messages)


def test_each_chunk_is_read_once_for_both_targets_and_both_hold_exactly_the_epochs(
    fan: Any, pair: Pair, staging_url: str, reads: list[int]
) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    for epoch in range(3):
        reads.clear()
        assert commit(fan, lease, epoch).state == EpochState.COMMITTED
        chunks = staged_chunks(staging_url, epoch)
        assert chunks >= PARTS
        assert reads == [chunks]  # one read of every chunk, for both targets
    total = 3 * PARTS * PER_PART
    assert influx_count(pair.a, M) == total
    assert influx_count(pair.b_direct, M) == total
    for target in ("a", "b"):
        assert deliveries(staging_url, SINK, target) == [0, 1, 2]
        assert counts(staging_url, target) == [(e, PARTS * PER_PART, 0) for e in range(3)]


def test_a_target_that_fails_mid_epoch_does_not_stop_the_other(
    fan: Any, pair: Pair, staging_url: str, reads: list[int]
) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    pair.proxy.delay_s = 0.3  # b answers each of its 12 requests in 0.3 s...
    timer = pair.proxy.set_mode_later(CUT, 0.5)  # ...and goes down after one or two
    try:
        assert commit(fan, lease, 0).state == EpochState.COMMITTED
    finally:
        timer.cancel()
    assert influx_count(pair.a, M) == PARTS * PER_PART  # a took the whole epoch
    assert influx_count(pair.b_direct, M) < PARTS * PER_PART  # b was cut midway
    rows = target_rows(staging_url, SINK)
    assert (rows["a"]["state"], rows["a"]["delivered"]) == ("live", 0)
    assert rows["b"]["state"] == "lagging"
    assert reads[0] == staged_chunks(staging_url, 0)  # the shared read went to its end


def test_each_target_records_its_own_dead_letters_once_and_its_own_counts(
    fan: Any, pair: Pair, staging_url: str, reads: list[int]
) -> None:
    # field v of "clash" is a string in both: each target refuses the float points
    for influx in (pair.a, pair.b_direct):
        write_points(influx, ['clash,host=z v="text" 1700000000000000001'])
    clash = [f"clash,host=h{i} v={i}.5 {1700000000000000000 + i}" for i in range(3)]
    lease = fan.committer.claim(SINK, "r1", "q1")
    assert commit(fan, lease, 0, clash).state == EpochState.COMMITTED
    assert len(reads) == 1
    assert dead_letter_targets(staging_url) == {"a": 3, "b": 3}
    for target in ("a", "b"):
        assert counts(staging_url, target) == [(0, PARTS * PER_PART, 3)]


def test_an_epoch_changed_after_the_decision_is_found_by_the_one_read_for_both(
    fan: Any, staging_url: str, reads: list[int]
) -> None:
    lease = fan.committer.claim(SINK, "r1", "q1")
    fan.ledger.decide(lease, 0, stage(fan, SINK, 0, epoch_points(0), run=lease.run_id))
    # a chunk recompressed from other lines, its count kept: a valid gzip member
    other = StagedChunk.of_lines("w", 0, lines(9, PER_PART), compressed=True).stored
    changed = sql(
        staging_url,
        "UPDATE twophase_staged_chunks SET body_gz = %s WHERE ctid = (SELECT ctid FROM"
        " twophase_staged_chunks WHERE body_gz IS NOT NULL LIMIT 1) RETURNING 1",
        other,
    )
    assert changed == [(1,)]
    reads.clear()
    with pytest.raises(PermanentError, match="changed after the decision"):
        fan.promoter.promote(lease, 0)
    # read and checked once for both, up to the changed chunk (nothing of it sent)
    assert len(reads) == 1 and reads[0] <= staged_chunks(staging_url, 0)
    assert epoch_row(staging_url, SINK, 0)["state"] == EpochState.PRECOMMITTED
