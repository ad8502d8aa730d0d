"""The conformance kit: what every kind of target must do, checked against its real server.

A kind's tests subclass [`TargetConformance`][twophase.testing.conformance.TargetConformance]
and give it the target (an empty one for each check)::

    import pytest
    from twophase.config import TargetConfig
    from twophase.testing import TargetConformance

    class TestMyStore(TargetConformance):
        @pytest.fixture
        def target(self, tmp_path) -> TargetConfig:
            return TargetConfig(url=f"mystore://{tmp_path}/points")

The checks stage and decide epochs in a staging store of their own (a database made
beside ``TWOPHASE_STAGING_URL``'s, or ``staging_store_url``), deliver them through the
real protocol and read the target back through its kind's ``Readback``:

* a re-sent body changes nothing (an overwriting kind: the same body twice; a
  transactional one: the same body in the transactions of two epochs, and the first
  epoch's record found again);
* a point's key is its measurement, tag set and time: points of one time that differ
  in their tags only are each held;
* an epoch delivered twice, and re-sent by an operator, is held once;
* a transactional kind's record names the generation: one of another generation is
  inert, one of its own is found again; a sink reset, the next query's epochs (numbered
  from 0 again) are delivered whole;
* failures are classified: a point the store refuses is ``BadPointsError`` with the
  store's reason, and the sender delivers the other points of its body; an
  unreachable store is retryable; bad credentials are ``TargetAuthError``;
* a lagging target caught up gets the epochs in order: the later value wins;
* a process SIGKILLed while it delivers (``promote_batch``; for a transactional kind
  also ``before_target_commit`` and ``after_target_commit``), then ``recover``: the
  target holds the epoch's points, each once.

pytest is a test-time dependency of twophase, not a run-time one: this module imports
it, and [`twophase.testing`][twophase.testing] loads this module only when
``TargetConformance`` is first asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from twophase.config import NamedTarget, Secret, TargetConfig, TwoPhaseConfig, load_staging_config
from twophase.errors import (
    BadPointsError,
    RetryableError,
    TargetAuthError,
    TargetUnavailableError,
    TransactionLostError,
    TwoPhaseError,
)
from twophase.model import CommitMessage, EpochState
from twophase.operations import Guard, recover, resend, reset
from twophase.protocol.commit.runtime import TwoPhase
from twophase.targets import (
    EpochWriter,
    Readback,
    TargetWriter,
    kind_of,
    make_readback,
    make_writer,
)
from twophase.targets.sender import BatchSender
from twophase.testing import crash
from twophase.testing.support import (
    Case,
    Held,
    difference,
    expected,
    held,
    scratch_staging,
    unreachable,
)

__all__ = ["TargetConformance"]

_POINTS = 12  # points of an epoch: a few requests of _BATCH
_BATCH = 4  # target_batch_points of the checks that deliver epochs in several requests
_NAME = "conformance"  # the target's name where a check names it
_FORCE = Guard(force=True)  # an operator's command on a sink the check's run just used
_CRASH_POINTS = ("promote_batch", "before_target_commit", "after_target_commit")
_TRANSACTIONAL_ONLY = {"before_target_commit", "after_target_commit"}


class TargetConformance:
    """The checks a kind of target passes; subclass it once per kind (and server).

    Override the ``target`` fixture (required) and, where the defaults do not fit, the
    ``second_target`` and ``staging_store_url`` fixtures and the methods ``readback``,
    ``writer``, ``unavailable``, ``bad_credentials``, ``refused_line`` and
    ``child_env``. Every check uses a sink and a measurement of its own.
    """

    # --- what a kind's tests give ------------------------------------------------------

    @pytest.fixture
    def target(self) -> TargetConfig:
        """The target under test, holding nothing of the check's measurement."""
        pytest.fail(f"{type(self).__name__} must override the `target` fixture", pytrace=False)

    @pytest.fixture
    def second_target(self, target: TargetConfig) -> TargetConfig:
        """Another target of the kind, for the sink of the catch-up check to deliver to
        while ``target`` is down. By default ``target`` itself for a kind that
        overwrites (sharing a store is harmless when a re-sent body changes nothing);
        a transactional kind gives one of its own (another schema, database or file)."""
        if kind_of(target).transactional:
            pytest.skip("a transactional kind overrides `second_target` (another store)")
        return target

    @pytest.fixture(scope="class")
    @classmethod
    def staging_store_url(cls) -> Iterator[str]:
        """A staging store of the class's own, beside ``TWOPHASE_STAGING_URL``'s."""
        base = os.environ.get("TWOPHASE_STAGING_URL")
        if not base:
            pytest.fail("TWOPHASE_STAGING_URL is not set: the checks need a staging store")
        with scratch_staging(base) as url:
            yield url

    def readback(self, config: TargetConfig) -> Readback:
        """How the checks read the target back: its kind's ``Readback``."""
        return make_readback(config)

    def writer(self, config: TargetConfig) -> TargetWriter:
        """A writer of the target, of its kind."""
        return make_writer(config)

    @contextlib.contextmanager
    def unavailable(self, config: TargetConfig) -> Iterator[TargetConfig]:
        """The target's settings while its store cannot be reached (by default: a port
        nothing listens on; given up on within a second or two)."""
        yield unreachable(config)

    def bad_credentials(self, config: TargetConfig) -> TargetConfig | None:
        """The target with a wrong password or token; None (the check skipped) when the
        target has none. By default the URL's password, ``password`` or ``token``."""
        wrong = "conformance-wrong-secret"
        parts = urlsplit(config.url)
        if parts.password:
            user = parts.username or ""
            host = parts.netloc.rpartition("@")[2]
            url = urlunsplit(parts._replace(netloc=f"{user}:{wrong}@{host}"))
            return dataclasses.replace(config, url=url)
        if config.password is not None:
            return dataclasses.replace(config, password=Secret(wrong))
        if config.influxdb.token is not None:
            return config.with_fields(token=Secret(wrong))
        return None

    def refused_line(self, measurement: str, time_ns: int) -> str | None:
        """A point the store refuses once field ``v`` of ``measurement`` holds floats
        (by default ``v`` as a string: a field type conflict); None when the store
        refuses no point (the check skipped)."""
        return f'{measurement},host=refused v="text" {time_ns}'

    def child_env(self) -> dict[str, str]:
        """The environment of the crash checks' child process: this one's, with this
        process's ``sys.path`` (where the kind was found) as ``PYTHONPATH``."""
        paths = [p for p in sys.path if p and Path(p).exists()]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}

    # --- per check -----------------------------------------------------------------------

    @pytest.fixture
    def case(self) -> Case:
        return Case.new()

    @pytest.fixture
    def staging(self, staging_store_url: str) -> TwoPhaseConfig:
        """Only the staging half matters: the checks pair it with their targets."""
        staging = load_staging_config(env={}, staging_url=staging_store_url)
        return TwoPhaseConfig(staging, TargetConfig(url="http://unused.invalid"))

    def held(self, config: TargetConfig, case: Case) -> list[Held]:
        """What the target holds of the check's measurement."""
        return held(self.readback(config), case)

    #: Whether a point written again with another value keeps the value written last
    #: (InfluxDB, PostgreSQL's upsert). A store that keeps one of them (a deduplicating
    #: VictoriaMetrics) says False: the catch-up check then shows every epoch delivered,
    #: the rewritten point once with one of its values, not their order.
    keeps_last_write = True

    def holds(self, config: TargetConfig, case: Case, want: list[Held]) -> None:
        """AssertionError, saying what is missing, extra or held twice, unless the
        target holds exactly ``want``."""
        got = self.held(config, case)
        if got != want:
            raise AssertionError(difference(got, want))

    # --- the checks ------------------------------------------------------------------------

    def test_a_resent_body_changes_nothing(self, target: TargetConfig, case: Case) -> None:
        lines = case.lines(0, _POINTS)
        body = "\n".join(lines).encode()
        writer = self.writer(target)
        try:
            if isinstance(writer, EpochWriter) and kind_of(target).transactional:
                _in_two_epochs(writer, case, body, len(lines))
            else:
                writer.write(body)
                writer.write(gzip.compress(body), gzipped=True)  # as staged chunks go out
        finally:
            writer.close()
        self.holds(target, case, expected(lines))

    def test_points_differing_in_tags_only_are_each_held(
        self, target: TargetConfig, case: Case
    ) -> None:
        lines = [*case.lines(0, _POINTS), *case.lines(0, _POINTS, host="b")]  # same times
        writer = self.writer(target)
        try:
            with _epoch(writer, target, case, 0, len(lines)):
                writer.write("\n".join(lines).encode())
        finally:
            writer.close()
        self.holds(target, case, expected(lines))

    def test_a_resent_epoch_is_held_once(
        self, target: TargetConfig, staging: TwoPhaseConfig, case: Case
    ) -> None:
        lines = case.lines(0, _POINTS)
        config = _config(staging, dataclasses.replace(target, batch_points=_BATCH))
        with TwoPhase.open(config, writer=_Counting(self.writer(target))) as tp:
            lease = tp.begin_run(case.sink, "r1", "q1")
            tp.ledger.decide(lease, 0, _stage(tp, case, lines))
            plan = tp.ledger.plan_promotion(lease, 0)
            (delivery,) = tp.deliveries.values()
            counting = tp.writer
            assert isinstance(counting, _Counting)
            assert delivery.deliver(plan, _nothing) == (len(lines), 0)
            sent = counting.writes
            # delivered again, as a promotion repeated after a crash before the mark is
            assert delivery.deliver(plan, _nothing) == (len(lines), 0)
            if kind_of(target).transactional:
                assert counting.writes == sent, "a delivered epoch's record must skip it"
            result = tp.promoter.promote(lease, 0)
            assert (result.delivered, result.rejected) == (len(lines), 0)
        self.holds(target, case, expected(lines))
        report = resend(config, case.sink, guard=_FORCE)  # an operator's resend
        assert [e.epoch for e in report.resent] == [0]
        self.holds(target, case, expected(lines))

    def test_a_record_of_another_generation_is_inert(
        self, target: TargetConfig, case: Case
    ) -> None:
        if not kind_of(target).transactional:
            pytest.skip("a kind that overwrites keeps no record")
        first, second = case.lines(0, _POINTS), case.lines(1, _POINTS)
        writer = self.writer(target)
        assert isinstance(writer, EpochWriter)
        try:
            assert writer.begin(case.sink, 0, _NAME, generation=0) is None
            writer.write("\n".join(first).encode())
            writer.commit(len(first), 0)
            # epoch 0 of generation 1 (after a reset) is another epoch: sent
            assert writer.begin(case.sink, 0, _NAME, generation=1) is None
            writer.write("\n".join(second).encode())
            writer.commit(len(second), 0)
            # each generation's record found again: a re-send within it sends nothing
            assert writer.begin(case.sink, 0, _NAME, generation=0) == (len(first), 0)
            assert writer.begin(case.sink, 0, _NAME, generation=1) == (len(second), 0)
        finally:
            writer.close()
        self.holds(target, case, expected(first + second))

    def test_a_reset_sinks_next_query_is_delivered_whole(
        self, target: TargetConfig, staging: TwoPhaseConfig, case: Case
    ) -> None:
        """A sink reset (its query's checkpoint reset on purpose): the next query numbers
        its epochs from 0 again, and the target gets every one of them."""
        old, new = case.lines(0, _POINTS), case.lines(1, _POINTS)
        config = _config(staging, target)
        with TwoPhase.open(config) as tp:
            lease = tp.begin_run(case.sink, "r1", "q1")
            assert (
                tp.committer.commit(lease, 0, _stage(tp, case, old)).state == EpochState.COMMITTED
            )
        reset(config.staging, case.sink, guard=_FORCE)
        with TwoPhase.open(config) as tp:
            lease = tp.begin_run(case.sink, "r2", "q2")
            messages = _stage(tp, case, new, run="r2", query="q2")
            assert tp.committer.commit(lease, 0, messages).state == EpochState.COMMITTED
        self.holds(target, case, expected(old + new))

    def test_a_refused_point_is_bad_points_and_the_others_delivered(
        self, target: TargetConfig, case: Case
    ) -> None:
        good, more = case.lines(0, _POINTS), case.lines(1, _POINTS)
        refused = self.refused_line(case.measurement, case.base_ns + 3 * 1000 * 1_000_000)
        if refused is None:
            pytest.skip("the store refuses no point")
        mixed = [*more[:3], refused, *more[3:]]
        writer = self.writer(target)
        try:
            with _epoch(writer, target, case, 0, len(good)):
                writer.write("\n".join(good).encode())  # field v holds floats now
            with pytest.raises(BadPointsError) as caught, _epoch(writer, target, case, 1, 0):
                writer.write("\n".join(mixed).encode())
            assert caught.value.reason, "a refusal carries the store's reason"
            with _epoch(writer, target, case, 2, len(more)):
                rejects = BatchSender(writer, target).send(
                    "\n".join(mixed).encode(), len(mixed), lambda: mixed
                )
        finally:
            writer.close()
        assert [index for index, _ in rejects] == [3]
        assert all(reason for _, reason in rejects)
        self.holds(target, case, expected(good + more))

    def test_an_unreachable_target_is_retryable(self, target: TargetConfig, case: Case) -> None:
        with self.unavailable(target) as down:
            failure = _one_write(self, down, case)
        assert isinstance(failure, RetryableError), repr(failure)
        assert isinstance(failure, TargetUnavailableError | TransactionLostError), repr(failure)
        _no_secret(failure, target)

    def test_bad_credentials_are_an_auth_error(self, target: TargetConfig, case: Case) -> None:
        bad = self.bad_credentials(target)
        if bad is None:
            pytest.skip("the target has no credentials")
        failure = _one_write(self, bad, case)
        assert isinstance(failure, TargetAuthError), repr(failure)
        assert "conformance-wrong-secret" not in str(failure)
        _no_secret(failure, target)

    def test_a_target_caught_up_gets_the_epochs_in_order(
        self,
        target: TargetConfig,
        second_target: TargetConfig,
        staging: TwoPhaseConfig,
        case: Case,
    ) -> None:
        epochs = {e: [*case.lines(e, _POINTS), case.last(e)] for e in (0, 1)}
        with self.unavailable(target) as down:
            lagging = _sink(second_target, down)
            with TwoPhase.open(_config(staging, lagging)) as tp:
                lease = tp.begin_run(case.sink, "r1", "q1")
                for epoch, lines in epochs.items():
                    outcome = tp.committer.commit(lease, epoch, _stage(tp, case, lines, epoch))
                    assert outcome.state == EpochState.COMMITTED
        back = _config(staging, _sink(second_target, target))
        report = recover(back, case.sink, guard=_FORCE)
        assert [(c.target, c.epoch) for c in report.caught_up] == [(_NAME, 0), (_NAME, 1)]
        assert report.still_behind == ()
        if self.keeps_last_write:
            self.holds(target, case, expected(epochs[0] + epochs[1]))  # "last": epoch 1's
            return
        # A store that keeps one of a point's values, not the last: every other point,
        # and the rewritten one once, with one of the epochs' values.
        others = expected(epochs[0][:-1] + epochs[1][:-1])
        rewritten = [h for h in self.held(target, case) if h not in others]
        assert rewritten in ([h] for e in (0, 1) for h in expected([case.last(e)])), rewritten
        self.holds(target, case, sorted([*others, *rewritten], key=repr))

    @pytest.mark.parametrize("point", _CRASH_POINTS)
    def test_a_delivery_killed_then_recovered_holds_the_epoch_once(
        self,
        point: str,
        target: TargetConfig,
        staging: TwoPhaseConfig,
        case: Case,
        tmp_path: Path,
    ) -> None:
        transactional = kind_of(target).transactional
        if point in _TRANSACTIONAL_ONLY and not transactional:
            pytest.skip("a kind that overwrites commits no transaction")
        lines = case.lines(0, _POINTS)
        config = _config(staging, dataclasses.replace(target, batch_points=_BATCH))
        job = crash.CrashJob(config, case.sink, 0, (tuple(lines[:5]), tuple(lines[5:])))
        done = crash.run(job, point, tmp_path, self.child_env())
        assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
        if transactional:  # all or nothing: the transaction commits whole or not at all
            committed = point == "after_target_commit"
            self.holds(target, case, expected(lines) if committed else [])
        else:
            assert self.held(target, case), "killed after a request was taken: some held"
        report = recover(config, case.sink, guard=_FORCE)
        assert [r.epoch for r in report.recovered] == [0]
        self.holds(target, case, expected(lines))


# --- the checks' parts ----------------------------------------------------------------------


def _nothing() -> None:
    """A delivery's check before each request: nothing to stop it."""


class _Counting:
    """A target's writer that counts the bodies it sends (an ``EpochWriter``'s steps
    passed on as they are)."""

    def __init__(self, inner: TargetWriter) -> None:
        self.inner = inner
        self.writes = 0

    def write(self, body: bytes, gzipped: bool = False) -> None:
        self.writes += 1
        self.inner.write(body, gzipped)

    def begin(
        self, sink_id: str, epoch: int, target: str, again: bool = False, *, generation: int = 0
    ) -> tuple[int, int] | None:
        assert isinstance(self.inner, EpochWriter)
        return self.inner.begin(sink_id, epoch, target, again, generation=generation)

    def commit(self, delivered: int, rejected: int) -> None:
        assert isinstance(self.inner, EpochWriter)
        self.inner.commit(delivered, rejected)

    def rollback(self) -> None:
        assert isinstance(self.inner, EpochWriter)
        self.inner.rollback()

    def close(self) -> None:
        self.inner.close()


def _config(staging: TwoPhaseConfig, target: TargetConfig) -> TwoPhaseConfig:
    return dataclasses.replace(staging, target=target)


def _sink(first: TargetConfig, target: TargetConfig) -> TargetConfig:
    """A sink of two targets: ``first`` (named ``other``), then the target under test
    (named ``conformance``); one is enough to commit, and a round waits a second."""
    targets = (NamedTarget("other", first), NamedTarget(_NAME, target))
    return dataclasses.replace(first, targets=targets, min_targets=1, target_deadline_s=1)


def _stage(
    tp: TwoPhase,
    case: Case,
    lines: Sequence[str],
    epoch: int = 0,
    *,
    run: str = "r1",
    query: str = "q1",
) -> list[CommitMessage]:
    """The epoch's lines staged by two tasks of ``run`` of ``query``."""
    middle = len(lines) // 2
    return [
        tp.stager.stage(case.sink, epoch, list(part), partition_id=n, run_id=run, query_id=query)
        for n, part in enumerate((lines[:middle], lines[middle:]))
    ]


def _in_two_epochs(writer: EpochWriter, case: Case, body: bytes, points: int) -> None:
    """The same body in the transactions of two epochs; the first's record found again."""
    for epoch in (0, 1):
        assert writer.begin(case.sink, epoch, _NAME) is None
        writer.write(body)
        writer.commit(points, 0)
    found = writer.begin(case.sink, 0, _NAME)
    assert found == (points, 0), f"the first epoch's record not found again: {found}"


@contextlib.contextmanager
def _epoch(
    writer: TargetWriter, target: TargetConfig, case: Case, epoch: int, points: int
) -> Iterator[None]:
    """The writes inside: for a transactional kind, an epoch's transaction committed
    (rolled back on a failure); for an overwriting kind, as they are."""
    if not (isinstance(writer, EpochWriter) and kind_of(target).transactional):
        yield
        return
    assert writer.begin(case.sink, epoch, _NAME) is None
    try:
        yield
    except BaseException:
        writer.rollback()
        raise
    writer.commit(points, 0)


def _one_write(kit: TargetConformance, config: TargetConfig, case: Case) -> TwoPhaseError:
    """The failure of one body written to ``config`` (in an epoch's transaction for a
    transactional kind); AssertionError when it is taken."""
    body = "\n".join(case.lines(0, 2)).encode()
    try:
        writer = kit.writer(config)
        try:
            with _epoch(writer, config, case, 0, 2):
                writer.write(body)
        finally:
            writer.close()
    except TwoPhaseError as exc:
        return exc
    raise AssertionError(f"the write to {config.url} was taken")


def _no_secret(failure: Exception, config: TargetConfig) -> None:
    """No password or token of the target in the failure's message (one that is also
    the user's name cannot be told from it, and is not looked for)."""
    url = urlsplit(config.url)
    secrets = [s.reveal() for s in (config.password, config.influxdb.token) if s is not None]
    secrets += [p for p in [url.password] if p]
    users = {config.username, url.username}
    found = [s for s in secrets if s not in users and s in str(failure)]
    assert not found, "a secret in an error message"
