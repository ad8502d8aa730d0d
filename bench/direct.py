"""What a user writes instead of twophase: line protocol POSTed straight to InfluxDB.

Written on purpose without any of twophase's code: a ``urllib3`` pool, lines
joined into requests of 5,000 (InfluxDB's recommended batch size), one
``POST /write`` each, and an exception on anything but a 2xx answer. No
retries and no dead letters: at-least-once, Spark retries the task (and
writes its points again). The benchmark's "direct" side of every
comparison sends through this.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode

import urllib3

BATCH_LINES = 5000


class DirectWriteError(RuntimeError):
    """InfluxDB answered a write with an error."""


class DirectWriter:
    """POST /write?db=...&precision=ns, ``batch`` lines a request, one connection."""

    def __init__(
        self, url: str, database: str, batch: int = BATCH_LINES, timeout_s: float = 30.0
    ) -> None:
        query = urlencode({"db": database, "precision": "ns"})
        self.url = f"{url.rstrip('/')}/write?{query}"
        self.batch = batch
        self.pool = urllib3.PoolManager(
            maxsize=1, timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s), retries=False
        )

    def write(self, lines: Iterable[str]) -> int:
        """Send every line; return how many. Raises DirectWriteError on a refusal."""
        sent = 0
        iterator = iter(lines)
        while batch := list(itertools.islice(iterator, self.batch)):
            response = self.pool.request("POST", self.url, body="\n".join(batch).encode())
            if response.status >= 300:
                raise DirectWriteError(f"InfluxDB answered {response.status}: {response.data!r}")
            sent += len(batch)
        return sent

    def close(self) -> None:
        self.pool.clear()


class PartitionedWriter:
    """What a ``foreachPartition`` writer does with ``connections`` partitions: the lines
    cut into that many consecutive parts, each POSTed by its own thread over its own
    connection, at once."""

    def __init__(self, url: str, database: str, connections: int) -> None:
        self.writers = [DirectWriter(url, database) for _ in range(connections)]
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
