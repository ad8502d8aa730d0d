"""I1 before anything is sent: each staged chunk is checked against its own checksum as it
is read back, before it goes to any lane. A chunk changed after the decision never
reaches the target, nor does any chunk after it; the epoch stays PRECOMMITTED.

Counted by the test kit's proxy in front of the real InfluxDB: every line that reached
the server is one it forwarded."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import psycopg
import pytest

from devkit.faultproxy import FaultProxy
from tests.staging import M, epoch_row, lines, stage
from tests.support import admin_conninfo, begin_run, influx_rows, staging_config_for, two_phase
from twophase.config import GZIP, UNCOMPRESSED, TargetConfig
from twophase.errors import PermanentError
from twophase.model import EpochState, StagedChunk

SINK = "s"
CHUNK = 10  # points a chunk holds, and a request
CHUNKS = 6
VALUE = re.compile(r" v=([0-9.]+),")


@pytest.fixture
def counted(influx: TargetConfig) -> Iterator[FaultProxy]:
    with FaultProxy.for_url(influx.url) as proxy:
        yield proxy


def chunks(staging_url: str) -> list[tuple[int, int, set[float]]]:
    """(chunk, points, the values of its lines' field v) of the one staged write, in
    order."""
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        rows = conn.execute(
            "SELECT chunk, write_id::text, first_seq, points, body, body_gz"
            " FROM twophase_staged_chunks ORDER BY chunk"
        ).fetchall()
    out = []
    for chunk, write_id, first, points, body, gz in rows:
        staged = StagedChunk(write_id, first, points, None, body, 0, gz).lines()
        out.append((chunk, points, {float(VALUE.search(line)[1]) for line in staged}))  # type: ignore[index]
    return out


def change_chunk(staging_url: str, chunk: int) -> None:
    """Rewrite the chunk's lines with another value each (still valid points, as many),
    in the form it was stored: a target would take them."""
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        write_id, first, points, body, gz = conn.execute(
            "SELECT write_id::text, first_seq, points, body, body_gz"
            " FROM twophase_staged_chunks WHERE chunk = %s",
            (chunk,),
        ).fetchone()  # type: ignore[misc]
        stored = StagedChunk(write_id, first, points, None, body, 0, gz)
        changed = [line.replace(" v=", " v=1000") for line in stored.lines()]
        assert changed != stored.lines()
        again = StagedChunk.of_lines(write_id, first, changed, compressed=gz is not None)
        conn.execute(
            "UPDATE twophase_staged_chunks SET body = %s, body_gz = %s WHERE chunk = %s",
            (again.body, again.gz, chunk),
        )


@pytest.mark.parametrize("compression", [UNCOMPRESSED, GZIP])
@pytest.mark.parametrize("lanes", [1, 4])
def test_a_chunk_changed_after_the_decision_never_reaches_the_target(
    staging_url: str, influx: TargetConfig, counted: FaultProxy, compression: str, lanes: int
) -> None:
    staging = staging_config_for(
        staging_url,
        staging_chunk_points=CHUNK,
        compression=compression,
        promote_connections=lanes,
    )
    proxied = dataclasses.replace(influx, url=counted.url, batch_points=CHUNK)
    points = lines(0, CHUNK * CHUNKS)
    with two_phase(staging, proxied) as tp:
        lease = begin_run(tp, SINK, "r1", "q1")
        tp.ledger.decide(lease, 0, stage(tp, SINK, 0, [points]))
        layout = chunks(staging_url)
        assert len(layout) >= CHUNKS  # (more with lanes: a block is cut by lane)
        bad = layout[len(layout) // 3]
        change_chunk(staging_url, bad[0])
        counted.reset_counts()
        with pytest.raises(PermanentError, match="changed after the decision"):
            tp.promoter.promote(lease, 0)

    assert epoch_row(staging_url, SINK, 0)["state"] == EpochState.PRECOMMITTED
    before = sum(p for c, p, _ in layout if c < bad[0])
    assert counted.lines <= before  # nothing of the changed chunk, nor of any after it
    if lanes == 1:  # found as it was reached, while the chunks before it were being sent
        assert counted.lines > 0
    held = {dict(fields)["v"] for _, _, fields in influx_rows(influx, M)}
    assert len(held) == counted.lines
    # what the target holds is staged points of chunks before the changed one, unchanged
    assert held <= {v for c, _, values in layout if c < bad[0] for v in values}
