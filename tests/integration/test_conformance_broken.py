"""The conformance kit fails kinds that break what it checks: the example SQLite kind
(``examples/sqlite-target``, a kind that overwrites) and the PostgreSQL kind (a
transactional one), each broken one way, against their real stores. Each broken kind
fails the kit's checks of what it breaks, and the sound kind passes the same checks.

* ``tags_ignored``: a point's key is its measurement and time, its tags left out (a
  point overwrites one of another tag set at its time);
* ``keep_first``: a point written again keeps the value written first;
* ``swallowed_refusal``: a request the store refuses is reported taken (its refused
  point, and the others of its body, said to be delivered);
* ``lost_record``: a transactional kind that never finds the record of an epoch it
  delivered (each delivery writes the epoch again).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import inspect
import json
import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support import postgresql_target, sqlite_example
from twophase.config import TargetConfig, TwoPhaseConfig, load_staging_config
from twophase.errors import BadPointsError
from twophase.points.lineproto import parse_line
from twophase.postgresql import KIND as POSTGRESQL
from twophase.postgresql.writer import PostgresWriter
from twophase.targets import TargetKind, kinds
from twophase.testing import TargetConformance
from twophase.testing.support import Case

EXAMPLE = sqlite_example()
_SCHEMA, SqliteWriter, _connected, SQLITE = (
    EXAMPLE._SCHEMA,
    EXAMPLE.SqliteWriter,
    EXAMPLE._connected,
    EXAMPLE.KIND,
)


def _path(config: TargetConfig) -> str:
    return urlsplit(config.url).path


Key = tuple[str, str, int | None]  # measurement, tags as the SQLite kind stores them, time


def _points(body: bytes, gzipped: bool) -> list[tuple[str, Key]]:
    """A body's lines, each with its point's key."""
    text = (gzip.decompress(body) if gzipped else body).decode()
    lines = [line for line in text.split("\n") if line.strip()]
    points = [parse_line(line) for line in lines]
    keys = [(p.measurement, json.dumps(p.tags), p.time_ns) for p in points]
    return list(zip(lines, keys, strict=True))


class TagsIgnored(SqliteWriter):
    """Keys points by measurement and time: a point replaces any of its time, in its
    body or held."""

    def write(self, body: bytes, gzipped: bool = False) -> None:
        points = _points(body, gzipped)
        last = {(key[0], key[2]): line for line, key in points}
        with _file(self) as conn:
            for measurement, time in last:
                conn.execute(
                    "DELETE FROM points WHERE measurement = ? AND time = ?", (measurement, time)
                )
        super().write("\n".join(last.values()).encode())


class KeepFirst(SqliteWriter):
    """A point already held is left as it is: the first write wins."""

    def write(self, body: bytes, gzipped: bool = False) -> None:
        with _file(self) as conn:
            found = "SELECT 1 FROM points WHERE measurement = ? AND tags = ? AND time = ?"
            points = _points(body, gzipped)
            lines = [line for line, key in points if not conn.execute(found, key).fetchone()]
        if lines:
            super().write("\n".join(lines).encode())


class SwallowedRefusal(SqliteWriter):
    """A refused request reported taken."""

    def write(self, body: bytes, gzipped: bool = False) -> None:
        with contextlib.suppress(BadPointsError):
            super().write(body, gzipped)


class LostRecord(PostgresWriter):
    """Never finds an epoch's record: every delivery of an epoch writes it again."""

    def begin(
        self, sink_id: str, epoch: int, target: str, again: bool = False, *, generation: int = 0
    ) -> tuple[int, int] | None:
        return super().begin(sink_id, epoch, target, again=True, generation=generation)


@contextlib.contextmanager
def _file(writer: SqliteWriter) -> Iterator[sqlite3.Connection]:
    """The SQLite kind's file, its tables made, opened for a broken writer's own step
    (its failures classified as the kind's are: a locked file may free up)."""
    with _connected(writer._config) as conn:
        for statement in _SCHEMA:
            conn.execute(statement)
        yield conn


BROKEN: dict[str, tuple[TargetKind, type]] = {
    "tags_ignored": (SQLITE, TagsIgnored),
    "keep_first": (SQLITE, KeepFirst),
    "swallowed_refusal": (SQLITE, SwallowedRefusal),
    "lost_record": (POSTGRESQL, LostRecord),
}
# The kit's checks each broken kind must fail, and what each says.
FAILS = {
    "tags_ignored": {"test_points_differing_in_tags_only_are_each_held": "missing: "},
    "keep_first": {"test_a_target_caught_up_gets_the_epochs_in_order": "not expected: "},
    "swallowed_refusal": {
        "test_a_refused_point_is_bad_points_and_the_others_delivered": "DID NOT RAISE"
    },
    "lost_record": {
        "test_a_resent_body_changes_nothing": "the first epoch's record not found again",
        "test_a_resent_epoch_is_held_once": "a delivered epoch's record must skip it",
    },
}
# What a failed check raises: an assert, or pytest.raises that saw nothing raised.
FAILED = (AssertionError, pytest.fail.Exception)


class _Kit(TargetConformance):
    """The kit's checks, called directly (not collected: no ``Test`` prefix)."""

    @contextlib.contextmanager
    def unavailable(self, config: TargetConfig) -> Iterator[TargetConfig]:
        """A SQLite file locked by another connection (as the SQLite kind's own tests
        make it unavailable); a server's port nothing listens on."""
        if urlsplit(config.url).scheme != "sqlite":
            with super().unavailable(config) as down:
                yield down
            return
        holder = sqlite3.connect(_path(config), isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            yield dataclasses.replace(
                config, timeout_s=0.2, retry_deadline_s=1, retry_initial_s=0.05, retry_max_s=0.2
            )
        finally:
            holder.execute("ROLLBACK")
            holder.close()


@pytest.fixture
def kit_staging(staging_url: str) -> TwoPhaseConfig:
    """The checks' staging store: the test's own database."""
    staging = load_staging_config(env={}, staging_url=staging_url)
    return TwoPhaseConfig(staging, TargetConfig(url="http://unused.invalid"))


@pytest.fixture
def empty(base_staging_url: str, tmp_path: Path) -> Iterator[Callable[[TargetKind], Targets]]:
    """Empty targets of a kind's store, the target and the catch-up's other one (SQLite
    files; a PostgreSQL database, dropped afterwards), the kind named in their settings."""
    with contextlib.ExitStack() as stack:

        def made(kind: TargetKind) -> Targets:
            if kind.transactional:  # one database: no check below of it takes a second
                only = stack.enter_context(postgresql_target(base_staging_url, "tp_broken"))[0]
                pair = [only, only]
            else:
                fast = {"retry_deadline_s": 5, "retry_initial_s": 0.05, "retry_max_s": 0.5}
                pair = [
                    TargetConfig(url=f"sqlite://{tmp_path / name}", **fast)  # type: ignore[arg-type]
                    for name in ("points.db", "other.db")
                ]
            first, second = (dataclasses.replace(c, kind=kind.name) for c in pair)
            return first, second

        yield made


Targets = tuple[TargetConfig, TargetConfig]


def _run(check: str, targets: Targets, staging: TwoPhaseConfig) -> None:
    """The kit's ``check`` against ``targets`` (the target, the catch-up's other)."""
    given: dict[str, Any] = {
        "target": targets[0],
        "second_target": targets[1],
        "staging": staging,
        "case": Case.new(),
    }
    method = getattr(_Kit(), check)
    method(**{name: given[name] for name in inspect.signature(method).parameters})


CASES = [
    pytest.param(broken, check, id=f"{broken}-{check}")
    for broken, checks in FAILS.items()
    for check in checks
]


def test_the_checks_named_are_the_kits() -> None:
    checks = {name for name in dir(TargetConformance) if name.startswith("test_")}
    assert {c for each in FAILS.values() for c in each} <= checks


@pytest.mark.parametrize(("broken", "check"), CASES)
def test_a_broken_kind_fails_the_check_of_what_it_breaks(
    broken: str,
    check: str,
    empty: Callable[[TargetKind], Targets],
    kit_staging: TwoPhaseConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sound, writer = BROKEN[broken]
    kind = dataclasses.replace(sound, name=f"broken-{broken}", schemes=(), writer=writer)
    monkeypatch.setitem(kinds(), kind.name, kind)  # found by its name (target_kind)
    with pytest.raises(FAILED, match=re.escape(FAILS[broken][check])):
        _run(check, empty(kind), kit_staging)


# The sound kinds pass every check in the default run (test_conformance_sqlite.py,
# test_conformance_postgresql.py); here, through the same registration as the broken
# ones, with --full.
@pytest.mark.full
@pytest.mark.parametrize(("broken", "check"), CASES)
def test_the_sound_kind_passes_the_same_check(
    broken: str,
    check: str,
    empty: Callable[[TargetKind], Targets],
    kit_staging: TwoPhaseConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sound, _ = BROKEN[broken]
    kind = dataclasses.replace(sound, name=f"sound-{sound.name}", schemes=())
    monkeypatch.setitem(kinds(), kind.name, kind)
    _run(check, empty(kind), kit_staging)
