"""The grant table of the roles of least privilege, and `twophase db grants` without a
database. (tests/integration/test_privileges.py runs the protocol under the roles.)"""

from __future__ import annotations

import contextlib
import io

import pytest

from twophase.cli import main
from twophase.store.least_privilege import (
    DRIVER,
    EXECUTOR,
    GRANTS,
    OPERATOR,
    READER,
    SELECT,
    SEQUENCE,
    RoleNames,
    statements,
)
from twophase.store.schema import VERSION_TABLE, metadata

pytestmark = pytest.mark.unit


def test_every_table_of_the_schema_has_its_grants() -> None:
    tables = {table.name for table in metadata.sorted_tables} | {VERSION_TABLE}
    assert tables - {g.name for g in GRANTS} == set()


def test_each_kind_may_do_what_the_one_before_it_may() -> None:
    """The driver stages too (a driver of the Python API, Spark in local mode), and the
    operator's commands run the protocol (recover, resend, requeue) -- but never make a
    target: only a query's run registers one."""
    for grant in GRANTS:
        for lesser, greater in ((EXECUTOR, DRIVER), (DRIVER, OPERATOR)):
            more = set(grant.privileges(lesser)) - set(grant.privileges(greater))
            never = {"INSERT"} if (grant.name, greater) == ("twophase_targets", OPERATOR) else set()
            assert more == never, (grant.name, lesser, greater)


def test_the_reader_reads_every_table_and_nothing_else() -> None:
    for grant in GRANTS:
        expected = () if grant.kind == SEQUENCE else (SELECT,)
        assert grant.privileges(READER) == expected, grant.name


def test_no_role_may_change_the_schema_or_empty_a_table() -> None:
    allowed = {"SELECT", "INSERT", "UPDATE", "DELETE", "USAGE"}
    for grant in GRANTS:
        for kind in (EXECUTOR, DRIVER, OPERATOR, READER):
            assert set(grant.privileges(kind)) <= allowed, (grant.name, kind)


def test_role_and_schema_names_are_quoted_identifiers() -> None:
    hostile = 'tp"; DROP TABLE twophase_epochs; --'
    text = [s.as_string() for s in statements(RoleNames(reader=hostile), schema="Stage One")]
    assert text[0] == 'GRANT USAGE ON SCHEMA "Stage One" TO "tp""; DROP TABLE twophase_epochs; --"'
    assert 'GRANT SELECT ON TABLE "Stage One"."twophase_sinks" TO "tp""; DROP' in text[2]
    assert all(line.startswith("GRANT ") for line in text)


def test_one_role_of_several_kinds_gets_each_kinds_grants() -> None:
    text = [s.as_string() for s in statements(RoleNames(executor="job", driver="job"))]
    schema = 'GRANT USAGE ON SCHEMA "public" TO "job"'
    assert text.count(schema) == 2
    assert 'GRANT SELECT, INSERT ON TABLE "public"."twophase_writes" TO "job"' in text


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_the_cli_prints_the_grants_without_a_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TWOPHASE_STAGING_URL", raising=False)
    code, out, _ = _cli("db", "grants", "--executor", "tp_exec", "--reader", "tp_read")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == 'GRANT USAGE ON SCHEMA "public" TO "tp_exec";'
    assert 'GRANT INSERT ON TABLE "public"."twophase_staged_chunks" TO "tp_exec";' in lines
    assert 'GRANT SELECT ON TABLE "public"."twophase_staged_chunks" TO "tp_read";' in lines
    assert not [line for line in lines if "tp_exec" in line and "UPDATE" in line]


@pytest.mark.parametrize(
    "args,problem",
    [
        ((), "name a role to grant to"),
        (("--reader", "r", "--apply", "--schema", "s"), "--schema goes with the printed SQL"),
    ],
)
def test_the_cli_refuses_grants_it_cannot_make(args: tuple[str, ...], problem: str) -> None:
    code, out, err = _cli("db", "grants", *args)
    assert (code, out) == (2, "")
    assert problem in err
