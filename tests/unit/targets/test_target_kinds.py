"""Kinds of target: the registry, and a transactional kind's epoch in one transaction
(pure logic, a fake store)."""

from __future__ import annotations

import pytest

from tests.fakes import FakeClock, FakeInflux, make_sender, staged
from twophase.config import TargetConfig, load_target_config
from twophase.errors import ConfigError, TargetUnavailableError, TransactionLostError
from twophase.protocol.deliver.delivery import TargetDelivery
from twophase.targets import OVERWRITE, TRANSACTION, EpochWriter, TargetKind, kind_of, kinds

pytestmark = pytest.mark.unit


class FakeStore(FakeInflux):
    """A transactional store: bodies held in an open transaction, visible at commit;
    a record per (sink, target, generation, epoch). ``lose`` makes the write of that
    number (over the store's life) lose the transaction."""

    def __init__(self, clock: FakeClock, lose: tuple[int, ...] = ()) -> None:
        super().__init__(clock)
        self.lose, self.writes, self.commits = lose, 0, 0
        self.records: dict[tuple[str, str, int, int], tuple[int, int]] = {}
        self.visible: list[str] = []
        self._open: tuple[str, str, int, int] | None = None
        self._held: list[str] = []

    def begin(
        self, sink_id: str, epoch: int, target: str, again: bool = False, *, generation: int = 0
    ) -> tuple[int, int] | None:
        key = (sink_id, target, generation, epoch)
        if key in self.records and not again:
            return self.records[key]
        self._open, self._held = key, []
        return None

    def write(self, body: bytes, gzipped: bool = False) -> None:
        assert self._open is not None, "a body outside the transaction"
        self.writes += 1
        if self.writes in self.lose:
            self._open = None
            raise TransactionLostError("connection lost")
        before = dict(self.stored)
        super().write(body, gzipped)
        self._held += [line for line in self.stored if self.stored[line] > before.get(line, 0)]

    def commit(self, delivered: int, rejected: int) -> None:
        assert self._open is not None
        self.records[self._open] = (delivered, rejected)
        self.visible += self._held
        self.commits += 1
        self._open = None

    def rollback(self) -> None:
        self._open, self._held = None, []


def delivery(
    store: FakeStore, clock: FakeClock, points: int = 4, generations: dict[str, int] | None = None
) -> TargetDelivery:
    """A delivery to ``store`` named ``pg``; ``generations``: the sinks' generations on
    it, as the staging store would give them (0 for a sink not in it)."""
    sender = make_sender(store, clock).sender
    given = {} if generations is None else generations
    config = TargetConfig(url="postgresql://h/db", batch_points=points)
    reader_and_letters = staged([[f"m,k=a v={i}i {i}" for i in range(10)]], 3)[1]
    return TargetDelivery(
        "pg",
        reader_and_letters,  # type: ignore[arg-type]
        (sender, sender),
        reader_and_letters,  # type: ignore[arg-type]
        config,
        lanes=4,
        epochs=store,
        generation=lambda sink_id, target: given.get(sink_id, 0),
    )


def test_an_epoch_commits_once_with_its_record_and_a_repeat_sends_nothing() -> None:
    clock = FakeClock()
    store = FakeStore(clock)
    plan, _ = staged([[f"m,k=a v={i}i {i}" for i in range(10)]], 3)
    target = delivery(store, clock)
    assert target.deliver(plan, lambda: None) == (10, 0)
    assert (len(store.visible), store.commits, store.writes) == (10, 1, 3)
    assert target.deliver(plan, lambda: None) == (10, 0)  # the record's counts
    assert (store.commits, store.writes) == (1, 3)


def test_a_record_of_an_older_generation_sends_the_epoch_a_repeat_in_its_own_does_not() -> None:
    clock = FakeClock()
    store = FakeStore(clock)
    plan, _ = staged([[f"m,k=a v={i}i {i}" for i in range(10)]], 3)
    generations = {plan.sink_id: 0}
    target = delivery(store, clock, generations=generations)
    assert target.deliver(plan, lambda: None) == (10, 0)
    generations[plan.sink_id] = 1  # a reset: the next query's epoch 0 is another epoch
    assert target.deliver(plan, lambda: None) == (10, 0)
    assert (store.commits, store.writes) == (2, 6)
    assert target.deliver(plan, lambda: None) == (10, 0)  # a re-send in generation 1
    assert (store.commits, store.writes) == (2, 6)
    assert set(store.records) == {(plan.sink_id, "pg", g, plan.epoch) for g in (0, 1)}


def test_a_transactional_delivery_needs_the_generation() -> None:
    clock = FakeClock()
    sender = make_sender(FakeStore(clock), clock).sender
    with pytest.raises(ValueError, match="needs the generation"):
        TargetDelivery(
            "pg",
            None,  # type: ignore[arg-type]
            (sender, sender),
            None,  # type: ignore[arg-type]
            TargetConfig(url="postgresql://h/db"),
            epochs=FakeStore(clock),
        )


def test_a_lost_transaction_starts_the_epoch_over_whole() -> None:
    clock = FakeClock()
    store = FakeStore(clock, lose=(2,))
    plan, _ = staged([[f"m,k=a v={i}i {i}" for i in range(10)]], 3)
    assert delivery(store, clock).deliver(plan, lambda: None) == (10, 0)
    # the first transaction's first body was never committed; the second sent all three
    assert (store.commits, store.writes, sorted(store.visible)) == (
        1,
        2 + 3,
        sorted({f"m,k=a v={i}i {i}" for i in range(10)}),
    )
    assert clock.now > 0  # waited before starting over


def test_a_transaction_lost_past_the_deadline_gives_up_committing_nothing() -> None:
    clock = FakeClock()
    store = FakeStore(clock, lose=tuple(range(1, 10_000)))
    plan, _ = staged([[f"m,k=a v={i}i {i}" for i in range(10)]], 3)
    with pytest.raises(TargetUnavailableError, match="still unavailable"):
        delivery(store, clock).deliver(plan, lambda: None)
    assert store.commits == 0 and store.visible == []


def test_an_operators_resend_sends_the_epoch_again_despite_its_record() -> None:
    clock = FakeClock()
    store = FakeStore(clock)
    plan, _ = staged([[f"m,k=a v={i}i {i}" for i in range(10)]], 3)
    target = delivery(store, clock)
    target.deliver(plan, lambda: None)
    assert target.send(plan) == (10, 0)
    assert store.commits == 2


def test_a_fenced_run_commits_nothing_on_the_target() -> None:
    clock = FakeClock()
    store = FakeStore(clock)
    plan, _ = staged([[f"m,k=a v={i}i {i}" for i in range(10)]], 3)
    checks = []

    def check() -> None:
        checks.append(1)
        if len(checks) > 3:  # fenced while the bodies were sent
            raise RuntimeError("fenced")

    with pytest.raises(RuntimeError, match="fenced"):
        delivery(store, clock).deliver(plan, check)
    assert store.commits == 0 and store.visible == []


def test_kinds_are_told_by_scheme_or_by_name() -> None:
    assert kind_of(TargetConfig(url="https://h:8086")).name == "influxdb"
    assert kind_of(TargetConfig(url="http://h:8086", kind="influxdb")).resend == OVERWRITE
    assert "influxdb" in kinds()
    with pytest.raises(ConfigError, match=r"TWOPHASE_TARGET_KIND.*no kind of target takes ftp"):
        kind_of(TargetConfig(url="ftp://h"))
    with pytest.raises(ConfigError, match=r"TWOPHASE_TARGET_KIND.*'nosuch' is not a kind"):
        kind_of(TargetConfig(url="http://h", kind="nosuch"))


def test_a_kind_declares_what_a_resent_epoch_does() -> None:
    def never(config: TargetConfig) -> None:
        raise AssertionError

    kind = TargetKind("t", ("t",), TRANSACTION, never, never)  # type: ignore[arg-type]
    assert kind.transactional and not kind.lanes
    with pytest.raises(ValueError, match="resend must be"):
        TargetKind("t", ("t",), "sometimes", never, never)  # type: ignore[arg-type]
    assert isinstance(FakeStore(FakeClock()), EpochWriter)


def test_a_postgresql_target_needs_no_influxdb_settings() -> None:
    config = load_target_config(
        {"TWOPHASE_TARGET_URL": "postgresql://u@h/db", "TWOPHASE_INFLUX_API": "v1"}
    )
    assert not config.is_influx and kind_of(config).name == "postgresql"


def test_targets_of_two_kinds_are_told_apart_by_their_urls() -> None:
    config = load_target_config(
        {
            "TWOPHASE_TARGETS": "influx=http://h:8086,pg=postgresql://u@h:5432/metrics",
            "TWOPHASE_INFLUX_API": "v1",
            "TWOPHASE_INFLUX_DB": "m",
            "TWOPHASE_TARGET_PG_TARGET_CREATE_TABLES": "true",
        }
    )
    influx, pg = config.named_targets()
    assert (kind_of(influx.config).name, kind_of(pg.config).name) == ("influxdb", "postgresql")
    assert pg.config.postgresql.create_tables and not influx.config.postgresql.create_tables
    with pytest.raises(ConfigError, match=r"TWOPHASE_TARGET_URL.*must not hold a password"):
        load_target_config({"TWOPHASE_TARGET_URL": "postgresql://u:secret@h/db"})


def test_an_epoch_without_points_opens_no_transaction() -> None:
    clock = FakeClock()
    store = FakeStore(clock)
    plan, _ = staged([[]], 3)
    assert delivery(store, clock).deliver(plan, lambda: None) == (0, 0)
    assert store.commits == 0 and store.records == {}


def test_two_postgresql_targets_may_not_share_a_schema_of_one_database() -> None:
    env = {"TWOPHASE_TARGETS": "p=postgresql://u@h:5432/m,q=postgresql://v@h/m"}
    with pytest.raises(ConfigError, match=r"'p' and 'q' write to the same server and schema"):
        load_target_config(env)
    apart = load_target_config({**env, "TWOPHASE_TARGET_Q_TARGET_SCHEMA": "other"})
    assert [t.config.postgresql.schema for t in apart.named_targets()] == ["public", "other"]
    assert load_target_config({"TWOPHASE_TARGETS": "p=postgresql://u@h/m,q=postgresql://u@h/n"})


class OlderContract(FakeStore):
    """An EpochWriter of the contract before generations: its begin takes none."""

    def begin(  # type: ignore[override]
        self, sink_id: str, epoch: int, target: str, again: bool = False
    ) -> tuple[int, int] | None:
        return super().begin(sink_id, epoch, target, again)


def test_a_transactional_writer_whose_begin_takes_no_generation_is_refused_at_the_start() -> None:
    from twophase.protocol.commit.runtime import _epochs

    target = TargetConfig(url="postgresql://h/db")
    with pytest.raises(TypeError, match="must take the keyword `generation`"):
        _epochs(target, OlderContract(FakeClock()))
    assert _epochs(target, FakeStore(FakeClock())) is not None
