"""Bad input never crashes a batch and is never lost: it lands in the dead-letter
table with a reason, and the rest of the epoch arrives (real PostgreSQL and InfluxDB)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest

from tests.encoders import ENCODERS, encode
from tests.support import admin_conninfo, begin_run, influx_query, influx_rows
from twophase.points.builder import PointBuilder, PointSpec
from twophase.protocol.commit.runtime import TwoPhase

T = datetime(2024, 1, 1, tzinfo=timezone.utc)
SPEC = PointSpec(measurement="bad input", tag_columns=("host", "dc"), time_column="ts")


def row(i: int, **change: Any) -> dict[str, Any]:
    base = {"host": f"h{i}", "dc": "eu", "ts": T.replace(minute=i % 60), "v": float(i), "n": i}
    return {**base, **change}


# (row, fragment of the reason a person reads)
BAD_ROWS = [
    (row(1, v=None), "null"),
    (row(2, v=math.nan), "NaN"),
    (row(3, v=math.inf), "infinite"),
    (row(4, v=None, n=None), "null"),
    (row(5, ts=None), "time"),
    (row(6, ts="yesterday-ish"), "time"),
    (row(7, host=""), "empty"),
    (row(8, host="two\nlines"), "newline"),
    (row(9, v="x" * 70_000), "65535"),
    (row(10, ts=datetime(2300, 1, 1, tzinfo=timezone.utc)), "range"),
    (row(11, n=2**70), "64-bit"),
]
# Awkward but representable: must arrive intact, not be dead-lettered.
ODD_ROWS = [
    row(20, host="a b,c=d", dc='q"uote'),
    row(21, host="ünïcödé ✓", dc="日本"),
    {**row(22), "field with space,comma=eq": 1.25},
]


def dead_letters(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        return conn.execute(
            "SELECT epoch, phase, seq, reason, payload FROM twophase_dead_letters"
            " ORDER BY epoch, phase, seq"
        ).fetchall()


def counts(url: str, epoch: int) -> tuple[Any, ...] | None:
    with psycopg.connect(admin_conninfo(url)) as conn:
        return conn.execute(
            "SELECT points_staged, points_rejected_stage, points_delivered,"
            " points_rejected_promote FROM twophase_epochs WHERE epoch = %s",
            (epoch,),
        ).fetchone()


@pytest.fixture(params=ENCODERS)
def encoder(request: pytest.FixtureRequest) -> str:
    """Every test here runs with the row builder and with the columnar encoder."""
    return str(request.param)


def commit_rows(
    tp: TwoPhase, lease: Any, epoch: int, rows: list[dict[str, Any]], encoder: str = "rows"
) -> Any:
    items = encode(PointBuilder(SPEC), rows, encoder)
    message = tp.stager.stage("s", epoch, items, run_id="r1", query_id="q1")
    return tp.committer.commit(lease, epoch, [message])


def test_bad_rows_are_dead_lettered_with_reasons_and_the_rest_arrives(
    tp: TwoPhase, staging_url: str, encoder: str
) -> None:
    good = [row(i) for i in range(30, 40)]
    rows = good[:5] + [r for r, _ in BAD_ROWS] + ODD_ROWS + good[5:]
    lease = begin_run(tp, "s", "r1", "q1")
    commit_rows(tp, lease, 0, rows, encoder)

    letters = dead_letters(staging_url)
    assert len(letters) == len(BAD_ROWS)
    for (epoch, phase, seq, reason, payload), (bad, fragment) in zip(
        letters, BAD_ROWS, strict=True
    ):
        assert (epoch, phase, seq) == (0, "stage", rows.index(bad))
        assert fragment.lower() in reason.lower(), reason
        assert f'"host": {json.dumps(bad["host"])}' in payload  # the row itself is kept
    delivered = len(good) + len(ODD_ROWS)
    assert counts(staging_url, 0) == (delivered, len(BAD_ROWS), delivered, 0)
    assert len(influx_rows(tp.config.target, SPEC.measurement)) == delivered

    hosts = {
        s["tags"]["host"]: s["tags"]["dc"]
        for s in influx_query(tp.config.target, 'SELECT * FROM "bad input" GROUP BY *')
    }
    assert hosts["a b,c=d"] == 'q"uote'
    assert hosts["ünïcödé ✓"] == "日本"
    odd_field = influx_query(
        tp.config.target, 'SELECT "field with space,comma=eq" FROM "bad input" WHERE host = \'h22\''
    )
    assert odd_field[0]["values"][0][1] == 1.25


@pytest.mark.lanes(1)  # seq is the line's place in the task's order
def test_field_type_change_between_epochs_is_a_promote_dead_letter(
    tp: TwoPhase, staging_url: str, encoder: str
) -> None:
    lease = begin_run(tp, "s", "r1", "q1")
    commit_rows(tp, lease, 0, [row(i) for i in range(5)], encoder)  # v is a float
    second = [row(i + 5) for i in range(5)]
    second[2]["v"] = "now a string"  # InfluxDB refuses a new type for the field
    outcome = commit_rows(tp, lease, 1, second, encoder)

    assert outcome.state == "COMMITTED"
    assert (outcome.promoted.delivered, outcome.promoted.rejected) == (4, 1)
    (letter,) = dead_letters(staging_url)
    epoch, phase, seq, reason, payload = letter
    assert (epoch, phase, seq) == (1, "promote", 2)
    assert "field type conflict" in reason
    assert 'v="now a string"' in payload
    assert counts(staging_url, 1) == (5, 0, 4, 1)
    assert len(influx_rows(tp.config.target, SPEC.measurement)) == 9
    # Re-promoting (e.g. a replay) does not record the rejection twice.
    tp.committer.commit(lease, 1, [])
    assert len(dead_letters(staging_url)) == 1
