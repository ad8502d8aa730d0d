"""Least privilege: the job, the exporter and the operator's commands, each under a role
of its own with the grants `twophase db grants` gives it, and each refused what it must
not do. The roles are made for the test (LOGIN, a password) and dropped after it."""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from tests.integration.cli_helpers import BAD_POINT, Cli, Result
from tests.staging import in_thread, lines
from tests.support import (
    admin_conninfo,
    create_database,
    drop_database,
    influx_count,
    scrape,
    staging_config_for,
    two_phase,
    unique,
)
from twophase.config import StagingConfig, TargetConfig, TwoPhaseConfig
from twophase.errors import FrozenHolderError
from twophase.model import CommitMessage, EpochState
from twophase.operations import start_exporter
from twophase.operations.hooks import Guard
from twophase.operations.recover import recover
from twophase.operations.resync import resync
from twophase.points.builder import Rejected
from twophase.protocol.ledger.epoch_ledger import Ledger
from twophase.protocol.maintain.gc import GarbageCollector
from twophase.protocol.stage.stager import Stager
from twophase.store.database import Database
from twophase.store.least_privilege import GRANTS, ROLES
from twophase.store.locks import LockOwner

SINK = "s"
M = "proto"  # the measurement of test_protocol.lines
DENIED = psycopg.errors.InsufficientPrivilege


@dataclass(frozen=True)
class Roles:
    """The test's roles by kind (``executor``...), and a staging URL logging in as each."""

    names: dict[str, str]
    urls: dict[str, str]
    owner_url: str

    def staging(self, kind: str, **overrides: Any) -> StagingConfig:
        return staging_config_for(self.urls[kind], **overrides)

    def cli(self, kind: str, influx: TargetConfig) -> Cli:
        return Cli(self.urls[kind], influx)


def _require_createrole(conninfo: str) -> None:
    with psycopg.connect(conninfo) as conn:
        row = conn.execute(
            "SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    if not (row and row[0]):
        pytest.fail(
            "the test role of TWOPHASE_STAGING_URL needs CREATEROLE to make the roles of "
            "least privilege (scripts/dev.sh start gives it to the dev cluster's role)",
            pytrace=False,
        )


def _login_url(base: str, role: str, password: str) -> str:
    url = make_url(base).set(username=role, password=password)
    return url.render_as_string(hide_password=False)


@pytest.fixture
def roles(base_staging_url: str, template_db: str) -> Iterator[Roles]:
    """A store of its own and a role per kind of process, granted by `twophase db grants
    --apply` as the store's owner. Roles are the cluster's, not the database's: unique
    names, dropped once the database (and with it every grant) is gone."""
    owner = admin_conninfo(base_staging_url)
    _require_createrole(owner)
    database = unique("twophase_t")
    owner_url = create_database(base_staging_url, database, template=template_db)
    tag = uuid.uuid4().hex[:10]
    names = {kind: f"tp_{tag}_{kind}" for kind in ROLES}
    urls = {}
    try:
        with psycopg.connect(owner, autocommit=True) as conn:
            for kind, name in names.items():
                password = secrets.token_urlsafe(18)
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(name), sql.Literal(password)
                    )
                )
                urls[kind] = _login_url(owner_url, name, password)
        yield Roles(names, urls, owner_url)
    finally:
        _drop(owner, list(names.values()), lambda: drop_database(base_staging_url, database))


def _drop(owner: str, roles: list[str], drop_database: Callable[[], None]) -> None:
    """End what a failed test left connected (the owner may end a role's sessions once a
    member of it), drop the database and its grants with it, then the roles."""
    with psycopg.connect(owner, autocommit=True) as conn:
        try:
            for role in roles:
                name = sql.Identifier(role)
                conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(name))
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                    (role,),
                )
            drop_database()
        finally:
            for role in roles:
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _grant(roles: Roles, influx: TargetConfig) -> Result:
    flags = [arg for kind, name in roles.names.items() for arg in (f"--{kind}", name)]
    return Cli(roles.owner_url, influx)("db", "grants", *flags, "--apply")


def _stage(stager: Stager, epoch: int, parts: list[list[Any]], run: str) -> list[CommitMessage]:
    return [
        stager.stage(SINK, epoch, part, partition_id=i, run_id=run, query_id="q1")
        for i, part in enumerate(parts)
    ]


def _epoch_parts(epoch: int, offset: float = 0.0) -> list[list[Any]]:
    """Two tasks' output: epoch 1 has a row rejected at stage and a point InfluxDB refuses."""
    first: list[Any] = list(lines(epoch, 10, offset)[:4])
    rest: list[Any] = list(lines(epoch, 10, offset)[4:])
    if epoch == 1:
        first.append(Rejected(4, "field 'v' is null", '{"v": null}'))
        rest.append(BAD_POINT)
    return [first, rest]


def _refused(url: str, statement: str) -> str:
    with psycopg.connect(admin_conninfo(url)) as conn, pytest.raises(DENIED) as refusal:
        conn.execute(statement)
    return str(refusal.value)


def test_the_job_and_the_exporter_run_under_roles_of_least_privilege(
    roles: Roles, influx: TargetConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="twophase")
    granted = _grant(roles, influx)
    assert granted.code == 0, granted.err
    assert "statements run in schema public" in granted.out
    _executors_and_driver(roles, influx)
    _operator(roles, influx)
    # InfluxDB holds epochs 0-2 as decided, less the point it refuses (10 points each)
    assert influx_count(influx, M) == 30
    _reader(roles, influx, tmp_path)
    _refusals(roles, influx)
    _collect_and_reset(roles, influx)
    # The driver's threads (catch-up, automatic GC) and a replay's discard only warn of
    # a failure: none may have been refused a privilege.
    assert [r.getMessage() for r in caplog.records if "permission denied" in r.getMessage()] == []


def _executors_and_driver(roles: Roles, influx: TargetConfig) -> None:
    """The executors stage, the driver claims, decides, promotes, marks, discards a
    replay's writes, collects orphans and ends its run."""
    with Database(roles.staging("executor")) as executors:
        stager = Stager(executors, executors.config)
        staged = {epoch: _stage(stager, epoch, _epoch_parts(epoch), "r1") for epoch in (0, 1, 2)}
        orphan = _stage(stager, 7, _epoch_parts(1), "r1")  # a task of an epoch never decided
    with two_phase(roles.staging("driver", orphan_grace="1h"), influx) as tp:
        lease = tp.claim(SINK, "r1", "q1")
        for epoch in (0, 1):
            assert tp.committer.commit(lease, epoch, staged[epoch]).state == EpochState.COMMITTED
        # Spark in local mode (or a driver of the Python API) stages in the driver: a
        # replay of epoch 1 that recomputed other values
        replayed = _stage(tp.stager, 1, _epoch_parts(1, offset=0.5), "r1")
        replay = tp.committer.commit(lease, 1, replayed)
        assert replay.replay and replay.state == EpochState.COMMITTED
        assert tp.ledger.decide(lease, 2, staged[2]).state == EpochState.PRECOMMITTED
        report = tp.gc.collect(SINK, ahead_s=2 * 3600)  # the orphan is past its grace
        assert report.orphan_writes == 2  # its two tasks
        assert tp.runs.end(SINK, "r1", "stopped")
    with psycopg.connect(admin_conninfo(roles.owner_url)) as conn:
        left = conn.execute(
            "SELECT count(*) FROM twophase_writes WHERE write_id = ANY(%s::uuid[])",
            ([m.write_id for m in replayed + orphan],),
        ).fetchone()
    assert left == (0,)  # the replay's writes discarded, the orphan collected


def _operator(roles: Roles, influx: TargetConfig) -> None:
    """The operator's commands that change the store: recover the epoch the driver left
    decided, resend one, requeue the refused point (refused again: a dead letter once
    more)."""
    cli = roles.cli("operator", influx)
    recovered = cli("recover", "--sink", SINK, "--json")
    assert recovered.code == 0, recovered.err
    assert [r["epoch"] for r in recovered.json()["recovered"]] == [2]
    resent = cli("resend", "--sink", SINK, "--epoch", "0", "--json")
    assert resent.code == 0, resent.err
    requeued = cli("dead-letters", "--sink", SINK, "--requeue", "--json")
    assert requeued.code == 0, requeued.err
    assert (requeued.json()["correction"], requeued.json()["requeued"]) == (1, 1)


def _reader(roles: Roles, influx: TargetConfig, tmp_path: Path) -> None:
    """The exporter, verify and every command that only reads."""
    exporter = start_exporter(roles.staging("reader"), port=0, host="127.0.0.1")
    try:
        got = scrape(exporter.port)
    finally:
        exporter.close()
    assert got[("twophase_store_up", ())] == 1
    assert got[("twophase_last_committed_epoch", (("sink", SINK),))] == 2
    assert got[("twophase_target_lag_epochs", (("sink", SINK), ("target", "default")))] == 0
    cli = roles.cli("reader", influx)
    verified = cli("verify", "--sink", SINK)
    assert verified.code == 0, verified.out + verified.err
    export = tmp_path / "letters.csv"
    for command in (
        ("status",),
        ("epochs", "--sink", SINK),
        ("epochs", "--sink", SINK, "--epoch", "1"),  # and its history
        ("dead-letters", "--sink", SINK),
        ("dead-letters", "--sink", SINK, "--export", str(export)),
        ("targets",),
        ("db", "current"),
        ("db", "history"),
    ):
        done = cli(*command)
        assert done.code == 0, (command, done.err)


def _refusals(roles: Roles, influx: TargetConfig) -> None:
    """Each role is refused what is not its kind's."""
    assert "twophase_epochs" in _refused(
        roles.urls["reader"], "UPDATE twophase_epochs SET state = 'ABORTED'"
    )
    gc = roles.cli("reader", influx)("gc", "--yes")
    assert gc.code == 1
    assert "permission denied" in gc.err and "twophase db grants" in gc.err
    assert "twophase_staged_chunks" in _refused(
        roles.urls["executor"], "SELECT body_gz FROM twophase_staged_chunks"
    )
    with Database(roles.staging("executor")) as executors, pytest.raises(DENIED):
        Ledger(executors).begin_run(SINK, "r-executor", "q1")  # nor can it decide
    with Database(roles.staging("driver")) as driver, pytest.raises(DENIED):
        Ledger(driver).reset(SINK)  # an operator's decision
    assert "twophase_runs" in _refused(roles.urls["operator"], "DROP TABLE twophase_runs")
    regrant = roles.cli("operator", influx)("db", "grants", "--reader", "nobody", "--apply")
    assert regrant.code == 2 and "no such role: nobody" in regrant.err
    reader = roles.names["reader"]
    regrant = roles.cli("operator", influx)("db", "grants", "--reader", reader, "--apply")
    assert regrant.code == 1 and "that owns the staging schema" in regrant.err  # nor grant


def _collect_and_reset(roles: Roles, influx: TargetConfig) -> None:
    """The driver's GC purges what retention no longer keeps and compacts the history;
    the operator resets the sink, and its `gc` removes the writes that made orphans,
    and a failed task's."""
    with Database(roles.staging("driver")) as driver:
        collector = GarbageCollector(driver, 60, 60, history_s=60)
        report = collector.collect(SINK, ahead_s=3600)
    assert report.epochs_purged == 4  # 0-2 and the correction
    assert report.epochs_compacted == 1  # 0: 1 has dead letters, 2 is the last committed
    cli = roles.cli("operator", influx)
    reset = cli("reset", "--sink", SINK, "--yes")
    assert reset.code == 0, reset.err
    with Database(roles.staging("executor")) as executors:
        _stage(Stager(executors, executors.config), 3, _epoch_parts(1), "r2")
    collected = cli("gc", "--sink", SINK, "--orphan-grace", "0s", "--yes", "--json")
    assert collected.code == 0, collected.err
    assert collected.json()["orphan_writes"] == 7  # 1-2's four, the correction's, r2's two


def test_the_operator_ends_a_frozen_drivers_session_as_a_member_of_its_role(
    roles: Roles, influx: TargetConfig
) -> None:
    """PostgreSQL lets a role end only its own sessions (or a member of that role): a
    frozen driver's lock session is ended by the operator's recover once the operator
    is a member of the driver's role."""
    assert _grant(roles, influx).code == 0
    with Database(roles.staging("executor")) as executors:
        staged = _stage(Stager(executors, executors.config), 0, _epoch_parts(0), "r1")
    operator, driver = (sql.Identifier(roles.names[kind]) for kind in ("operator", "driver"))
    with two_phase(roles.staging("driver"), influx) as tp:
        lease = tp.begin_run(SINK, "r1", "q1")
        assert tp.ledger.decide(lease, 0, staged).state == EpochState.PRECOMMITTED
        with tp.ledger.recovering(lease):  # and the driver froze, holding its lock
            (held,) = _lock_sessions(roles)
            refused = psycopg.connect(admin_conninfo(roles.urls["operator"]))
            with refused, pytest.raises(DENIED):
                refused.execute("SELECT pg_terminate_backend(%s)", (held,))
            with psycopg.connect(admin_conninfo(roles.owner_url), autocommit=True) as conn:
                conn.execute(sql.SQL("GRANT {} TO {}").format(driver, operator))
            recovered = roles.cli("operator", influx)("recover", "--sink", SINK, "--force")
            assert recovered.code == 0, recovered.err
            assert held not in _lock_sessions(roles)  # ended, the lock taken over
    assert influx_count(influx, M) == 10


DEADLINE_S = 2.0  # the operator's staging_retry_deadline in the frozen-holder tests


def test_an_operator_that_may_not_end_a_frozen_drivers_session_says_how_and_gives_up(
    roles: Roles, influx: TargetConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the driver's role (nor pg_signal_backend), the operator's recover finds
    the frozen driver's recovery lock session and may not end it: it says so once, with
    the command and the grants that end it, and fails after staging_retry_deadline
    rather than wait for a session that never ends by itself."""
    assert _grant(roles, influx).code == 0
    with Database(roles.staging("executor")) as executors:
        staged = _stage(Stager(executors, executors.config), 0, _epoch_parts(0), "r1")
    with two_phase(roles.staging("driver"), influx) as tp:
        lease = tp.begin_run(SINK, "r1", "q1")
        assert tp.ledger.decide(lease, 0, staged).state == EpochState.PRECOMMITTED
        with tp.ledger.recovering(lease):  # and the driver froze, holding its lock
            (held,) = _lock_sessions(roles)
            error = _frozen_out(roles, influx, caplog, lambda config: recover(config, SINK, FORCE))
            assert "recover:s" in str(error)
            assert held in _lock_sessions(roles)  # waited for, never ended
            _names_the_remedy(roles, error, held, caplog)
    assert influx_count(influx, M) == 0


def test_an_operator_resync_gives_up_on_a_frozen_drivers_target_lock(
    roles: Roles, influx: TargetConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The same with a target's lock: a resync of the target the frozen driver was
    catching up fails after staging_retry_deadline, naming the grants."""
    assert _grant(roles, influx).code == 0
    with Database(roles.staging("executor")) as executors:
        staged = _stage(Stager(executors, executors.config), 0, _epoch_parts(0), "r1")
    with two_phase(roles.staging("driver"), influx) as tp:
        lease = tp.claim(SINK, "r1", "q1")
        assert tp.committer.commit(lease, 0, staged).state == EpochState.COMMITTED
        owner = LockOwner(SINK, lease.token)
        with tp.db.session_lock(f"twophase-target:{SINK}:default", owner):  # and froze
            (held,) = _lock_sessions(roles)
            error = _frozen_out(
                roles,
                influx,
                caplog,
                lambda config: resync(config, SINK, "default", from_epoch=0, guard=FORCE),
            )
            assert "twophase-target:s:default" in str(error)
            assert held in _lock_sessions(roles)
            _names_the_remedy(roles, error, held, caplog)


FORCE = Guard(force=True)


def _frozen_out(
    roles: Roles,
    influx: TargetConfig,
    caplog: pytest.LogCaptureFixture,
    command: Callable[[TwoPhaseConfig], object],
) -> FrozenHolderError:
    """Run the operator's ``command`` with a short staging_retry_deadline, on a thread
    (an unbounded wait would never return): the FrozenHolderError it failed with, within
    the deadline and a margin."""
    caplog.set_level(logging.WARNING, logger="twophase.store.locks")
    config = TwoPhaseConfig(roles.staging("operator", staging_retry_deadline=DEADLINE_S), influx)
    started = time.monotonic()
    thread, box = in_thread(lambda: command(config))
    thread.join(DEADLINE_S + 20)
    assert not thread.is_alive(), "the operator's command waited past its deadline"
    assert DEADLINE_S <= time.monotonic() - started < DEADLINE_S + 20
    error = box.get("error")
    assert isinstance(error, FrozenHolderError), box
    return error


def _names_the_remedy(
    roles: Roles, error: FrozenHolderError, held: int, caplog: pytest.LogCaptureFixture
) -> None:
    operator, driver = roles.names["operator"], roles.names["driver"]
    message = str(error)
    assert f"SELECT pg_terminate_backend({held})" in message
    assert f'GRANT pg_signal_backend TO "{operator}"' in message
    assert f'GRANT "{driver}" TO "{operator}"' in message
    assert "staging_retry_deadline" in message
    warned = [r.getMessage() for r in caplog.records if "may not end" in r.getMessage()]
    assert len(warned) == 1, warned  # said once, not at every try
    assert f"session {held}" in warned[0] and "GRANT pg_signal_backend" in warned[0]


def _lock_sessions(roles: Roles) -> list[int]:
    """The sessions of the driver's role that hold an advisory lock."""
    with psycopg.connect(admin_conninfo(roles.owner_url)) as conn:
        rows = conn.execute(
            "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND a.usename = %s",
            (roles.names["driver"],),
        ).fetchall()
    return [row[0] for row in rows]


def test_every_object_of_the_migrated_schema_has_its_grants(staging_url: str) -> None:
    """An object a new revision adds must be in the grant table (twophase.store.least_privilege)."""
    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        found = conn.execute(
            "SELECT c.relname, c.relkind FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND c.relname LIKE 'twophase\\_%'"
            " AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')"
        ).fetchall()
    kinds = {"r": "table", "p": "table", "v": "view", "m": "view", "S": "sequence"}
    assert {(name, kinds.get(kind, kind)) for name, kind in found} == {
        (g.name, g.kind) for g in GRANTS
    }
