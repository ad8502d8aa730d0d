"""Delivering line protocol through an :class:`~twophase.influx.InfluxWriter`.

Retry with backoff, splitting on 413 and bisection on 400 -- all
independent of HTTP, so pure logic a fake writer can
test. Correctness rests on one property of InfluxDB: re-sending a point
(same measurement, tag set and timestamp) overwrites it with itself, so any
body may be sent again, whole or in parts, without changing the result.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from twophase.config import InfluxConfig
from twophase.errors import BadPointsError, BatchTooLargeError, InfluxUnavailableError
from twophase.influx.writers import InfluxWriter
from twophase.retry import RetryPolicy

log = logging.getLogger("twophase.influx.sender")


@dataclass(frozen=True)
class RetryEvent:
    """One failed attempt that will be retried (for callbacks and metrics)."""

    attempt: int
    delay_s: float
    lines: int
    error: Exception


class BatchSender:
    """Sends request bodies of line protocol with retries, 413 splitting and 400 bisection.

    Idempotent in effect (re-sending a body changes nothing in InfluxDB). A
    refused body is split left half before right half, so the same input
    always produces the same sequence of requests. The retry policy comes
    from the config. A sender keeps no state between calls; concurrent
    ``send`` calls are safe when the writer is.
    """

    def __init__(
        self,
        writer: InfluxWriter,
        config: InfluxConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        on_attempt_failed: Callable[[RetryEvent], None] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._writer = writer
        self._policy = RetryPolicy.from_config(config)
        self._sleep = sleep
        self._clock = clock
        self._on_attempt_failed = on_attempt_failed
        self._rand = rand

    def send(
        self, body: bytes, count: int, lines: Callable[[], Sequence[str]]
    ) -> list[tuple[int, str]]:
        """Deliver ``count`` lines joined into one request ``body``; return (index,
        reason) of the lines InfluxDB rejected.

        ``body`` goes out as it is, in one request (staged chunks are stored
        that way, so the common case costs no per-line work); the caller keeps
        it within the batch limits. Every other line was acknowledged on
        return.

        Transient errors (InfluxUnavailableError from the writer) are retried
        with backoff until ``policy.deadline_s`` has passed without progress --
        measured from the call's start or the last acknowledged request,
        whichever is later, so a long send that keeps delivering is not cut
        off -- then InfluxUnavailableError is raised: nothing is known about
        which lines arrived; the caller re-sends the whole set later, which is
        idempotent. The last attempt starts before the deadline, so the call
        may end up to one request timeout after it.

        Only when InfluxDB refuses the body are its lines taken apart, through
        ``lines()``: 413 splits it in halves recursively (a single line that is
        too large is rejected with the reason); 400/422 bisects: the halves
        are re-sent separately (idempotent) until each rejected line is
        isolated and rejected with InfluxDB's reason; good lines of the same
        body are delivered. Auth, not-found and other permanent errors
        propagate at once.
        """
        delivery = _Delivery(self)
        delivery.deliver_body(body, count, lambda: list(_encoded(lines())))
        return delivery.rejected


def _encoded(lines: Iterable[str]) -> Iterator[tuple[int, bytes]]:
    return ((i, line.encode("utf-8")) for i, line in enumerate(lines))


class _Delivery:
    """The state of one ``send`` call: rejected lines and the time of the last progress."""

    def __init__(self, sender: BatchSender) -> None:
        self._sender = sender
        self.policy = sender._policy
        self.rejected: list[tuple[int, str]] = []
        self.progress_at = sender._clock()

    def deliver(self, batch: list[tuple[int, bytes]]) -> None:
        self.deliver_body(b"\n".join(line for _, line in batch), len(batch), lambda: batch)

    def deliver_body(
        self, body: bytes, count: int, batch: Callable[[], list[tuple[int, bytes]]]
    ) -> None:
        """Send ``body`` (``count`` lines); split ``batch()`` when InfluxDB refuses it."""
        try:
            self.write_with_retry(body, count)
        except BatchTooLargeError as exc:
            self.split(batch(), str(exc))
        except BadPointsError as exc:
            # with 1.x the good lines were written already; re-sending them is harmless
            self.split(batch(), exc.reason)

    def split(self, batch: list[tuple[int, bytes]], reason: str) -> None:
        if len(batch) == 1:
            self.rejected.append((batch[0][0], reason))
            return
        middle = len(batch) // 2
        self.deliver(batch[:middle])
        self.deliver(batch[middle:])

    def write_with_retry(self, body: bytes, lines: int) -> None:
        for attempt in itertools.count(1):
            try:
                self._sender._writer.write(body)
            except InfluxUnavailableError as exc:
                self.wait_or_give_up(attempt, lines, exc)
                continue
            self.progress_at = self._sender._clock()
            return

    def wait_or_give_up(self, attempt: int, lines: int, exc: InfluxUnavailableError) -> None:
        """Sleep before the next attempt, or raise when the deadline does not allow one."""
        retry_after = getattr(exc, "retry_after", None)
        remaining = self.progress_at + self.policy.deadline_s - self._sender._clock()
        if remaining <= 0 or (retry_after or 0.0) > remaining:
            raise InfluxUnavailableError(
                f"InfluxDB still unavailable after {attempt} attempt(s) and "
                f"{self.policy.deadline_s:g}s without progress: {exc}"
            ) from exc
        delay = min(self.policy.delay(attempt, retry_after, self._sender._rand), remaining)
        log.warning(
            "write of %d line(s) failed (attempt %d, %s); retrying in %.2fs: %s",
            lines,
            attempt,
            type(exc).__name__,
            delay,
            exc,
        )
        if self._sender._on_attempt_failed is not None:
            self._sender._on_attempt_failed(RetryEvent(attempt, delay, lines, exc))
        self._sender._sleep(delay)
