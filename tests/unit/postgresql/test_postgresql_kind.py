"""The PostgreSQL target kind's pure logic: column types, value and shape checks, the
settings check, connection strings, read-back series and the streamed body's pattern."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from twophase.config import Secret, TargetConfig, load_config
from twophase.errors import (
    ConfigError,
    TargetAuthError,
    TargetNotFoundError,
    TargetRequestError,
    TargetTableError,
    TransactionLostError,
    TransientWriteError,
)
from twophase.points.lineproto import parse_line
from twophase.postgresql import KIND, streamed
from twophase.postgresql.connect import check_settings, classify, conninfo, session_limits
from twophase.postgresql.readback import _series, ns_of
from twophase.postgresql.tables import (
    TableShape,
    check_shape,
    column_type,
    names_problem,
    point_problem,
    value_problem,
)
from twophase.targets.contract import TRANSACTION


def test_the_kind_is_transactional_and_keeps_microseconds() -> None:
    assert KIND.name == "postgresql" and KIND.resend == TRANSACTION
    assert KIND.schemes == ("postgresql", "postgres")
    assert KIND.time_resolution_ns == 1000 and not KIND.lanes


@pytest.mark.parametrize(
    ("value", "kind"),
    [(1.5, "double precision"), (3, "bigint"), (True, "boolean"), ("x", "text")],
)
def test_a_field_column_is_created_with_its_first_values_type(value: Any, kind: str) -> None:
    assert column_type(value) == kind


@pytest.mark.parametrize(
    ("kind", "value", "problem"),
    [
        ("double precision", 1.5, None),
        ("double precision", 2, None),
        ("double precision", "x", "is a string, its column is double precision"),
        ("double precision", True, "is a boolean"),
        ("bigint", 2**63 - 1, None),
        ("bigint", 2**63, "out of bigint's range"),
        ("bigint", 1.0, "is a float, its column is bigint"),
        ("integer", 2**31, "out of integer's range"),
        ("smallint", -(2**15), None),
        ("numeric(20,0)", 2**64 - 1, None),
        ("numeric(20,0)", 10**20, "out of numeric(20,0)'s range"),
        ("numeric(10,2)", 12345678.5, None),
        ("numeric", float("nan"), "has no numeric value"),
        ("boolean", True, None),
        ("boolean", 1, "is a integer"),
        ("text", "ok", None),
        ("character varying(10)", "ok", None),
        ("text", "nul\0", "NUL"),
        ("text", 1, "is a integer, its column is text"),
        ("jsonb", 1, "not one twophase writes"),
    ],
)
def test_a_value_is_checked_against_its_columns_type(
    kind: str, value: Any, problem: str | None
) -> None:
    found = value_problem("f", kind, value)
    assert (found is None) if problem is None else (found is not None and problem in found)


COLUMNS = {"time": "timestamp with time zone", "host": "text", "v": "double precision"}


def test_the_shapes_tags_are_its_unique_keys_text_columns() -> None:
    shape = check_shape("s", "m", COLUMNS, [("v",), ("host", "time")])
    assert shape.tags == ("host",) and shape.key == ("time", "host")
    assert shape.is_field("v") and not shape.is_field("host")


@pytest.mark.parametrize(
    ("columns", "keys", "named"),
    [
        ({"host": "text"}, [("time", "host")], "has no column 'time'"),
        ({**COLUMNS, "time": "timestamp without time zone"}, [("time",)], "column 'time'"),
        ({**COLUMNS, "host": "integer"}, [("time", "host")], "column 'host'"),
        (COLUMNS, [("host",)], "no unique key on (time"),
        (COLUMNS, [], "no unique key"),
    ],
)
def test_a_table_that_cannot_take_points_is_refused_naming_the_column(
    columns: dict[str, str], keys: list[tuple[str, ...]], named: str
) -> None:
    with pytest.raises(TargetRequestError) as refused:
        check_shape("we'ird", "m", columns, keys)
    assert named in str(refused.value) and '"we\'ird"."m"' in str(refused.value)


@pytest.mark.parametrize("kind", ["character(8)", "character(1)", "bpchar"])
def test_a_character_n_tag_column_is_refused_naming_the_table_and_the_column(kind: str) -> None:
    """Two tags that differ only in trailing spaces would be one key of it: an upsert
    holding both would fail (21000) every time it is sent."""
    with pytest.raises(ConfigError) as refused:
        check_shape("public", "m", {**COLUMNS, "host": kind}, [("time", "host")])
    assert isinstance(refused.value, TargetTableError)  # a target's refusal: it lags
    assert refused.value.option == '"public"."m"'
    assert f"tag column 'host' is {kind}" in str(refused.value)
    assert "text or varchar" in str(refused.value)


@pytest.mark.parametrize("kind", ["text", "character varying", "character varying(40)"])
def test_text_and_varchar_tag_columns_are_taken(kind: str) -> None:
    shape = check_shape("public", "m", {**COLUMNS, "host": kind}, [("time", "host")])
    assert shape.tags == ("host",)


SHAPE = TableShape("public", "m", COLUMNS, ("host",))


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("m,host=a v=1 1000", None),
        ("m v=1 1000", None),
        ("m v=1", "no timestamp"),
        ("m,zone=z v=1 1000", "tag 'zone' has no column in the unique key"),
        ("m,host=a w=1 1000", "field 'w' has no column"),
        ('m,host=a v="x" 1000', "is a string"),
        ("m,host=a host=1 1000", "name of the table's time or of a tag column"),
        ("m,time=a v=1 1000", "tag named 'time'"),
    ],
)
def test_a_point_is_checked_against_its_table(line: str, problem: str | None) -> None:
    found = point_problem(parse_line(line), SHAPE)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_names_postgresql_would_cut_are_refused() -> None:
    assert names_problem(parse_line("m,t=1 f=1 1")) is None
    assert "measurement" in (names_problem(parse_line(f"{'é' * 32} f=1 1")) or "")
    assert "tag" in (names_problem(parse_line(f"m,{'t' * 64}=1 f=1 1")) or "")


def _config(url: str, **more: Any) -> TargetConfig:
    """A target's config; ``more`` by field, the PostgreSQL kind's own included."""
    return TargetConfig(url=url).with_fields(**more)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql://u:hunter2@db/x", "holds a password"),
        ("postgresql://u@db/x?password=hunter2", "holds a password"),
        ("postgresql://u@db/x?sslpassword=hunter2", "holds a password"),
        ("http://db:8086", "starts with postgresql://"),
        ("postgresql://u@db", "names no database"),
        ("not a url", "is not a database URL"),
    ],
)
def test_settings_a_target_cannot_use_are_refused_naming_the_url(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_settings(_config(url))
    assert problem in str(refused.value) and "hunter2" not in str(refused.value)
    assert refused.value.option.endswith("_URL")


@pytest.mark.parametrize("url", ["postgresql://u@db/x", "postgres://db:5433/x?sslmode=require"])
def test_a_postgresql_url_without_password_is_accepted(url: str) -> None:
    check_settings(_config(url))


def test_the_connection_string_holds_tls_files_and_never_the_password() -> None:
    config = _config(
        "postgresql://u@db.example.com/x",
        password=Secret("hunter2"),
        tls_ca="/ca.pem",
        tls_cert="/c.pem",
        tls_key="/k.pem",
    )
    info = conninfo(config)
    assert "hunter2" not in info
    assert "sslmode=verify-full" in info and "sslrootcert=%2Fca.pem" in info
    assert "sslcert=%2Fc.pem" in info and "sslkey=%2Fk.pem" in info
    assert "sslmode" not in conninfo(_config("postgresql://u@127.0.0.1/x"))


def test_read_back_rows_become_series_by_tag_set() -> None:
    rows = [(1, "", 1.0), (2, "a", 2.0), (3, "a", None), (4, "b", 4.0)]
    series = list(_series("m", ("host",), ["v"], [(_moment(t), h, v) for t, h, v in rows]))
    assert [(s["tags"], s["values"]) for s in series] == [
        ({}, [[1000, 1.0]]),
        ({"host": "a"}, [[2000, 2.0], [3000, None]]),
        ({"host": "b"}, [[4000, 4.0]]),
    ]


def _moment(micros: int) -> Any:
    from datetime import datetime, timedelta, timezone

    moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=micros)
    assert ns_of(moment) == micros * 1000
    return moment


@pytest.mark.parametrize(
    ("error", "outside", "inside"),
    [
        (psycopg.errors.InvalidPassword("no"), TargetAuthError, TargetAuthError),
        (psycopg.errors.InsufficientPrivilege("no"), TargetAuthError, TargetAuthError),
        (psycopg.errors.InvalidCatalogName("no"), TargetNotFoundError, TargetNotFoundError),
        (psycopg.errors.InvalidSchemaName("no"), TargetNotFoundError, TargetNotFoundError),
        (psycopg.errors.AdminShutdown("bye"), TransientWriteError, TransactionLostError),
        (psycopg.errors.TooManyConnections("full"), TransientWriteError, TransactionLostError),
        (
            psycopg.errors.ReadOnlySqlTransaction("standby"),
            TransientWriteError,
            TransactionLostError,
        ),
        (psycopg.errors.DeadlockDetected("x"), TransientWriteError, TransactionLostError),
        (psycopg.errors.SyntaxError("x"), TargetRequestError, TargetRequestError),
        (psycopg.OperationalError("connection refused"), TransientWriteError, TransactionLostError),
        (
            psycopg.OperationalError('FATAL:  password authentication failed for user "u"'),
            TargetAuthError,
            TargetAuthError,
        ),
        (
            psycopg.OperationalError('FATAL:  database "x" does not exist'),
            TargetNotFoundError,
            TargetNotFoundError,
        ),
    ],
)
def test_failures_are_classified_by_sqlstate_or_libpqs_words(
    error: psycopg.Error, outside: type[Exception], inside: type[Exception]
) -> None:
    config = _config("postgresql://u@db/x", password=Secret("hunter2"))
    assert type(classify(error, config, in_transaction=False)) is outside
    assert type(classify(error, config, in_transaction=True)) is inside
    assert "hunter2" not in str(classify(error, config, in_transaction=True))


@pytest.mark.parametrize(
    ("error", "named"),
    [
        (
            psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
            "past target_lock_timeout 1.5s",
        ),
        (
            psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
            "past target_statement_timeout 30s",
        ),
    ],
)
def test_a_statement_past_its_limit_may_pass_and_names_the_setting(
    error: psycopg.Error, named: str
) -> None:
    config = _config("postgresql://u@db/x", lock_timeout_s=1.5, statement_timeout_s=30.0)
    assert type(classify(error, config, in_transaction=False)) is TransientWriteError
    lost = classify(error, config, in_transaction=True)
    assert type(lost) is TransactionLostError and named in str(lost)


def test_a_statement_an_operator_cancelled_names_no_setting() -> None:
    error = psycopg.errors.QueryCanceled("canceling statement due to user request")
    lost = classify(error, _config("postgresql://u@db/x"), in_transaction=True)
    assert type(lost) is TransactionLostError and "target_" not in str(lost)


def test_a_sessions_limits_come_from_the_target_settings() -> None:
    config = _config("postgresql://u@db/x", lock_timeout_s=0.0001, statement_timeout_s=0.0)
    limits = dict(session_limits(config))
    assert limits["lock_timeout"] == "1ms"  # a limit under a millisecond is not none
    assert limits["statement_timeout"] == "0ms"  # 0: none
    assert limits["idle_in_transaction_session_timeout"] == "300000ms"
    defaults = dict(session_limits(_config("postgresql://u@db/x")))
    assert (defaults["lock_timeout"], defaults["statement_timeout"]) == ("5000ms", "60000ms")


@pytest.mark.parametrize(
    ("value", "problem"),
    [("soon", "is not a duration"), ("-1s", "is not a duration"), ("30d", "must be at most")],
)
@pytest.mark.parametrize("option", ["target_lock_timeout", "target_statement_timeout"])
def test_a_bad_limit_fails_naming_its_setting(option: str, value: str, problem: str) -> None:
    env = {
        "TWOPHASE_STAGING_URL": "postgresql+psycopg://u@db:5432/tp",
        "TWOPHASE_TARGET_URL": "postgresql://u@db:5432/metrics",
        f"TWOPHASE_{option.upper()}": value,
    }
    with pytest.raises(ConfigError) as refused:
        load_config(env=env)
    assert refused.value.option == f"TWOPHASE_{option.upper()}" and problem in str(refused.value)


def test_a_failure_that_broke_the_connection_is_a_lost_transaction() -> None:
    config = _config("postgresql://u@db/x")
    error = psycopg.errors.IdleInTransactionSessionTimeout("terminating connection")
    assert type(classify(error, config, in_transaction=True)) is TargetRequestError
    assert type(classify(error, config, in_transaction=True, broken=True)) is TransactionLostError
    assert type(classify(error, config, in_transaction=False, broken=True)) is TransientWriteError


# --- a body streamed ---------------------------------------------------------------

_CPU = TableShape(
    "public",
    "cpu",
    {
        "time": "timestamp with time zone",
        "host": "text",
        "region": "text",
        "usage": "double precision",
        "count": "bigint",
        "up": "boolean",
        "note": "text",
        "ratio": "real",
    },
    ("host", "region"),
)


def _copied(body: str) -> str | None:
    keys = streamed.first_keys(body)
    how = None if keys is None else streamed.plan(keys, _CPU)
    return None if how is None else streamed.rows(body, how)


def test_a_plain_body_becomes_copy_rows_in_line_order() -> None:
    body = (
        "cpu,region=eu,host=a usage=1.5,count=-3i,up=T 1000\n"
        "cpu,region=,host=b usage=2.,count=0u,up=false -5\n"
    )
    assert _copied(body) == "eu\ta\t1.5\t-3\tT\t1000\n\tb\t2.\t0\tfalse\t-5\n"


def test_escaped_tags_and_strings_become_copy_text_that_reads_them_unescaped() -> None:
    body = 'cpu,host=a\\ b\\,c\\=d,region="q" note="say \\"hi\\" \\\\ ,=" 7\n'
    assert _copied(body) == 'a\\ b\\,c\\=d\t"q"\tsay \\"hi\\" \\\\ ,=\t7\n'


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("cpu,host=a usage=1.5 1\ncpu,host=a count=1i 2", "another shape"),
        ("cpu,host=a usage=1.5 1\n\ncpu,host=a usage=2.5 2", "a blank line"),
        ("cpu,host=a usage=1.5", "no timestamp"),
        ("cpu,host=a usage=1.5i 1", "an integer into a double precision column"),
        ("cpu,host=a count=1.5 1", "a float into a bigint column"),
        ("cpu,host=a up=yes 1", "a boolean PostgreSQL reads but line protocol does not"),
        ("cpu,host=a usage=inf 1", "a float only Python reads"),
        ("cpu,host=a usage=1_0 1", "a float only Python reads"),
        ("cpu,host=a,host=b usage=1.5 1", "a tag twice"),
        ("cpu,host=a=b usage=1.5 1", "a tag value with an equals sign"),
        ('cpu,host=a note="a\\nb" 1', "a backslash escaping nothing in a string"),
        ("cpu,host=a\\b usage=1.5 1", "a backslash escaping nothing in a tag"),
        ('cpu,host=a note="x\ty" 1', "a tab in a string"),
        ('cpu,host=a usage="1.5" 1', "a string into a number's column"),
        ("cp\\ u,host=a usage=1.5 1", "an escaped measurement"),
        ("cpu,host=a\tb usage=1.5 1", "a tab COPY would read as a column"),
        ("cpu,zone=a usage=1.5 1", "a tag without its column"),
        ("cpu,host=a ratio=1.5 1", "a field of a type not streamed"),
        ("cpu,host=a host=1.5 1", "a field named as a tag"),
        ("cpu,host=a time=1.5 1", "a field named as the time column"),
        ("cpu,host=a usage=1.5 1 2", "more than a timestamp"),
    ],
)
def test_a_body_read_otherwise_point_by_point_is_not_streamed(body: str, why: str) -> None:
    assert _copied(body) is None, why
