"""One secret through every way in, and out through every operation: it shows nowhere.

Distinctive passwords (one holding ``/``, ``@`` and a ``%`` that starts no escape) are
given as the staging URL's password (in its user information and in its query,
``password``/``sslpassword``), through ``*_FILE`` variables, in the TOML file
``TWOPHASE_CONFIG`` names, as Spark sink options and as a target's own override.
Real servers of the test's own then take them or refuse them: a PostgreSQL whose role
has the odd password, an InfluxDB 1.x with authentication on. The CLI runs against the
right server, one that refuses the password, one that is not there and one that is not
loopback; commits succeed, and fail when InfluxDB refuses the credentials. No stdout,
stderr, log record (DEBUG, every logger), staging table or metric (the exporter's, the
driver's) holds any of them, in any form they take on the wire (percent-encoded, HTTP
basic auth's base64).
"""

from __future__ import annotations

import base64
import logging
import os
import pickle
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from prometheus_client import generate_latest
from psycopg import sql

from devkit import InfluxServer, PostgresServer
from devkit.ports import free_port
from scripts.tlskit import REMOTE_NAME
from tests.staging import lines
from tests.support import REPO, begin_run, two_phase
from twophase import operations as ops
from twophase.config import TwoPhaseConfig, load_config
from twophase.errors import ConfigError, TargetAuthError
from twophase.influx.query import query_v1
from twophase.model import EpochState
from twophase.spark.options import build_sink, parse_options
from twophase.targets import metering

PLAIN = "Zq9-SECRET-7c1f"
ODD = "Zq9/SECRET@7c1f%Qx"  # a URL's delimiters, and a "%" that starts no escape
WRONG = "Zq9-SECRET-wrong"  # what the servers refuse
KEY_PASSPHRASE = "Zq9-SECRET-sslkey"  # sslpassword: never used, never shown
# Every secret holds both: a piece of one cut anywhere still shows one of them.
MARKS = ("Zq9", "SECRET")
USER = "tp-admin"  # InfluxDB's user (its password: PLAIN)
SECRETS = (PLAIN, ODD, WRONG, KEY_PASSPHRASE)
# HTTP basic auth carries user:password in base64.
FORMS = (*MARKS, *(base64.b64encode(f"{USER}:{s}".encode()).decode() for s in SECRETS))
DB = "secrets"
SINK, FANNED = "one", "fanned"
SCRIPT = Path(sys.executable).with_name("twophase")


class AuthInflux(InfluxServer):
    """InfluxDB 1.x that refuses any request without a user's right password."""

    def _config(self) -> str:
        return super()._config().replace("[http]\n", "[http]\n  auth-enabled = true\n")

    def admin(self, statement: str) -> None:
        query_v1(self.url, None, statement, USER, PLAIN, method="POST")


@dataclass(frozen=True)
class Servers:
    pg: PostgresServer
    influx: AuthInflux
    root: Path

    def staging_url(self, password: str = ODD, encode: bool = False, port: int = 0) -> str:
        secret = quote(password, safe="") if encode else password  # raw: the last "@" ends it
        return f"postgresql+psycopg://twophase:{secret}@127.0.0.1:{port or self.pg.port}/{DB}"

    def query_url(self) -> str:
        """The password in the query, with a bare "%" libpq would refuse quoting it."""
        base = f"postgresql+psycopg://twophase@127.0.0.1:{self.pg.port}/{DB}"
        return f"{base}?password={ODD}&sslpassword={KEY_PASSPHRASE}"

    def file(self, name: str, text: str) -> str:
        path = self.root / name
        path.write_text(text + "\n")
        path.chmod(0o600)
        return str(path)

    def toml(self) -> str:
        url = self.staging_url(encode=True)
        return self.file(
            "twophase.toml",
            f'staging_url = "{url}"\ninflux_url = "{self.influx.url}"\ninflux_api = "v1"\n'
            f'influx_db = "{DB}"\ninflux_user = "{USER}"\ninflux_password = "{PLAIN}"',
        )

    def fanned_env(self) -> dict[str, str]:
        """Two targets on the one server: ``a``'s own password is wrong, ``b`` has the
        shared one (from a file)."""
        return {
            "TWOPHASE_STAGING_URL_FILE": self.file("staging-url", self.staging_url()),
            "TWOPHASE_TARGETS": f"a={self.influx.url},b={self.influx.url}",
            "TWOPHASE_INFLUX_API": "v1",
            "TWOPHASE_TARGET_USERNAME": USER,
            "TWOPHASE_TARGET_PASSWORD_FILE": self.file("influx-password", PLAIN),
            "TWOPHASE_TARGET_A_INFLUX_DB": f"{DB}_a",
            "TWOPHASE_TARGET_A_TARGET_PASSWORD": WRONG,
            "TWOPHASE_TARGET_B_INFLUX_DB": f"{DB}_b",
            "TWOPHASE_TARGET_B_TARGET_PASSWORD_FILE": self.file("b-password", PLAIN),
            "TWOPHASE_TARGET_DEADLINE": "1s",
            "TWOPHASE_TARGET_RETRY_DEADLINE": "2s",
        }


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    root = tmp_path_factory.mktemp("secrets")
    pg = PostgresServer(root / "pg", free_port())
    influx = AuthInflux(root / "influx", free_port())
    pg.start()
    influx.start()
    try:
        pg.set_password(ODD)
        pg.create_database(DB)
        # The first user of a server with authentication on may be made without it.
        query_v1(
            influx.url,
            None,
            f"CREATE USER \"{USER}\" WITH PASSWORD '{PLAIN}' WITH ALL PRIVILEGES",
            method="POST",
        )
        for name in (DB, f"{DB}_a", f"{DB}_b"):
            influx.admin(f'CREATE DATABASE "{name}"')
        yield Servers(pg, influx, root)
    finally:
        influx.stop()
        pg.destroy()


@dataclass
class Seen:
    """Everything the operations showed, by where it was shown."""

    texts: list[tuple[str, str]] = field(default_factory=list)

    def add(self, where: str, text: str) -> None:
        self.texts.append((where, text))

    def leaks(self) -> list[tuple[str, str]]:
        return [(where, form) for where, text in self.texts for form in FORMS if form in text]


def base_env() -> dict[str, str]:
    """This process's environment without any setting of twophase or libpq."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("TWOPHASE_", "PG"))}


def run_cli(seen: Seen, name: str, env: dict[str, str], *args: str) -> int:
    done = subprocess.run(
        [str(SCRIPT), *args],
        cwd=REPO,
        env=base_env() | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    seen.add(f"{name}: stdout", done.stdout)
    seen.add(f"{name}: stderr", done.stderr)
    return done.returncode


def cli_on_staging(servers: Servers, seen: Seen) -> None:
    """Every way in to the staging URL's password, against the right server, one that
    refuses it, one that is not there and a host that is not loopback."""
    url_file = servers.file("url-encoded", servers.staging_url(encode=True))
    broken = servers.file("broken.toml", f'staging_url = "{servers.staging_url()}\nx = 1')
    unreachable = servers.staging_url(PLAIN, port=free_port())
    # A name that is not loopback (at 127.0.0.1): verified TLS, which this server lacks,
    # unless the URL says otherwise (then a warning shows the URL, masked).
    remote = servers.staging_url().replace("127.0.0.1", REMOTE_NAME) + "?hostaddr=127.0.0.1"
    runs: list[tuple[str, dict[str, str], tuple[str, ...], int]] = [
        ("db upgrade", {"TWOPHASE_STAGING_URL": servers.staging_url()}, ("db", "upgrade"), 0),
        ("db current, _FILE", {"TWOPHASE_STAGING_URL_FILE": url_file}, ("db", "current"), 0),
        ("db current, query", {"TWOPHASE_STAGING_URL": servers.query_url()}, ("db", "current"), 0),
        ("status, query", {"TWOPHASE_STAGING_URL": servers.query_url()}, ("--debug", "status"), 0),
        ("status, wrong", {"TWOPHASE_STAGING_URL": servers.staging_url(WRONG)}, ("status",), 1),
        (
            "status, debug",
            {"TWOPHASE_STAGING_URL": servers.staging_url(WRONG)},
            ("--debug", "status"),
            1,
        ),
        (
            "status, unreachable",
            {"TWOPHASE_STAGING_URL": unreachable, "TWOPHASE_STAGING_CONNECT_TIMEOUT": "1s"},
            ("--json", "status"),
            1,
        ),
        ("status, not loopback", {"TWOPHASE_STAGING_URL": remote}, ("status",), 1),
        ("status, weak", {"TWOPHASE_STAGING_URL": remote + "&sslmode=disable"}, ("status",), 0),
        ("TOML broken", {"TWOPHASE_CONFIG": broken}, ("status",), 1),
        ("flag", {}, ("--staging-url", servers.staging_url(), "db", "history"), 0),
        ("flag after", {}, ("targets", "--staging-url", servers.query_url()), 0),
    ]
    for name, env, args, code in runs:
        assert run_cli(seen, name, env, *args) == code, seen.texts[-1]
    assert "sslmode=disable" in dict(seen.texts)["status, weak: stderr"]


def refused_at_load(servers: Servers, seen: Seen) -> None:
    """Settings refused when loaded: the message names the setting, never the value."""
    toml = {"TWOPHASE_CONFIG": servers.toml()}
    influx = servers.influx.url.replace("//", f"//{USER}:{quote(PLAIN, safe='')}@")
    refused = [
        toml | {"TWOPHASE_TARGET_PASSWORD": PLAIN + "\nsecond line"},
        toml | {"TWOPHASE_STAGING_URL": servers.staging_url() + "\r"},
        toml | {"TWOPHASE_TARGET_URL": influx},
        toml | {"TWOPHASE_TARGET_URL": f"{servers.influx.url}?p={ODD}"},
        {"TWOPHASE_STAGING_URL": servers.staging_url(), "TWOPHASE_TARGETS": influx},
        {"TWOPHASE_STAGING_URL": servers.staging_url(), "TWOPHASE_TARGETS": f"a={influx}"},
    ]
    for number, env in enumerate(refused):
        with pytest.raises(ConfigError) as caught:
            load_config(env=env)
        seen.add(f"refused setting {number}", f"{caught.value!s} {caught.value!r}")


def commits(servers: Servers, seen: Seen) -> None:
    """A sink configured by the TOML file: a commit InfluxDB takes, then one whose
    password (from the environment, over the file's) it refuses."""
    good = load_config(env={"TWOPHASE_CONFIG": servers.toml()})
    seen.add("config repr", repr(good))
    epoch(good, 0, seen)
    bad = load_config(env={"TWOPHASE_CONFIG": servers.toml(), "TWOPHASE_TARGET_PASSWORD": WRONG})
    with pytest.raises(TargetAuthError) as refused:
        epoch(bad, 1, seen)
    seen.add("refused commit", f"{refused.value!s} {refused.value!r} {refused.value.__cause__!r}")


def epoch(config: TwoPhaseConfig, number: int, seen: Seen, sink: str = SINK) -> Any:
    with two_phase(config.staging, config.target, serve_metrics=True) as tp:
        lease = begin_run(tp, sink, f"run-{number}", "query")
        staged = lines(number, 20)
        message = tp.stager.stage(sink, number, staged, run_id=lease.run_id, query_id="query")
        seen.add(f"commit message {number}", repr(message))
        outcome = tp.committer.commit(lease, number, [message])
        seen.add(f"outcome {number}", repr(outcome))
        return outcome


def fanned_out(servers: Servers, seen: Seen) -> None:
    """Two targets: ``a`` refuses its own password and is left lagging, ``b`` takes it."""
    env = servers.fanned_env() | {"TWOPHASE_METRICS_PORT": str(free_port())}
    outcome = epoch(load_config(env=env), 0, seen, sink=FANNED)
    assert outcome.state == EpochState.COMMITTED
    with urllib.request.urlopen(f"http://127.0.0.1:{env['TWOPHASE_METRICS_PORT']}/metrics") as got:
        seen.add("driver endpoint", got.read().decode())
    seen.add("driver registry", generate_latest(metering.REGISTRY).decode())


def cli_on_influx(servers: Servers, seen: Seen) -> None:
    """verify and recover read and write InfluxDB with the credentials: the file's, a
    variable's wrong one, a target's own wrong one."""
    toml = {"TWOPHASE_CONFIG": servers.toml()}
    fanned = servers.fanned_env()
    runs: list[tuple[str, dict[str, str], tuple[str, ...], int]] = [
        ("verify, TOML", toml, ("verify", "--sink", SINK, "--epoch", "0"), 0),
        (
            "verify, wrong",
            toml | {"TWOPHASE_TARGET_PASSWORD": WRONG},
            ("--debug", "verify", "--sink", SINK),
            2,
        ),
        (
            "recover, wrong",
            toml | {"TWOPHASE_TARGET_PASSWORD": WRONG},
            ("recover", "--force", "--json"),
            1,
        ),
        ("targets", fanned, ("targets", "--json"), 0),
        ("verify b", fanned, ("verify", "--sink", FANNED, "--target", "b"), 0),
        ("verify a", fanned, ("--debug", "verify", "--sink", FANNED, "--target", "a"), 2),
        ("status", fanned, ("status", "--json"), 0),
    ]
    for name, env, args, code in runs:
        assert run_cli(seen, name, env, *args) == code, seen.texts[-1]


def spark_options(servers: Servers, seen: Seen, monkeypatch: pytest.MonkeyPatch) -> None:
    """Secrets as sink options are refused; from the environment they stay out of the
    options shipped to executors."""
    given = [
        {"staging_url": servers.staging_url()},
        {"staging_url": servers.query_url()},
        {"target_password": PLAIN},
        {"INFLUX_TOKEN": PLAIN},
    ]
    for options in given:
        with pytest.raises(ConfigError) as refused:
            parse_options({"sink_id": "spark", "measurement": "m", **options})
        seen.add(f"option {sorted(options)}", f"{refused.value!s} {refused.value!r}")
    with pytest.raises(ConfigError) as refused:
        build_sink("spark", "dead_letters", None, {"influx_token": PLAIN})
    seen.add("foreachBatch keyword", str(refused.value))
    for name in [k for k in os.environ if k.startswith(("TWOPHASE_", "PG"))]:
        monkeypatch.delenv(name)
    for name, value in servers.fanned_env().items():
        monkeypatch.setenv(name, value)
    sink = parse_options({"sink_id": "spark", "measurement": "m", "min_targets": "1"})
    seen.add("sink options", f"{sink!r} {pickle.dumps(sink)!r}")


def tables_and_exporter(servers: Servers, seen: Seen) -> None:
    config = load_config(env={"TWOPHASE_CONFIG": servers.toml()})
    with psycopg.connect(config.staging.psycopg_conninfo()) as conn:
        names = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", ("twophase%",)
        ).fetchall()
        assert len(names) >= 9
        for (name,) in names:
            query = sql.SQL("SELECT t::text FROM {} AS t").format(sql.Identifier(name))
            rows = [row[0] for row in conn.execute(query)]
            seen.add(f"table {name}", "\n".join(rows))
        errors = conn.execute("SELECT last_error FROM twophase_sinks").fetchall()
        assert any("401" in (row[0] or "") for row in errors), errors  # the refusal is there
    exporter = ops.start_exporter(config.staging, port=0, host="127.0.0.1", live_window_s=600)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics") as got:
            seen.add("exporter", got.read().decode())
    finally:
        exporter.close()


def test_no_secret_shows_anywhere(
    servers: Servers, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG)
    seen = Seen()
    cli_on_staging(servers, seen)
    refused_at_load(servers, seen)
    commits(servers, seen)
    fanned_out(servers, seen)
    cli_on_influx(servers, seen)
    spark_options(servers, seen, monkeypatch)
    tables_and_exporter(servers, seen)
    for record in caplog.records:
        shown = logging.Formatter().format(record)  # the message, the traceback too
        seen.add(f"log {record.name}", shown)
    assert seen.leaks() == []
