"""Under Spark Connect a foreachBatch function decides nothing before its client has
claimed the sink with the query's id (await_claim), against a real PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from twophase.config import TargetConfig
from twophase.errors import CheckpointResetError, ConfigError, FencedError
from twophase.spark import driver_commit
from twophase.spark.driver_commit import await_claim, claim
from twophase.spark.options import SinkOptions, parse_options

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sink(
    staging_url: str, influx: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SinkOptions]:
    monkeypatch.setenv("TWOPHASE_STAGING_URL", staging_url)
    monkeypatch.setenv("TWOPHASE_TARGET_URL", influx.url)
    monkeypatch.setenv("TWOPHASE_INFLUX_API", "v1")
    monkeypatch.setenv("TWOPHASE_INFLUX_DB", str(influx.influxdb.database))
    # The per-process parts and leases are keyed by explicit settings, not the environment:
    # this test's database needs parts of its own.
    monkeypatch.setattr(driver_commit, "_parts", {})
    monkeypatch.setattr(driver_commit, "_leases", {})
    yield parse_options({"sink_id": "dash", "measurement": "m"})
    for parts in driver_commit._parts.values():
        parts.close()


def claim_later(sink: SinkOptions, run_id: str, query_id: str, delay: float) -> threading.Thread:
    def client() -> None:
        time.sleep(delay)
        claim(sink, run_id, query_id)

    thread = threading.Thread(target=client)
    thread.start()
    return thread


def test_the_function_waits_for_its_clients_claim(sink: SinkOptions) -> None:
    client = claim_later(sink, "writer-run", "query-1", delay=0.5)
    started = time.monotonic()
    assert await_claim(sink, "writer-run", timeout=20) == "query-1"
    assert time.monotonic() - started >= 0.4
    client.join()
    lease = claim(sink, "writer-run", None)  # the function's own claim: the client's run
    assert (lease.run_id, lease.query_id) == ("writer-run", "query-1")


def test_without_a_claim_the_function_fails_naming_query_id(sink: SinkOptions) -> None:
    with pytest.raises(ConfigError) as raised:
        await_claim(sink, "writer-run", timeout=0.3)
    assert raised.value.option == "query_id"
    assert "claim_query(query, writer)" in str(raised.value)


def test_a_reset_checkpoint_is_refused_at_the_clients_claim(sink: SinkOptions) -> None:
    lease = claim(sink, "writer-run-1", "query-1")
    parts = driver_commit.two_phase(sink)
    parts.ledger.decide(lease, 0, [])
    with pytest.raises(CheckpointResetError):
        claim(sink, "writer-run-2", "query-2")  # a new query id: the checkpoint was reset
    with pytest.raises(ConfigError):  # so the new run's function decides nothing
        await_claim(sink, "writer-run-2", timeout=0.3)


def test_a_run_the_next_client_superseded_is_fenced(sink: SinkOptions) -> None:
    claim(sink, "writer-run-1", "query-1")
    driver_commit._leases.clear()  # another process: the restarted client and its server
    claim(sink, "writer-run-2", "query-1")
    assert await_claim(sink, "writer-run-1", timeout=1) == "query-1"  # it did claim, once
    driver_commit._leases.clear()
    with pytest.raises(FencedError):
        claim(sink, "writer-run-1", None)
