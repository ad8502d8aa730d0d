"""I7 with a transactional target: a sink delivering to InfluxDB (target a) and to a
PostgreSQL database (target b), its driver SIGKILLed at every protocol step, among
them the two of b's transaction (its bodies sent, uncommitted; committed on b, not yet
recorded in the staging store). After the restart both targets hold exactly what a
crash-free run leaves: InfluxDB the same points, PostgreSQL the same rows, and the
point PostgreSQL refuses is b's dead letter. Each epoch reaches a once (its recording
proxy shows each request) but the one a kill left unrecorded, sent again whole; and b
commits each epoch once (a trigger on b's record of delivered epochs counts every
write of it, in the epoch's transaction: a second delivery of an epoch would add one)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.integration.crash_driver import MEASUREMENT
from tests.integration.crash_helpers import (
    EPOCHS,
    every_epoch_committed,
    run_driver,
    staging_summary,
)
from tests.integration.deliveries import Recording, check_deliveries, settled
from tests.support import (
    admin_conninfo,
    create_database,
    create_influx_database,
    drop_database,
    drop_influx_database,
    influx_rows,
    unique,
)
from twophase.config import InfluxDBSettings, TargetConfig
from twophase.postgresql.record import record_ddl

# Per epoch, over one lane: 9 requests of 40 points to a (18 promote_batch checks with
# b's), one transaction on b, each target's delivery recorded in the mark's transaction.
PG_CRASHES = [
    ("after_decide", 2),  # epoch 1 decided, sent to neither target
    ("promote_batch", 23),  # epoch 1, part of its requests acknowledged, b's uncommitted
    ("before_target_commit", 2),  # epoch 1 sent to b, b's transaction not committed
    ("after_target_commit", 2),  # epoch 1 committed on b, not recorded in staging
    ("in_deliver", 4),  # epoch 1 in both, the mark recording the second, uncommitted
    ("after_promote", 2),  # epoch 1 in both targets, not marked
    ("in_mark", 2),  # epoch 1's mark, uncommitted
    ("after_mark", 2),  # epoch 1 COMMITTED, not in Spark's log: a replay
]
FULL = [("stage_rows", 14), ("in_stage", 5), ("in_decide", 2), ("before_dead_letters", 1)]
# Decided and sent to neither target, and the mark: as with two InfluxDB targets
# (test_crash_matrix.py); inline here with --full.
LIKE_TWO_TARGETS = {"after_decide", "in_mark"}
MATRIX = [
    pytest.param(
        "inline",
        1,
        *c,
        id=f"inline-{c[0]}-{c[1]}",
        marks=[pytest.mark.full] if c[0] in LIKE_TWO_TARGETS else [],
    )
    for c in PG_CRASHES
]
MATRIX += [
    pytest.param("inline", 1, *c, id=f"inline-{c[0]}-{c[1]}", marks=pytest.mark.full) for c in FULL
]
# Four lanes (the background runs): a write's lines staged in a chunk per lane, and a
# request per chunk to each target (b's one lane too: no two chunks fit in 40 points),
# 12 to a and 12 to b: 24 promote_batch checks per epoch, 29 is 5 into epoch 1.
_LANE_NTH = {"promote_batch": 29}
MATRIX += [
    pytest.param(
        "background",
        4,
        p,
        _LANE_NTH.get(p, n),
        id=f"background-{p}-{_LANE_NTH.get(p, n)}",
        marks=pytest.mark.full,
    )
    for p, n in [*PG_CRASHES, ("drain", 2)]
]


def pg_target(base_staging_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A database for target b on the staging server: (its name, its URL, no password:
    the driver's libpq reads it from PGPASSWORD)."""
    name = unique("tp_target")
    create_database(base_staging_url, name)
    url = make_url(base_staging_url)
    monkeypatch.setenv("PGPASSWORD", url.password or "")
    return name, f"postgresql://{url.username}@{url.host}:{url.port}/{name}"


# Every write of b's record of an epoch, counted in the epoch's transaction on b.
_AUDIT = (
    "CREATE TABLE record_writes (epoch bigint NOT NULL)",
    "CREATE FUNCTION count_record_write() RETURNS trigger LANGUAGE plpgsql AS"
    " $$BEGIN INSERT INTO record_writes VALUES (NEW.epoch); RETURN NEW; END$$",
    "CREATE TRIGGER counted AFTER INSERT OR UPDATE ON public.twophase_delivered"
    " FOR EACH ROW EXECUTE FUNCTION count_record_write()",
)


def audit_deliveries(base_staging_url: str, name: str) -> None:
    """b's record table made beforehand (as a DBA may: the kind uses it as it finds it)
    with a trigger counting each committed write of an epoch's record."""
    with psycopg.connect(admin_conninfo(base_staging_url, name)) as conn:
        conn.execute(record_ddl("public"))
        for statement in _AUDIT:
            conn.execute(statement)


def committed_deliveries(base_staging_url: str, name: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin_conninfo(base_staging_url, name)) as conn:
        return conn.execute(
            "SELECT epoch, count(*) FROM record_writes GROUP BY epoch ORDER BY epoch"
        ).fetchall()


def resent(promotion: str, point: str) -> int | None:
    """The epoch a kill at ``point`` may leave to be sent to a again: the one it left
    decided and unrecorded (epoch 1), or, in the background, epoch 0, still being sent
    while epoch 1 stages; none once its mark committed."""
    if point == "after_mark":
        return None
    return 0 if promotion == "background" and point in ("stage_rows", "in_stage") else 1


def landed(promotion: str, point: str) -> list[list[tuple[int, str]]]:
    """The epochs a kill at ``point`` leaves decided, with their states (the ways it may
    find them): epoch 1 decided and PRECOMMITTED from its vote to its mark, COMMITTED
    after it; before its vote (staging, the vote uncommitted) only epoch 0, still being
    promoted in the background; the caller of epoch 2 waiting for epoch 1 to promote
    (``drain``), epoch 1 either way. Where the kill landed is what ``resent`` takes."""
    done, open_ = "COMMITTED", "PRECOMMITTED"
    if point in ("stage_rows", "in_stage") and promotion == "background":
        return [[(0, done)], [(0, open_)]]
    if point in ("stage_rows", "in_stage", "in_decide"):
        return [[(0, done)]]
    if point == "drain":
        return [[(0, done), (1, open_)], [(0, done), (1, done)]]
    return [[(0, done), (1, done if point == "after_mark" else open_)]]


def pg_rows(base_staging_url: str, name: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin_conninfo(base_staging_url, name)) as conn:
        return conn.execute(
            f"SELECT time, part, k, v, n FROM {MEASUREMENT} ORDER BY time, part, k"  # noqa: S608
        ).fetchall()


def pg_records(base_staging_url: str, name: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin_conninfo(base_staging_url, name)) as conn:
        return conn.execute(
            "SELECT target, epoch, count(*) FROM twophase_delivered GROUP BY target, epoch"
            " ORDER BY epoch"
        ).fetchall()


@pytest.fixture(scope="module")
def crash_free_pg(
    base_staging_url: str,
    template_db: str,
    influx_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """One crash-free run to both targets: what every crashed run must end up equal to."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        staging_name, db = unique("tp_clean"), unique("clean")
        url = create_database(base_staging_url, staging_name, template=template_db)
        create_influx_database(influx_url, db)
        influx = TargetConfig(url=influx_url, influxdb=InfluxDBSettings(api="v1", database=db))
        target, target_url = pg_target(base_staging_url, monkeypatch)
        log = tmp_path_factory.mktemp("clean-pg") / "log"
        done = run_driver(url, influx, log, "clean", extra=("--influx-url-b", target_url))
        assert done.returncode == 0, done.stderr
        yield {
            "rows": influx_rows(influx, MEASUREMENT),
            "pg": pg_rows(base_staging_url, target),
            "dead": _target_letters(url),
        }
        drop_database(base_staging_url, staging_name)
        drop_database(base_staging_url, target)
        drop_influx_database(influx_url, db)


@pytest.mark.parametrize(("promotion", "lanes", "point", "nth"), MATRIX)
def test_sigkill_at_each_step_with_a_postgresql_target(
    promotion: str,
    lanes: int,
    point: str,
    nth: int,
    crash_free_pg: dict[str, Any],
    base_staging_url: str,
    staging_url: str,
    influx: TargetConfig,
    recording: Recording,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target, target_url = pg_target(base_staging_url, monkeypatch)
    try:
        audit_deliveries(base_staging_url, target)
        log, a = tmp_path / "spark-commit-log", recording.target
        options: dict[str, Any] = dict(
            promotion=promotion, lanes=lanes, extra=("--influx-url-b", target_url)
        )
        crashed = run_driver(staging_url, a, log, "run-1", f"{point}:{nth}", **options)
        assert crashed.returncode == -signal.SIGKILL, (crashed.stdout, crashed.stderr)
        before = settled(recording.proxy)
        at_kill = [row[:2] for row in staging_summary(staging_url)["epochs"]]
        assert at_kill in landed(promotion, point), at_kill
        decided = [epoch for epoch, _ in at_kill]
        restarted = run_driver(staging_url, a, log, "run-2", perturb=decided, **options)
        assert restarted.returncode == 0, restarted.stderr
        after = settled(recording.proxy)[len(before) :]
        check_deliveries(before, after, EPOCHS, resent(promotion, point), ordered=lanes == 1)
        assert influx_rows(influx, MEASUREMENT) == crash_free_pg["rows"]
        assert pg_rows(base_staging_url, target) == crash_free_pg["pg"]
        assert pg_records(base_staging_url, target) == [("b", e, 1) for e in range(EPOCHS)]
        assert committed_deliveries(base_staging_url, target) == [(e, 1) for e in range(EPOCHS)]
        assert staging_summary(staging_url)["epochs"] == every_epoch_committed()
        assert _target_letters(staging_url) == crash_free_pg["dead"]
    finally:
        drop_database(base_staging_url, target)


def _target_letters(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        return conn.execute(
            "SELECT target, epoch, phase, payload FROM twophase_dead_letters"
            " ORDER BY target, epoch, payload"
        ).fetchall()
