"""The model-based stateful test: hypothesis drives the real protocol (a real staging
store, real InfluxDB and PostgreSQL targets, two in-process kinds) and the reference
model (``tests/model``) side by side, and after every step checks that they agree.

How it works, how to run it for hours and how to replay a failure: the stateful test
section of ``docs/development.md``. In short: the default run is seeded
(``derandomize``) and bounded; ``--full`` runs a longer one; ``TWOPHASE_STATEFUL_EXAMPLES``,
``TWOPHASE_STATEFUL_STEPS`` and ``TWOPHASE_STATEFUL_SEED`` size and seed a run; a failure
prints the shrunk steps, which paste into a test as ``replay(...)`` does below.

Known defects of the current code make some checks fail; each such check names its
defect in ``KNOWN_DEFECTS``: while the defect is listed there the check's failure is
recorded (``FOUND``) and the step goes on; once it is fixed, take it out of the set and
the check fails the test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import twophase.faults
import twophase.operations
from tests.integration import memory_kinds
from tests.model import COMMITTED, FAILED, PRECOMMITTED, REPLAY, SinkModel
from tests.support import (
    admin_conninfo,
    create_influx_database,
    drop_influx_database,
    influx_query,
    postgresql_target,
    staging_config_for,
    unique,
)
from twophase.config import (
    InfluxDBSettings,
    NamedTarget,
    StagingConfig,
    TargetConfig,
    TwoPhaseConfig,
)
from twophase.errors import FencedError, TwoPhaseError
from twophase.faults import CRASH_POINTS
from twophase.operations import Guard, recover, requeue, resend, reset, resync
from twophase.operations.requeuer import RequeueFilter
from twophase.postgresql.readback import PostgresReadback
from twophase.protocol.commit.runtime import TwoPhase
from twophase.store.locks import LOCK_SEED
from twophase.targets import make_writer

# `twophase targets remove`, where this tree has it: the rule remove_target runs then.
REMOVE = getattr(twophase.operations, "remove_target", None)

# --- known defects: a check of one of these records its failure instead of failing -----

PG_RESET = "pg-target-loses-data-after-reset"  # its delivered record outlives a reset
RESEND_OPEN_TX = "resend-holds-a-transaction-while-sending"  # ended by the session timeout
RECOVERY_LOCK = "recovery-lock-never-checked-once-held"  # Ledger.recovering drops HeldLock
UNCONFIGURED_BLOCKS_GC = "unconfigured-target-blocks-compaction"  # history never bounded
KNOWN_DEFECTS: set[str] = set()
FOUND: dict[str, str] = {}  # defect -> the first failure seen (printed at the end)

FORCE = Guard(force=True)  # the query is stopped by the machine before an operator acts
QUERY = "query"
T0 = 1_700_000_000_000_000_000  # every point's time: points differ by their tag k
KEYS = ("k0", "k1", "k2", "k3", "k4")
SEED = "seed"  # a key only the seed writes (left out of what a target is found to hold)
LATER = 400 * 86400.0  # seconds the clock moves on: past retention and history
SESSION_TIMEOUT = "1s"  # staging_session_timeout: a transaction idle longer is ended
SLOW_S = 1.5  # a slow target's pause before each request: past the session timeout
RECOVERY_THREAD = "stateful-recovery"  # the run's other process's recovery
LANE_THREAD = "twophase-lane"  # an overwriting target's requests go on these threads
MEMORY = ("ow", "tx")  # the in-process targets (overwriting, transactional)
SPARE_NAMES = ("ow2", "tx2", "ow3")  # names targets are added or renamed to


def known(machine: Any, defect: str, ok: bool, message: str) -> None:
    """A check that a known defect fails: while the defect is known, its failure is
    recorded with the steps that led to it, and the example ends there (its later steps
    are skipped)."""
    if ok:
        return
    if defect in KNOWN_DEFECTS:
        FOUND.setdefault(defect, "\n    ".join([message, *machine.trail]))
        machine.broken = True
        return
    raise _defect_error(defect)(f"{message} [{defect}]")


_DEFECT_ERRORS: dict[str, type[AssertionError]] = {}


def _defect_error(defect: str) -> type[AssertionError]:
    """An AssertionError class of the defect's own: hypothesis tells failures apart by
    their type and where they are raised, and would otherwise shrink one defect's
    failure into another's (every check raises here)."""
    name = "Defect_" + defect.replace("-", "_")
    return _DEFECT_ERRORS.setdefault(defect, type(name, (AssertionError,), {}))


# --- crash points raised in-process ----------------------------------------------------


class Crash(BaseException):
    """The process died at a crash point (a BaseException: nothing catches it)."""


class Faults:
    """Stands for ``twophase.faults.crash_point`` in every module: raises ``Crash`` at the
    n-th hit of the armed point (and at every point of the dead process after it), or
    pauses there once in the recovery thread of ``recovery_lock_lost`` (``pause``). The
    catch-up worker's hits are not counted: its timing is its own."""

    def __init__(self) -> None:
        self.armed: tuple[str, int] | None = None
        self.hits = 0
        self.dead = False
        self.seen: list[str] = []
        self.pause: tuple[str, float, threading.Event] | None = None

    def __call__(self, name: str, sink_id: str | None = None) -> None:
        if self.dead:
            raise Crash(name)
        if threading.current_thread().name.startswith("twophase-catch-up"):
            return
        self.seen.append(name)
        if self.pause is not None and self.pause[0] == name:
            _, seconds, paused = self.pause
            if threading.current_thread().name.startswith((RECOVERY_THREAD, LANE_THREAD)):
                self.pause = None
                paused.set()
                time.sleep(seconds)
                return
        if self.armed is None or self.armed[0] != name:
            return
        self.hits += 1
        if self.hits >= self.armed[1]:
            self.armed, self.dead = None, True
            raise Crash(name)

    def arm(self, name: str, nth: int) -> None:
        self.armed, self.hits, self.seen = (name, nth), 0, []


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    hook = Faults()
    original = twophase.faults.crash_point
    for module in list(sys.modules.values()):
        if module.__name__.startswith("twophase") and (
            getattr(module, "crash_point", None) is original
        ):
            monkeypatch.setattr(module, "crash_point", hook)
    return hook


# A commit's crash points, in the order a commit reaches them (the protocol's list), and
# those where its crash leaves its epoch decided: after the vote committed (in_plan is
# inside the decision's own transaction).
_FIRST, _LAST = CRASH_POINTS.index("stage_rows"), CRASH_POINTS.index("after_mark")
COMMIT_POINTS = CRASH_POINTS[_FIRST : _LAST + 1]
DECIDED_AT = {"after_decide", *COMMIT_POINTS[COMMIT_POINTS.index("promote_batch") :]}
CLAIM_POINTS = ("in_begin_run", "after_begin_run", "in_plan", "promote_batch", "in_mark")


# --- what a step stages ----------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """An epoch's points: tag k -> field v; ``bad`` adds one point every strict target
    refuses (its field v a string), staged last."""

    values: tuple[tuple[str, float], ...]
    bad: bool = False

    def points(self, name: str) -> dict[str, float | str]:
        found: dict[str, float | str] = dict(self.values)
        if self.bad:
            found[name] = "x"
        return found


batches = st.builds(
    Batch,
    st.dictionaries(
        st.sampled_from(KEYS), st.integers(0, 999).map(lambda n: n + 0.5), min_size=1
    ).map(lambda d: tuple(sorted(d.items()))),
    st.booleans(),
)


def lines_of(measurement: str, points: dict[str, float | str]) -> list[str]:
    return [
        f'{measurement},k={k} v="{v}" {T0}'
        if isinstance(v, str)
        else f"{measurement},k={k} v={v} {T0}"
        for k, v in points.items()
    ]


# --- the servers, shared by the examples of a test -------------------------------------


@dataclass
class Servers:
    staging: StagingConfig
    staging_url: str
    influx: TargetConfig
    pg: TargetConfig


@pytest.fixture
def servers(staging_url: str, influx_url: str, base_staging_url: str) -> Iterator[Servers]:
    name = unique("st")
    create_influx_database(influx_url, name)
    influx = TargetConfig(
        url=influx_url,
        retry_deadline_s=10,
        retry_initial_s=0.05,
        retry_max_s=0.5,
        batch_points=2,
        influxdb=InfluxDBSettings(api="v1", database=name),
    )
    staging = staging_config_for(
        staging_url,
        staging_session_timeout=SESSION_TIMEOUT,
        history_retention="1h",
        retention="1h",
        gc_interval="0",
        staging_chunk_points=2,
        compression="none",
        promote_connections=1,
    )
    with postgresql_target(base_staging_url, "st_pg") as (pg, _), memory_kinds.registered():
        pg = dataclasses.replace(pg, batch_points=2, retry_deadline_s=10)
        try:
            yield Servers(staging, staging_url, influx, pg)
        finally:
            drop_influx_database(influx_url, name)


def memory_target(store: str, transactional: bool) -> TargetConfig:
    scheme = "memtx" if transactional else "memow"
    return TargetConfig(
        url=f"{scheme}://{store}",
        batch_points=2,
        retry_deadline_s=0.3,
        retry_initial_s=0.02,
        retry_max_s=0.05,
        timeout_s=2,
    )


# How many writes a batch is staged as: one (the foreachBatch adapter's driver, a small
# batch) or one per partition (Spark tasks).
PARTS = st.integers(1, 3)


def step(*conditions: Any, **strategies: Any) -> Any:
    """A rule, run only while its conditions hold and no known defect has broken the
    example (past one, the model and the implementation no longer agree by design)."""

    def wrap(method: Any) -> Any:
        @functools.wraps(method)
        def traced(self: SinkMachine, **args: Any) -> Any:
            shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
            self.trail.append(f"state.{method.__name__}({shown})")
            return method(self, **args)

        ready = precondition(lambda self: not self.broken and all(c(self) for c in conditions))
        return ready(rule(**strategies)(traced))

    return wrap


# --- the machine -------------------------------------------------------------------------


class SinkMachine(RuleBasedStateMachine):
    """One sink over four targets to begin with (``ow``, ``tx`` in process; ``influx``;
    ``pg``), driven by a query's runs and by operators."""

    servers: Servers
    faults: Faults

    def __init__(self) -> None:
        super().__init__()
        tag = uuid.uuid4().hex[:8]
        self.sink, self.measurement = f"st-{tag}", f"st_{tag}"
        self.model = SinkModel()
        # configured targets: name -> settings; memory ones -> their store's name
        self.configured: dict[str, TargetConfig] = {}
        self.stores: dict[str, str] = {}
        for name in MEMORY:
            self.stores[name] = f"{name}-{tag}"
            self.configured[name] = memory_target(self.stores[name], name.startswith("tx"))
        self.configured["influx"] = self.servers.influx
        self.configured["pg"] = self.servers.pg
        for name in self.configured:
            self.model.add_target(name)
        self.next_epoch = 0
        self.cursors: dict[str, int] = {}  # the highest cursor seen per target (and query)
        self.renamed: set[str] = set()  # names the sink has that are no longer configured
        self.forgotten: set[str] = set()  # such names a reset took from the sink (their
        # dead letters stay, so no target takes the name again)
        self.queries = 0
        self.tp: TwoPhase | None = None
        self.lease: Any = None
        self.broken = False  # a known defect was found: the example's later steps skip
        self.trail: list[str] = []  # the rules run, as hypothesis prints them
        self.lock_race = ""  # the defect a check failing now points at (a race just run)
        # Whether the run's last commit in this process returned: its next one then finds
        # nothing pending and skips recovering (the committer's own shortcut).
        self.settled = False
        self.seed()
        self.start()

    def seed(self) -> None:
        """A float written first to the measurement on InfluxDB and PostgreSQL, so that
        field v is a float there (a string is then refused, whichever request comes
        first); the key ``seed`` is not the model's."""
        for name in ("influx", "pg"):
            writer = make_writer(self.configured[name])
            try:
                writer.write(f"{self.measurement},k={SEED} v=0.5 {T0}".encode())
            finally:
                writer.close()

    # --- the query's process ---------------------------------------------------------

    def config(self) -> TwoPhaseConfig:
        targets = tuple(NamedTarget(n, c) for n, c in self.configured.items())
        first = next(iter(self.configured.values()))
        influx = dataclasses.replace(
            first,
            targets=targets,
            min_targets=self.model.min_targets,
            target_deadline_s=0.3,
            retry_deadline_s=1,
        )
        return TwoPhaseConfig(self.servers.staging, influx)

    @property
    def query(self) -> str:
        return f"{QUERY}-{self.queries}"

    def start(self) -> None:
        """A query's process starts: opens, claims (recovering what is pending)."""
        self.tp = TwoPhase.open(self.config())
        self.settled = False
        run = f"run-{uuid.uuid4().hex[:8]}"
        recovered = self.model.recover()
        try:
            self.lease = self.tp.claim(self.sink, run, self.query)
            claimed = True
        except TwoPhaseError:
            claimed = False
            self.lease = self.tp.begin_run(self.sink, f"{run}-again", self.query)
        assert claimed == recovered, f"claim {'succeeded' if claimed else 'failed'}"

    def stop(self) -> None:
        """The query's process ends cleanly."""
        if self.tp is not None:
            self.tp.close()
            self.tp = None

    def die(self) -> None:
        """The process died: nothing of it runs on (its worker stopped, its sessions
        ended by the server), and no step of it is finished."""
        assert self.tp is not None
        self.faults.dead = True
        try:
            self.tp.catch_up.close()
            for writer in self.tp.writers.values():
                writer.close()
            self.tp.ledger.close()
            self.tp.db.close()
        finally:
            self.faults.dead = False
            self.tp = None

    def stage_and_commit(
        self, tp: TwoPhase, lease: Any, epoch: int, batch: Batch, parts: int = 1
    ) -> Any:
        """Stage the batch as ``parts`` writes (1: one write, as the foreachBatch adapter's
        driver stages a small batch; more: a write per partition, as Spark tasks do),
        then commit their messages."""
        lines = lines_of(self.measurement, batch.points(f"bad{self.model.resets}e{epoch}"))
        messages = [
            tp.stager.stage(
                self.sink,
                epoch,
                lines[part::parts],
                partition_id=part,
                run_id=lease.run_id,
                query_id=lease.query_id,
            )
            for part in range(parts)
        ]
        ours = tp is self.tp and lease is self.lease
        if ours:
            self.settled = False  # a commit forgets its predecessor's outcome as it starts
        outcome = tp.committer.commit(lease, epoch, messages)
        if ours:
            self.settled = True
        return outcome

    # --- rules: the query ------------------------------------------------------------

    @step(batch=batches, parts=PARTS)
    def commit(self, batch: Batch, parts: int = 1) -> None:
        """The next batch (or, after a failed commit, the same epoch again with values
        computed again: a replay when it was decided), staged as ``parts`` writes."""
        epoch = self.next_epoch
        want = self.model.commit(epoch, batch.points(f"bad{self.model.resets}e{epoch}"))
        try:
            outcome = self.stage_and_commit(self.tp, self.lease, epoch, batch, parts)
        except TwoPhaseError as exc:
            assert want in (FAILED, PRECOMMITTED), f"commit of {epoch} failed: {exc!r}"
            return
        assert want in (COMMITTED, REPLAY), f"commit of {epoch}: {outcome}, model {want}"
        assert outcome.replay == (want == REPLAY), outcome
        self.next_epoch += 1

    @step(lambda self: self.model.last_committed() is not None, batch=batches, data=st.data())
    def replay_committed(self, batch: Batch, data: st.DataObject) -> None:
        """Spark re-runs a committed epoch (its values computed again): nothing changes."""
        committed = sorted(e for e in self.model.committed if e >= 0)
        epoch = data.draw(st.sampled_from(committed), label="epoch")
        # After a commit that returned, the epoch is found at once; otherwise the commit
        # recovers what is pending first, which fails where the model says.
        recovered = self.settled or self.model.recover()
        try:
            outcome = self.stage_and_commit(self.tp, self.lease, epoch, batch)
        except TwoPhaseError as exc:
            assert not recovered, f"replay of {epoch} failed: {exc!r}"
            return
        assert recovered and outcome.replay, outcome

    @step(point=st.sampled_from(COMMIT_POINTS), nth=st.integers(1, 3), batch=batches, parts=PARTS)
    def crash_in_commit(self, point: str, nth: int, batch: Batch, parts: int = 1) -> None:
        """The process dies at the n-th hit of a crash point in a commit (its staging of
        ``parts`` writes included), and restarts."""
        epoch = self.next_epoch
        self.faults.arm(point, nth)
        try:
            outcome = self.stage_and_commit(self.tp, self.lease, epoch, batch, parts)
        except Crash:
            seen = self.faults.seen
            if self.model.recover() and ("after_decide" in seen or point in DECIDED_AT):
                self.model.decide(epoch, batch.points(f"bad{self.model.resets}e{epoch}"))
            self.die()
            self.start()
            return
        except TwoPhaseError:
            self.faults.armed = None
            self.model.commit(epoch, batch.points(f"bad{self.model.resets}e{epoch}"))
            return
        self.faults.armed = None
        want = self.model.commit(epoch, batch.points(f"bad{self.model.resets}e{epoch}"))
        assert want in (COMMITTED, REPLAY), (outcome, want)
        self.next_epoch += 1

    @step(point=st.sampled_from(CLAIM_POINTS), nth=st.integers(1, 2))
    def crash_in_restart(self, point: str, nth: int) -> None:
        """The process stops; its restart dies in its claim, and restarts again."""
        self.stop()
        self.faults.arm(point, nth)
        try:
            self.start()
        except Crash:
            self.die()
            self.start()
        except AssertionError:
            # the claim's recovery predicted by the model ran: fine unless it crashed
            raise
        self.faults.armed = None

    @step(batch=batches)
    def zombie(self, batch: Batch) -> None:
        """A newer run claims the sink while the older one still runs: the older one's
        commit is fenced and changes nothing."""
        old_tp, old_lease = self.tp, self.lease
        self.tp = None
        self.start()
        try:
            with pytest.raises(FencedError):
                self.stage_and_commit(old_tp, old_lease, self.next_epoch, batch)
        finally:
            old_tp.close()

    @step()
    def restart(self) -> None:
        self.stop()
        self.start()

    # --- rules: targets --------------------------------------------------------------

    def live_targets(self) -> list[Any]:
        """The model's targets the configuration names."""
        return [t for t in self.model.targets.values() if t.configured]

    def memory_names(self) -> list[str]:
        return sorted(n for n in self.configured if n in self.stores)

    @step(
        lambda self: any(t.up for n, t in self.model.targets.items() if n in self.stores),
        data=st.data(),
    )
    def target_down(self, data: st.DataObject) -> None:
        name = data.draw(
            st.sampled_from([n for n in self.memory_names() if self.model.targets[n].up])
        )
        memory_kinds.store_of(self.configured[name].url).down = True
        self.model.set_up(name, False)

    @step(lambda self: any(not t.up for t in self.live_targets()), data=st.data())
    def target_up(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(t.name for t in self.live_targets() if not t.up)))
        memory_kinds.store_of(self.configured[name].url).down = False
        self.model.set_up(name, True)

    @step(k=st.integers(1, 4))
    def min_targets(self, k: int) -> None:
        """The query restarts with another ``min_targets``."""
        self.stop()
        self.model.min_targets = k
        self.start()

    @step(lambda self: len(self.configured) < 7, name=st.sampled_from(SPARE_NAMES))
    def add_target(self, name: str) -> None:
        """The query restarts with a new target (a store of its own, empty)."""
        if name not in self.free_names():
            return
        self.stop()
        self.stores[name] = f"{name}-{uuid.uuid4().hex[:8]}"
        self.configured[name] = memory_target(self.stores[name], name.startswith("tx"))
        self.model.add_target(name)
        self.start()

    def free_names(self) -> list[str]:
        taken = {*self.configured, *self.renamed, *self.forgotten}
        return [n for n in SPARE_NAMES if n not in taken]

    @step(lambda self: self.memory_names() and self.free_names(), data=st.data())
    def rename_target(self, data: st.DataObject) -> None:
        """The query restarts with a memory target renamed in its configuration (same
        store): the old name is no longer configured."""
        old = data.draw(st.sampled_from(self.memory_names()), label="old")
        new = data.draw(st.sampled_from(self.free_names()), label="new")
        self.rename(old, new)

    def rename(self, old: str, new: str) -> None:
        self.stop()
        self.configured[new] = self.configured.pop(old)
        self.stores[new] = self.stores.pop(old)
        self.model.rename_target(old, new)
        self.renamed.add(old)
        self.cursors.pop(old, None)
        self.start()

    @step(
        lambda self: any(
            memory_kinds.store_of(c.url).strict
            for n, c in self.configured.items()
            if n in self.stores
        ),
        data=st.data(),
    )
    def accept_refused(self, data: st.DataObject) -> None:
        """A memory target's store is changed to take what it refused (strings)."""
        name = data.draw(st.sampled_from(self.memory_names()))
        memory_kinds.store_of(self.configured[name].url).strict = False
        self.model.targets[name].strict = False

    # --- rules: operators (the query stopped while they act, then restarted) ---------

    @step()
    def operator_recover(self) -> None:
        self.stop()
        ok = self.model.recover()
        try:
            report = recover(self.config(), self.sink, guard=FORCE)
        except TwoPhaseError as exc:  # an epoch fewer than min_targets owed targets took
            assert not ok, f"recover failed: {exc!r}"
        else:
            behind = {s.target for s in report.still_behind}
            up = {n for n, t in self.model.targets.items() if t.up}
            assert not ok or not behind & up, report
        self.model.catch_up()
        self.start()

    @step(lambda self: self.model.retained(), slow=st.booleans())
    def operator_resend(self, slow: bool) -> None:
        """``twophase resend`` of every retained epoch; ``slow``: a target takes longer
        per request than the staging session timeout."""
        self.stop()
        slowed = None
        up = [n for n in self.memory_names() if self.model.targets[n].up]
        if slow and up:
            slowed = memory_kinds.store_of(self.configured[up[0]].url)
            slowed.slow_s = SLOW_S
        try:
            resend(self.config(), self.sink, guard=FORCE)
            done = None
        except TwoPhaseError as exc:
            done = exc
        finally:
            if slowed is not None:
                slowed.slow_s = 0.0
        ok = self.model.resend(self.configured)  # in the configuration's order
        if done is not None and ok:
            if slowed is None:
                raise AssertionError(f"resend failed: {done!r}")
            known(self, RESEND_OPEN_TX, False, f"resend with a slow target failed: {done!r}")
        assert ok or done is not None, "resend sent to a target that is down"
        self.start()

    @step(
        lambda self: any(t.dead for n, t in self.model.targets.items() if n in self.configured),
        data=st.data(),
    )
    def operator_requeue(self, data: st.DataObject) -> None:
        """``twophase dead-letters --requeue --target NAME``."""
        names = sorted(n for n, t in self.model.targets.items() if t.dead and n in self.configured)
        name = data.draw(st.sampled_from(names), label="target")
        if not self.model.targets[name].up or self.model.pending:
            return
        self.stop()
        requeue(self.config(), self.sink, RequeueFilter(target=name), guard=FORCE)
        self.model.recover()
        self.model.requeue(name)
        self.start()

    @step(lambda self: any(n in self.model.targets for n in self.configured), data=st.data())
    def operator_resync(self, data: st.DataObject) -> None:
        """``twophase targets resync NAME`` of an up target."""
        names = sorted(n for n in self.configured if self.model.targets[n].up)
        if not names or self.model.pending:
            return
        name = data.draw(st.sampled_from(names), label="target")
        self.stop()
        resync(self.config(), self.sink, name, guard=FORCE)
        self.model.catch_up()
        self.start()

    @step()
    def operator_gc(self) -> None:
        """The clock moves past retention and history_retention; GC collects."""
        self.stop()
        self.model.catch_up()  # the closed worker's last look: checked by the invariant
        with TwoPhase.open(self.config()) as tp:
            tp.gc.collect(self.sink, ahead_s=LATER)
        self.model.expire()
        self.start()

    @step(lambda self: not self.model.pending)
    def operator_reset(self) -> None:
        """``twophase reset``, then a new query starts at epoch 0."""
        self.stop()
        reset(self.servers.staging, self.sink, guard=FORCE)
        self.model.reset()
        self.queries += 1
        self.next_epoch = 0
        self.cursors = {}
        # the reset forgot the sink's targets; the claim registers the configured ones only
        self.forgotten |= self.renamed
        self.renamed = set()
        self.start()

    @step(
        lambda self: REMOVE is not None and len(self.removable()) > 0,
        data=st.data(),
    )
    def remove_target(self, data: st.DataObject) -> None:
        """``twophase targets remove NAME``: a memory target taken out of the
        configuration and removed from the sink, or a name a rename left behind."""
        self.remove(data.draw(st.sampled_from(self.removable()), label="target"))

    def remove(self, name: str) -> None:
        self.stop()
        self.configured.pop(name, None)
        self.stores.pop(name, None)
        assert REMOVE is not None
        REMOVE(self.config(), self.sink, name, guard=FORCE)
        self.model.remove_target(name)
        self.renamed.discard(name)
        self.start()

    def removable(self) -> list[str]:
        """Targets the sink has that may be removed: a configured memory target (one
        other target stays), or one no longer configured."""
        gone = sorted(self.renamed)
        kept = [n for n in self.memory_names() if len(self.configured) > 1]
        return [*gone, *kept]

    @precondition(lambda self: self.broken)
    @rule()
    def known_defect_found(self) -> None:
        """Nothing: the example found a known defect; its remaining steps do nothing."""

    # --- the recovery lock lost while it is held -------------------------------------

    @step(
        lambda self: all(t.up for t in self.live_targets()) and not self.model.pending,
        first=batches,
        second=batches,
    )
    def recovery_lock_lost(self, first: Batch, second: Batch) -> None:
        """An epoch left PRECOMMITTED is recovered on a thread of the run, which pauses
        after its first request; meanwhile the session of its recovery lock is ended and
        the run's commit of the next epoch recovers it too. The paused recovery must stop
        (its lock is gone) rather than send the older epoch over the newer one."""
        epoch = self.next_epoch
        self.faults.arm("after_decide", 1)
        with contextlib.suppress(Crash):
            self.stage_and_commit(self.tp, self.lease, epoch, first)
        self.faults.armed, self.faults.dead = None, False  # the process lives on
        self.model.decide(epoch, first.points(f"bad{self.model.resets}e{epoch}"))
        paused = threading.Event()
        self.faults.pause = ("promote_batch", 2.0, paused)
        self.lock_race = RECOVERY_LOCK  # what the checks after this step point at
        failure: list[BaseException] = []

        def recovering(other: TwoPhase) -> None:
            try:
                other.committer.recover(self.lease)
            except BaseException as exc:
                failure.append(exc)

        # the run's other process (a claim on the driver, a commit in a worker)
        other = TwoPhase.open(self.config())
        thread = threading.Thread(target=recovering, args=(other,), name=RECOVERY_THREAD)
        thread.start()
        if not paused.wait(5):  # nothing left to recover: the race cannot be run
            thread.join(30)
            other.close()
            self.faults.pause, self.lock_race = None, ""
            self.model.recover()
            self.next_epoch = epoch + 1
            return
        self.kill_lock_holder(f"recover:{self.sink}")
        self.model.recover()
        try:
            self.stage_and_commit(self.tp, self.lease, epoch + 1, second)
            want = self.model.commit(
                epoch + 1, second.points(f"bad{self.model.resets}e{epoch + 1}")
            )
            assert want == COMMITTED, want
            self.next_epoch = epoch + 2
        finally:
            thread.join(30)
            other.close()
            self.faults.pause = None
        self.next_epoch = max(self.next_epoch, epoch + 1)

    def kill_lock_holder(self, name: str) -> None:
        with psycopg.connect(admin_conninfo(self.servers.staging_url), autocommit=True) as conn:
            row = conn.execute(
                "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
                " AND (l.classid::int8 << 32 | l.objid::int8) = hashtextextended(%s, %s)",
                (name, LOCK_SEED),
            ).fetchone()
            assert row is not None, f"nobody holds {name}"
            conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))

    # --- invariants --------------------------------------------------------------------

    @invariant()
    def targets_hold_what_the_model_says(self) -> None:
        """Every up target caught up (the run's catch-up, on this thread), then: each
        target holds exactly the model's points, no cursor went back, the dead letters
        are the model's, and the transactional targets took no epoch twice."""
        if self.broken:
            return
        assert self.tp is not None
        up = [n for n in self.configured if self.model.targets[n].up]
        report = self.tp.catch_up.run(self.lease, up)
        assert not report.failed, report.failed
        self.model.catch_up()
        for name in self.configured:
            got, want = self.held(name), self.model.expected(name)
            if got != want:
                defect = self.lock_race or None
                if self.model.resets and self.kind_is_transactional(name):
                    defect = PG_RESET
                message = f"target {name} holds {got}, the model says {want}"
                if defect is None:
                    raise AssertionError(message)
                known(self, defect, False, message)
        self.check_cursors()
        self.check_dead_letters()
        self.check_no_second_delivery()
        self.lock_race = ""

    def kind_is_transactional(self, name: str) -> bool:
        return self.configured[name].url.startswith(("postgresql", "memtx"))

    def held(self, name: str) -> dict[str, Any]:
        config = self.configured[name]
        if name in self.stores:
            return memory_kinds.store_of(config.url).held(self.measurement)
        if name == "influx":
            # the measurement is the machine's own name: no user input
            query = f'SELECT v FROM "{self.measurement}" GROUP BY k'  # noqa: S608
            series = influx_query(config, query)
            return {s["tags"]["k"]: s["values"][0][1] for s in series if s["tags"]["k"] != SEED}
        readback = PostgresReadback(config)
        try:
            found = {}
            for series in readback.window(self.measurement, T0 - 1000, T0 + 1000):
                column = series["columns"].index("v")
                for row in series["values"]:
                    found[series["tags"]["k"]] = row[column]
            found.pop(SEED, None)
            return found
        finally:
            readback.close()

    def check_cursors(self) -> None:
        rows = self.store_rows(
            "SELECT target, delivered_epoch FROM twophase_targets WHERE sink_id = %s"
        )
        for target, cursor in rows:
            if cursor is None:
                continue
            assert cursor >= self.cursors.get(target, cursor), (target, cursor, self.cursors)
            self.cursors[target] = cursor

    def check_dead_letters(self) -> None:
        rows = self.store_rows(
            "SELECT target, payload FROM twophase_dead_letters WHERE sink_id = %s"
            " AND phase = 'promote' AND requeued_in IS NULL"
        )
        got = {(t, p.split(",k=")[1].split(" ")[0]) for t, p in rows}
        want = {(n, k) for n, t in self.model.targets.items() for k in t.dead}
        message = f"dead letters {sorted(got)}, the model says {sorted(want)}"
        odd = {t for t, _ in got ^ want}
        if (
            self.model.resets
            and odd
            and all(self.kind_is_transactional(t) for t in odd if t in self.configured)
        ):
            known(self, PG_RESET, False, message)  # the epoch was never sent to them
            return
        assert got == want, message

    def check_no_second_delivery(self) -> None:
        for name in self.configured:
            if not self.configured[name].url.startswith("memtx"):
                continue
            commits = memory_kinds.store_of(self.configured[name].url).commits
            firsts = [c for c in commits if c[0] == self.sink and not c[4]]
            twice = len(firsts) != len(set(firsts))
            known(
                self,
                self.lock_race or RECOVERY_LOCK,
                not twice,
                f"target {name} took an epoch twice: {firsts}",
            )

    @invariant()
    def history_bounded(self) -> None:
        """Once GC ran past history_retention, the store keeps no record the model says
        is compacted."""
        floor = self.model.floor()
        if floor is None or self.broken:
            return
        # an epoch a dead letter names keeps its record (its letters are read through it)
        [(kept,)] = self.store_rows(
            "SELECT count(*) FROM twophase_epochs e WHERE sink_id = %s AND epoch >= 0"
            " AND epoch <= %s AND NOT EXISTS (SELECT 1 FROM twophase_dead_letters d"
            " WHERE d.sink_id = e.sink_id AND d.epoch = e.epoch)",
            floor,
        )
        known(
            self,
            UNCONFIGURED_BLOCKS_GC,
            kept == 0,
            f"{kept} epoch records at or below {floor} kept past history_retention",
        )

    def store_rows(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(admin_conninfo(self.servers.staging_url)) as conn:
            return conn.execute(query, (self.sink, *params)).fetchall()

    def teardown(self) -> None:
        self.faults.armed, self.faults.dead, self.faults.pause = None, False, None
        if self.tp is not None:
            with contextlib.suppress(TwoPhaseError):
                self.tp.close()


# --- runs ----------------------------------------------------------------------------------


def stateful_settings(full: bool) -> settings:
    """The default run: seeded and bounded; ``--full`` runs longer; the environment
    (``TWOPHASE_STATEFUL_EXAMPLES``, ``_STEPS``, ``_SEED``) sizes a run of hours."""
    examples = int(os.environ.get("TWOPHASE_STATEFUL_EXAMPLES", 400 if full else 15))
    steps = int(os.environ.get("TWOPHASE_STATEFUL_STEPS", 40 if full else 22))
    seed = os.environ.get("TWOPHASE_STATEFUL_SEED")
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=seed is None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
        print_blob=True,
    )


def run_machine(servers: Servers, faults: Faults, full: bool) -> None:
    SinkMachine.servers, SinkMachine.faults = servers, faults
    FOUND.clear()
    try:
        run_state_machine_as_test(SinkMachine, settings=stateful_settings(full))
    finally:
        for defect, message in FOUND.items():
            print(f"known defect {defect} found: {message}")


def test_the_implementation_follows_the_model(servers: Servers, faults: Faults) -> None:
    """The default run: seeded, bounded (``--full`` adds the long one below)."""
    run_machine(servers, faults, full=False)


@pytest.mark.full
@pytest.mark.timeout(0)  # its length is set by its examples and steps, not by a limit
def test_the_implementation_follows_the_model_long(servers: Servers, faults: Faults) -> None:
    """The long run (``--full``): more and longer examples."""
    run_machine(servers, faults, full=True)


# --- replays: shrunk sequences pasted from a failure's output ------------------------------


def replay(servers: Servers, faults: Faults, steps: Any) -> set[str]:
    """Run ``steps(state)`` (the lines hypothesis printed, ``state.`` calls) on a fresh
    machine; the known defects it found."""
    SinkMachine.servers, SinkMachine.faults = servers, faults
    FOUND.clear()
    state = SinkMachine()
    try:
        steps(state)
    finally:
        state.teardown()
    return set(FOUND)


def _check(state: SinkMachine) -> None:
    state.history_bounded()
    state.targets_hold_what_the_model_says()


def _reset_then_epoch_0(state: SinkMachine) -> None:
    state.commit(batch=Batch((("k0", 1.5), ("k1", 2.5)), True))
    _check(state)
    state.operator_reset()
    _check(state)
    state.commit(batch=Batch((("k0", 3.5),), False))
    _check(state)


def _slow_resend(state: SinkMachine) -> None:
    state.commit(batch=Batch((("k0", 1.5), ("k1", 2.5), ("k2", 3.5)), False))
    _check(state)
    state.operator_resend(slow=True)
    _check(state)


def _recovery_lock_lost(state: SinkMachine) -> None:
    state.commit(batch=Batch((("k0", 0.5),), False))
    _check(state)
    state.recovery_lock_lost(
        first=Batch((("k0", 1.5), ("k1", 1.5), ("k2", 1.5)), False),
        second=Batch((("k0", 2.5), ("k1", 2.5), ("k2", 2.5)), False),
    )
    _check(state)


def _renamed_target_then_gc(state: SinkMachine) -> None:
    state.commit(batch=Batch((("k0", 0.5),), False))
    _check(state)
    state.rename("ow", "ow2")  # rename_target's draws: old 'ow', new 'ow2'
    _check(state)
    state.commit(batch=Batch((("k0", 1.5),), False))
    _check(state)
    state.commit(batch=Batch((("k0", 2.5),), False))
    _check(state)
    state.operator_gc()  # the old name holds the floor back: nothing compacted
    _check(state)
    if REMOVE is None:  # a tree without `twophase targets remove`: nothing frees it
        return
    state.remove("ow")  # remove_target's draw: 'ow'
    _check(state)
    state.operator_gc()  # now compacted up to the last epoch but one
    _check(state)


@pytest.mark.parametrize(
    ("defect", "steps"),
    [
        pytest.param(PG_RESET, _reset_then_epoch_0, id="reset"),
        pytest.param(RESEND_OPEN_TX, _slow_resend, id="slow-resend"),
        pytest.param(RECOVERY_LOCK, _recovery_lock_lost, id="recovery-lock"),
        pytest.param(UNCONFIGURED_BLOCKS_GC, _renamed_target_then_gc, id="unconfigured-gc"),
    ],
)
def test_replay(servers: Servers, faults: Faults, defect: str, steps: Any) -> None:
    """Each known defect's sequence: it finds the defect while the defect is known (take
    it out of KNOWN_DEFECTS once fixed, and the sequence must pass)."""
    found = replay(servers, faults, steps)
    if defect in KNOWN_DEFECTS:
        assert defect in found, f"{defect} is known, and the sequence no longer finds it"


class _Forgetful(dict[Any, Any]):
    """A transactional store's records that are never found again: the store lost them."""

    def get(self, key: Any, default: Any = None) -> Any:
        return default


def test_a_second_delivery_fails_the_machine(servers: Servers, faults: Faults) -> None:
    """The machine sees a second delivery where none is allowed: a transactional memory
    target that loses its records takes the epoch a crash left undecided in the mark a
    second time when the restart recovers it, and the check after the step fails."""

    def steps(state: SinkMachine) -> None:
        memory_kinds.store_of(state.configured["tx"].url).records = _Forgetful()
        state.crash_in_commit(point="after_promote", nth=1, batch=Batch((("k0", 1.5),), False))
        with pytest.raises(AssertionError, match="took an epoch twice"):
            state.targets_hold_what_the_model_says()

    replay(servers, faults, steps)
