"""Memory bounds against the real servers, each shown with input far larger than its
bound and the peak memory measured (tracemalloc): ``verify`` in passes over shares of
the series, ``dead-letters --requeue`` a batch (one correction) at a time, and a
decompression bomb in a staged chunk refused without inflating it."""

from __future__ import annotations

import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.staging import stage
from tests.support import admin_conninfo, begin_run, influx_count, influx_query
from twophase import operations as ops
from twophase.config import TargetConfig
from twophase.errors import InflateLimitError
from twophase.influx.influxdb_kind import InfluxReadback
from twophase.influx.writers import V1Writer
from twophase.operations import requeuer as requeue_module
from twophase.operations.hooks import Guard
from twophase.operations.verify import Verifier
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.deliver.reader import StagedReader
from twophase.store.views import Views

SINK = "bounds"
BASE = 1_700_000_000_000_000_000
MiB = 1024 * 1024


def peak_of(work: Callable[[], Any]) -> tuple[Any, int]:
    """``work()``'s result and the most memory it held at once beyond what it started
    with, in bytes."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = work()
        return result, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


# --- verify, in passes ----------------------------------------------------------------

SERIES, STAMPS = 1000, 30  # an epoch of 30,000 points


def committed_epoch(tp: TwoPhase) -> None:
    lines = [
        f"big,host=h{s},dc=d{s % 7} v={s * t}i,w={t}.5 {BASE + t * 1000}"
        for t in range(STAMPS)
        for s in range(SERIES)
    ]
    lease = begin_run(tp, SINK, "r1", "q1")
    half = len(lines) // 2
    tp.committer.commit(lease, 0, stage(tp, SINK, 0, [lines[:half], lines[half:]]))
    tp.runs.end(SINK, "r1", "stopped")


def verifier(tp: TwoPhase, influx: TargetConfig, pass_points: int) -> Verifier:
    return Verifier(
        Views(tp.db), StagedReader(tp.db), InfluxReadback(influx), pass_points=pass_points
    )


def test_verify_of_a_large_epoch_holds_one_pass_at_a_time(
    tp: TwoPhase, influx: TargetConfig
) -> None:
    """30,000 points verified in 6 passes of 5,000: the same report as one pass, at a
    fraction of its memory."""
    committed_epoch(tp)
    influx_query(influx, "DELETE FROM big WHERE host = 'h7'")  # a series lost: 30 missing
    selection = Views(tp.db).epochs(SINK)
    whole, one_pass = peak_of(lambda: verifier(tp, influx, 10**9).verify(SINK, selection))
    stages: list[str] = []

    def verify_in_passes() -> Any:
        progress = lambda step, *_: stages.append(step)  # noqa: E731
        return verifier(tp, influx, 5_000).verify(SINK, selection, progress)

    passes, in_passes = peak_of(verify_in_passes)
    print(
        f"verify of {SERIES * STAMPS} points: peak {one_pass / MiB:.1f} MiB in one pass,"
        f" {in_passes / MiB:.1f} MiB in passes of 5,000"
    )
    assert passes == whole
    assert (whole.points, whole.series) == (SERIES * STAMPS, SERIES)
    [lost] = whole.differences
    assert (lost.tags["host"], lost.missing) == ("h7", STAMPS)
    assert "read staged points (pass 6 of 6)" in stages
    # about 320 bytes per expected point: 10 MB for one pass of 30,000, 1.6 MB for 5,000
    assert in_passes < one_pass / 3, (in_passes / MiB, one_pass / MiB)
    assert in_passes < 5 * MiB, in_passes / MiB


def test_a_decompression_bomb_in_a_staged_chunk_is_refused_without_inflating_it(
    tp: TwoPhase, influx: TargetConfig, staging_url: str
) -> None:
    """A staged chunk replaced by 256 MiB of zeros in a 250 KB gzip member whose trailer
    says 64 bytes: verify stops inflating it at 65 bytes."""
    committed_epoch(tp)
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MiB)
    bomb = b"".join([*(compressor.compress(zeros) for _ in range(256)), compressor.flush()])
    bomb = bomb[:-4] + (64).to_bytes(4, "little")
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        conn.execute(
            "UPDATE twophase_staged_chunks SET body_gz = %s"
            " WHERE chunk = 0 AND write_id IN (SELECT write_id FROM twophase_writes"
            " WHERE sink_id = %s AND partition_id = 0)",
            (bomb, SINK),
        )
    selection = Views(tp.db).epochs(SINK)

    def verify() -> str:
        with pytest.raises(InflateLimitError, match="damaged: its gzip member inflates past 64"):
            verifier(tp, influx, 10**9).verify(SINK, selection)
        return "refused"

    refused, peak = peak_of(verify)
    print(f"verify of a chunk holding a 256 MiB bomb: peak {peak / MiB:.2f} MiB")
    assert refused == "refused" and peak < 8 * MiB, peak / MiB


# --- requeue, a batch at a time -------------------------------------------------------

LETTERS, PAD = 3000, "x" * 4000  # 12 MB of dead letters' lines


def letter_lines(name: str = "held") -> list[str]:
    return [f'{name},n={i} v={i}.5,pad="{PAD}" {BASE + i}' for i in range(LETTERS)]


def refused_store(tp: TwoPhase, influx: TargetConfig, sink: str = SINK, name: str = "held") -> None:
    """3,000 points of 4 KB refused by a field type conflict: dead letters of epoch 0."""
    V1Writer(influx).write(f'{name} v="text" {BASE - 1}'.encode())
    lines = letter_lines(name)
    lease = begin_run(tp, sink, "r1", "q1")
    result = tp.committer.commit(lease, 0, stage(tp, sink, 0, [lines]))
    assert result.promoted is not None and result.promoted.rejected == LETTERS
    tp.runs.end(sink, "r1", "stopped")


def corrections(staging_url: str, sink: str = SINK) -> list[tuple[int, str, int]]:
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        rows = conn.execute(
            "SELECT epoch, state, points_staged FROM twophase_epochs WHERE epoch < 0"
            " AND sink_id = %s ORDER BY epoch DESC",
            (sink,),
        ).fetchall()
    return [tuple(row) for row in rows]


def test_requeue_of_many_letters_runs_in_batches_one_correction_each(
    tp: TwoPhase, influx: TargetConfig, staging_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of at most 500 letters: six corrections, each decided and promoted before
    the next batch is read, holding a sixth of what one correction of every letter
    holds. Letters refused again by a correction are not carried again by the same
    requeue: the first requeue (before the fix) ends."""
    refused_store(tp, influx)
    # ("spare", not "held_...": InfluxDB 1.6.7 keeps the type of "held" once both are dropped)
    refused_store(tp, influx, "whole", "spare")
    monkeypatch.setattr(requeue_module, "REQUEUE_LETTERS", 500)
    again = ops.requeue(tp.config, SINK, guard=Guard(force=True))  # not fixed yet
    assert again.corrections == (1, 2, 3, 4, 5, 6) and again.requeued == LETTERS
    assert sum(r.rejected for r in again.results) == LETTERS  # refused again, once each
    influx_query(influx, 'DROP MEASUREMENT "held"')  # the fix
    influx_query(influx, 'DROP MEASUREMENT "spare"')

    done, batched = peak_of(lambda: ops.requeue(tp.config, SINK, guard=Guard(force=True)))
    assert done.corrections == (7, 8, 9, 10, 11, 12)
    assert done.from_epochs == (-6, -5, -4, -3, -2, -1)
    assert sum(r.delivered for r in done.results) == LETTERS
    assert influx_count(influx, "held") == LETTERS
    assert [c[1:] for c in corrections(staging_url)] == [("COMMITTED", 500)] * 12

    monkeypatch.setattr(requeue_module, "REQUEUE_LETTERS", 10_000)  # all in one batch
    whole, one = peak_of(lambda: ops.requeue(tp.config, "whole", guard=Guard(force=True)))
    assert whole.corrections == (1,) and influx_count(influx, "spare") == LETTERS
    print(
        f"requeue of {LETTERS} letters of 4 KB: peak {batched / MiB:.1f} MiB in batches"
        f" of 500, {one / MiB:.1f} MiB in one"
    )
    assert batched < one / 2, (batched / MiB, one / MiB)


def test_requeue_batches_are_bounded_by_bytes_too(
    tp: TwoPhase, influx: TargetConfig, staging_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused_store(tp, influx)
    influx_query(influx, 'DROP MEASUREMENT "held"')
    monkeypatch.setattr(requeue_module, "REQUEUE_BYTES", 1_000_000)  # about 247 letters
    done = ops.requeue(tp.config, SINK, guard=Guard(force=True))
    staged = [c[2] for c in corrections(staging_url)]
    batches, used = [0], 0  # the oldest first, as many as fit
    for size in (len(line) for line in letter_lines()):
        if used + size > 1_000_000:
            batches, used = [*batches, 0], 0
        batches[-1], used = batches[-1] + 1, used + size
    assert staged == batches and len(done.corrections) == len(batches) == 13


def test_a_requeue_cut_between_batches_leaves_the_rest_to_the_next(
    tp: TwoPhase, influx: TargetConfig, staging_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second batch's decision fails: the first correction is delivered, the rest of
    the letters are as they were, and the same command again carries them once."""
    refused_store(tp, influx)
    influx_query(influx, 'DROP MEASUREMENT "held"')
    monkeypatch.setattr(requeue_module, "REQUEUE_LETTERS", 1000)
    decide = requeue_module.Requeuer.decide
    calls = []

    def failing(self: Any, lease: Any, selection: Any) -> Any:
        calls.append(selection.correction)
        if len(calls) == 2:
            raise RuntimeError("cut")
        return decide(self, lease, selection)

    monkeypatch.setattr(requeue_module.Requeuer, "decide", failing)
    with pytest.raises(RuntimeError, match="cut"):
        ops.requeue(tp.config, SINK, guard=Guard(force=True))
    monkeypatch.setattr(requeue_module.Requeuer, "decide", decide)
    done = ops.requeue(tp.config, SINK, guard=Guard(force=True))
    assert done.corrections == (2, 3) and done.requeued == LETTERS - 1000
    assert influx_count(influx, "held") == LETTERS
    assert [c[1:] for c in corrections(staging_url)] == [("COMMITTED", 1000)] * 3
