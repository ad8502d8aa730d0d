"""What a user writes instead of twophase: line protocol POSTed straight to InfluxDB.

Written on purpose without any of twophase's code: a ``urllib3`` pool, lines
joined into requests of 5,000 (InfluxDB's recommended batch size), one
``POST /write`` each, and an exception on anything but a 2xx answer. No
retries and no dead letters: at-least-once, Spark retries the task (and
writes its points again). The benchmark's "direct" side of every
comparison sends through this.

With ``gzip_level`` set, each request's body is compressed as a user
compresses it: ``gzip.compress`` of the joined lines, sent with
``Content-Encoding: gzip``. ``gzip.compress(body)`` without a level, as
users write it (and as the official ``influxdb-client`` does with
``enable_gzip``), compresses at level 9: :data:`USERS_GZIP_LEVEL`.
"""

from __future__ import annotations

import gzip
import itertools
import math
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode

import urllib3

BATCH_LINES = 5000
USERS_GZIP_LEVEL = 9  # gzip.compress's default


class DirectWriteError(RuntimeError):
    """InfluxDB answered a write with an error."""


class DirectWriter:
    """POST /write?db=...&precision=ns, ``batch`` lines a request, one connection; each
    body gzip-compressed at ``gzip_level`` (None: sent as text)."""

    def __init__(
        self,
        url: str,
        database: str,
        batch: int = BATCH_LINES,
        timeout_s: float = 30.0,
        gzip_level: int | None = None,
    ) -> None:
        query = urlencode({"db": database, "precision": "ns"})
        self.url = f"{url.rstrip('/')}/write?{query}"
        self.batch = batch
        self.gzip_level = gzip_level
        self.headers = {} if gzip_level is None else {"Content-Encoding": "gzip"}
        self.pool = urllib3.PoolManager(
            maxsize=1, timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s), retries=False
        )

    def write(self, lines: Iterable[str]) -> int:
        """Send every line; return how many. Raises DirectWriteError on a refusal."""
        sent = 0
        iterator = iter(lines)
        while batch := list(itertools.islice(iterator, self.batch)):
            body = "\n".join(batch).encode()
            if self.gzip_level is not None:
                body = gzip.compress(body, compresslevel=self.gzip_level)
            response = self.pool.request("POST", self.url, body=body, headers=self.headers)
            if response.status >= 300:
                raise DirectWriteError(f"InfluxDB answered {response.status}: {response.data!r}")
            sent += len(batch)
        return sent

    def close(self) -> None:
        self.pool.clear()


class PartitionedWriter:
    """What a ``foreachPartition`` writer does with ``connections`` partitions: the lines
    cut into that many consecutive parts, each POSTed by its own thread over its own
    connection, at once; each body gzip-compressed at ``gzip_level`` (None: as text)."""

    def __init__(
        self, url: str, database: str, connections: int, gzip_level: int | None = None
    ) -> None:
        self.writers = [
            DirectWriter(url, database, gzip_level=gzip_level) for _ in range(connections)
        ]
        self.pool = ThreadPoolExecutor(connections)

    def write(self, lines: Sequence[str]) -> int:
        size = math.ceil(len(lines) / len(self.writers))
        parts = [lines[i * size : (i + 1) * size] for i in range(len(self.writers))]
        return sum(
            self.pool.map(lambda job: job[0].write(job[1]), zip(self.writers, parts, strict=True))
        )

    def close(self) -> None:
        self.pool.shutdown()
        for writer in self.writers:
            writer.close()
