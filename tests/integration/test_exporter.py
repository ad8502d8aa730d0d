"""The exporter over a real staging store, scraped over HTTP, and the driver's metrics."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from devkit.faultproxy import CUT
from devkit.ports import free_port, port_is_free
from tests.fakes import FakeClock
from tests.integration.cli_helpers import known_store, sql
from tests.integration.fanout_helpers import two_targets
from tests.staging import INTERVAL_S, committer_of, lines, stage
from tests.support import (
    NO_CACHE,
    admin_conninfo,
    begin_run,
    scrape,
    staging_config_for,
    two_phase,
    value,
)
from twophase.config import ExporterConfig, StagingConfig, TargetConfig
from twophase.errors import FencedError, TargetUnavailableError
from twophase.model import Lease
from twophase.operations import exporter as exporter_module
from twophase.operations import start_exporter
from twophase.operations.exporter import Exporter, StoreCollector, metric_names
from twophase.protocol.commit.runtime import TwoPhase
from twophase.protocol.ledger import target_ledger as targets_module
from twophase.store.database import Database


@pytest.fixture
def exporter(staging: StagingConfig) -> Iterator[Exporter]:
    """An exporter that reads the store at every scrape (no cache: each test changes the
    store between scrapes)."""
    running = start_exporter(staging, port=0, live_window_s=600, exporter=NO_CACHE)
    yield running
    running.close()


def test_a_scrape_reports_every_sink(tp: TwoPhase, exporter: Exporter, staging_url: str) -> None:
    known_store(tp)  # s: 0-2 committed (a row and a point rejected), 3 PRECOMMITTED
    got = scrape(exporter.port)
    s = {"sink": "s"}
    assert value(got, "twophase_store_up") == 1
    assert value(got, "twophase_last_decided_epoch", **s) == 3
    assert value(got, "twophase_last_committed_epoch", **s) == 2
    assert value(got, "twophase_epochs", state="precommitted", **s) == 1
    assert value(got, "twophase_epochs", state="committed", **s) == 3
    assert value(got, "twophase_points_staged_total", **s) == 41  # 4 epochs, 1 bad point
    assert value(got, "twophase_points_delivered_total", **s) == 30
    assert value(got, "twophase_points_rejected_total", phase="stage", **s) == 1
    assert value(got, "twophase_points_rejected_total", phase="promote", **s) == 1
    assert value(got, "twophase_dead_letters", phase="promote", **s) == 1
    assert value(got, "twophase_oldest_precommitted_age_seconds", **s) > 0
    assert value(got, "twophase_run_state", state="live", **s) == 1
    assert value(got, "twophase_commit_duration_seconds_count", **s) == 3
    assert value(got, "twophase_promote_attempts_total", **s) == 3
    retained = sql(
        staging_url,
        "SELECT sum(octet_length(c.body_gz)) FROM twophase_staged_chunks c JOIN twophase_epochs e"
        " ON c.write_id = ANY(e.write_ids) WHERE e.sink_id = 's'",
    )[0][0]
    assert value(got, "twophase_staged_bytes", **s) == retained > 0
    assert {name for name, _ in got} <= metric_names()

    tp.ledger.abort("s", 3, "test")
    tp.runs.end("s", "r1", "stopped")
    begin_run(tp, "t", "r10", "q9")  # fences r9 of sink t
    with pytest.raises(FencedError):
        tp.ledger.decide(Lease("t", "r9", "q9", 1), 1, [])
    got = scrape(exporter.port)
    assert value(got, "twophase_epochs", state="aborted", **s) == 1
    assert value(got, "twophase_oldest_precommitted_age_seconds", **s) == 0
    assert value(got, "twophase_run_state", state="ended", **s) == 1
    assert value(got, "twophase_run_state", state="live", **s) == 0
    assert value(got, "twophase_staged_bytes", **s) < retained
    assert value(got, "twophase_fenced_attempts_total", sink="t") == 1


def test_the_histogram_counts_each_new_commit_once(tp: TwoPhase, exporter: Exporter) -> None:
    lease = begin_run(tp, "h", "r1", "q1")
    for epoch in range(3):
        tp.committer.commit(lease, epoch, stage(tp, "h", epoch, [lines(epoch, 5)]))
    assert value(scrape(exporter.port), "twophase_commit_duration_seconds_count", sink="h") == 3
    assert value(scrape(exporter.port), "twophase_commit_duration_seconds_count", sink="h") == 3
    tp.committer.commit(lease, 3, stage(tp, "h", 3, [lines(3, 5)]))
    got = scrape(exporter.port)
    assert value(got, "twophase_commit_duration_seconds_count", sink="h") == 4
    assert value(got, "twophase_commit_duration_seconds_bucket", sink="h", le="+Inf") == 4


def test_an_unreachable_store_is_store_up_zero_until_it_is_back(
    tp: TwoPhase, exporter: Exporter, staging_url: str
) -> None:
    known_store(tp)
    name = staging_url.rsplit("/", 1)[1]
    block = f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'
    kick = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
    admin = admin_conninfo(staging_url, "postgres")
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(block)
        conn.execute(kick, (name,))
        try:
            down = scrape(exporter.port)
        finally:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert value(down, "twophase_store_up") == 0
    assert not [key for key in down if key[0] == "twophase_last_decided_epoch"]
    # The pool reconnects with backoff: a scrape or two may still find it reconnecting.
    deadline = time.monotonic() + 30
    while value(up := scrape(exporter.port), "twophase_store_up") != 1:
        assert time.monotonic() < deadline, "the exporter never saw the store again"
    assert value(up, "twophase_store_up") == 1
    assert value(up, "twophase_last_decided_epoch", sink="s") == 3


def test_the_driver_serves_its_influx_request_metrics(
    staging: StagingConfig, influx: TargetConfig
) -> None:
    port = free_port()
    metered = dataclasses.replace(influx, metrics_port=port)
    with two_phase(staging, metered, serve_metrics=True) as tp:
        lease = begin_run(tp, "d", "r1", "q1")
        bad = 'proto,host=a v="text" 1700000000000000001'
        tp.committer.commit(lease, 0, stage(tp, "d", 0, [lines(0, 5)]))
        tp.committer.commit(lease, 1, stage(tp, "d", 1, [[*lines(1, 4), bad]]))
        before = scrape(port)
    one = {"target": "default"}  # the one influx_url names
    assert value(before, "twophase_target_responses_total", status_class="2xx", **one) >= 2
    assert value(before, "twophase_target_responses_total", status_class="4xx", **one) >= 1
    assert value(before, "twophase_target_sent_bytes_total", **one) > 0
    assert value(before, "twophase_target_request_duration_seconds_count", **one) >= 3

    closed = dataclasses.replace(
        influx, url=f"http://127.0.0.1:{free_port()}", metrics_port=port, retry_deadline_s=0.3
    )
    with two_phase(staging, closed, serve_metrics=True) as tp:
        lease = begin_run(tp, "d2", "r1", "q1")
        with pytest.raises(TargetUnavailableError):
            tp.committer.commit(lease, 0, stage(tp, "d2", 0, [lines(0, 5)]))
    after = scrape(port)
    assert value(after, "twophase_target_retries_total", reason="transport") >= 1
    unserved = free_port()
    with two_phase(staging, dataclasses.replace(influx, metrics_port=unserved)):
        assert port_is_free(unserved)  # the CLI's processes never take the driver's port
    assert value(after, "twophase_target_responses_total", status_class="transport", **one) >= 2


def test_the_driver_labels_its_requests_with_their_target(
    staging: StagingConfig, influx_url: str
) -> None:
    port = free_port()
    with two_targets(influx_url) as pair:
        pair.proxy.set_mode(CUT)  # b refuses every connection: a takes the epochs
        config = dataclasses.replace(pair.config, metrics_port=port)
        with two_phase(staging, config, serve_metrics=True) as tp:
            tp.catch_up.close()  # no catch-up: b's requests are the commit's only
            lease = tp.committer.claim("m", "r1", "q1")
            tp.committer.commit(lease, 0, stage(tp, "m", 0, [lines(0, 5)]))
            got = scrape(port)
    a, b = {"target": "a"}, {"target": "b"}
    assert value(got, "twophase_target_responses_total", status_class="2xx", **a) >= 1
    assert value(got, "twophase_target_responses_total", status_class="transport", **b) >= 1
    assert value(got, "twophase_target_sent_bytes_total", **a) > 0
    assert value(got, "twophase_target_request_duration_seconds_count", **b) >= 1


def test_gc_takes_purged_epochs_off_the_staged_bytes(tp: TwoPhase, exporter: Exporter) -> None:
    known_store(tp)
    tp.ledger.abort("s", 3, "test")
    assert value(scrape(exporter.port), "twophase_staged_bytes", sink="s") > 0
    assert tp.gc.collect("s", ahead_s=30 * 86400).epochs_purged == 4
    got = scrape(exporter.port)
    assert value(got, "twophase_staged_bytes", sink="s") == 0
    assert value(got, "twophase_staged_bytes", sink="t") > 0  # another sink's stay


def test_automatic_gc_lowers_the_retained_bytes(
    staging_url: str, influx: TargetConfig, exporter: Exporter
) -> None:
    retained_sql = "SELECT sum(octet_length(body_gz)) FROM twophase_staged_chunks"
    with two_phase(staging_config_for(staging_url, retention="0s"), influx) as tp:
        clock = FakeClock(0.0)
        committer, auto = committer_of(tp, clock, limit=100)
        try:
            lease = begin_run(tp, "a", "r1", "q1")
            for epoch in range(3):
                committer.commit(lease, epoch, stage(tp, "a", epoch, [lines(epoch, 10)]))
            retained = value(scrape(exporter.port), "twophase_staged_bytes", sink="a")
            assert retained == sql(staging_url, retained_sql)[0][0] > 0
            clock.sleep(INTERVAL_S)  # due: the next commit starts a collection
            committer.commit(lease, 3, stage(tp, "a", 3, [lines(3, 10)]))
            assert auto.wait(30)
        finally:
            committer.close()
    assert value(scrape(exporter.port), "twophase_staged_bytes", sink="a") == 0


class CountingDatabase(Database):
    """The store, counting the transactions its users open (a read of the exporter)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._counting = threading.Lock()
        super().__init__(*args, **kwargs)  # checks the schema: a transaction
        self.transactions = 0

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Cursor[Any]]:
        with self._counting:
            self.transactions = getattr(self, "transactions", 0) + 1
        with super().transaction() as cur:
            yield cur


def test_scrapes_within_the_cache_window_cost_one_read(
    tp: TwoPhase, staging: StagingConfig
) -> None:
    known_store(tp)
    db = CountingDatabase(staging, max_size=1)
    running = exporter_module.start(db, port=0, config=ExporterConfig(cache_s=60))
    try:
        with ThreadPoolExecutor(8) as pool:  # 8 scrapes at once, then 8 more at once
            answers = list(pool.map(lambda _: scrape(running.port), range(16)))
    finally:
        running.close()
    # One read: the sinks and their commits, whether the store has targets, the targets.
    assert db.transactions == 3
    assert {value(a, "twophase_store_reads_total") for a in answers} == {1}
    assert {value(a, "twophase_last_decided_epoch", sink="s") for a in answers} == {3}

    now = [0.0]
    again = CountingDatabase(staging, max_size=1)
    collector = StoreCollector(again, 600, cache_s=5, clock=lambda: now[0])
    try:
        for at in (0.0, 4.9):  # within the window of the first read: no other
            now[0] = at
            assert list(collector.collect())
        assert again.transactions == 3
        now[0] = 5.0  # the window has passed: the next scrape reads the store again
        reads = {f.name: f for f in collector.collect()}["twophase_store_reads"]
        assert (reads.samples[0].value, again.transactions) == (2, 6)
    finally:
        again.close()


def _history(url: str, sink: str, first: int, last: int) -> None:
    """Epochs ``first``..``last`` of ``sink`` COMMITTED, as SQL writes them (no points);
    its target ``default`` holds them all, ``b`` lacks the last three."""
    sql(
        url,
        "INSERT INTO twophase_sinks (sink_id, last_decided_epoch, last_committed_epoch)"
        " VALUES (%s, %s, %s) ON CONFLICT (sink_id) DO UPDATE SET last_decided_epoch ="
        " EXCLUDED.last_decided_epoch, last_committed_epoch = EXCLUDED.last_committed_epoch",
        sink,
        last,
        last,
    )
    sql(
        url,
        "INSERT INTO twophase_epochs (sink_id, epoch, state, write_ids, checksum,"
        " points_staged, decided_at, committed_at) SELECT %s, e, 'COMMITTED',"
        " ARRAY[gen_random_uuid()], 'x', 10, now(), now()"
        " FROM generate_series(%s::bigint, %s::bigint) e",
        sink,
        first,
        last,
    )
    sql(
        url,
        "INSERT INTO twophase_targets (sink_id, target, delivered_epoch) VALUES"
        " (%s, 'default', %s), (%s, 'b', %s) ON CONFLICT (sink_id, target) DO UPDATE SET"
        " delivered_epoch = EXCLUDED.delivered_epoch",
        sink,
        last,
        sink,
        last - 3,
    )
    with psycopg.connect(admin_conninfo(url), autocommit=True) as conn:
        conn.execute("ANALYZE twophase_epochs")
        conn.execute("ANALYZE twophase_targets")


def _read_costs(url: str, seen: int) -> dict[str, int]:
    """Buffers each query of an exporter's read touches, planned for its values (custom)
    and as the pool's prepared statements run it (generic)."""
    reads = {
        "sinks": (exporter_module._SINKS_SQL, {"window": 600.0, "cli": "cli-", "cli_len": 4}),
        "new sink's commits": (_committed(["s"], [None])),
        "commits since": (_committed(["s"], [seen])),
        "targets": (targets_module._STATES, {"s": None}),
    }
    with psycopg.connect(admin_conninfo(url)) as conn:
        return {
            f"{name}, {kind}": plan_buffers(conn, statement, params, kind == "generic")
            for name, (statement, params) in reads.items()
            for kind in ("custom", "generic")
        }


def _committed(sinks: list[str], seen: list[int | None]) -> tuple[str, dict[str, Any]]:
    params = {"sinks": sinks, "seen": seen, "done": "COMMITTED", "recent": 100, "most": 10_000}
    return exporter_module._COMMITTED_SQL, params


def test_a_read_costs_the_same_whatever_the_history(staging_url: str) -> None:
    _history(staging_url, "s", 0, 99)
    small = _read_costs(staging_url, seen=95)
    _history(staging_url, "s", 100, 200_099)
    large = _read_costs(staging_url, seen=200_095)
    print("buffers of an exporter's read, 100 epochs -> 200,100 epochs:", small, large)
    assert {name: cost for name, cost in large.items() if cost > 2 * small[name] + 4} == {}


def plan_buffers(conn: psycopg.Connection[Any], statement: str, params: Any, generic: bool) -> int:
    """The shared buffers one run of ``statement`` touches (EXPLAIN (ANALYZE, BUFFERS)),
    prepared and run with ``params`` as psycopg runs a statement it prepares, with the
    plan PostgreSQL chooses for these values, or a generic plan (the staging pool's)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, statement)
    values = [params[name] for name in names]
    types = ", ".join(_pg_type(v) for v in values)
    mode = "force_generic_plan" if generic else "auto"
    conn.execute(pgsql.SQL("SET plan_cache_mode = {}").format(pgsql.SQL(mode)))
    conn.execute(pgsql.SQL("PREPARE measured ({}) AS {}").format(pgsql.SQL(types), pgsql.SQL(text)))
    try:
        run = pgsql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE measured ({})")
        literals = pgsql.SQL(", ").join(pgsql.Literal(v) for v in values)
        row = conn.execute(run.format(literals)).fetchone()
    finally:
        conn.execute("DEALLOCATE measured")
    assert row is not None
    top = row[0][0]["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])


def _pg_type(value: Any) -> str:
    if isinstance(value, float):
        return "float8"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, list):
        return "text[]" if any(isinstance(v, str) for v in value) else "bigint[]"
    return "text"
