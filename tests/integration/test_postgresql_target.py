"""The PostgreSQL target kind against a real PostgreSQL: tables created or checked, rows
upserted, an epoch committed once with its record, refusals, lost connections, readers
that never see half an epoch, read-back, gzip bodies and hostile names.

Every test writes to a database of its own (``twophase_target_*``), dropped after.
"""

from __future__ import annotations

import dataclasses
import gzip
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.integration.fanout_helpers import target_rows
from tests.staging import M, lines, stage
from tests.support import (
    admin_conninfo,
    create_database,
    drop_database,
    influx_rows,
    target_config,
    two_phase,
    unique,
)
from twophase.config import NamedTarget, Secret, StagingConfig, TargetConfig, TwoPhaseConfig
from twophase.config.urls import DbUrl
from twophase.errors import (
    BadPointsError,
    ConfigError,
    EpochStartOverError,
    TargetAuthError,
    TargetNotFoundError,
    TargetRequestError,
    TransactionLostError,
    TransientWriteError,
)
from twophase.model import EpochState
from twophase.operations.verify import verify
from twophase.postgresql import KIND, PostgresReadback, PostgresWriter, connect, record_ddl
from twophase.postgresql.connect import APPLICATION_NAME
from twophase.protocol.commit.runtime import TwoPhase
from twophase.targets.sender import BatchSender


@dataclasses.dataclass(frozen=True)
class Target:
    """A target database: its admin connection string and a config builder."""

    name: str
    admin: str  # a connection string with the password, for the test's own reads
    url: str  # the target's URL as a user writes it: no password
    password: str

    def config(self, **settings: Any) -> TargetConfig:
        return target_config(self.url, password=Secret(self.password), timeout_s=5.0, **settings)

    def writer(self, **settings: Any) -> PostgresWriter:
        return PostgresWriter(self.config(**settings))

    def sql(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def count(self, table: str) -> int:
        return int(self.sql(f'SELECT count(*) FROM "{table}"')[0][0])  # noqa: S608 test's own name


@pytest.fixture
def target(base_staging_url: str) -> Iterator[Target]:
    name = unique("twophase_target")
    create_database(base_staging_url, name)
    base = DbUrl.parse(base_staging_url)
    assert base.password is not None
    url = f"postgresql://{base.user}@{base.hosts}/{name}"
    try:
        yield Target(name, admin_conninfo(base_staging_url, name), url, base.password)
    finally:
        drop_database(base_staging_url, name)


CPU = (
    b'cpu,host=a,region=eu usage=1.5,count=3i,up=true,note="x" 1000000000\n'
    b"cpu,host=b usage=2.5 1000000000\n"
    b"cpu,host=a,region=eu usage=3.5 2000000000\n"
)


def _epoch(writer: PostgresWriter, epoch: int, *bodies: bytes, sink: str = "s") -> bool:
    """One epoch of ``bodies`` committed (its counts: a point a line); False when the
    target's record holds it already."""
    if writer.begin(sink, epoch, "t") is not None:
        return False
    for body in bodies:
        writer.write(body)
    writer.commit(sum(len(body.splitlines()) for body in bodies), 0)
    return True


def _rows(target: Target, table: str, columns: str = "*") -> list[tuple[Any, ...]]:
    order = "1, 2, 3" if columns == "*" else columns
    return target.sql(f'SELECT {columns} FROM "{table}" ORDER BY {order}')  # noqa: S608


# --- tables created or checked -------------------------------------------------------


def test_a_missing_table_is_created_from_the_first_points(target: Target) -> None:
    writer = target.writer(create_tables=True)
    try:
        assert _epoch(writer, 1, CPU)
    finally:
        writer.close()
    columns = dict(
        target.sql(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'cpu'"
        )
    )
    assert columns == {
        "time": "timestamp with time zone",
        "host": "text",
        "region": "text",
        "usage": "double precision",
        "count": "bigint",
        "up": "boolean",
        "note": "text",
    }
    key = target.sql(
        "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'cpu'::regclass "
        "AND indisunique"
    )
    assert [row[0].split("(")[-1] for row in key] == ['"time", host, region)']
    rows = _rows(target, "cpu", "host, region, usage, count, up, note")
    assert rows == [
        ("a", "eu", 1.5, 3, True, "x"),
        ("a", "eu", 3.5, None, None, None),
        ("b", "", 2.5, None, None, None),
    ]


def test_a_later_field_gets_its_column_and_a_new_tag_is_refused(target: Target) -> None:
    writer = target.writer(create_tables=True)
    try:
        assert _epoch(writer, 1, b"m,host=a v=1 1000")
        assert _epoch(writer, 2, b"m,host=a w=2i 2000")
        assert writer.begin("s", 3, "t") is None
        with pytest.raises(BadPointsError) as refused:
            writer.write(b"m,host=a v=3 3000\nm,host=a,zone=z v=4 4000")
        writer.rollback()
    finally:
        writer.close()
    assert refused.value.line == 1
    assert "tag 'zone'" in refused.value.reason and '"public"."m"' in refused.value.reason
    assert _rows(target, "m", "host, v, w") == [("a", 1.0, None), ("a", None, 2)]


@pytest.mark.parametrize(
    ("ddl", "named"),
    [
        ("CREATE TABLE m (time timestamptz, host integer, v float8, UNIQUE (time, host))", "host"),
        ("CREATE TABLE m (time timestamp, host text, v float8, UNIQUE (time, host))", "time"),
        ("CREATE TABLE m (time timestamptz, host text, v float8)", "no unique key"),
    ],
)
def test_a_table_that_cannot_take_the_points_is_refused_naming_the_column(
    target: Target, ddl: str, named: str
) -> None:
    target.sql(ddl)
    writer = target.writer()
    try:
        assert writer.begin("s", 1, "t") is None
        with pytest.raises(TargetRequestError) as refused:
            writer.write(b"m,host=a v=1 1000")
        writer.rollback()  # safe: the failure ended the epoch already
    finally:
        writer.close()
    assert '"public"."m"' in str(refused.value) and named in str(refused.value)
    assert not isinstance(refused.value, BadPointsError)
    assert target.count("twophase_delivered") == 0


@pytest.mark.parametrize("kind", ["char(8)", "bpchar"])
def test_a_character_n_tag_column_is_refused_naming_the_table_and_the_column(
    target: Target, kind: str
) -> None:
    """character(n) pads its values and compares them without their trailing spaces:
    tags 'a' and 'a ' would be one key, and the upsert holding both would fail
    (cardinality_violation) every time it is sent."""
    target.sql(
        f"CREATE TABLE m (time timestamptz NOT NULL, host {kind} NOT NULL DEFAULT '', "
        "v float8, UNIQUE (time, host))"
    )
    writer = target.writer()
    try:
        assert writer.begin("s", 1, "t") is None
        with pytest.raises(ConfigError) as refused:
            writer.write(b"m,host=a v=1 1000\nm,host=a\\  v=2 1000")  # tags 'a' and 'a '
        assert writer.begin("s", 1, "t") is None  # the refusal ended the epoch
        writer.rollback()
    finally:
        writer.close()
    assert refused.value.option == '"public"."m"'
    assert "tag column 'host'" in str(refused.value) and "text or varchar" in str(refused.value)
    assert target.count("m") == 0 and target.count("twophase_delivered") == 0


def test_without_create_tables_a_missing_table_is_a_request_error(target: Target) -> None:
    writer = target.writer()
    try:
        with pytest.raises(TargetRequestError, match=r'"public"\."nope" does not exist'):
            writer.write(b"nope v=1 1000")
    finally:
        writer.close()


def test_a_field_without_a_column_or_of_another_type_is_refused_with_the_reason(
    target: Target,
) -> None:
    target.sql(
        "CREATE TABLE m (time timestamptz NOT NULL, host text NOT NULL DEFAULT '', "
        "v float8, n bigint, UNIQUE (time, host))"
    )
    writer = target.writer()
    try:
        for body, line, reason in [
            (b"m,host=a v=1 1000\nm,host=a w=1 2000", 1, "field 'w' has no column"),
            (b'm,host=a n="text" 1000', 0, "field 'n' is a string, its column is bigint"),
            (b"m,host=a n=1.5 1000", 0, "field 'n' is a float, its column is bigint"),
            (b"m v=1", 0, "no timestamp"),
            (b"m,host=a v=1 1000\nnot line protocol", 1, "not a line of line protocol"),
        ]:
            with pytest.raises(BadPointsError) as refused:
                writer.write(body)
            assert refused.value.line == line and reason in refused.value.reason, body
    finally:
        writer.close()
    assert target.count("m") == 0  # a refused body writes nothing of itself


# --- upserts, re-sent bodies and epochs -------------------------------------------------


def test_a_point_written_again_wins_field_by_field(target: Target) -> None:
    writer = target.writer(create_tables=True)
    try:
        assert _epoch(writer, 1, b"m,host=a v=1,w=10 1000000")
        assert _epoch(writer, 2, b"m,host=a v=2 1000000\nm,host=a v=3 1000000")
    finally:
        writer.close()
    assert _rows(target, "m", "host, v, w") == [("a", 3.0, 10.0)]


def test_a_body_sent_again_changes_nothing(target: Target) -> None:
    writer = target.writer(create_tables=True)
    try:
        writer.write(CPU)
        first = _rows(target, "cpu")
        writer.write(CPU)
        writer.write(gzip.compress(CPU), gzipped=True)
    finally:
        writer.close()
    assert _rows(target, "cpu") == first and len(first) == 3


def test_an_epoch_sent_again_is_skipped_by_its_record(target: Target) -> None:
    writer = target.writer(create_tables=True)
    other = target.writer(create_tables=True)
    try:
        assert _epoch(writer, 7, b"m v=1 1000\nm v=2 2000")
        assert other.begin("s", 7, "t") == (2, 0)  # another writer: the record has it
        assert writer.begin("s", 7, "t") == (2, 0)
        assert _epoch(writer, 7, b"m v=1 1000", sink="another sink")
        assert writer.begin("s", 7, "t", again=True) is None  # an operator's resend
        writer.write(b"m v=3 1000")
        writer.commit(1, 1)
    finally:
        writer.close()
        other.close()
    assert target.sql(
        "SELECT sink_id, target, epoch, delivered, rejected FROM twophase_delivered ORDER BY 1"
    ) == [("another sink", "t", 7, 1, 0), ("s", "t", 7, 1, 1)]
    assert _rows(target, "m", "v") == [(2.0,), (3.0,)]


def test_a_rolled_back_epoch_leaves_no_trace_and_can_be_sent_again(target: Target) -> None:
    writer = target.writer(create_tables=True)
    try:
        assert writer.begin("s", 1, "t") is None
        writer.write(b"m v=1 1000")
        writer.rollback()
        writer.rollback()  # none open: nothing happens
        assert target.count("m") == 0  # the table stays (made on its own), without the rows
        assert _epoch(writer, 1, b"m v=2 1000")
    finally:
        writer.close()
    assert _rows(target, "m", "v") == [(2.0,)]


def test_refused_rows_become_dead_letters_with_postgresqls_reason(target: Target) -> None:
    """Through the real sender: PostgreSQL refuses a row (a CHECK constraint), the
    writer refuses a line (no column for its field); the other rows of the body commit."""
    target.sql(
        "CREATE TABLE m (time timestamptz NOT NULL, host text NOT NULL DEFAULT '', "
        "v float8 CHECK (v < 100), UNIQUE (time, host))"
    )
    config = target.config()
    writer = PostgresWriter(config)
    lines = [f"m,host=h{i} v={i} {1000 * (i + 1)}" for i in range(10)]
    lines[3] = "m,host=h3 v=500 4000"  # PostgreSQL's CHECK refuses it
    lines[7] = "m,host=h7 nope=1 8000"  # no such column
    try:
        assert writer.begin("s", 1, "t") is None
        rejects = BatchSender(writer, config, sleep=lambda s: None).send(
            "\n".join(lines).encode(), len(lines), lambda: lines
        )
        writer.commit(8, 2)
    finally:
        writer.close()
    assert [index for index, _ in rejects] == [3, 7]
    assert "PostgreSQL" in rejects[0][1] and "check constraint" in rejects[0][1]
    assert "field 'nope' has no column" in rejects[1][1]
    assert target.count("m") == 8


def test_a_value_out_of_the_columns_range_is_refused(target: Target) -> None:
    target.sql(
        "CREATE TABLE m (time timestamptz NOT NULL, n integer, u numeric(20,0), UNIQUE (time))"
    )
    writer = target.writer()
    try:
        with pytest.raises(BadPointsError, match="out of integer's range"):
            writer.write(b"m n=3000000000i 1000")
        writer.write(b"m u=18446744073709551615u 1000")  # numeric(20,0) holds any uint64
    finally:
        writer.close()
    assert target.sql("SELECT u::text FROM m") == [("18446744073709551615",)]


# --- lost connections, and readers during an epoch --------------------------------------


def _terminate_writers(target: Target) -> int:
    rows = target.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = %s AND application_name = %s",
        target.name,
        APPLICATION_NAME,
    )
    return len(rows)


def test_a_connection_killed_mid_epoch_loses_the_whole_epoch(target: Target) -> None:
    writer = target.writer(create_tables=True)
    try:
        assert _epoch(writer, 1, b"m v=1 1000")
        assert writer.begin("s", 2, "t") is None
        writer.write(b"m v=2 2000")
        assert _terminate_writers(target) == 1
        with pytest.raises(TransactionLostError, match="nothing of it was committed"):
            writer.write(b"m v=3 3000")
        writer.rollback()
        assert _rows(target, "m", "v") == [(1.0,)]
        assert target.sql("SELECT epoch FROM twophase_delivered") == [(1,)]
        assert _epoch(writer, 2, b"m v=2 2000", b"m v=3 3000")  # started over: reconnects
    finally:
        writer.close()
    assert _rows(target, "m", "v") == [(1.0,), (2.0,), (3.0,)]


def test_a_connection_killed_before_commit_is_a_lost_transaction(target: Target) -> None:
    writer = target.writer(create_tables=True)
    try:
        assert writer.begin("s", 1, "t") is None
        writer.write(b"m v=1 1000")
        _terminate_writers(target)
        with pytest.raises(TransactionLostError):
            writer.commit(1, 0)
        assert writer.begin("s", 1, "t") is None  # not recorded: owed still
        writer.rollback()
    finally:
        writer.close()


def test_a_reader_never_sees_part_of_an_epoch(target: Target) -> None:
    total, per_body = 50_000, 5_000
    bodies = [
        "\n".join(
            f"big,host=h{i % 50} v={i} {(i + 1) * 1000}" for i in range(start, start + per_body)
        ).encode()
        for start in range(0, total, per_body)
    ]
    target.sql(
        "CREATE TABLE big (time timestamptz NOT NULL, host text NOT NULL DEFAULT '', "
        "v float8, UNIQUE (time, host))"
    )
    seen: set[int] = set()
    done, polling = threading.Event(), threading.Event()

    def poll() -> None:
        with psycopg.connect(target.admin, autocommit=True) as conn:
            while not done.is_set():
                polling.set()
                seen.add(conn.execute("SELECT count(*) FROM big").fetchone()[0])  # type: ignore[index]
            seen.add(conn.execute("SELECT count(*) FROM big").fetchone()[0])  # type: ignore[index]

    reader = threading.Thread(target=poll)
    reader.start()
    assert polling.wait(timeout=30)
    writer = target.writer()
    try:
        assert _epoch(writer, 1, *bodies)
    finally:
        done.set()
        reader.join(timeout=30)
        writer.close()
    assert seen == {0, total}  # polled before, during and after: never part of it


# --- reading back, gzip, names ---------------------------------------------------------


def test_read_back_gives_series_by_tag_set_in_nanoseconds(target: Target) -> None:
    writer = target.writer(create_tables=True)
    try:
        assert _epoch(
            writer,
            1,
            b'm,host=a v=1,s="x" 1000001999\nm,host=a v=2 1000003000\n'
            b"m,host=b v=3 1000002000\nm v=4 1000002000\nm,host=a v=5 5000000000",
        )
    finally:
        writer.close()
    readback = KIND.readback(target.config())
    try:
        readback.probe()
        series = list(readback.window("m", 1000001500, 1000003000))
        assert list(readback.window("absent", 0, 10**18)) == []
    finally:
        readback.close()
    assert series == [
        {
            "name": "m",
            "tags": {},
            "columns": ["time", "v", "s"],
            "values": [[1000002000, 4.0, None]],
        },
        {
            "name": "m",
            "tags": {"host": "a"},
            "columns": ["time", "v", "s"],
            "values": [[1000003000, 2.0, None]],  # its 1000001999 is kept as 1000001000, out
        },
        {
            "name": "m",
            "tags": {"host": "b"},
            "columns": ["time", "v", "s"],
            "values": [[1000002000, 3.0, None]],
        },
    ]


def test_probe_names_a_missing_schema(target: Target) -> None:
    readback = PostgresReadback(target.config(schema="absent"))
    try:
        with pytest.raises(TargetNotFoundError, match="'absent'"):
            readback.probe()
    finally:
        readback.close()


def test_gzip_bodies_of_several_members_are_written(target: Target) -> None:
    body = gzip.compress(b"m,host=a v=1 1000\n") + gzip.compress(b"m,host=b v=2 1000\n")
    writer = target.writer(create_tables=True)
    try:
        assert writer.begin("s", 1, "t") is None
        writer.write(body, gzipped=True)
        writer.commit(2, 0)
    finally:
        writer.close()
    assert _rows(target, "m", "host, v") == [("a", 1.0), ("b", 2.0)]


def test_hostile_names_are_quoted_everywhere(target: Target) -> None:
    target.sql('CREATE SCHEMA "we\'ird ""schema"""')
    line = 'mé\\ "tab\\,le\\ ☃,ta\\ g"\\=x=v\\ al fi\\,eld\\ é"=1,"q"=2i 1000\n'
    writer = target.writer(create_tables=True, schema='we\'ird "schema"')
    try:
        assert _epoch(writer, 1, line.encode())
        assert writer.begin("s", 1, "t") == (1, 0)
    finally:
        writer.close()
    columns = target.sql(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = %s ORDER BY ordinal_position",
        'we\'ird "schema"',
        'mé "tab,le ☃',
    )
    assert [c for (c,) in columns] == ["time", 'ta g"=x', 'fi,eld é"', '"q"']
    readback = PostgresReadback(target.config(schema='we\'ird "schema"'))
    try:
        series = list(readback.window('mé "tab,le ☃', 0, 10**6))
    finally:
        readback.close()
    assert series[0]["tags"] == {'ta g"=x': "v al"} and series[0]["values"] == [[1000, 1.0, 2]]


def test_a_name_longer_than_postgresql_allows_is_refused(target: Target) -> None:
    writer = target.writer(create_tables=True)
    try:
        with pytest.raises(BadPointsError, match="longer than PostgreSQL's 63 bytes"):
            writer.write(f"m {'f' * 64}=1 1000".encode())
    finally:
        writer.close()


# --- connection failures ----------------------------------------------------------------


def test_a_wrong_password_is_an_auth_error_without_the_password(target: Target) -> None:
    config = dataclasses.replace(target.config(), password=Secret("not-the-password-42"))
    writer = PostgresWriter(config)
    with pytest.raises(TargetAuthError) as refused:
        writer.begin("s", 1, "t")
    assert "not-the-password-42" not in str(refused.value)
    with pytest.raises(TargetAuthError):  # the epoch lock was released: begin tries again
        writer.begin("s", 1, "t")
    writer.close()


def test_a_missing_database_is_not_found(target: Target) -> None:
    config = dataclasses.replace(target.config(), url=target.url + "_absent")
    writer = PostgresWriter(config)
    with pytest.raises(TargetNotFoundError, match="does not exist"):
        writer.write(b"m v=1 1")
    writer.close()


def test_a_role_without_privilege_is_an_auth_error(target: Target) -> None:
    target.sql("CREATE TABLE m (time timestamptz NOT NULL, v float8, UNIQUE (time))")
    target.sql("REVOKE ALL ON SCHEMA public FROM PUBLIC")
    with psycopg.connect(target.admin, autocommit=True) as conn:
        conn.execute(record_ddl("public"))  # as a DBA makes it
    role = unique("tp_reader")
    target.sql(f"CREATE ROLE \"{role}\" LOGIN PASSWORD 'pw'")
    try:
        target.sql(f'GRANT USAGE ON SCHEMA public TO "{role}"')
        target.sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"')
        target.sql(f'GRANT INSERT, UPDATE ON twophase_delivered TO "{role}"')
        config = dataclasses.replace(target.config(), username=role, password=Secret("pw"))
        writer = PostgresWriter(config)
        try:
            assert writer.begin("s", 1, "t") is None
            with pytest.raises(TargetAuthError, match="permission denied"):
                writer.write(b"m v=1 1000")
        finally:
            writer.close()
    finally:
        target.sql(f'REVOKE ALL ON ALL TABLES IN SCHEMA public FROM "{role}"')
        target.sql(f'REVOKE ALL ON SCHEMA public FROM "{role}"')
        target.sql(f'DROP ROLE "{role}"')


# --- deliveries at the same time ----------------------------------------------------------


def test_a_second_delivery_of_an_epoch_at_once_waits_then_finds_the_record(
    target: Target,
) -> None:
    first, second = target.writer(create_tables=True), target.writer(create_tables=True)
    found: list[tuple[int, int] | None] = []
    try:
        assert first.begin("s", 5, "t") is None
        first.write(b"m v=1 1000")
        waiter = threading.Thread(target=lambda: found.append(second.begin("s", 5, "t")))
        waiter.start()
        waiter.join(timeout=1)
        assert waiter.is_alive() and found == []  # waits on the epoch's lock
        first.commit(1, 0)
        waiter.join(timeout=30)
    finally:
        first.close()
        second.close()
    assert found == [(1, 0)]
    assert _rows(target, "m", "v") == [(1.0,)]


def test_two_sinks_creating_one_table_at_once_share_it(target: Target) -> None:
    """The table is made in a transaction of its own, committed at once: the second
    sink finds it, and its epoch does not wait for the first's."""
    first, second = target.writer(create_tables=True), target.writer(create_tables=True)
    failures: list[BaseException] = []

    def other_sink() -> None:
        try:
            assert _epoch(second, 1, b"m,host=b v=2 1000", sink="other")
        except BaseException as exc:  # reported below
            failures.append(exc)

    try:
        assert first.begin("s", 1, "t") is None
        first.write(b"m,host=a v=1 1000")  # creates m, committed; its row uncommitted
        racer = threading.Thread(target=other_sink)
        racer.start()
        racer.join(timeout=30)
        assert not racer.is_alive() and failures == []
        assert _rows(target, "m", "host, v") == [("b", 2.0)]
        first.commit(1, 0)
    finally:
        first.close()
        second.close()
    assert _rows(target, "m", "host, v") == [("a", 1.0), ("b", 2.0)]


def test_names_twophase_uses_are_refused_as_points(target: Target) -> None:
    writer = target.writer(create_tables=True)
    try:
        assert writer.begin("s", 1, "t") is None
        for body, reason in [
            (b"m v=1 1000\ntwophase_delivered v=1 1000", "twophase's delivered record"),
            (b"m v=1 1000\nm,time=x v=2 2000", "a tag named 'time'"),
            (b"m v=1 1000\nm time=3 3000", "field 'time' has the name of the table's time"),
        ]:
            with pytest.raises(BadPointsError) as refused:
                writer.write(body)
            assert refused.value.line == 1 and reason in refused.value.reason, body
        writer.write(b"m v=1 1000")
        writer.commit(1, 3)
    finally:
        writer.close()
    assert _rows(target, "m", "v") == [(1.0,)]


def test_a_connection_killed_between_bodies_outside_an_epoch_is_transient(
    target: Target,
) -> None:
    writer = target.writer(create_tables=True)
    try:
        writer.write(b"m v=1 1000")
        assert _terminate_writers(target) == 1
        with pytest.raises(TransientWriteError):
            writer.write(b"m v=2 2000")
        writer.write(b"m v=2 2000")  # connects again
    finally:
        writer.close()
    assert _rows(target, "m", "v") == [(1.0,), (2.0,)]


def test_an_epoch_never_goes_on_over_a_new_connection(target: Target) -> None:
    writer = target.writer(create_tables=True)
    try:
        assert writer.begin("s", 1, "t") is None
        writer.write(b"m v=1 1000")
        writer._conn.close()  # type: ignore[union-attr]  # gone, unnoticed by the epoch
        with pytest.raises(TransactionLostError):
            writer.write(b"m v=2 2000")
        assert writer.begin("s", 1, "t") is None  # the epoch lock was released
        writer.rollback()
    finally:
        writer.close()
    assert target.count("m") == 0


def test_an_epoch_left_idle_is_ended_by_postgresql_and_lost(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen delivery does not hold its epoch's locks for ever: PostgreSQL ends its
    session after IDLE_IN_TRANSACTION_S, and the epoch is lost, never half committed."""
    monkeypatch.setattr(connect, "IDLE_IN_TRANSACTION_S", 0.5)
    writer = target.writer(create_tables=True)
    other = target.writer(create_tables=True)
    try:
        assert writer.begin("s", 1, "t") is None
        writer.write(b"m v=1 1000")
        time.sleep(2)  # frozen, inside the transaction
        assert other.begin("s", 1, "t") is None  # not held up by the frozen one's lock
        other.rollback()
        with pytest.raises(TransactionLostError):
            writer.write(b"m v=2 2000")
    finally:
        writer.close()
        other.close()
    assert target.count("m") == 0


# --- waits bounded: tables made outside the epoch, readers' locks ------------------------


def test_a_new_field_column_does_not_lock_readers_out_for_the_epoch(target: Target) -> None:
    """The column is added in a transaction of its own, committed at once: a reader of
    the table (a dashboard) is not held by the ACCESS EXCLUSIVE lock until the epoch
    commits."""
    writer = target.writer(create_tables=True)
    try:
        assert _epoch(writer, 1, b"m,host=a v=1 1000")
        assert writer.begin("s", 2, "t") is None
        writer.write(b"m,host=a w=2i 2000")  # a new field: column w
        with psycopg.connect(target.admin, autocommit=True) as reader:
            reader.execute("SET lock_timeout = '2s'")  # fails, rather than waits, if held
            seen = reader.execute("SELECT count(*), count(w) FROM m").fetchone()
        assert seen == (1, 0)  # the column is there; the epoch's row is not, till its commit
        writer.commit(1, 0)
    finally:
        writer.close()
    assert _rows(target, "m", "host, v, w") == [("a", 1.0, None), ("a", None, 2)]


def test_a_column_for_a_table_the_epoch_wrote_to_starts_the_epoch_over(target: Target) -> None:
    """The epoch's transaction holds a lock on a table it wrote to, which the column's
    transaction would wait for in vain: the epoch is ended, the column added, and the
    epoch, sent again, finds it."""
    writer = target.writer(create_tables=True)
    try:
        assert _epoch(writer, 1, b"m,host=a v=1 1000")
        assert writer.begin("s", 2, "t") is None
        writer.write(b"m,host=a v=2 2000")
        with pytest.raises(EpochStartOverError, match=r'"public"\."m"'):
            writer.write(b"m,host=a w=3i 3000")
        assert target.sql("SELECT count(*), count(w) FROM m") == [(1, 0)]  # w, no epoch 2
        assert _epoch(writer, 2, b"m,host=a v=2 2000", b"m,host=a w=3i 3000")
    finally:
        writer.close()
    assert _rows(target, "m", "host, v, w") == [("a", 1.0, None), ("a", 2.0, None), ("a", None, 3)]
    assert target.sql("SELECT epoch FROM twophase_delivered ORDER BY 1") == [(1,), (2,)]


def test_an_epoch_started_over_for_a_column_is_delivered_whole_once(
    target: Target, staging: StagingConfig
) -> None:
    """Through the protocol: a request per point, the second bringing a field the first
    request's table lacks. The delivery starts the epoch over once, at once."""
    config = TwoPhaseConfig(staging, target.config(create_tables=True, batch_points=1))
    points = ["m,host=a v=1 1000", "m,host=b w=2i 2000", "m,host=c v=3,w=4i 3000"]
    with TwoPhase.open(config) as tp:
        lease = tp.committer.claim("c", "r1", "q1")
        outcome = tp.committer.commit(lease, 0, stage(tp, "c", 0, [points]))
    assert outcome.state == EpochState.COMMITTED
    assert outcome.promoted is not None and outcome.promoted.delivered == 3
    assert _rows(target, "m", "host, v, w") == [("a", 1.0, None), ("b", None, 2), ("c", 3.0, 4)]
    assert target.sql("SELECT epoch, delivered FROM twophase_delivered") == [(0, 3)]


@pytest.mark.timeout(60)
def test_a_column_waits_for_a_readers_lock_in_short_tries_then_the_epoch_fails_retryably(
    target: Target,
) -> None:
    """A reader holding the table (a long query's ACCESS SHARE lock): the column's
    transaction waits for it in short tries, between which other readers go on, until
    target_lock_timeout; then the epoch fails as one that may pass. Once the reader is
    gone, the epoch is sent again and commits."""
    writer = target.writer(create_tables=True, lock_timeout_s=2.0)
    waits: list[float] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:  # a dashboard polling the table meanwhile
        with psycopg.connect(target.admin, autocommit=True) as reader:
            reader.execute("SET lock_timeout = '2s'")
            while not stop.is_set():
                began = time.monotonic()
                try:
                    reader.execute("SELECT count(*) FROM m")
                except psycopg.Error as exc:  # reported below
                    failures.append(exc)
                    return
                waits.append(time.monotonic() - began)

    try:
        assert _epoch(writer, 1, b"m,host=a v=1 1000")
        with psycopg.connect(target.admin) as holder:
            holder.execute("LOCK TABLE m IN ACCESS SHARE MODE")
            assert writer.begin("s", 2, "t") is None
            poller = threading.Thread(target=read)
            poller.start()
            started = time.monotonic()
            try:
                with pytest.raises(TransactionLostError, match="past target_lock_timeout 2s"):
                    writer.write(b"m,host=a w=2i 2000")
                took = time.monotonic() - started
            finally:
                stop.set()
                poller.join(timeout=30)
        assert 2.0 <= took < 15
        assert failures == [] and waits  # the readers were never held for 2 s
        assert _epoch(writer, 2, b"m,host=a w=2i 2000")  # the reader gone: the column added
    finally:
        writer.close()
    assert _rows(target, "m", "host, v, w") == [("a", 1.0, None), ("a", None, 2)]


def test_a_session_ends_a_statement_past_its_limits(target: Target) -> None:
    config = target.config(lock_timeout_s=1.5, statement_timeout_s=0.25)
    conn = connect.connect(config)
    try:
        shown = [
            conn.execute(f"SHOW {name}").fetchone()
            for name in ("lock_timeout", "statement_timeout")
        ]
        assert shown == [("1500ms",), ("250ms",)]
        with pytest.raises(psycopg.errors.QueryCanceled) as cancelled:
            conn.execute("SELECT pg_sleep(5)")
    finally:
        conn.close()
    lost = connect.classify(cancelled.value, config, in_transaction=True)
    assert isinstance(lost, TransactionLostError) and "target_statement_timeout 0.25s" in str(lost)


# --- with InfluxDB: a target held up by a reader's lock is left lagging ------------------

FAN = "fan-pg"


def _fan(influx: TargetConfig, target: Target) -> TargetConfig:
    """A sink delivering to InfluxDB (``influx``) and to the PostgreSQL target (``pg``),
    either enough (min_targets 1), a commit's round of a second."""
    pg = target.config(
        create_tables=True,
        lock_timeout_s=1.0,
        retry_deadline_s=20,
        retry_initial_s=0.05,
        retry_max_s=0.5,
    )
    return dataclasses.replace(
        influx,
        targets=(NamedTarget("influx", influx), NamedTarget("pg", pg)),
        min_targets=1,
        target_deadline_s=1.0,
    )


BASE = 1_700_000_000_000_000_000  # epoch 0's first point, as lines(0, n) stamps it


@pytest.mark.timeout(90)
@pytest.mark.parametrize("lock", ["table", "row"])
def test_a_readers_lock_leaves_the_postgresql_target_lagging_not_the_sink_stopped(
    lock: str, target: Target, staging: StagingConfig, influx: TargetConfig, staging_url: str
) -> None:
    """An open transaction on the target holds, for ``table``, ACCESS SHARE on the
    measurement's table while epoch 1 brings a new field (its column to add); for
    ``row``, a lock on the row epoch 1 writes again. InfluxDB alone makes min_targets:
    the commit returns within a bounded time, the PostgreSQL target left lagging; once
    the lock is released, its catch-up delivers epoch 1 exactly, once."""
    if lock == "table":
        second = f"{M},host=a,n=0 w=5i {BASE + 10**9}"
        expected = [("0", 0.0, 0, None), ("1", 1.0, 0, None), ("2", 2.0, 0, None)]
        expected.append(("0", None, None, 5))
        hold = f"LOCK TABLE {M} IN ACCESS SHARE MODE"
    else:
        second = f"{M},host=a,n=0 v=9,e=1i {BASE}"  # epoch 0's first point, again
        expected = [("0", 9.0, 1, None), ("1", 1.0, 0, None), ("2", 2.0, 0, None)]
        hold = f"SELECT * FROM {M} FOR UPDATE"  # noqa: S608 the test's own name
    with two_phase(staging, _fan(influx, target)) as tp:
        tp.catch_up.close()  # the backlog is delivered below, once the lock is gone
        lease = tp.committer.claim(FAN, "r1", "q1")
        outcome = tp.committer.commit(lease, 0, stage(tp, FAN, 0, [lines(0, 3)]))
        assert outcome.state == EpochState.COMMITTED
        if lock == "row":
            target.sql(f"ALTER TABLE {M} ADD COLUMN w bigint")  # the same columns for both
        with psycopg.connect(target.admin) as holder:  # a reader's open transaction
            holder.execute(hold)
            started = time.monotonic()
            outcome = tp.committer.commit(lease, 1, stage(tp, FAN, 1, [[second]]))
            took = time.monotonic() - started
            assert outcome.state == EpochState.COMMITTED and took < 20
            rows = target_rows(staging_url, FAN)
            assert (rows["influx"]["state"], rows["influx"]["delivered"]) == ("live", 1)
            assert (rows["pg"]["state"], rows["pg"]["delivered"]) == ("lagging", 0)
        report = tp.catch_up.run(lease, ["pg"])  # the lock released with its transaction
    assert report.delivered == (("pg", 1),) and report.failed == ()
    assert target_rows(staging_url, FAN)["pg"]["state"] == "live"
    assert target.sql("SELECT epoch FROM twophase_delivered ORDER BY 1") == [(0,), (1,)]
    assert target.sql(f"SELECT n, v, e, w FROM {M} ORDER BY time, n") == expected  # noqa: S608
    assert len(influx_rows(influx, M)) == len(expected)


# --- verify, through SQL ----------------------------------------------------------------


def test_verify_reads_a_postgresql_target_back_and_finds_what_changed(
    target: Target, staging: StagingConfig
) -> None:
    """Two epochs through the protocol (c's point stamped inside a microsecond, kept to
    it); verify finds the target as staged, then a row changed, a row deleted and a row
    added by hand."""
    config = TwoPhaseConfig(staging, target.config(create_tables=True))
    epochs = {
        0: ["cpu,host=a usage=1.5 1000000000", "cpu,host=b usage=2.5 1000000000"],
        1: ["cpu,host=a usage=3.5 2000000000", "cpu,host=c usage=4.5 3000000999"],
    }
    with TwoPhase.open(config) as tp:
        lease = tp.committer.claim("v", "r1", "q1")
        for epoch, lines in epochs.items():
            outcome = tp.committer.commit(lease, epoch, stage(tp, "v", epoch, [lines]))
            assert outcome.state == EpochState.COMMITTED
    [same] = verify(config, "v")
    assert same.report.ok and same.report.points == 4, same.report

    target.sql("UPDATE cpu SET usage = 9 WHERE host = 'a' AND time = to_timestamp(2)")
    target.sql("DELETE FROM cpu WHERE host = 'b'")
    target.sql("INSERT INTO cpu (time, host, usage) VALUES (to_timestamp(1.5), 'a', 0.5)")
    [changed] = verify(config, "v")
    found = {d.tags["host"]: (d.missing, d.different, d.extra) for d in changed.report.differences}
    assert found == {"a": (0, 1, 1), "b": (1, 0, 0)}, changed.report  # c: as staged
