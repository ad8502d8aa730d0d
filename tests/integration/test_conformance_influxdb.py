"""The InfluxDB kind passes the conformance kit against the dev env's InfluxDB 1.x.

The dev server runs without authentication: the bad-credentials check writes to an
influxd of this module's own that requires it (``auth-enabled = true``).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from devkit.faultproxy import wait_until
from devkit.ports import free_port
from tests.support import create_influx_database, drop_influx_database, influx_admin, unique
from twophase.config import InfluxDBSettings, Secret, TargetConfig
from twophase.influx.query import query_v1
from twophase.testing import TargetConformance
from twophase.testing.support import Case

PASSWORD = f"adm1n-{uuid.uuid4().hex}"


def _pings(url: str) -> bool:
    try:
        return urllib3.request("GET", f"{url}/ping", retries=False, timeout=1).status == 204
    except urllib3.exceptions.HTTPError:
        return False


@pytest.fixture(scope="module")
def secured_influx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TargetConfig]:
    """An influxd that requires credentials, its admin's settings (the right ones)."""
    root: Path = tmp_path_factory.mktemp("influxd-secured")
    http, rpc = free_port(), free_port()
    (root / "influxd.conf").write_text(
        f'reporting-disabled = true\nbind-address = "127.0.0.1:{rpc}"\n'
        f'[meta]\n  dir = "{root}/meta"\n'
        f'[data]\n  dir = "{root}/data"\n  wal-dir = "{root}/wal"\n'
        f'[http]\n  bind-address = "127.0.0.1:{http}"\n  auth-enabled = true\n'
        "  log-enabled = false\n"
    )
    binary = shutil.which("influxd") or "/usr/bin/influxd"
    with open(root / "log", "wb") as log:
        proc = subprocess.Popen(
            [binary, "-config", str(root / "influxd.conf")], stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{http}"
    try:
        assert wait_until(lambda: _pings(url), 30), (root / "log").read_text()[-2000:]
        influx_admin(url, f"CREATE USER admin WITH PASSWORD '{PASSWORD}' WITH ALL PRIVILEGES")
        query_v1(url, None, 'CREATE DATABASE "secured"', "admin", Secret(PASSWORD), method="POST")
        yield TargetConfig(
            url=url,
            username="admin",
            password=Secret(PASSWORD),
            influxdb=InfluxDBSettings(api="v1", database="secured"),
        )
    finally:
        proc.terminate()
        proc.wait(timeout=15)


class TestInfluxDB1Conformance(TargetConformance):
    @pytest.fixture
    def target(self, influx: TargetConfig) -> TargetConfig:
        return influx  # a database of the test's own (tests/integration/conftest.py)

    @pytest.fixture
    def second_target(self, influx: TargetConfig) -> Iterator[TargetConfig]:
        other = TargetConfig(
            url=influx.url, influxdb=InfluxDBSettings(api="v1", database=unique("tp_other"))
        )
        create_influx_database(influx.url, str(other.influxdb.database))
        yield other
        drop_influx_database(influx.url, str(other.influxdb.database))

    def test_bad_credentials_are_an_auth_error(
        self, target: TargetConfig, case: Case, secured_influx: TargetConfig
    ) -> None:
        self.secured = secured_influx
        super().test_bad_credentials_are_an_auth_error(target, case)

    def bad_credentials(self, config: TargetConfig) -> TargetConfig | None:
        """The secured server's admin with a wrong password (the kit's default)."""
        right = dataclasses.replace(self.secured, timeout_s=config.timeout_s)
        return super().bad_credentials(right)
