"""I7: SIGKILL a real driver process at every protocol step; after restart and
recovery InfluxDB holds exactly what a crash-free run writes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from devkit.faultproxy import CUT, PASS, FaultProxy, Recorded
from tests.integration.cli_helpers import SCRIPT
from tests.integration.crash_driver import (
    BAD_EPOCH,
    MEASUREMENT,
    PARTITIONS,
    POINTS_PER_PARTITION,
    read_log,
)
from tests.integration.crash_helpers import (
    EPOCHS,
    SINK,
    dead_letters,
    every_epoch_committed,
    run_driver,
    staging_summary,
    start_driver,
)
from tests.integration.deliveries import (
    WHOLE,
    Landing,
    Recording,
    check_deliveries,
    recorded,
    settled,
)
from tests.staging import scalar
from tests.support import (
    REPO,
    admin_conninfo,
    create_influx_database,
    drop_influx_database,
    influx_rows,
    staging_config_for,
    two_phase,
    unique,
)
from twophase.config import InfluxDBSettings, TargetConfig
from twophase.faults import CRASH_POINTS

# (crash point, n-th time reached, points per InfluxDB request): each lands inside
# epoch 1 or 2, mid-sequence. The chunks are compressed (the default) and of 20 lines
# (CHUNK_POINTS), so that a request carries whole gzip members as stored, as promotion
# sends them: 40-point requests two members (8 requests per epoch), 250-point
# requests up to twelve (2 per epoch). A write's 100 lines are five chunks.
CHUNK_POINTS = 20
CRASHES = [
    ("stage_rows", 31, 40),  # epoch 1, mid-COPY of its second write (7 checks per write)
    ("in_stage", 5, 40),  # epoch 1, its second write recorded, not committed
    ("after_stage", 5, 40),  # epoch 1, after some writes staged, before decide
    ("in_decide", 2, 40),  # epoch 1's vote written, its transaction not committed
    ("after_decide", 2, 40),  # epoch 1 decided, not promoted
    ("promote_batch", 11, 40),  # epoch 1, after 3 of its 8 requests (the third refused)
    ("promote_batch", 3, 250),  # epoch 1, after its first request (twelve members)
    ("before_dead_letters", 1, 40),  # epoch 1's rejecting request sent, its letter unrecorded
    ("after_promote", 3, 40),  # epoch 2 fully sent, not marked COMMITTED
    ("in_mark", 2, 40),  # epoch 1 marked COMMITTED, the mark not committed
    ("after_mark", 2, 40),  # epoch 1 COMMITTED, not in Spark's commit log: a replay
]
# Background promotion: the same points, now in the promoter thread while the caller
# stages the next epoch, and the caller waiting for a handed-off epoch (epoch 1's commit
# waiting for epoch 0). after_decide is then "decided, not handed off".
BACKGROUND_CRASHES = [*CRASHES, ("drain", 2, 40)]
# Four lanes: each block of 20 lines is staged in a chunk per lane (its series), and
# an epoch goes out over four connections at once, about 10 requests of up to 40
# points (4 of up to 250) per epoch: the kills inside promotion moved to epoch 1, and
# the one mid-COPY too (22 checks per write, one per chunk and per 50 lines).
_LANE_NTH = {("stage_rows", 40): 95, ("promote_batch", 40): 15, ("promote_batch", 250): 6}
LANE_CRASHES = [(p, _LANE_NTH.get((p, b), n), b) for p, n, b in BACKGROUND_CRASHES]
GZIP, TEXT = ("gzip", CHUNK_POINTS), ("none", None)  # compression, staging_chunk_points
MATRIX = (
    [(GZIP, "inline", 1, *c) for c in CRASHES]
    + [(GZIP, "background", 1, *c) for c in BACKGROUND_CRASHES]
    + [(GZIP, "inline", 4, *c) for c in LANE_CRASHES if c[0] != "drain"]
    + [(GZIP, "background", 4, *c) for c in LANE_CRASHES]
)
# Text chunks (compression = none), one of 100 lines per write: 40-point requests cut
# every chunk (9 requests per epoch), 250-point ones carry two whole chunks, then one.
# The path staged before compression, and with compression = none: two kills in the
# default run (TEXT_DEFAULT), the rest with --full.
_TEXT_NTH = {("stage_rows", 40): 14, ("promote_batch", 40): 11}
_TEXT_LANE_NTH = {("stage_rows", 40): 20, ("promote_batch", 40): 15, ("promote_batch", 250): 6}
TEXT_CRASHES = [(p, _TEXT_NTH.get((p, b), n), b) for p, n, b in CRASHES]
TEXT_BACKGROUND = [*TEXT_CRASHES, ("drain", 2, 40)]
TEXT_LANES = [(p, _TEXT_LANE_NTH.get((p, b), n), b) for p, n, b in TEXT_BACKGROUND]
MATRIX += (
    [(TEXT, "inline", 1, *c) for c in TEXT_CRASHES]
    + [(TEXT, "background", 1, *c) for c in TEXT_BACKGROUND]
    + [(TEXT, "inline", 4, *c) for c in TEXT_LANES if c[0] != "drain"]
    + [(TEXT, "background", 4, *c) for c in TEXT_LANES]
)
# The default run: every point once per promotion mode, inline over one lane and in
# the background over four; in the other two modes, over compressed chunks, the points
# the lanes change (a write's chunk per lane, the requests cut from them, the hand-off);
# over text chunks, a kill mid-COPY and one mid-promotion. The rest: with --full.
DEFAULT_MODES = {("inline", 1), ("background", 4)}
LANE_POINTS = {"stage_rows", "promote_batch", "drain"}
TEXT_DEFAULT = {("inline", 1, "promote_batch", 40), ("background", 4, "stage_rows", 40)}


def in_default_run(m: tuple[Any, ...]) -> bool:
    layout, promotion, lanes, point, _, batch = m
    if layout == TEXT:
        return (promotion, lanes, point, batch) in TEXT_DEFAULT
    return (promotion, lanes) in DEFAULT_MODES or point in LANE_POINTS


MATRIX_PARAMS = [
    pytest.param(
        *m,
        id=f"{m[0][0]}-{m[1]}-{m[2]}lane-{m[3]}-{m[5]}",
        marks=[] if in_default_run(m) else [pytest.mark.full],
    )
    for m in MATRIX
]


# Where each kill of the matrix lands, read from what InfluxDB acknowledged before it
# (Landing). The kills in promotion over one lane: the points of epoch 1 acknowledged
# (gzip: its third 40-point request is the one refused and taken apart, 100 points
# after it, and 240 after its first of 250, refused too; text: 2 requests of 40, and
# the first of 250, refused, 200). Over four lanes, the n-th request's answer leaves
# up to three more under way: somewhere inside epoch 1.
_PROMOTED = {  # (compression, point, batch): points of epoch 1 acknowledged, one lane
    ("gzip", "promote_batch", 40): 100,
    ("gzip", "promote_batch", 250): 240,
    ("gzip", "before_dead_letters", 40): 100,
    ("none", "promote_batch", 40): 80,
    ("none", "promote_batch", 250): 200,
    ("none", "before_dead_letters", 40): 100,
}
_STAGING = ("stage_rows", "in_stage", "after_stage")


def landing(
    layout: tuple[str, int | None], promotion: str, lanes: int, point: str, batch: int
) -> Landing:
    """Where the kill at ``point`` (its n-th time as the matrix gives it) lands."""
    if point in _STAGING and promotion == "background":
        return Landing(0, 0, WHOLE)  # epoch 1 stages while epoch 0 may still be sent
    if point in (*_STAGING, "in_decide", "after_decide"):
        return Landing(1, 0)  # epoch 0 delivered, nothing of epoch 1 sent
    if point == "drain":  # epoch 2's commit waiting for epoch 1, which may still be sent
        return Landing(1, 0, WHOLE)
    if point == "after_promote":
        return Landing(2, WHOLE)
    if point in ("in_mark", "after_mark"):
        return Landing(1, WHOLE)
    if lanes > 1:
        return Landing(1, 1, WHOLE - 1)
    return Landing(1, _PROMOTED[(layout[0], point, batch)])


def test_the_matrices_cover_every_named_crash_point() -> None:
    """Each point is killed at in a driver, in every mode, or in the test named for it."""
    in_steps = {point for point, _, _ in CRASHES}
    assert {point for point, _, _ in BACKGROUND_CRASHES} == in_steps | {"drain"}
    assert {point for point, _, _ in LANE_CRASHES} == in_steps | {"drain"}
    modes = {(promotion, lanes) for promotion in ("inline", "background") for lanes in (1, 4)}
    for layout in (GZIP, TEXT):
        assert {(m[1], m[2]) for m in MATRIX if m[0] == layout} == modes
        assert {m[3] for m in MATRIX if m[0] == layout} == in_steps | {"drain"}
    at_restart = {second.split(":")[0] for _, _, second, _ in RESTART_CRASHES}
    assert {promotion for promotion, _, _, _ in RESTART_CRASHES} == {"inline", "background"}
    targets = {point for point, _ in TARGET_CRASHES} | {p.values[0] for p in TARGET_DOWN_CRASHES}
    targets |= {param.values[0] for param in AVAILABILITY_CRASHES}
    covered = in_steps | {"drain"} | at_restart | targets | set(ELSEWHERE)
    assert covered == set(CRASH_POINTS), set(CRASH_POINTS) ^ covered
    for point, test in ELSEWHERE.items():
        path, _, name = test.partition("::")
        source = (REPO / path).read_text()
        assert f"def {name}(" in source and f'"{point}' in source, (point, test)


def test_crash_free_run_is_complete(crash_free: dict[str, Any]) -> None:
    expected = EPOCHS * PARTITIONS * POINTS_PER_PARTITION
    assert len(crash_free["rows"]) == expected
    assert len(crash_free["dead"]) == 1 and crash_free["dead"][0][:2] == (BAD_EPOCH, "promote")


@pytest.mark.parametrize(("layout", "promotion", "lanes", "point", "nth", "batch"), MATRIX_PARAMS)
def test_sigkill_at_each_step_then_recover(
    layout: tuple[str, int | None],
    promotion: str,
    lanes: int,
    point: str,
    nth: int,
    batch: int,
    crash_free: dict[str, Any],
    staging_url: str,
    influx: TargetConfig,
    recording: Recording,
    tmp_path: Path,
) -> None:
    log = tmp_path / "spark-commit-log"
    crash = f"{point}:{nth}"
    crashed = run_driver(
        staging_url,
        recording.target,
        log,
        "run-1",
        crash,
        batch_points=batch,
        promotion=promotion,
        lanes=lanes,
        layout=layout,
    )
    assert crashed.returncode == -signal.SIGKILL, (crashed.stdout, crashed.stderr)
    before, where = settled(recording.proxy), landing(layout, promotion, lanes, point, batch)
    where.check(before)  # the kill where the matrix says it is
    # It really died mid-sequence: some epoch is not COMMITTED, or not in Spark's log.
    summary = staging_summary(staging_url)["epochs"]
    committed = [row[0] for row in summary if row[1] == "COMMITTED"]
    assert len(committed) < EPOCHS or len(read_log(log)) < EPOCHS, (summary, read_log(log))

    # The restarted run recomputes every epoch the crashed run had decided with
    # different values: only replay detection keeps them out of InfluxDB.
    decided = [row[0] for row in summary]
    restarted = run_driver(
        staging_url,
        recording.target,
        log,
        "run-2",
        perturb=decided,
        batch_points=batch,
        promotion=promotion,
        lanes=lanes,
        layout=layout,
    )
    assert restarted.returncode == 0, restarted.stderr
    # Nothing doubled: each epoch sent once, but the one the kill left with requests
    # acknowledged and its mark uncommitted, which may be sent again, whole.
    after = settled(recording.proxy)[len(before) :]
    resend = None if point == "after_mark" else where.epoch
    check_deliveries(before, after, EPOCHS, resend, ordered=lanes == 1)
    assert influx_rows(influx, MEASUREMENT) == crash_free["rows"]  # nothing missing
    assert dead_letters(staging_url) == crash_free["dead"]  # each rejection once
    assert staging_summary(staging_url)["epochs"] == every_epoch_committed()  # none pending
    if point == "after_mark" and promotion == "inline":  # in the background, Spark's log
        assert "replay=True" in restarted.stdout  # may hold the epoch before its mark

    staging = staging_config_for(staging_url, orphan_grace="0s")
    with two_phase(staging, influx) as tp:
        tp.gc.collect()
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        orphans = conn.execute(
            "SELECT count(*) FROM twophase_writes w JOIN twophase_epochs e USING (sink_id, epoch)"
            " WHERE NOT (w.write_id = ANY(e.write_ids))"
        ).fetchone()
        assert orphans == (0,)
        assert conn.execute("SELECT count(*) FROM twophase_writes").fetchone() == (
            EPOCHS * PARTITIONS,
        )


# A crash in the last epoch, restarted with no new input: the restarted driver has no
# epoch to commit. Inline, Spark's log never holds an epoch before it is COMMITTED, so
# the restart replays the last one. In the background, commit returns once the epoch is
# decided and handed off, and Spark logs it while it promotes: a kill then ("held", the
# promoter paused there until the test kills the driver once the epoch is in the log)
# leaves a logged epoch PRECOMMITTED that only the restart's claim can deliver.
LAST = EPOCHS - 1
LAST_EPOCH_CRASHES = [
    ("inline", "after_decide"),  # decided, not promoted, not logged: replayed
    ("inline", "after_mark"),  # COMMITTED, not logged: replayed, skipped
    ("background", "after_decide"),  # decided, not handed off, not logged: replayed
    ("background", "promote_batch:2"),  # logged, 2 of its requests sent: held
    ("background", "after_promote"),  # logged, every request sent, not marked: held
]
HELD = {"promote_batch", "after_promote"}  # in the promoter thread, after Spark's log


@pytest.mark.parametrize(
    ("promotion", "point"),
    LAST_EPOCH_CRASHES,
    ids=[f"{promotion}-{point}" for promotion, point in LAST_EPOCH_CRASHES],
)
def test_sigkill_in_the_last_epoch_then_restart_with_no_new_input(
    promotion: str,
    point: str,
    crash_free: dict[str, Any],
    staging_url: str,
    influx: TargetConfig,
    tmp_path: Path,
) -> None:
    log, plan = tmp_path / "spark-commit-log", tmp_path / "crash-plan.json"
    held = promotion == "background" and point.split(":")[0] in HELD
    armed: dict[str, Any] = {"at": point, "scope": "process"}
    if held:
        armed["pause_s"] = 300  # the test kills the driver while it sleeps there
    driver = start_driver(
        staging_url, influx, log, "run-1", promotion=promotion, arm_last=(plan, armed)
    )
    if held:
        deadline = time.monotonic() + 120
        while not (plan.with_name(plan.name + ".fired").exists() and LAST in read_log(log)):
            assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
            time.sleep(0.05)
        driver.kill()
    driver.communicate(timeout=300)
    assert driver.returncode == -signal.SIGKILL
    summary = staging_summary(staging_url)["epochs"]
    assert summary[LAST][:2] == (LAST, "PRECOMMITTED") or point == "after_mark", summary
    if held:  # in Spark's log: nothing will run the epoch again
        assert read_log(log) == list(range(EPOCHS)), read_log(log)

    decided = [row[0] for row in summary]
    restarted = run_driver(staging_url, influx, log, "run-2", perturb=decided, promotion=promotion)
    assert restarted.returncode == 0, restarted.stderr
    if held:
        assert restarted.stdout == ""  # no epoch committed: the claim alone recovered it
    assert influx_rows(influx, MEASUREMENT) == crash_free["rows"]
    assert dead_letters(staging_url) == crash_free["dead"]
    assert staging_summary(staging_url)["epochs"] == every_epoch_committed()  # none pending


# A second kill while the restarted run claims the sink and recovers what the first
# left: the first kill leaves epoch 1 decided and not promoted ("after_decide:2"), or
# COMMITTED and not in Spark's log ("after_mark:2", so that the restart replays it and
# discards its new writes). A third run finishes; automatic GC (purging every
# delivered epoch at once) runs in the second.
GC = ("--gc-interval", "0.01s", "--retention", "0s")
RESTART_CRASHES = [
    ("inline", "after_decide:2", "in_begin_run", ()),  # its claim's token, not committed
    ("inline", "after_decide:2", "after_begin_run", ()),  # claimed, epoch 1 not recovered
    ("inline", "after_decide:2", "in_plan", ()),  # recovery's attempt counted, uncommitted
    ("background", "after_decide:2", "in_plan", ()),
    ("inline", "after_mark:2", "in_discard", ()),  # the replay's new writes being deleted
    ("inline", "after_decide:2", "in_gc", GC),  # a purge of delivered epochs, uncommitted
    ("background", "after_decide:2", "in_gc", GC),  # ... beside a promotion in the background
]
# What the second kill leaves, read before and after it: an in_* step's transaction
# undone whole (no run-2 row, no attempt counted, the replay's new writes not deleted,
# nothing purged); after_begin_run, the claim committed and nothing after it.
SECOND_KILL_LEAVES: dict[str, tuple[str, Callable[[int], int]]] = {
    "in_begin_run": ("SELECT count(*) FROM twophase_runs WHERE run_id = 'run-2'", lambda _: 0),
    "after_begin_run": (
        "SELECT count(*) FROM twophase_runs r JOIN twophase_epochs e USING (sink_id)"
        " WHERE r.run_id = 'run-2' AND e.epoch = 1 AND e.state = 'PRECOMMITTED'",
        lambda _: 1,
    ),
    "in_plan": ("SELECT promote_attempts FROM twophase_epochs WHERE epoch = 1", lambda n: n),
    "in_discard": (
        "SELECT count(*) FROM twophase_writes WHERE epoch = 1",
        lambda n: n + PARTITIONS,  # the replay staged its own, and they are all still there
    ),
    "in_gc": ("SELECT count(*) FROM twophase_epochs WHERE purged_at IS NOT NULL", lambda _: 0),
}
# Points a driver does not reach, and the tests that kill there.
ELSEWHERE = {
    "before_split_decide": "tests/e2e/test_dead_letters.py::"
    "test_each_kind_of_malformed_line_is_dead_lettered_once",
    "in_discard": "tests/integration/test_gc.py::test_sigkill_in_sparks_abort_then_gc",
    "in_gc": "tests/integration/test_cli_destructive.py::test_sigkill_in_gc_and_reset_then_again",
    "in_reset": "tests/integration/test_cli_destructive.py::"
    "test_sigkill_in_gc_and_reset_then_again",
    "in_requeue": "tests/integration/test_requeue.py::"
    "test_sigkill_at_each_step_of_a_requeue_then_recover",
    "in_remove": "tests/integration/test_target_removal.py::test_sigkill_in_remove_then_again",
    # a transactional target's own steps: its bodies sent, uncommitted; committed on it
    "before_target_commit": "tests/integration/test_crash_matrix_postgresql.py::"
    "test_sigkill_at_each_step_with_a_postgresql_target",
    "after_target_commit": "tests/integration/test_crash_matrix_postgresql.py::"
    "test_sigkill_at_each_step_with_a_postgresql_target",
}


@pytest.mark.parametrize(
    ("promotion", "first", "second", "extra"),
    RESTART_CRASHES,
    ids=[f"{p}-{f.split(':')[0]}-then-{s}" for p, f, s, _ in RESTART_CRASHES],
)
def test_sigkill_again_while_the_restart_claims_and_recovers(
    promotion: str,
    first: str,
    second: str,
    extra: Sequence[str],
    crash_free: dict[str, Any],
    staging_url: str,
    influx: TargetConfig,
    tmp_path: Path,
) -> None:
    log = tmp_path / "spark-commit-log"
    left, expect = SECOND_KILL_LEAVES[second]
    runs = [("run-1", first, ()), ("run-2", second, extra)]
    for run_id, crash, more in runs:
        decided = [row[0] for row in staging_summary(staging_url)["epochs"]]
        before = scalar(staging_url, left)
        killed = run_driver(
            staging_url,
            influx,
            log,
            run_id,
            crash,
            perturb=decided,
            promotion=promotion,
            extra=more,
        )
        assert killed.returncode == -signal.SIGKILL, (run_id, crash, killed.stderr)
    assert scalar(staging_url, left) == expect(before), (second, before)

    decided = [row[0] for row in staging_summary(staging_url)["epochs"]]
    finished = run_driver(staging_url, influx, log, "run-3", perturb=decided, promotion=promotion)
    assert finished.returncode == 0, finished.stderr
    assert influx_rows(influx, MEASUREMENT) == crash_free["rows"]
    assert dead_letters(staging_url) == crash_free["dead"]
    assert staging_summary(staging_url)["epochs"] == every_epoch_committed()
    staging = staging_config_for(staging_url, orphan_grace="0s")
    with two_phase(staging, influx) as tp:
        tp.gc.collect()
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        assert conn.execute("SELECT count(*) FROM twophase_writes").fetchone() == (
            EPOCHS * PARTITIONS,
        )


# Two targets, a and b (each its own InfluxDB database): every step of a fan-out
# promotion killed, inline over one lane and in the background over four. Per epoch,
# 9 requests of 40 points go to each target (18 promote_batch checks), and each
# target's delivery is recorded in the mark's transaction (2 in_deliver checks).
TARGET_CRASHES = [
    ("stage_rows", 14),  # staging knows no targets: killed as with one
    ("in_stage", 5),
    ("after_stage", 5),
    ("in_decide", 2),  # epoch 1's vote, uncommitted
    ("after_decide", 2),  # epoch 1 decided, sent to neither target
    ("promote_batch", 23),  # epoch 1, 5 of its 18 requests acknowledged (100 points each)
    ("before_dead_letters", 1),  # epoch 1's rejecting request, in one target
    ("in_deliver", 3),  # epoch 1 in both, the mark recording the first, uncommitted
    ("in_deliver", 4),  # epoch 1 in both, the mark recording the second, uncommitted
    ("after_promote", 2),  # epoch 1 in both targets, not marked
    ("in_mark", 2),  # epoch 1's mark, uncommitted
    ("after_mark", 2),  # epoch 1 COMMITTED, not in Spark's log: a replay
]
# Four lanes: a write's lines staged in a chunk per lane (6 checks per write, as above);
# 12 requests per target and epoch (24 promote_batch checks): 29 is 5 into epoch 1.
_TARGET_LANE_NTH = {"stage_rows": 20, "promote_batch": 29}
TARGET_MATRIX = [("inline", 1, *c) for c in TARGET_CRASHES] + [
    ("background", 4, p, _TARGET_LANE_NTH.get(p, n)) for p, n in [*TARGET_CRASHES, ("drain", 2)]
]
# Before the decision nothing knows of the targets: those kills are the one-target
# matrix's (in both modes), and here with --full.
BEFORE_TARGETS = {"stage_rows", "in_stage", "after_stage", "in_decide"}
TARGET_PARAMS = [
    pytest.param(
        *m,
        id=f"{m[0]}-{m[1]}lane-{m[2]}-{m[3]}",
        marks=[pytest.mark.full] if m[2] in BEFORE_TARGETS else [],
    )
    for m in TARGET_MATRIX
]


def target_landing(promotion: str, point: str) -> tuple[Landing, Landing]:
    """Where a kill of the two-target matrix lands (see ``landing``): in the target whose
    delivery reached the point, and in the other. Each target is sent on a thread of its
    own, so a kill inside one target's requests finds the other anywhere up to the same
    place (it may be half-way through taking the same refused body apart)."""
    if point in _STAGING and promotion == "background":
        return Landing(0, 0, WHOLE), Landing(0, 0, WHOLE)
    if point in (*_STAGING, "in_decide", "after_decide"):
        return Landing(1, 0), Landing(1, 0)
    if point in ("promote_batch", "before_dead_letters"):
        if promotion == "inline":
            return Landing(1, 100), Landing(1, 0, 100)
        return Landing(1, 1, WHOLE - 1), Landing(1, 0, WHOLE - 1)
    if point == "drain":
        return Landing(1, 0, WHOLE), Landing(1, 0, WHOLE)
    return Landing(1, WHOLE), Landing(1, WHOLE)  # in_deliver, after_promote, in_mark, after_mark


def check_landings(
    landings: tuple[Landing, Landing], a: Sequence[Recorded], b: Sequence[Recorded]
) -> None:
    """AssertionError unless one target holds the first landing and the other the second."""
    reached, other = landings
    try:
        reached.check(a)
        other.check(b)
    except AssertionError:
        reached.check(b)
        other.check(a)


@pytest.fixture
def influx_b(influx_url: str) -> Iterator[TargetConfig]:
    """Target b's database on the same server (target a's: the ``influx`` fixture)."""
    name = unique("tpb")
    create_influx_database(influx_url, name)
    yield TargetConfig(url=influx_url, influxdb=InfluxDBSettings(api="v1", database=name))
    drop_influx_database(influx_url, name)


@pytest.fixture
def recording_b(influx_b: TargetConfig) -> Iterator[Recording]:
    """Target b behind a fault proxy that records every write request."""
    with recorded(influx_b) as each:
        yield each


def target_dead_letters(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin_conninfo(url)) as conn:
        return conn.execute(
            "SELECT target, epoch, phase, payload FROM twophase_dead_letters"
            " ORDER BY target, epoch, payload"
        ).fetchall()


def per_target(dead: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The crash-free run's dead letters, once per target: each target refuses the bad
    point, and a letter names the target that refused it."""
    return [(target, *letter) for target in ("a", "b") for letter in dead]


def recover_command(
    staging_url: str, a: tuple[TargetConfig, str], b: tuple[TargetConfig, str]
) -> tuple[list[str], dict[str, str]]:
    """`twophase recover` of the sink with targets a and b (each: its database, and the
    URL it is reached at), and its environment."""
    env = {
        **os.environ,
        "TWOPHASE_STAGING_URL": staging_url,
        "TWOPHASE_TARGETS": f"a={a[1]},b={b[1]}",
        "TWOPHASE_TARGET_A_INFLUX_DB": str(a[0].influxdb.database),
        "TWOPHASE_TARGET_B_INFLUX_DB": str(b[0].influxdb.database),
        "TWOPHASE_INFLUX_API": "v1",
        "TWOPHASE_TARGET_BATCH_POINTS": "40",
    }
    env.pop("TWOPHASE_TARGET_URL", None)
    return [str(SCRIPT), "recover", "--sink", SINK, "--force"], env


def target_b(influx: TargetConfig, url: str | None = None) -> tuple[str, ...]:
    return ("--influx-url-b", url or influx.url, "--influx-db-b", str(influx.influxdb.database))


@pytest.mark.parametrize(("promotion", "lanes", "point", "nth"), TARGET_PARAMS)
def test_sigkill_at_each_step_of_a_two_target_promotion(
    promotion: str,
    lanes: int,
    point: str,
    nth: int,
    crash_free: dict[str, Any],
    staging_url: str,
    influx: TargetConfig,
    influx_b: TargetConfig,
    recording: Recording,
    recording_b: Recording,
    tmp_path: Path,
) -> None:
    log, b = tmp_path / "spark-commit-log", target_b(influx_b, recording_b.target.url)
    options: dict[str, Any] = dict(promotion=promotion, lanes=lanes, extra=b)
    a = recording.target
    crashed = run_driver(staging_url, a, log, "run-1", f"{point}:{nth}", **options)
    assert crashed.returncode == -signal.SIGKILL, (crashed.stdout, crashed.stderr)
    proxies = (recording.proxy, recording_b.proxy)
    before = [settled(proxy) for proxy in proxies]
    landings = target_landing(promotion, point)
    check_landings(landings, *before)  # the kill where the matrix says it is, in each target
    where = landings[0]
    summary = staging_summary(staging_url)["epochs"]
    decided = [row[0] for row in summary]
    restarted = run_driver(staging_url, a, log, "run-2", perturb=decided, **options)
    assert restarted.returncode == 0, restarted.stderr
    resend = None if point == "after_mark" else where.epoch
    for proxy, sent in zip(proxies, before, strict=True):  # each target: nothing doubled
        after = settled(proxy)[len(sent) :]
        check_deliveries(sent, after, EPOCHS, resend, ordered=lanes == 1)
    for target in (influx, influx_b):  # each target: nothing missing
        assert influx_rows(target, MEASUREMENT) == crash_free["rows"]
    assert target_dead_letters(staging_url) == per_target(crash_free["dead"])
    assert staging_summary(staging_url)["epochs"] == every_epoch_committed()
    delivered = "SELECT count(*) FROM twophase_target_deliveries GROUP BY target ORDER BY target"
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        assert conn.execute(delivered).fetchall() == [(EPOCHS,), (EPOCHS,)]


# Target b down (its fault proxy cutting every connection) through the crash and the
# restart: every epoch is COMMITTED with a alone; b is brought back, and `twophase
# recover` delivers its backlog, killed once in its own catch-up (in_deliver) first.
# The default run: a kill mid-promotion, in the mark's record of a alone, and after
# the mark (a replay); the rest with --full. Each case's recover is killed too.
TARGET_DOWN_CRASHES = [
    pytest.param("after_decide", 2, id="after_decide-2", marks=pytest.mark.full),
    pytest.param("promote_batch", 14, id="promote_batch-14"),
    pytest.param("in_deliver", 2, id="in_deliver-2"),
    pytest.param("in_mark", 2, id="in_mark-2", marks=pytest.mark.full),
    pytest.param("after_mark", 2, id="after_mark-2"),
]


@pytest.mark.parametrize(("point", "nth"), TARGET_DOWN_CRASHES)
def test_sigkill_with_one_target_down_then_recover_catches_it_up(
    point: str,
    nth: int,
    crash_free: dict[str, Any],
    staging_url: str,
    influx: TargetConfig,
    influx_b: TargetConfig,
    tmp_path: Path,
) -> None:
    log = tmp_path / "spark-commit-log"
    with FaultProxy.for_url(influx_b.url).start() as proxy:
        proxy.set_mode(CUT)
        proxy.record = True
        b = target_b(influx_b, proxy.url)
        crashed = run_driver(staging_url, influx, log, "run-1", f"{point}:{nth}", extra=b)
        assert crashed.returncode == -signal.SIGKILL, (crashed.stdout, crashed.stderr)
        decided = [row[0] for row in staging_summary(staging_url)["epochs"]]
        restarted = run_driver(staging_url, influx, log, "run-2", perturb=decided, extra=b)
        assert restarted.returncode == 0, restarted.stderr
        assert influx_rows(influx, MEASUREMENT) == crash_free["rows"]  # a, all along
        assert influx_rows(influx_b, MEASUREMENT) == []
        assert staging_summary(staging_url)["epochs"] == every_epoch_committed()
        proxy.set_mode(PASS)
        recover, env = recover_command(staging_url, (influx, influx.url), (influx_b, proxy.url))
        killed = subprocess.run(
            recover, env={**env, "TWOPHASE_CRASH_AT": "in_deliver:2"}, capture_output=True
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        # killed recording epoch 1, sent: b holds epochs 0 and 1, its cursor on 0
        assert len(influx_rows(influx_b, MEASUREMENT)) == 2 * PARTITIONS * POINTS_PER_PARTITION
        cursor = "SELECT delivered_epoch FROM twophase_targets WHERE target = 'b'"
        assert scalar(staging_url, cursor) == 0
        before = settled(proxy)
        Landing(1, WHOLE).check(before)  # what b was sent says so too
        done = subprocess.run(recover, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        after = settled(proxy)[len(before) :]
    check_deliveries(before, after, EPOCHS, resend=1)  # epoch 1's record was uncommitted
    assert influx_rows(influx_b, MEASUREMENT) == crash_free["rows"]
    assert influx_rows(influx, MEASUREMENT) == crash_free["rows"]
    assert target_dead_letters(staging_url) == per_target(crash_free["dead"])


# The availability rule (I10) in the two-target matrix: epochs 0 and 1 go to a alone
# (b down: lagging); then a goes down too, and epoch 2's commit fails (it stays
# PRECOMMITTED). b comes back, a stays down: the restart's claim catches b up (epochs
# 0 and 1) and delivers 2 to it, killed at each step of that; the next restart
# finishes on b alone; a comes back and `twophase recover` catches it up. Both targets
# then hold exactly what a crash-free run writes.
AVAILABILITY_CRASHES = [
    # the default run: a kill in each half of the take-over (b's catch-up, epoch 2)
    pytest.param("in_deliver", 1, id="in_deliver-1"),  # b's catch-up: epoch 0's record
    pytest.param(  # b's catch-up, in epoch 1
        "promote_batch", 12, id="promote_batch-12", marks=pytest.mark.full
    ),
    pytest.param("in_deliver", 3, id="in_deliver-3"),  # epoch 2 in b, its record
    pytest.param("in_mark", 1, id="in_mark-1", marks=pytest.mark.full),  # epoch 2's mark
    pytest.param("in_plan", 1, id="in_plan-1", marks=pytest.mark.full),  # the recovery's plan
    pytest.param("promote_batch", 1, id="promote_batch-1", marks=pytest.mark.full),
    pytest.param("after_promote", 1, id="after_promote-1", marks=pytest.mark.full),
    pytest.param("after_mark", 1, id="after_mark-1", marks=pytest.mark.full),
]


# Where each kill lands in b (its catch-up sends 0 and 1, then 2), and the epoch it
# leaves to be sent to b again: sent, or in part, and unrecorded.
B_LANDINGS = {
    ("in_deliver", 1): (Landing(0, WHOLE), 0),
    ("promote_batch", 12): (Landing(1, 100), 1),  # 9 requests of epoch 0, 3 of 1
    ("in_deliver", 3): (Landing(2, WHOLE), 2),
    ("in_mark", 1): (Landing(2, WHOLE), 2),
    ("in_plan", 1): (Landing(0, 0), None),  # before anything is sent
    ("promote_batch", 1): (Landing(0, 40), 0),
    ("after_promote", 1): (Landing(2, WHOLE), 2),
    ("after_mark", 1): (Landing(2, WHOLE), None),
}


@pytest.mark.parametrize(("point", "nth"), AVAILABILITY_CRASHES)
def test_sigkill_while_a_lagging_target_takes_over_from_one_that_is_down(
    point: str,
    nth: int,
    crash_free: dict[str, Any],
    staging_url: str,
    influx: TargetConfig,
    influx_b: TargetConfig,
    tmp_path: Path,
) -> None:
    log = tmp_path / "spark-commit-log"
    with (
        FaultProxy.for_url(influx.url).start() as pa,
        FaultProxy.for_url(influx_b.url).start() as pb,
    ):
        a = TargetConfig(
            url=pa.url, influxdb=InfluxDBSettings(api="v1", database=influx.influxdb.database)
        )
        b = (*target_b(influx_b, pb.url), "--retry-deadline", "3")
        pa.record = pb.record = True

        def decided() -> list[int]:
            return [row[0] for row in staging_summary(staging_url)["epochs"]]

        pb.set_mode(CUT)
        first = run_driver(staging_url, a, log, "run-1", extra=b, epochs=2)
        assert first.returncode == 0, first.stderr  # epochs 0 and 1 in a alone
        pa.set_mode(CUT)
        stopped = run_driver(staging_url, a, log, "run-2", perturb=decided(), extra=b, epochs=3)
        assert stopped.returncode != 0  # epoch 2: no target took it
        assert staging_summary(staging_url)["epochs"][2][1] == "PRECOMMITTED"
        pb.set_mode(PASS)  # b back, a still down
        crashed = run_driver(
            staging_url, a, log, "run-3", f"{point}:{nth}", perturb=decided(), extra=b
        )
        assert crashed.returncode == -signal.SIGKILL, (crashed.stdout, crashed.stderr)
        before = settled(pb)
        where, resend = B_LANDINGS[(point, nth)]
        where.check(before)
        restarted = run_driver(staging_url, a, log, "run-4", perturb=decided(), extra=b)
        assert restarted.returncode == 0, restarted.stderr  # on b alone
        assert influx_rows(influx_b, MEASUREMENT) == crash_free["rows"]
        assert staging_summary(staging_url)["epochs"] == every_epoch_committed()
        pa.set_mode(PASS)
        recover, env = recover_command(staging_url, (influx, pa.url), (influx_b, pb.url))
        done = subprocess.run(recover, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        check_deliveries(before, settled(pb)[len(before) :], EPOCHS, resend)
        check_deliveries(settled(pa), [], EPOCHS, None)  # a: each epoch once, all along
    for target in (influx, influx_b):  # each target: nothing missing or doubled
        assert influx_rows(target, MEASUREMENT) == crash_free["rows"]
    assert target_dead_letters(staging_url) == per_target(crash_free["dead"])
