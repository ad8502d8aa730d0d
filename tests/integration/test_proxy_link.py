"""The test kit's proxy as a slow link in front of a real InfluxDB: its bandwidth holds
a write at least its transmission time, shared by all connections, on top of the
answer's delay; and gzip bodies of several members are counted and accepted.

Lower bounds only: a loaded machine makes everything slower, never faster."""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode

import pytest
import urllib3

from devkit.faultproxy import BURST_BYTES, FaultProxy
from tests.support import influx_count
from twophase.config import TargetConfig

RATE_BPS = 20_000_000
TOTAL_BYTES = 2_500_000
REQUESTS = 5  # each carrying a fifth of the bytes
SLACK = 0.9  # of the time the link takes at least: room for a timer's rounding


@pytest.fixture
def proxy(influx: TargetConfig) -> Iterator[FaultProxy]:
    with FaultProxy.for_url(influx.url) as made:
        yield made


def bodies(count: int, size: int) -> list[bytes]:
    """``count`` line-protocol bodies of about ``size`` bytes each, distinct points."""
    out = []
    for body in range(count):
        stamp = 1_700_000_000 * 10**9 + body * 10**6
        lines = [
            f'link,body={body} text="{"x" * 60}",i={i}i {stamp + i}' for i in range(size // 100)
        ]
        out.append("\n".join(lines).encode())
    return out


def post(pool: urllib3.PoolManager, url: str, body: bytes, gzipped: bool = False) -> int:
    headers = {"Content-Encoding": "gzip"} if gzipped else {}
    return pool.request("POST", url, body=body, headers=headers).status


def send_all(
    proxy: FaultProxy, influx: TargetConfig, parts: list[bytes], connections: int
) -> float:
    """Seconds to POST ``parts``, spread over ``connections`` connections writing at once."""
    url = f"{proxy.url}/write?{urlencode({'db': influx.influxdb.database, 'precision': 'ns'})}"
    pools = [urllib3.PoolManager(maxsize=1, retries=False) for _ in range(connections)]
    shares = [parts[i::connections] for i in range(connections)]

    def send(job: tuple[urllib3.PoolManager, list[bytes]]) -> list[int]:
        return [post(job[0], url, body) for body in job[1]]

    started = time.perf_counter()
    with ThreadPoolExecutor(connections) as threads:
        statuses = [s for done in threads.map(send, zip(pools, shares, strict=True)) for s in done]
    elapsed = time.perf_counter() - started
    assert statuses == [204] * len(parts)
    return elapsed


@pytest.mark.parametrize(
    ("connections", "delay_s"),
    [(1, 0.0), (REQUESTS, 0.0), (1, 0.1)],
    ids=["one connection", "a link shared by connections", "with a delay"],
)
def test_a_write_takes_at_least_its_time_on_the_link(
    proxy: FaultProxy, influx: TargetConfig, connections: int, delay_s: float
) -> None:
    proxy.bandwidth_bps = RATE_BPS
    proxy.delay_s = delay_s
    parts = bodies(REQUESTS, TOTAL_BYTES // REQUESTS)
    sent = sum(map(len, parts))
    on_link = (8 * (sent - BURST_BYTES)) / RATE_BPS  # about 1 s
    # each connection's requests wait for their answers one after the other
    answers = delay_s * REQUESTS / connections
    elapsed = send_all(proxy, influx, parts, connections)
    assert elapsed >= SLACK * (on_link + answers)
    assert proxy.lines == sum(part.count(b"\n") + 1 for part in parts)


def test_an_unlimited_link_is_the_default(proxy: FaultProxy) -> None:
    assert proxy.bandwidth_bps is None
    proxy.bandwidth_bps = RATE_BPS
    assert proxy.bandwidth_bps == RATE_BPS
    proxy.bandwidth_bps = None
    assert proxy.bandwidth_bps is None


def test_a_gzip_body_of_several_members_is_counted_and_stored(
    proxy: FaultProxy, influx: TargetConfig
) -> None:
    parts = bodies(3, 10_000)
    body = b"".join(gzip.compress(part + b"\n") for part in parts)
    url = f"{proxy.url}/write?{urlencode({'db': influx.influxdb.database, 'precision': 'ns'})}"
    pool = urllib3.PoolManager(maxsize=1, retries=False)
    assert post(pool, url, body, gzipped=True) == 204
    assert (proxy.write_requests, proxy.lines) == (1, 300)
    assert influx_count(influx, "link") == 300
