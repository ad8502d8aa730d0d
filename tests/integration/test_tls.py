"""TLS to both servers, with a CA the test kit makes: PostgreSQL with sslmode=verify-full
and a client certificate, InfluxDB over https. Certificate problems fail at once with
a ConfigError naming the setting to fix, and no secret in any message or CLI output. A
host that is not loopback (a name the certificate lists, reached at 127.0.0.1 through
libpq's hostaddr) is verified against the system's CAs unless its URL chooses a weaker
sslmode, which is honoured and warned of once."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from devkit.ports import free_port
from scripts.tlskit import REMOTE_NAME, HttpsInflux, Kit, TlsPostgres, make_kit
from tests.staging import lines
from tests.support import REPO, begin_run, two_phase
from twophase.config import (
    StagingConfig,
    TargetConfig,
    load_setting,
    load_staging_config,
    load_target_config,
    sslmode,
)
from twophase.errors import ConfigError
from twophase.influx.query import query_v1
from twophase.model import EpochState
from twophase.protocol.commit.runtime import TwoPhase
from twophase.store.database import Database

PASSWORD = "Tls-Pg-Secret-31337"  # the staging role's password: must appear nowhere
INFLUX_PASSWORD = "Tls-Influx-Secret-27182"
DATABASE = "tls"
SINK = "tls-sink"
FAST_S = 5.0  # a certificate error comes well inside this (the retry deadline is 60 s)


@dataclass(frozen=True)
class Servers:
    kit: Kit
    postgres: TlsPostgres
    influx: HttpsInflux

    def staging(self, host: str = "localhost", **settings: str) -> StagingConfig:
        url = self.postgres.tls_url_for(DATABASE, host)
        files = {
            "staging_tls_ca": str(self.kit.ca),
            "staging_tls_cert": str(self.kit.client_cert),
            "staging_tls_key": str(self.kit.client_key),
        }
        given = {**files, "staging_connect_timeout": "20s", **settings}
        return load_staging_config(env={}, staging_url=url, **{k: v for k, v in given.items() if v})

    def influx_config(self, host: str = "localhost", **settings: str) -> TargetConfig:
        url = self.influx.url.replace("localhost", host)
        given = {"target_tls_ca": str(self.kit.ca), "target_retry_deadline": "60s", **settings}
        return load_target_config(
            env={},
            target_url=url,
            influx_api="v1",
            influx_db=DATABASE,
            target_username="writer",
            target_password=INFLUX_PASSWORD,
            **given,
        )

    def env(self) -> dict[str, str]:
        """The TWOPHASE_* variables of a process using both servers over TLS."""
        staging, influx = self.staging(), self.influx_config()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_")}
        return env | {
            "TWOPHASE_STAGING_URL": staging.url.reveal(),
            "TWOPHASE_STAGING_TLS_CA": str(self.kit.ca),
            "TWOPHASE_STAGING_TLS_CERT": str(self.kit.client_cert),
            "TWOPHASE_STAGING_TLS_KEY": str(self.kit.client_key),
            "TWOPHASE_TARGET_URL": influx.url,
            "TWOPHASE_INFLUX_API": "v1",
            "TWOPHASE_INFLUX_DB": DATABASE,
            "TWOPHASE_TARGET_USERNAME": "writer",
            "TWOPHASE_TARGET_PASSWORD": INFLUX_PASSWORD,
            "TWOPHASE_TARGET_TLS_CA": str(self.kit.ca),
        }


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    root = tmp_path_factory.mktemp("tls")
    kit = make_kit(root / "kit")
    postgres = TlsPostgres(root / "pg", free_port(), kit)
    influx = HttpsInflux(root / "influx", free_port(), kit)
    postgres.start()
    influx.start()
    try:
        postgres.create_database(DATABASE)
        postgres.set_password(PASSWORD)
        influx.create_database(DATABASE)
        found = Servers(kit, postgres, influx)
        upgrade = cli(found.env(), "-m", "alembic", "upgrade", "head")
        assert upgrade.returncode == 0, upgrade.stderr
        yield found
    finally:
        influx.stop()
        postgres.destroy()


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``<args>`` from the repository root, ``python`` first unless it is a command."""
    command = list(args) if Path(args[0]).is_absolute() else [sys.executable, *args]
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def twophase_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``twophase`` command, as an operator runs it."""
    return cli(env, str(Path(sys.executable).with_name("twophase")), *args)


def no_secret(*texts: str) -> bool:
    return not any(secret in text for text in texts for secret in (PASSWORD, INFLUX_PASSWORD))


def epoch(tp: TwoPhase, number: int) -> Any:
    lease = begin_run(tp, SINK, "r1", "q1")
    message = tp.stager.stage(SINK, number, lines(number, 25), run_id="r1", query_id="q1")
    return lease, message


def test_the_protocol_runs_over_tls_both_ways(servers: Servers) -> None:
    with two_phase(servers.staging(), servers.influx_config()) as tp:
        lease, message = epoch(tp, 0)
        assert tp.committer.commit(lease, 0, [message]).state == EpochState.COMMITTED
        with tp.db.transaction() as cur:
            cur.execute("SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            assert cur.fetchone() == (True, "/CN=twophase")
    tls = {"ca_certs": str(servers.kit.ca)}
    counted = query_v1(servers.influx.url, DATABASE, "SELECT count(v) FROM proto", tls=tls)
    assert counted[0]["values"][0][1] == 25
    status = twophase_cli(servers.env(), "--json", "status", "--sink", SINK)
    assert status.returncode == 0, status.stderr
    assert no_secret(status.stdout, status.stderr)


@pytest.mark.parametrize(
    ("host", "settings", "option"),
    [
        ("localhost", {"staging_tls_ca": "wrong"}, "TWOPHASE_STAGING_TLS_CA"),
        ("127.0.0.1", {}, "TWOPHASE_STAGING_URL"),  # the certificate names localhost only
        ("localhost", {"staging_tls_cert": "", "staging_tls_key": ""}, "TWOPHASE_STAGING_TLS_CERT"),
    ],
    ids=["wrong CA", "host name mismatch", "no client certificate"],
)
def test_a_staging_certificate_problem_fails_at_once_naming_the_setting(
    servers: Servers, host: str, settings: dict[str, str], option: str
) -> None:
    if settings.get("staging_tls_ca") == "wrong":
        settings = {"staging_tls_ca": str(servers.kit.wrong_ca)}
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        two_phase(servers.staging(host, **settings), servers.influx_config()).__enter__()
    assert time.monotonic() - started < FAST_S  # not the 20 s connect timeout
    assert refused.value.option == option, str(refused.value)
    assert no_secret(str(refused.value))


@pytest.mark.parametrize(
    ("host", "wrong_ca", "option"),
    [("localhost", True, "TWOPHASE_TARGET_TLS_CA"), ("127.0.0.1", False, "TWOPHASE_TARGET_URL")],
    ids=["wrong CA", "host name mismatch"],
)
def test_an_influx_certificate_problem_fails_the_promotion_at_once(
    servers: Servers, host: str, wrong_ca: bool, option: str
) -> None:
    settings = {"target_tls_ca": str(servers.kit.wrong_ca)} if wrong_ca else {}
    with two_phase(servers.staging(), servers.influx_config(host, **settings)) as tp:
        lease, message = epoch(tp, 1 if wrong_ca else 2)
        started = time.monotonic()
        with pytest.raises(ConfigError) as refused:
            tp.committer.commit(lease, message.epoch, [message])
        assert time.monotonic() - started < FAST_S  # not after influx_retry_deadline (60 s)
        assert refused.value.option == option, str(refused.value)
        assert no_secret(str(refused.value))
        assert tp.ledger.pending(SINK) == [message.epoch]  # decided; a fixed setting recovers
        good = replace(servers.influx_config(), tls_ca=str(servers.kit.ca))
    with two_phase(servers.staging(), good) as tp:
        assert [r.epoch for r in tp.committer.recover(lease)] == [message.epoch]


@pytest.mark.parametrize(
    ("variable", "wrong", "option"),
    [
        ("TWOPHASE_STAGING_TLS_CA", "wrong_ca", "TWOPHASE_STAGING_TLS_CA"),
        ("TWOPHASE_TARGET_TLS_CA", "wrong_ca", "TWOPHASE_TARGET_TLS_CA"),
        ("TWOPHASE_STAGING_TLS_CA", "/nonexistent/ca.crt", "TWOPHASE_STAGING_TLS_CA"),
        ("TWOPHASE_STAGING_TLS_KEY", "", "TWOPHASE_STAGING_TLS_KEY"),
    ],
    ids=["staging wrong CA", "influx wrong CA", "missing CA file", "certificate without key"],
)
def test_the_cli_names_the_setting_in_one_line_without_secrets(
    servers: Servers, variable: str, wrong: str, option: str
) -> None:
    env = servers.env()
    env[variable] = str(servers.kit.wrong_ca) if wrong == "wrong_ca" else wrong
    command = ("verify", "--sink", SINK) if "TARGET" in variable else ("status",)
    done = twophase_cli(env, *command)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert option in errors[0], errors[0]
    assert no_secret(done.stdout, done.stderr)


def test_a_ca_file_that_holds_no_certificate_is_refused_naming_it(
    servers: Servers, tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigError) as refused:
        two_phase(servers.staging(staging_tls_ca=str(garbage)), servers.influx_config()).__enter__()
    assert refused.value.option == "TWOPHASE_STAGING_TLS_CA"
    with pytest.raises(ConfigError, match="is not a readable file") as missing:
        load_setting("target_tls_ca", {"TWOPHASE_TARGET_TLS_CA": str(tmp_path / "none.pem")})
    assert missing.value.option == "TWOPHASE_TARGET_TLS_CA"


# --- a host that is not loopback: verified TLS unless its URL says otherwise ------------


def remote_staging(servers: Servers, query: str = "") -> StagingConfig:
    """The TLS server by a name that is not loopback (``REMOTE_NAME``, reached at
    127.0.0.1 through libpq's hostaddr: the certificate is checked against the name),
    with the client certificate the server wants and no CA given."""
    url = servers.postgres.tls_url_for(DATABASE, REMOTE_NAME) + "?hostaddr=127.0.0.1" + query
    files = {
        "staging_tls_cert": str(servers.kit.client_cert),
        "staging_tls_key": str(servers.kit.client_key),
    }
    return load_staging_config(env={}, staging_url=url, staging_connect_timeout="20s", **files)


def tls_in_use(config: StagingConfig) -> bool:
    with Database(config) as db, db.transaction() as cur:
        cur.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        return bool(cur.fetchone()[0])


@pytest.fixture
def libpq_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """No libpq variable that would choose for twophase, and no URL warned of yet."""
    for name in ("PGSSLMODE", "PGSSLROOTCERT", "PGHOST", "PGHOSTADDR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sslmode, "_warned", set())


@pytest.mark.usefixtures("libpq_defaults")
def test_a_host_that_is_not_loopback_is_verified_against_the_systems_cas(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = remote_staging(servers)
    assert "sslmode=verify-full" in config.psycopg_conninfo()
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:  # the test CA is not one of the system's
        Database(config)
    assert time.monotonic() - started < FAST_S
    assert refused.value.option == "TWOPHASE_STAGING_TLS_CA", str(refused.value)
    assert no_secret(str(refused.value))
    # The system's CAs as OpenSSL's variable names them: trusted now, the name matches.
    monkeypatch.setenv("SSL_CERT_FILE", str(servers.kit.ca))
    assert tls_in_use(config)


@pytest.mark.usefixtures("libpq_defaults")
def test_a_weaker_sslmode_written_for_it_is_honoured_with_one_warning(
    servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="twophase")
    config = remote_staging(servers, "&sslmode=require")  # encrypted, the server unchecked
    assert tls_in_use(config) and tls_in_use(config)
    warnings = [r.getMessage() for r in caplog.records if r.name == "twophase.config.sslmode"]
    assert len(warnings) == 1, warnings
    assert "sslmode=require" in warnings[0] and REMOTE_NAME in warnings[0]
    assert no_secret(*warnings)
    with two_phase(servers.staging(), servers.influx_config()) as tp:
        begin_run(tp, SINK, "r1", "q1")  # the sink status reads, whichever test runs first
    env = servers.env() | {"TWOPHASE_STAGING_URL": config.url.reveal()}
    del env["TWOPHASE_STAGING_TLS_CA"]
    status = twophase_cli(env, "status", "--sink", SINK)
    assert status.returncode == 0, status.stderr
    shown = [line for line in status.stderr.splitlines() if "sslmode=require" in line]
    assert len(shown) == 1 and shown[0].startswith("twophase: warning: TWOPHASE_STAGING_URL")
    assert no_secret(status.stdout, status.stderr)
