"""One epoch, several measurements: each row's measurement taken from a column
(``measurement_column``), staged and promoted to the real InfluxDB, every measurement
exact; rows whose measurement cannot be written are dead letters with the reason."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.encoders import ENCODERS, encode
from tests.fuzz import HOSTILE
from tests.support import Influx, admin_conninfo, begin_run
from twophase.config import TargetConfig
from twophase.model import EpochState
from twophase.points.builder import PointBuilder, PointSpec
from twophase.protocol.commit.runtime import TwoPhase

T0 = 1_700_000_000_000_000_000
SPEC = PointSpec(tag_columns=("host",), time_column="t", measurement_column="metric")
# Three measurements, one of them with the characters a measurement escapes.
MEASUREMENTS = ("cpu", "disk io,sda", "ünï ☃")
# (measurement column value, fragment of the reason)
BAD = [(None, "is null"), ("", "empty string"), ("#cpu", "'#'"), ("cpu\\", "backslash")]


def rows() -> list[dict[str, Any]]:
    good = [
        {"metric": MEASUREMENTS[i % 3], "host": f"h{i}", "t": T0 + i, "v": float(i)}
        for i in range(30)
    ]
    bad = [{"metric": value, "host": "x", "t": T0, "v": 1.0} for value, _ in BAD]
    return good[:10] + bad + good[10:]


def dead_letters(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        return conn.execute(
            "SELECT phase, reason, payload FROM twophase_dead_letters ORDER BY seq"
        ).fetchall()


def commit(tp: TwoPhase, sink_id: str, items: Any, epoch: int = 0) -> Any:
    lease = begin_run(tp, sink_id, "r1", "q1")
    message = tp.stager.stage(sink_id, epoch, items, run_id="r1", query_id="q1")
    return tp.committer.commit(lease, epoch, [message])


@pytest.mark.parametrize("encoder", ENCODERS)
def test_three_measurements_from_one_column_arrive_exactly(
    encoder: str, tp: TwoPhase, staging_url: str, influx: TargetConfig
) -> None:
    outcome = commit(tp, "multi", encode(PointBuilder(SPEC), rows(), encoder))
    assert outcome.state == EpochState.COMMITTED

    stored = Influx(influx.url, str(influx.influxdb.database)).points()
    assert sorted(stored) == sorted(MEASUREMENTS)
    for index, measurement in enumerate(MEASUREMENTS):
        expected = {(T0 + i, f"h{i}", float(i)) for i in range(index, 30, 3)}
        got = {(when, tags["host"], fields["v"]) for when, tags, fields in stored[measurement]}
        assert got == expected, measurement
        assert all(set(fields) == {"v"} for _, _, fields in stored[measurement])

    letters = dead_letters(staging_url)
    assert len(letters) == len(BAD)
    for (phase, reason, payload), (value, words) in zip(letters, BAD, strict=True):
        assert phase == "stage" and "measurement column 'metric'" in reason and words in reason
        assert f'"metric": {json.dumps(value)}' in payload and '"host": "x"' in payload


@pytest.mark.parametrize("encoder", ENCODERS)
def test_hostile_measurement_values_are_measurements_or_dead_letters(
    encoder: str, tp: TwoPhase, staging_url: str, influx: TargetConfig
) -> None:
    values = [*HOSTILE, "a,b c=d", 'q"uote', "日本"]
    items = list(
        encode(
            PointBuilder(SPEC),
            [{"metric": v, "host": "h", "t": T0 + i, "v": i} for i, v in enumerate(values)],
            encoder,
        )
    )
    accepted = [values[i] for i, item in enumerate(items) if isinstance(item, str)]
    # Only a backslash at the end or before a space does not read back unchanged.
    assert set(values) - set(accepted) == {"\\", "\\\\ "}
    assert commit(tp, "hostile", items).state == EpochState.COMMITTED
    stored = Influx(influx.url, str(influx.influxdb.database)).points()
    assert sorted(stored) == sorted(accepted)
    assert len(dead_letters(staging_url)) == len(values) - len(accepted)
