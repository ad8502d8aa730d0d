"""Hostile sink ids, measurement and column names (SQL, quotes, unicode, 10,000
characters) go through the real protocol and the CLI as data, never as SQL; text
PostgreSQL cannot hold is refused with an error naming what is wrong."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.encoders import ENCODERS, encode
from tests.fuzz import HOSTILE, any_text, examples
from tests.integration.cli_helpers import make_cli
from tests.support import Influx, admin_conninfo, begin_run
from twophase.config import StagingConfig, TargetConfig
from twophase.errors import ConfigError
from twophase.model import EpochState
from twophase.points.builder import PointBuilder, PointSpec
from twophase.protocol.commit.runtime import TwoPhase

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
TABLES = ("twophase_sinks", "twophase_epochs", "twophase_writes", "twophase_staged_chunks")
# Measurement and column names: the hostile texts a point can carry (a newline
# cannot be in a name, a leading '#' cannot start a measurement).
NAMES = [name for name in HOSTILE if "\x1b" not in name]


def table_counts(url: str) -> dict[str, int]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}  # type: ignore[index]  # noqa: S608


def deliver(
    tp: TwoPhase, sink_id: str, measurement: str, column: str, epoch: int = 0, encoder: str = "rows"
) -> list[str]:
    """One epoch of three points under these names, through the whole protocol."""
    spec = PointSpec(measurement, (column,), (column + "_f",), "t")
    rows = [{column: f"v{i}'--", column + "_f": i, "t": i} for i in range(3)]
    lines = [item for item in encode(PointBuilder(spec), rows, encoder) if isinstance(item, str)]
    assert len(lines) == len(rows)
    lease = begin_run(tp, sink_id, "r1", "q1")
    message = tp.stager.stage(sink_id, epoch, lines, run_id="r1", query_id="q1")
    assert tp.committer.commit(lease, epoch, [message]).state == EpochState.COMMITTED
    return lines


@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("name", NAMES, ids=range(len(NAMES)))
def test_hostile_names_are_stored_and_shown_as_data(
    name: str, encoder: str, tp: TwoPhase, staging: StagingConfig, influx: TargetConfig
) -> None:
    url = staging.url.reveal()
    measurement, column = "m" + name, "c" + name
    try:
        PointSpec(measurement, (column,), (column + "_f",)).validate()
    except ConfigError as exc:  # a backslash InfluxDB would read back differently
        assert exc.option in ("measurement", "tags") and "backslash" in exc.problem
        measurement, column = "m_" + name.replace("\\", "/"), "c_" + name.replace("\\", "/")
    deliver(tp, name, measurement, column, encoder=encoder)
    counts = table_counts(url)  # every table still there, one sink
    assert counts["twophase_sinks"] == 1 and counts["twophase_epochs"] == 1
    stored = Influx(influx.url, str(influx.influxdb.database)).points()
    assert list(stored) == [measurement]
    assert {tags[column] for _, tags, _ in stored[measurement]} == {"v0'--", "v1'--", "v2'--"}
    cli = make_cli(url, influx)
    status = cli("--json", "status", "--sink", name)
    assert status.code == 0, status.err
    assert [s["sink_id"] for s in status.json()["sinks"]] == [name]
    epochs = cli("--json", "epochs", "--sink", name)
    assert epochs.code == 0 and [e["state"] for e in epochs.json()["epochs"]] == ["COMMITTED"]


@pytest.mark.parametrize(
    ("sink_id", "words"),
    [("a\x00b", "contains a NUL character"), ("a\ud800", "lone surrogate"), ("", "non-empty")],
)
def test_sink_ids_postgresql_cannot_hold_are_refused_clearly(
    sink_id: str, words: str, tp: TwoPhase
) -> None:
    with pytest.raises(ConfigError, match=words) as claim:
        begin_run(tp, sink_id, "r1", "q1")
    assert claim.value.option == "sink_id"
    with pytest.raises(ConfigError, match=words):
        tp.stager.stage(sink_id, 0, ["m f=1i 1"], run_id="r1", query_id="q1")


@settings(
    max_examples=examples(40),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sink_id=st.one_of(any_text, st.sampled_from(HOSTILE)))
def test_any_sink_id_is_data_or_refused(tp: TwoPhase, staging: StagingConfig, sink_id: str) -> None:
    before = table_counts(staging.url.reveal())
    unstorable = not sink_id or "\x00" in sink_id or any(0xD800 <= ord(c) < 0xE000 for c in sink_id)
    try:
        lease = begin_run(tp, sink_id, "r1", "q1")
    except ConfigError as exc:  # NUL, a lone surrogate, empty: nothing else
        assert unstorable and exc.option == "sink_id", exc
        assert table_counts(staging.url.reveal()) == before
        return
    assert not unstorable
    assert lease.sink_id == sink_id
    with psycopg.connect(admin_conninfo(staging.url.reveal())) as conn:
        row = conn.execute(
            "SELECT sink_id FROM twophase_sinks WHERE sink_id = %s", (sink_id,)
        ).fetchone()
    assert row == (sink_id,)
