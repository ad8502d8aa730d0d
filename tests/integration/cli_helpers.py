"""Helpers for the CLI tests: run ``twophase`` in-process or as a real subprocess, and
build a staging store in a known state through the real protocol.

(A module of helpers, no tests; named ``test_cli_*`` to sit with the CLI tests.)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.staging import lines, stage
from tests.support import REPO, admin_conninfo, begin_run
from twophase.cli import main
from twophase.config import TargetConfig
from twophase.points.builder import Rejected
from twophase.protocol.commit.runtime import TwoPhase

SINK = "s"
OTHER = "t"
M = "proto"
BAD_POINT = f'{M},host=a,n=0 v="not a float" ' + str(1_700_000_000_000_000_000 + 2 * 10**12 + 500)
SCRIPT = Path(sys.executable).with_name("twophase")


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def one_line_error(self) -> str:
        """The stderr of a failed command: exactly one line, no traceback."""
        assert "Traceback" not in self.err, self.err
        error_lines = [x for x in self.err.splitlines() if "error:" in x]
        assert len(error_lines) == 1 and self.err.count("\n") <= 2, self.err
        return error_lines[0]


class Cli:
    """``cli(*args)`` runs main() in this process (fast); ``cli.run(*args)`` runs the
    installed console script in a subprocess, configured through TWOPHASE_* only."""

    def __init__(self, staging_url: str, influx: TargetConfig):
        self.staging_url = staging_url
        self.influx = influx
        self.flags = ["--staging-url", staging_url, "--target-url", influx.url]
        self.flags += ["--influx-api", "v1", "--influx-db", influx.influxdb.database or ""]

    def __call__(self, *args: str, stdin: str = "") -> Result:
        out, err = io.StringIO(), io.StringIO()
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            _stdin(io.StringIO(stdin)),
        ):
            try:
                code = main([*self.flags, *args])
            except SystemExit as exc:  # argparse's usage errors and --help
                code = int(exc.code or 0)
        return Result(code, out.getvalue(), err.getvalue())

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_")}
        return env | {
            "TWOPHASE_STAGING_URL": self.staging_url,
            "TWOPHASE_TARGET_URL": self.influx.url,
            "TWOPHASE_INFLUX_API": "v1",
            "TWOPHASE_INFLUX_DB": self.influx.influxdb.database or "",
            "TWOPHASE_TARGET_RETRY_DEADLINE": "20s",
        }

    def run(self, *args: str, stdin: str = "", env: dict[str, str] | None = None) -> Result:
        done = subprocess.run(
            [str(SCRIPT), *args],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=REPO,
            env=self.env() if env is None else env,
            timeout=120,
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)


@contextlib.contextmanager
def _stdin(stream: io.StringIO) -> Any:
    saved = sys.stdin
    sys.stdin = stream
    try:
        yield
    finally:
        sys.stdin = saved


def make_cli(staging_url: str, influx: TargetConfig) -> Cli:
    if not SCRIPT.exists():
        pytest.fail(f"{SCRIPT} is missing: `pip install -e .` installs the console script")
    return Cli(staging_url, influx)


def known_store(tp: TwoPhase) -> None:
    """Sink ``s``: epochs 0-2 COMMITTED (10 points each; epoch 1 has a row rejected at
    stage, epoch 2 a point InfluxDB rejects), epoch 3 PRECOMMITTED (a driver that died
    after the vote). Sink ``t``: epoch 0 COMMITTED (5 points)."""
    lease = begin_run(tp, SINK, "r1", "q1")
    for epoch in (0, 1, 2):
        first: list[Any] = list(lines(epoch, 10)[:4])
        if epoch == 1:
            first.append(Rejected(4, "field 'v' is null", '{"v": null}'))
        rest = lines(epoch, 10)[4:] + ([BAD_POINT] if epoch == 2 else [])
        tp.committer.commit(lease, epoch, stage(tp, SINK, epoch, [first, rest]))
    tp.ledger.decide(lease, 3, stage(tp, SINK, 3, [lines(3, 10)]))
    other = begin_run(tp, OTHER, "r9", "q9")
    tp.committer.commit(other, 0, stage(tp, OTHER, 0, [lines(0, 5, host="t")], run="r9"))


def sql(staging_url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(admin_conninfo(staging_url)) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def make_idle(staging_url: str, sink: str = SINK) -> None:
    """Age the sink's owner past the live window (its driver is gone)."""
    sql(
        staging_url,
        "UPDATE twophase_sinks SET updated_at = now() - interval '1 hour' WHERE sink_id = %s",
        sink,
    )


def on_terminal(cli: Cli, answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the console script with a real terminal as stdin, typing ``answer``."""
    primary, secondary = os.openpty()
    try:
        os.write(primary, answer.encode() + b"\n")
        return subprocess.run(
            [str(SCRIPT), *args],
            stdin=secondary,
            capture_output=True,
            text=True,
            cwd=REPO,
            env=cli.env(),
            timeout=60,
            check=False,
        )
    finally:
        os.close(primary)
        os.close(secondary)


RECORDS = (
    "SELECT (SELECT array_agg(epoch ORDER BY epoch) FROM twophase_epochs WHERE sink_id = %(s)s),"
    " (SELECT array_agg(DISTINCT epoch) FROM twophase_writes WHERE sink_id = %(s)s),"
    " (SELECT array_agg(DISTINCT epoch) FROM twophase_epoch_events WHERE sink_id = %(s)s"
    " AND epoch IS NOT NULL),"
    " (SELECT array_agg(DISTINCT epoch) FROM twophase_target_deliveries WHERE sink_id = %(s)s)"
)


def records(staging_url: str, sink: str = "s") -> dict[str, list[int]]:
    """The epochs each per-epoch table still holds a row of, for the sink."""
    [row] = sql(staging_url, RECORDS.replace("%(s)s", "%s"), *[sink] * 4)
    names = ("epochs", "writes", "events", "deliveries")
    return {name: sorted(found or []) for name, found in zip(names, row, strict=True)}
