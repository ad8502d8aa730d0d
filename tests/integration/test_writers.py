"""The writers, the sender and API detection against real InfluxDB 1.x and VictoriaMetrics.

Faults are real too: a TCP proxy (devkit/faultproxy.py) in front of InfluxDB cuts,
stalls or drops replies, and InfluxDB itself rejects points, databases and
credentials. Every test uses its own database (the ``influx`` fixture) and
bounds its waits.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from devkit.faultproxy import CUT, DROP_REPLY, PASS, STALL, FaultProxy, wait_until
from devkit.ports import start_own_victoria_metrics
from tests.fakes import LineSender
from tests.support import begin_run, create_influx_database, drop_influx_database, two_phase
from twophase.config import InfluxDBSettings, Secret, StagingConfig, TargetConfig
from twophase.errors import (
    ConfigError,
    TargetAuthError,
    TargetNotFoundError,
    TargetRequestError,
    TargetUnavailableError,
    TransientWriteError,
)
from twophase.influx.api import AutoWriter, make_writer, resolve_api
from twophase.influx.query import query_v1
from twophase.influx.writers import V1Writer, V2Writer
from twophase.model import EpochState
from twophase.operations.store_only import dead_letters
from twophase.points.builder import PointBuilder, PointSpec, Rejected
from twophase.targets.sender import BatchSender, RetryEvent

T0 = 1_700_000_000_000_000_000


def points(n: int, measurement: str = "m", start: int = T0) -> list[str]:
    return [f"{measurement},host=h{i % 4} f={i}i {start + i * 1_000_000}" for i in range(n)]


def values(config: TargetConfig) -> list[list[Any]]:
    """[time, f] of every point of measurement m, in time order."""
    series = query_v1(config.url, config.influxdb.database, 'SELECT "f" FROM "m"')
    return [row for s in series for row in s["values"]]


def sender(
    writer: Any,
    deadline_s: float = 30,
    events: list[RetryEvent] | None = None,
    max_points: int = 5000,
) -> LineSender:
    """Fast retries; lines in batches of ``max_points`` (see LineSender)."""
    callback = events.append if events is not None else None
    retry = {"retry_initial_s": 0.05, "retry_max_s": 0.5, "retry_deadline_s": deadline_s}
    config = TargetConfig(url="http://unused", **retry)
    return LineSender(BatchSender(writer, config, on_attempt_failed=callback), max_points)


@pytest.fixture
def influx(influx_url: str) -> Iterator[TargetConfig]:
    """A fresh database of its own."""
    name = f"tw_{uuid.uuid4().hex[:12]}"
    create_influx_database(influx_url, name)
    yield TargetConfig(url=influx_url, influxdb=InfluxDBSettings(api="v1", database=name))
    drop_influx_database(influx_url, name)


# --- InfluxDB 1.x ---------------------------------------------------------------------


def test_v1_round_trip_is_exact_and_resending_changes_nothing(influx: TargetConfig) -> None:
    lines = [
        f'm,host=a,isp=big\\ isp bytes=10i,rate=0.25,ok=true,note="x \\"q\\"" {T0}',
        f"m,host=b,isp=small bytes=-3i,rate=1e-3,ok=false {T0 + 1}",
    ]
    writer = V1Writer(influx)
    for _ in range(2):
        writer.write("\n".join(lines).encode())
    writer.close()
    series = query_v1(influx.url, influx.influxdb.database, 'SELECT * FROM "m" GROUP BY *')
    got = {
        s["tags"]["host"]: (
            s["tags"],
            dict(zip(s["columns"], s["values"][0], strict=True)),
            len(s["values"]),
        )
        for s in series
    }
    assert got["a"] == (
        {"host": "a", "isp": "big isp"},
        {"time": T0, "bytes": 10, "rate": 0.25, "ok": True, "note": 'x "q"'},
        1,
    )
    assert got["b"] == (
        {"host": "b", "isp": "small"},
        {"time": T0 + 1, "bytes": -3, "rate": 0.001, "ok": False, "note": None},
        1,
    )


def gzip_members(lines: list[str], parts: int) -> bytes:
    """``lines`` cut into ``parts`` runs, each compressed into a gzip member holding its
    last newline, the members end to end: a body as promotion sends staged chunks."""
    size = -(-len(lines) // parts)
    runs = [lines[i : i + size] for i in range(0, len(lines), size)]
    return b"".join(gzip.compress(("\n".join(run) + "\n").encode()) for run in runs)


def test_v1_takes_gzip_members_end_to_end_as_one_body(influx: TargetConfig) -> None:
    lines = points(30)
    writer = V1Writer(influx)
    writer.write(gzip_members(lines, 3), gzipped=True)
    writer.close()
    assert values(influx) == [[T0 + i * 1_000_000, i] for i in range(30)]


def test_field_type_conflict_is_isolated_and_the_rest_delivered(influx: TargetConfig) -> None:
    writer = V1Writer(influx)
    writer.write(f"m f=1i {T0}".encode())  # f is now an integer field in InfluxDB
    lines = points(40, start=T0 + 1000)
    lines[13] = f"m,host=h1 f=1.5 {T0 + 5}"  # float into an integer field
    lines[30] = "m,host=h2 f= 12"  # does not parse
    rejected = sender(writer, max_points=16).send(lines)
    assert [i for i, _ in rejected] == [13, 30]
    assert rejected[0][1] == (
        'partial write: field type conflict: input field "f" on measurement "m" is type '
        "float, already exists as type integer dropped=1"
    )
    assert rejected[1][1] == "unable to parse 'm,host=h2 f= 12': missing field value"
    expected = [[T0, 1]] + [[T0 + 1000 + i * 1_000_000, i] for i in range(40) if i not in (13, 30)]
    assert values(influx) == expected


def test_missing_database_is_not_found(influx: TargetConfig) -> None:
    missing = influx.with_fields(database=f"nope_{uuid.uuid4().hex[:8]}")
    with pytest.raises(TargetNotFoundError) as caught:
        V1Writer(missing).write(b"m f=1i 1")
    assert str(caught.value).startswith(f"database not found: {missing.influxdb.database!r}")
    assert "TWOPHASE_INFLUX_DB" in str(caught.value)


def test_missing_retention_policy_is_not_found_and_not_retried(influx: TargetConfig) -> None:
    events: list[RetryEvent] = []
    writer = V1Writer(influx.with_fields(retention_policy="nope"))
    with pytest.raises(TargetNotFoundError, match="TWOPHASE_INFLUX_RP"):
        sender(writer, events=events).send(points(3))
    assert events == []


def test_v2_api_on_influxdb_16_is_not_found_with_a_hint(influx: TargetConfig) -> None:
    config = influx.with_fields(api="v2", bucket=influx.influxdb.database, org="-")
    with pytest.raises(TargetNotFoundError, match="TWOPHASE_INFLUX_API=v1"):
        V2Writer(config).write(b"m f=1i 1")


def test_resolve_api_on_influxdb(influx: TargetConfig) -> None:
    auto = influx.with_fields(api="auto")
    assert resolve_api(auto).influxdb.api == "v1"
    writer = make_writer(auto)  # resolved at the first write
    writer.write(f"m f=7i {T0}".encode())
    assert values(influx) == [[T0, 7]]
    assert isinstance(writer, AutoWriter)
    assert isinstance(writer._inner, V1Writer)


def test_auto_api_while_influxdb_is_down_is_retried_not_fatal(influx: TargetConfig) -> None:
    """make_writer does not ping: an outage at process start is retried like any other."""
    down = influx.with_fields(url=f"http://127.0.0.1:{free_port()}", api="auto")
    writer = make_writer(down)
    with pytest.raises(TargetUnavailableError):
        writer.write(b"m f=1i 1")


def test_resolve_api_unreachable() -> None:
    with pytest.raises(TargetUnavailableError):
        resolve_api(
            TargetConfig(
                url=f"http://127.0.0.1:{free_port()}", influxdb=InfluxDBSettings(database="x")
            )
        )


# --- credentials: a dedicated influxd with auth-enabled = true ------------------------

ADMIN_PASSWORD = "adm1n-" + uuid.uuid4().hex


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def auth_influx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("influxd") or "/usr/bin/influxd"
    if not os.path.exists(binary):
        pytest.fail("influxd is not installed; the auth tests need their own server")
    root: Path = tmp_path_factory.mktemp("influxd-auth")
    http, rpc = free_port(), free_port()
    (root / "influxd.conf").write_text(
        f'reporting-disabled = true\nbind-address = "127.0.0.1:{rpc}"\n'
        f'[meta]\n  dir = "{root}/meta"\n'
        f'[data]\n  dir = "{root}/data"\n  wal-dir = "{root}/wal"\n  query-log-enabled = false\n'
        f'[http]\n  bind-address = "127.0.0.1:{http}"\n  auth-enabled = true\n'
        "  log-enabled = false\n"
    )
    with open(root / "log", "wb") as log:
        proc = subprocess.Popen(
            [binary, "-config", str(root / "influxd.conf")], stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{http}"
    try:
        assert wait_until(lambda: _pings(url), timeout_s=30), (root / "log").read_text()[-2000:]
        query_v1(
            url,
            None,
            f"CREATE USER admin WITH PASSWORD '{ADMIN_PASSWORD}' WITH ALL PRIVILEGES",
            method="POST",
        )
        for q in (
            "CREATE DATABASE secured",
            "CREATE USER reader WITH PASSWORD 'reader-pw'",
            "GRANT READ ON secured TO reader",
        ):
            query_v1(url, None, q, "admin", ADMIN_PASSWORD, method="POST")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _pings(url: str) -> bool:
    try:
        return urllib3.request("GET", f"{url}/ping", timeout=1, retries=False).status == 204
    except urllib3.exceptions.HTTPError:
        return False


def _secured(url: str, username: str | None, password: str | None) -> TargetConfig:
    return TargetConfig(
        url=url,
        username=username,
        password=Secret(password) if password is not None else None,
        influxdb=InfluxDBSettings(api="v1", database="secured"),
    )


def test_wrong_password_is_401_auth_error_without_the_password(auth_influx: str) -> None:
    wrong = "Wr0ng-" + uuid.uuid4().hex
    with pytest.raises(TargetAuthError) as caught:
        V1Writer(_secured(auth_influx, "admin", wrong)).write(b"m f=1i 1")
    message = str(caught.value)
    assert "401" in message and "authorization failed" in message
    assert "TWOPHASE_TARGET_USERNAME" in message and "TWOPHASE_TARGET_PASSWORD" in message
    assert wrong not in message and wrong not in repr(caught.value)


def test_no_credentials_is_401(auth_influx: str) -> None:
    with pytest.raises(TargetAuthError, match="unable to parse authentication credentials"):
        V1Writer(_secured(auth_influx, None, None)).write(b"m f=1i 1")


def test_missing_write_privilege_is_403(auth_influx: str) -> None:
    events: list[RetryEvent] = []
    with pytest.raises(TargetAuthError, match="403") as caught:
        sender(V1Writer(_secured(auth_influx, "reader", "reader-pw")), events=events).send(
            points(2)
        )
    assert "reader-pw" not in str(caught.value) and events == []


def test_right_credentials_write_and_read(auth_influx: str) -> None:
    config = _secured(auth_influx, "admin", ADMIN_PASSWORD)
    assert resolve_api(config.with_fields(api="auto")).influxdb.api == "v1"
    assert sender(V1Writer(config)).send(points(3, "authed")) == []
    series = query_v1(
        auth_influx, "secured", 'SELECT COUNT("f") FROM "authed"', "admin", Secret(ADMIN_PASSWORD)
    )
    assert series[0]["values"][0][1] == 3


# --- VictoriaMetrics through /api/v2/write --------------------------------------------


def vm_export(vm_url: str, metric: str) -> list[dict[str, Any]]:
    pool = urllib3.PoolManager(retries=False, timeout=5)
    pool.request("GET", f"{vm_url}/internal/force_flush")
    query = urllib.parse.urlencode({"match[]": f'{{__name__="{metric}"}}'})
    body = pool.request("GET", f"{vm_url}/api/v1/export?{query}").data.decode()
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def test_v2_writer_against_victoria_metrics(vm_url: str) -> None:
    measurement = f"tp_{uuid.uuid4().hex[:10]}"
    now_ms = time.time_ns() // 1_000_000  # VM keeps ms and drops data older than its retention
    lines = [
        f"{measurement},host=h{i} f={i}i,g={i / 2} {(now_ms - i * 1000) * 1_000_000}"
        for i in range(5)
    ]
    config = TargetConfig(
        url=vm_url, influxdb=InfluxDBSettings(api="v2", bucket="b", org="o", token=Secret("unused"))
    )
    writer = V2Writer(config)
    assert sender(writer).send(lines) == []
    writer.close()
    assert wait_until(lambda: len(vm_export(vm_url, f"{measurement}_f")) == 5, timeout_s=20)
    got = {
        s["metric"]["host"]: (s["values"], s["timestamps"])
        for s in vm_export(vm_url, f"{measurement}_f")
    }
    assert got == {f"h{i}": ([i], [now_ms - i * 1000]) for i in range(5)}
    assert {s["metric"]["host"]: s["values"] for s in vm_export(vm_url, f"{measurement}_g")} == {
        f"h{i}": [i / 2] for i in range(5)
    }


def test_v2_writer_sends_gzip_members_end_to_end_to_victoria_metrics(vm_url: str) -> None:
    measurement = f"tp_{uuid.uuid4().hex[:10]}"
    now_ms = time.time_ns() // 1_000_000
    lines = [f"{measurement},host=h{i} f={i}i {(now_ms - i * 1000) * 1_000_000}" for i in range(9)]
    config = TargetConfig(
        url=vm_url, influxdb=InfluxDBSettings(api="v2", bucket="b", org="o", token=Secret("unused"))
    )
    writer = V2Writer(config)
    writer.write(gzip_members(lines, 3), gzipped=True)
    writer.close()
    assert wait_until(lambda: len(vm_export(vm_url, f"{measurement}_f")) == 9, timeout_s=20)
    got = {s["metric"]["host"]: s["values"] for s in vm_export(vm_url, f"{measurement}_f")}
    assert got == {f"h{i}": [i] for i in range(9)}


def test_resolve_api_on_victoria_metrics_asks_for_an_explicit_api(vm_url: str) -> None:
    ping = urllib3.request("GET", f"{vm_url}/ping", retries=False, timeout=5)
    assert ping.status == 204 and "X-Influxdb-Version" not in ping.headers
    with pytest.raises(ConfigError) as caught:
        resolve_api(TargetConfig(url=vm_url, influxdb=InfluxDBSettings(bucket="b", org="o")))
    assert caught.value.option == "TWOPHASE_INFLUX_API"
    assert (
        resolve_api(
            TargetConfig(url=vm_url, influxdb=InfluxDBSettings(api="v2", bucket="b", org="o"))
        ).influxdb.api
        == "v2"
    )


# --- a re-sent body on VictoriaMetrics -------------------------------------------------
# A point re-sent to InfluxDB overwrites itself; VictoriaMetrics stores every sample it
# is sent unless started with -dedup.minScrapeInterval, then keeps one per series and
# interval. The dev server runs with 1ms (devkit/servers.py), its timestamps' precision.


def vm_flags(vm_url: str) -> dict[str, str]:
    """The flags VictoriaMetrics was started with (its /flags lists only those set)."""
    body = urllib3.request("GET", f"{vm_url}/flags", retries=False, timeout=5).data.decode()
    pairs = (line.lstrip("-").split("=", 1) for line in body.splitlines() if "=" in line)
    return {name: value.strip('"') for name, value in pairs}


def require_dedup(vm_url: str) -> None:
    if vm_flags(vm_url).get("dedup.minScrapeInterval", "0s") in ("0s", "0"):
        pytest.fail(
            f"VictoriaMetrics at {vm_url} runs without -dedup.minScrapeInterval (started "
            "before devkit set it?): restart it, `scripts/dev.sh stop` then "
            "`scripts/dev.sh start`",
            pytrace=False,
        )


def vm_counted(vm_url: str, metric: str) -> int:
    """The samples of ``metric`` in the last hour as a query counts them: what a
    dashboard reads (deduplicated at query time when the server dedups)."""
    urllib3.request("GET", f"{vm_url}/internal/force_flush", retries=False, timeout=5)
    expr = f'sum(count_over_time({{__name__="{metric}"}}[1h]))'
    reply = urllib3.request(
        "GET", f"{vm_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=5
    )
    result = json.loads(reply.data)["data"]["result"]
    return int(result[0]["value"][1]) if result else 0


def vm_exported(vm_url: str, metric: str) -> int:
    """The samples of ``metric`` /api/v1/export returns (deduplicated when the server dedups)."""
    return sum(len(series["values"]) for series in vm_export(vm_url, metric))


def recent_lines(measurement: str, n: int) -> list[str]:
    """n points of distinct series and milliseconds (VictoriaMetrics keeps ms), recent
    enough for any retention."""
    now_ms = time.time_ns() // 1_000_000
    return [
        f"{measurement},host=h{i % 4} f={i}i {(now_ms - 60_000 + i) * 1_000_000}" for i in range(n)
    ]


def v2_config(vm_url: str) -> TargetConfig:
    return TargetConfig(
        url=vm_url, influxdb=InfluxDBSettings(api="v2", bucket="b", org="o", token=Secret("unused"))
    )


def write_twice(vm_url: str, body: bytes) -> None:
    """The same body through twophase's v2 writer twice: a promotion re-sent whole."""
    writer = make_writer(v2_config(vm_url))
    try:
        writer.write(body)
        writer.write(gzip.compress(body), gzipped=True)  # a re-send as staged: gzip
    finally:
        writer.close()


@pytest.fixture(scope="module")
def vm_without_dedup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A VictoriaMetrics of this module's own, without -dedup.minScrapeInterval."""
    server = start_own_victoria_metrics(tmp_path_factory.mktemp("vm"), dedup_interval=None)
    try:
        yield server.url
    finally:
        server.stop()


def test_a_resent_body_counts_once_on_victoria_metrics_with_dedup(vm_url: str) -> None:
    require_dedup(vm_url)
    measurement = f"tp_{uuid.uuid4().hex[:10]}"
    write_twice(vm_url, "\n".join(recent_lines(measurement, 20)).encode())
    metric = f"{measurement}_f"
    assert wait_until(lambda: vm_counted(vm_url, metric) >= 20, timeout_s=20)
    assert (vm_counted(vm_url, metric), vm_exported(vm_url, metric)) == (20, 20)


def test_victoria_metrics_without_dedup_keeps_a_resent_body_twice(vm_without_dedup: str) -> None:
    measurement = f"tp_{uuid.uuid4().hex[:10]}"
    write_twice(vm_without_dedup, "\n".join(recent_lines(measurement, 20)).encode())
    metric = f"{measurement}_f"
    assert wait_until(lambda: vm_counted(vm_without_dedup, metric) >= 40, timeout_s=20)
    assert (vm_counted(vm_without_dedup, metric), vm_exported(vm_without_dedup, metric)) == (
        40,
        40,
    )


def test_two_values_at_one_timestamp_keep_one_on_victoria_metrics_with_dedup(
    vm_url: str,
) -> None:
    """Not a later write's overwrite as in InfluxDB: one of the two is kept, which one
    is the server's choice (the biggest in current releases; either, tested with 1.79)."""
    require_dedup(vm_url)
    measurement = f"tp_{uuid.uuid4().hex[:10]}"
    (line,) = recent_lines(measurement, 1)
    writer = make_writer(v2_config(vm_url))
    writer.write(line.replace("f=0i", "f=1i").encode())
    writer.write(line.replace("f=0i", "f=2i").encode())
    writer.close()
    metric = f"{measurement}_f"
    assert wait_until(lambda: vm_counted(vm_url, metric) >= 1, timeout_s=20)
    assert vm_counted(vm_url, metric) == 1
    (series,) = vm_export(vm_url, metric)
    assert len(series["values"]) == 1 and series["values"][0] in (1, 2)


@pytest.mark.parametrize(("dedup", "copies"), [(True, 1), (False, 3)], ids=["dedup", "no-dedup"])
def test_an_epoch_sent_three_times_to_victoria_metrics(
    staging: StagingConfig, request: pytest.FixtureRequest, dedup: bool, copies: int
) -> None:
    """A committed epoch re-sent twice through the promoter (as an operator's resend, or
    a promotion a crash cut and repeated): counted once with dedup, thrice without."""
    vm = request.getfixturevalue("vm_url" if dedup else "vm_without_dedup")
    if dedup:
        require_dedup(vm)
    measurement = f"tp_{uuid.uuid4().hex[:10]}"
    lines = recent_lines(measurement, 50)
    influx = dataclasses.replace(v2_config(vm), retry_deadline_s=10, retry_initial_s=0.05)
    with two_phase(staging, influx) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        staged = [
            tp.stager.stage("s", 0, part, partition_id=i, run_id="r1", query_id="q1")
            for i, part in enumerate((lines[:25], lines[25:]))
        ]
        assert tp.committer.commit(lease, 0, staged).state == EpochState.COMMITTED
        for _ in range(2):
            assert next(iter(tp.deliveries.values())).send(tp.reader.plan("s", 0)) == (50, 0)
    metric = f"{measurement}_f"
    assert wait_until(lambda: vm_counted(vm, metric) >= 50 * copies, timeout_s=20)
    assert (vm_counted(vm, metric), vm_exported(vm, metric)) == (50 * copies, 50 * copies)


@pytest.mark.parametrize("allowed", [False, True], ids=["default", "allow_newlines"])
def test_a_string_value_cannot_inject_a_point_into_victoria_metrics(
    staging: StagingConfig, vm_url: str, allowed: bool
) -> None:
    """VictoriaMetrics ends a line at every newline, even inside a quoted string: a
    value holding a newline and a line of its own would add that line's point. By
    default the row is a dead letter and nothing of it is sent; allowed (for InfluxDB
    targets only) the injected point does reach VictoriaMetrics, which is why the
    default refuses."""
    measurement, injected = (f"tp_{uuid.uuid4().hex[:10]}" for _ in range(2))
    stamp = (time.time_ns() // 1_000_000 - 60_000) * 1_000_000  # recent, whole ms
    rows = [
        {"host": "a", "note": "fine", "v": 1, "t": stamp},
        {"host": "b", "note": f"x\n{injected},host=prod cpu=99 {stamp}\n", "v": 2, "t": stamp},
    ]
    spec = PointSpec(measurement, ("host",), time_column="t")
    items = list(PointBuilder(spec, allow_newlines=allowed).convert(rows))
    assert isinstance(items[1], Rejected) is not allowed
    with two_phase(staging, v2_config(vm_url)) as tp:
        lease = begin_run(tp, "s", "r1", "q1")
        message = tp.stager.stage("s", 0, items, run_id="r1", query_id="q1")
        assert message.rejected == (0 if allowed else 1)
        assert tp.committer.commit(lease, 0, [message]).state == EpochState.COMMITTED
    letters = dead_letters(staging, "s").dead_letters
    assert [(d.phase, "contains a newline" in d.reason) for d in letters] == (
        [] if allowed else [("stage", True)]
    )
    # The clean row's point is there: whatever the request could add is there too.
    metric = f"{measurement}_v"
    assert wait_until(lambda: vm_exported(vm_url, metric) >= 1, timeout_s=20)
    assert {s["metric"]["host"]: s["values"] for s in vm_export(vm_url, metric)}["a"] == [1]
    got = vm_export(vm_url, f"{injected}_cpu")
    if allowed:
        assert [(s["metric"]["host"], s["values"]) for s in got] == [("prod", [99])]
    else:
        assert got == []


def test_v2_writer_transport_faults_are_transient(vm_url: str) -> None:
    with FaultProxy.for_url(vm_url) as proxy:
        config = TargetConfig(
            url=proxy.url, timeout_s=1, influxdb=InfluxDBSettings(api="v2", bucket="b", org="o")
        )
        writer = V2Writer(config)
        proxy.set_mode(CUT)
        with pytest.raises(TransientWriteError, match=r"connection broken|cannot connect"):
            writer.write(b"m f=1i 1")
        proxy.set_mode(STALL)
        started = time.monotonic()
        with pytest.raises(TransientWriteError, match="timed out"):
            writer.write(b"m f=1i 1")
        assert time.monotonic() - started < 5
        proxy.set_mode(PASS)
        writer.write(f"tp_v2proxy f=1i {time.time_ns()}".encode())
        assert proxy.lines == 1
        writer.close()


# --- network faults between the sender and InfluxDB -----------------------------------


@pytest.fixture
def proxy(influx: TargetConfig) -> Iterator[FaultProxy]:
    with FaultProxy.for_url(influx.url) as p:
        yield p


def _through(proxy: FaultProxy, influx: TargetConfig, timeout_s: float = 2.0) -> V1Writer:
    return V1Writer(dataclasses.replace(influx, url=proxy.url, timeout_s=timeout_s))


def test_proxy_counts_the_lines_it_forwards(proxy: FaultProxy, influx: TargetConfig) -> None:
    assert sender(_through(proxy, influx), max_points=10).send(points(25)) == []
    assert (proxy.lines, proxy.write_requests) == (25, 3)
    query_v1(proxy.url, influx.influxdb.database, 'SELECT * FROM "m"')  # reads are not counted
    assert proxy.lines == 25 and len(values(influx)) == 25


def test_a_writer_keeps_one_connection_and_opens_another_after_close(
    proxy: FaultProxy, influx: TargetConfig
) -> None:
    writer = _through(proxy, influx)
    for i in range(5):  # its pool, made at the first write, is kept for the others
        writer.write(gzip_members(points(10, start=T0 + i), 2), gzipped=True)
    assert (proxy.write_requests, proxy.connections) == (5, 1)
    writer.close()
    writer.write(b"m,host=h0 f=0i 1")  # a write after close opens a new pool, as before
    writer.close()
    assert (proxy.write_requests, proxy.connections) == (6, 2)
    assert len(values(influx)) == 51


def test_a_url_with_a_path_keeps_it_and_an_unusable_url_fails_at_the_first_write(
    proxy: FaultProxy, influx: TargetConfig
) -> None:
    under = V1Writer(dataclasses.replace(influx, url=f"{proxy.url}/under"))
    with pytest.raises(TargetNotFoundError):  # /under/write: InfluxDB has no such path
        under.write(b"m f=1i 1")
    under.close()
    bad = V1Writer(dataclasses.replace(influx, url="http://[::1"))  # made: the URL is not read
    with pytest.raises(TargetRequestError, match="bad InfluxDB URL"):
        bad.write(b"m f=1i 1")
    bad.close()
    assert not values(influx)


@pytest.mark.parametrize("fault", [CUT, STALL, DROP_REPLY])
def test_fault_for_two_seconds_then_exactly_once(
    proxy: FaultProxy, influx: TargetConfig, fault: str
) -> None:
    events: list[RetryEvent] = []
    lines = points(50)
    proxy.set_mode(fault)
    timer = proxy.set_mode_later(PASS, 2.0)
    started = time.monotonic()
    try:
        rejected = sender(
            _through(proxy, influx, timeout_s=1.0), events=events, max_points=20
        ).send(lines)
    finally:
        timer.cancel()
    assert rejected == []
    assert 1.5 < time.monotonic() - started < 30
    assert events and all(isinstance(e.error, TransientWriteError) for e in events)
    if fault == STALL:
        assert "timed out" in str(events[0].error)
    # every point exactly once, although some bodies went through more than once
    assert values(influx) == [[T0 + i * 1_000_000, i] for i in range(50)]
    assert proxy.lines >= 50 + (20 if fault == DROP_REPLY else 0)


def test_stall_beyond_the_deadline_is_unavailable(proxy: FaultProxy, influx: TargetConfig) -> None:
    proxy.set_mode(STALL)
    started = time.monotonic()
    with pytest.raises(TargetUnavailableError) as caught:
        sender(_through(proxy, influx, timeout_s=0.5), deadline_s=2.0).send(points(5))
    elapsed = time.monotonic() - started
    assert 2.0 <= elapsed < 2.0 + 0.5 + 2.0  # the deadline plus at most one request timeout
    assert "timed out" in str(caught.value) and not isinstance(caught.value, TransientWriteError)
    assert values(influx) == []
