"""Chunked staging against real servers: chunk layout, promote-time rejects inside a
chunk, and migration 0002 moving one-row-per-point data into chunks and back."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from tests.staging import STAGED_POINTS, epoch_row, lines, scalar, stage
from tests.support import (
    admin_conninfo,
    alembic,
    begin_run,
    create_migrated_database,
    drop_database,
    influx_rows,
    staging_config_for,
    two_phase,
    unique,
)
from twophase.config import GZIP, UNCOMPRESSED, StagingConfig, TargetConfig
from twophase.model import EpochPlan, LineChecksum, StagedChunk, WriteRef
from twophase.points.builder import Rejected
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.deliver.reader import StagedReader
from twophase.protocol.stage.stager import Stager
from twophase.store.database import Database

# The layout of one lane: seq numbers, chunk boundaries and coalesced requests in the
# task's order (tests/integration/test_lanes.py covers several lanes).
pytestmark = pytest.mark.lanes(1)

M = "proto"


def write_lines(reader: StagedReader, write_id: str) -> list[tuple[int, str]]:
    """(seq, line) of one write, read back as promotion reads it."""
    plan = EpochPlan("s", 0, (WriteRef(write_id, 0, ""),))
    return [(seq, line) for _, seq, line in reader.lines(plan)]


def chunk_rows(url: str) -> list[tuple[int, int, int]]:
    """(chunk, first_seq, lines) of every staged chunk, in order."""
    with psycopg.connect(admin_conninfo(url)) as conn:
        rows = conn.execute(
            "SELECT chunk, first_seq, points FROM twophase_staged_chunks ORDER BY write_id, chunk"
        )
        return [tuple(r) for r in rows]


def test_a_large_write_is_staged_in_chunks_and_promoted_whole(
    tp: TwoPhase, staging_url: str
) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    points = lines(0, 12_001)
    (message,) = stage(tp, "s", 0, [points])
    assert chunk_rows(staging_url) == [(0, 0, 5000), (1, 5000, 5000), (2, 10000, 2001)]
    assert write_lines(tp.reader, message.write_id) == list(enumerate(points))
    tp.committer.commit(lease, 0, [message])
    assert epoch_row(staging_url, "s", 0)["delivered"] == 12_001
    assert len(influx_rows(tp.config.target, M)) == 12_001


def stored_digest(url: str) -> str:
    """The checksum of the staged chunks as PostgreSQL holds them, in order."""
    digest = LineChecksum()
    with psycopg.connect(admin_conninfo(url)) as conn:
        rows = conn.execute(
            "SELECT body, body_gz FROM twophase_staged_chunks ORDER BY write_id, chunk"
        )
        for body, gz in rows:
            digest.add_joined(gz if body is None else body.encode())
    return digest.hexdigest()


@pytest.mark.parametrize("compression", [GZIP, UNCOMPRESSED])
def test_chunks_are_cut_by_characters_and_rows_rejected_at_conversion_take_no_seq(
    tp: TwoPhase, staging: StagingConfig, staging_url: str, compression: str
) -> None:
    """Lines keep consecutive seqs around rejected rows; a line longer than the chunk
    limit is a chunk of its own; what is read back is what was staged; the write's
    checksum is over the chunks as stored (text: the lines themselves)."""
    long_line = f'{M},host=big v="{"x" * 300}" 1700000000000000099'
    items: list[str | Rejected] = [*lines(0, 4), Rejected(4, "no time", "{}"), long_line]
    items += [*lines(1, 3), Rejected(9, "bad tag", "{}")]
    config = replace(staging, chunk_points=3, chunk_chars=250, compression=compression)
    message = Stager(tp.db, config).stage("s", 0, items)
    assert (message.points, message.rejected) == (8, 2)
    assert chunk_rows(staging_url) == [(0, 0, 3), (1, 3, 1), (2, 4, 1), (3, 5, 3)]
    staged = [line for line in items if isinstance(line, str)]
    assert write_lines(tp.reader, message.write_id) == list(enumerate(staged))
    assert message.checksum == stored_digest(staging_url)
    stored = scalar(
        staging_url, "SELECT count(*) FROM twophase_staged_chunks WHERE body_gz IS NOT NULL"
    )
    assert stored == (4 if compression == GZIP else 0)
    digest = LineChecksum()
    for line in staged:
        digest.add(line)
    assert (message.checksum == digest.hexdigest()) == (compression == UNCOMPRESSED)
    stage_letters = scalar(
        staging_url, "SELECT string_agg(seq::text, ',' ORDER BY seq) FROM twophase_dead_letters"
    )
    assert stage_letters == "4,9"  # the rows' own indexes


def test_point_rejected_inside_a_coalesced_request_is_addressed_by_seq(
    tp: TwoPhase, staging_url: str
) -> None:
    """Three writes' chunks go out as one request; InfluxDB refuses one point of the
    second write (a field type conflict): exactly that point is dead-lettered, with
    its write, seq and text, and every other point is delivered."""
    lease = begin_run(tp, "s", "r1", "q1")
    tp.committer.commit(lease, 0, stage(tp, "s", 0, [lines(0, 5)]))  # v is a float
    conflicting = lines(1, 6)
    conflicting[3] = f'{M},host=a,n=0 v="text",e=1i 1700001000000000003'
    messages = stage(tp, "s", 1, [lines(2, 4), conflicting, lines(3, 5)])
    outcome = tp.committer.commit(lease, 1, messages)
    assert outcome.promoted is not None
    assert (outcome.promoted.delivered, outcome.promoted.rejected) == (14, 1)
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        letters = conn.execute(
            "SELECT write_id::text, seq, phase, payload, reason FROM twophase_dead_letters"
        ).fetchall()
    assert [row[:4] for row in letters] == [(messages[1].write_id, 3, "promote", conflicting[3])]
    assert "field type conflict" in letters[0][4]
    assert len(influx_rows(tp.config.target, M)) == 5 + 14


# --- migration 0002 ------------------------------------------------------------------

AWKWARD = [
    f'{M},host=a\\ b,n=1 v=1,s="tab\there" 1700000000000000001',
    f'{M},host=ü,n=2 v=2,s="back\\\\slash \\"q\\"" 1700000000000000002',
    f'{M},host=c,n=3 v=3,s="日本語" 1700000000000000003',
]


@pytest.fixture
def db_at_0001(base_staging_url: str) -> Iterator[str]:
    name = unique("twophase_mig")
    yield create_migrated_database(base_staging_url, name, "0001_initial")
    drop_database(base_staging_url, name)


def _decide_epoch_0(conn: psycopg.Connection[Any], write_ids: list[Any], points: int) -> None:
    """Sink s, run r1 and epoch 0 PRECOMMITTED with ``write_ids``, as older code left them."""
    conn.execute(
        "INSERT INTO twophase_sinks (sink_id, query_id, owner_run_id, fencing_token,"
        " last_decided_epoch) VALUES ('s', 'q1', 'r1', 1, 0)"
    )
    conn.execute(
        "INSERT INTO twophase_runs (run_id, sink_id, query_id, fencing_token)"
        " VALUES ('r1', 's', 'q1', 1)"
    )
    conn.execute(
        "INSERT INTO twophase_epochs (sink_id, epoch, state, run_id, query_id, write_ids,"
        " checksum, points_staged) VALUES ('s', 0, 'PRECOMMITTED', 'r1', 'q1', %s, 'x', %s)",
        (write_ids, points),
    )


def _stage_at_0001(url: str, writes: list[list[str]]) -> None:
    """What 0001's code staged: one row per line, the write row, a decided epoch."""
    ids = []
    with psycopg.connect(admin_conninfo(url)) as conn:
        for number, points in enumerate(writes):
            digest = LineChecksum()
            for line in points:
                digest.add(line)
            write_id = conn.execute(
                "INSERT INTO twophase_writes (write_id, sink_id, epoch, run_id, partition_id,"
                " attempt, points, rejected, checksum) VALUES (gen_random_uuid(), 's', 0, 'r1',"
                " %s, 0, %s, 0, %s) RETURNING write_id",
                (number, len(points), digest.hexdigest()),
            ).fetchone()[0]  # type: ignore[index]
            ids.append(write_id)
            with conn.cursor().copy(
                "COPY twophase_staged_points (write_id, seq, line) FROM STDIN"
            ) as copy:
                for seq, line in enumerate(points):
                    copy.write_row((write_id, seq, line))
        _decide_epoch_0(conn, ids, sum(len(w) for w in writes))


def _lines_at_0001(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        rows = conn.execute(
            "SELECT p.seq, p.line FROM twophase_staged_points p JOIN twophase_writes w"
            " USING (write_id) ORDER BY w.partition_id, p.seq"
        )
        return [tuple(r) for r in rows]


def test_migration_moves_staged_lines_into_chunks_and_back(
    db_at_0001: str, influx: TargetConfig
) -> None:
    """An epoch decided before the upgrade is promoted after it, byte for byte (its
    checksums still hold); the downgrade gives back the same lines."""
    writes = [AWKWARD + lines(0, 5002), lines(1, 2)]
    _stage_at_0001(db_at_0001, writes)
    before = _lines_at_0001(db_at_0001)

    assert alembic("upgrade", "head", url=db_at_0001).returncode == 0
    assert chunk_rows(db_at_0001) in (
        [(0, 0, 5000), (1, 5000, 5), (0, 0, 2)],
        [(0, 0, 2), (0, 0, 5000), (1, 5000, 5)],
    )  # two writes, in write-id order
    with two_phase(staging_config_for(db_at_0001), influx) as tp:
        assert scalar(db_at_0001, STAGED_POINTS) == 5007
        lease = begin_run(tp, "s", "r1", "q1")
        (result,) = tp.committer.recover(lease)
        assert (result.delivered, result.rejected) == (5007, 0)
    rows = influx_rows(influx, M)
    assert len(rows) == 5007
    assert {dict(r[2])["s"] for r in rows if dict(r[2]).get("s")} == {
        "tab\there",
        'back\\slash "q"',
        "日本語",
    }

    down = alembic("downgrade", "0001_initial", url=db_at_0001)
    assert down.returncode == 0, down.stderr
    assert _lines_at_0001(db_at_0001) == before


def test_migration_of_an_empty_store(db_at_0001: str) -> None:
    assert alembic("upgrade", "head", url=db_at_0001).returncode == 0
    assert chunk_rows(db_at_0001) == []
    assert alembic("downgrade", "0001_initial", url=db_at_0001).returncode == 0


def test_an_epoch_of_many_writes_is_read_in_plan_order_through_one_cursor(
    tp: TwoPhase, staging_url: str
) -> None:
    """30 writes (empty ones, multi-chunk ones): chunks come back write by write in the
    plan's order and seq by seq, so promotion sends the same sequence every time."""
    lease = begin_run(tp, "s", "r1", "q1")
    stager = Stager(tp.db, replace(tp.config.staging, chunk_points=4))
    parts = [lines(0, 60)[i::30][: i % 7] for i in range(30)]
    messages = [stager.stage("s", 0, part, partition_id=i) for i, part in enumerate(parts)]
    tp.ledger.decide(lease, 0, messages)
    plan = tp.ledger.plan_promotion(lease, 0)
    read = list(tp.reader.chunks_of([w.write_id for w in plan.writes]))
    expected = [
        (index, seq, line)
        for index, write in enumerate(plan.writes)
        for seq, line in enumerate(
            parts[next(i for i, m in enumerate(messages) if m.write_id == write.write_id)]
        )
    ]
    got = [
        (index, chunk.first_seq + offset, line)
        for index, chunk in read
        for offset, line in enumerate(chunk.lines())
    ]
    assert got == expected
    assert tp.promoter.promote(lease, 0).delivered == sum(map(len, parts))
    assert len(influx_rows(tp.config.target, M)) == sum(map(len, parts))


def test_migration_keeps_the_bounds_of_lines_holding_newlines(db_at_0001: str) -> None:
    """A line with a newline of its own (a caller's raw line; twophase's own
    serializer never makes one) stays one line through the upgrade and back."""
    odd = [f'{M} s="two\nlines" 1', f'{M} s="" 2', "", f"{M} v=1 3"]
    _stage_at_0001(db_at_0001, [odd, lines(0, 3)])
    before = _lines_at_0001(db_at_0001)
    assert alembic("upgrade", "head", url=db_at_0001).returncode == 0
    with psycopg.connect(admin_conninfo(db_at_0001)) as conn:
        layout = conn.execute(
            "SELECT points, ends IS NULL FROM twophase_staged_chunks ORDER BY points"
        ).fetchall()
        write_ids = [
            r[0]
            for r in conn.execute(
                "SELECT write_id::text FROM twophase_writes ORDER BY partition_id"
            )
        ]
    assert layout == [(3, True), (4, False)]  # bounds kept only where needed
    db = Database(staging_config_for(db_at_0001))
    try:
        assert [line for _, line in write_lines(StagedReader(db), write_ids[0])] == odd
    finally:
        db.close()
    assert alembic("downgrade", "0001_initial", url=db_at_0001).returncode == 0
    assert _lines_at_0001(db_at_0001) == before


# --- migration 0008 ------------------------------------------------------------------


@pytest.fixture
def db_at_0007(base_staging_url: str) -> Iterator[str]:
    name = unique("twophase_mig")
    yield create_migrated_database(base_staging_url, name, "0007_targets")
    drop_database(base_staging_url, name)


def _stage_text_chunks_at_0007(url: str, points: list[str]) -> None:
    """What 0007's code staged: text chunks of 5,000 lines, the write row (its checksum
    over the lines), the sink and run, a decided epoch 0."""
    digest = LineChecksum()
    for line in points:
        digest.add(line)
    with psycopg.connect(admin_conninfo(url)) as conn:
        write_id = conn.execute(
            "INSERT INTO twophase_writes (write_id, sink_id, epoch, run_id, partition_id,"
            " attempt, points, rejected, checksum) VALUES (gen_random_uuid(), 's', 0, 'r1',"
            " 0, 0, %s, 0, %s) RETURNING write_id",
            (len(points), digest.hexdigest()),
        ).fetchone()[0]  # type: ignore[index]
        for number, first in enumerate(range(0, len(points), 5000)):
            chunk = StagedChunk.of_lines(str(write_id), first, points[first : first + 5000])
            conn.execute(
                "INSERT INTO twophase_staged_chunks (write_id, chunk, first_seq, points, ends,"
                " body) VALUES (%s, %s, %s, %s, %s, %s)",
                (write_id, number, first, chunk.points, chunk.ends, chunk.body),
            )
        _decide_epoch_0(conn, [write_id], len(points))


def _chunk_texts(url: str) -> list[tuple[str | None, bool]]:
    """(body, whether body_gz is set, if the column exists) of every chunk, in order."""
    with psycopg.connect(admin_conninfo(url)) as conn:
        has_gz = conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'twophase_staged_chunks' AND column_name = 'body_gz'"
        ).fetchone()[0]  # type: ignore[index]
        gz = "body_gz IS NOT NULL" if has_gz else "false"
        rows = conn.execute(
            f"SELECT body, {gz} FROM twophase_staged_chunks c JOIN twophase_writes w"  # noqa: S608
            " USING (write_id) ORDER BY w.epoch, c.chunk"
        )
        return [tuple(r) for r in rows]


def test_migration_0008_keeps_text_chunks_and_its_downgrade_decompresses(
    db_at_0007: str, influx: TargetConfig
) -> None:
    """Chunks staged as text before the upgrade stay as they are and are promoted after
    it (their checksums over the lines still hold); a compressed epoch staged after it
    is promoted too, and the downgrade gives its chunks back as text."""
    old = AWKWARD + lines(0, 5002)
    _stage_text_chunks_at_0007(db_at_0007, old)
    assert alembic("upgrade", "head", url=db_at_0007).returncode == 0
    assert [gz for _, gz in _chunk_texts(db_at_0007)] == [False, False]  # nothing converted
    new = lines(1, 7002)
    one_lane = staging_config_for(db_at_0007, promote_connections=1)  # two chunks, in order
    with two_phase(one_lane, influx) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        (result,) = tp.committer.recover(lease)
        assert (result.delivered, result.rejected) == (5005, 0)
        outcome = tp.committer.commit(lease, 1, stage(tp, "s", 1, [new]))
        assert outcome.promoted is not None and outcome.promoted.delivered == 7002
    assert len(influx_rows(influx, M)) == 5005 + 7002
    assert [gz for _, gz in _chunk_texts(db_at_0007)] == [False, False, True, True]

    down = alembic("downgrade", "0007_targets", url=db_at_0007)
    assert down.returncode == 0, down.stderr
    texts = [body for body, _ in _chunk_texts(db_at_0007)]
    assert texts == ["\n".join(part) for part in (old[:5000], old[5000:], new[:5000], new[5000:])]
