"""Delivering line protocol through an [`InfluxWriter`][twophase.influx.writers.InfluxWriter].

Retry with backoff, splitting on 413 and bisection on 400 -- all
independent of HTTP, so pure logic a fake writer can
test. Correctness rests on one property of InfluxDB: re-sending a point
(same measurement, tag set and timestamp) overwrites it with itself, so any
body may be sent again, whole or in parts, without changing the result.
VictoriaMetrics has that property only when it runs with
``-dedup.minScrapeInterval``; without it, it keeps every copy it is sent
([`InfluxWriter`][twophase.influx.writers.InfluxWriter]).
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

    Idempotent in effect (re-sending a body changes nothing in InfluxDB, nor in a
    VictoriaMetrics with ``-dedup.minScrapeInterval``). A
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
        deadline: str = "influx_retry_deadline",
    ) -> None:
        self._writer = writer
        self._policy = RetryPolicy.from_config(config)
        self._deadline = deadline  # the setting ``config.retry_deadline_s`` came from
        self._sleep = sleep
        self._clock = clock
        self._on_attempt_failed = on_attempt_failed
        self._rand = rand

    def send(
        self,
        body: bytes,
        count: int,
        lines: Callable[[], Sequence[str]],
        *,
        before_attempt: Callable[[], None] | None = None,
        gzipped: bool = False,
    ) -> list[tuple[int, str]]:
        """Deliver ``count`` lines joined into one request ``body``; return (index,
        reason) of the lines InfluxDB rejected.

        ``body`` goes out as it is, in one request (staged chunks are stored
        that way, so the common case costs no per-line work); the caller keeps
        it within the batch limits. ``gzipped``: the body is gzip (members end
        to end), sent with ``Content-Encoding: gzip``. Every other line was
        acknowledged on return.

        Transient errors (InfluxUnavailableError from the writer) are retried
        with backoff until ``policy.deadline_s`` has passed without progress --
        measured from the start of the first failed attempt since InfluxDB last
        answered (acknowledged or refused a body), so a long send that keeps
        getting answers is not cut off by one failure late in it -- then
        InfluxUnavailableError is raised, saying how long the outage lasted:
        nothing is known about which lines arrived; the caller re-sends the
        whole set later, which is idempotent. The last attempt starts before
        the deadline, so the call may end up to one request timeout after it.

        Only when InfluxDB refuses the body are its lines taken apart, through
        ``lines()``: 413 splits it in halves recursively (a single line that is
        too large is rejected with the reason); 400/422 bisects: the halves
        are re-sent separately, as text (idempotent), until each rejected line is
        isolated and rejected with InfluxDB's reason; good lines of the same
        body are delivered. When the refusal names its line (InfluxDB 3, which
        refuses a request whole), that line is rejected and the others are
        re-sent at once, no bisection needed. Auth, not-found and other permanent errors
        propagate at once.

        ``before_attempt`` runs before every attempt -- the first, each retry
        after its wait, each part of a split -- and stops the send by raising
        (a promoter's fencing check: a fenced run sends nothing more).
        """
        delivery = _Delivery(self, before_attempt)
        delivery.deliver_body(body, count, lambda: list(_encoded(lines())), gzipped)
        return delivery.rejected


_NAMED_REFUSALS = 8  # lines a body may have named and skipped before it is bisected


def _named_line(exc: BadPointsError, lines: Sequence[tuple[int, bytes]]) -> int | None:
    """The line of ``lines`` the refusal names, when it names one of them as it is (the
    server's copy of the line must match ours: a line we count differently is not
    skipped on its word); None otherwise."""
    line = exc.line
    if line is None or not 0 <= line < len(lines):
        return None
    if exc.original is not None and lines[line][1].decode("utf-8", "replace") != exc.original:
        return None
    return line


def _encoded(lines: Iterable[str]) -> Iterator[tuple[int, bytes]]:
    return ((i, line.encode("utf-8")) for i, line in enumerate(lines))


class _Delivery:
    """The state of one ``send`` call: the lines rejected so far."""

    def __init__(self, sender: BatchSender, before_attempt: Callable[[], None] | None) -> None:
        self._sender = sender
        self._before_attempt = before_attempt
        self.policy = sender._policy
        self.rejected: list[tuple[int, str]] = []

    def deliver(self, batch: list[tuple[int, bytes]]) -> None:
        self.deliver_body(b"\n".join(line for _, line in batch), len(batch), lambda: batch)

    def deliver_body(
        self,
        body: bytes,
        count: int,
        batch: Callable[[], list[tuple[int, bytes]]],
        gzipped: bool = False,
    ) -> None:
        """Send ``body`` (``count`` lines); split ``batch()`` when InfluxDB refuses it.

        A refusal that names its line (InfluxDB 3: none of the body was written)
        rejects that line and sends the others again, up to ``_NAMED_REFUSALS``
        times per body (a body of many bad lines is then bisected: fewer bytes
        sent again); any other refusal is bisected at once (with 1.x the good
        lines were written already; re-sending them is harmless).
        """
        lines: list[tuple[int, bytes]] | None = None  # taken apart only when refused
        for _ in range(_NAMED_REFUSALS + 1):
            try:
                self.write_with_retry(body, count, gzipped)
                return
            except BatchTooLargeError as exc:
                self.split(batch() if lines is None else lines, str(exc))
                return
            except BadPointsError as exc:
                lines = batch() if lines is None else lines
                line = _named_line(exc, lines)
                if line is None:
                    self.split(lines, exc.reason)
                    return
                self.rejected.append((lines[line][0], exc.reason))
                lines = lines[:line] + lines[line + 1 :]
                if not lines:
                    return
                body, count = b"\n".join(text for _, text in lines), len(lines)
                gzipped = False
        assert lines  # past the named refusals: each half again, on its own
        middle = len(lines) // 2
        for half in (lines[:middle], lines[middle:]):
            if half:
                self.deliver(half)

    def split(self, batch: list[tuple[int, bytes]], reason: str) -> None:
        if len(batch) == 1:
            self.rejected.append((batch[0][0], reason))
            return
        middle = len(batch) // 2
        self.deliver(batch[:middle])
        self.deliver(batch[middle:])

    def write_with_retry(self, body: bytes, lines: int, gzipped: bool = False) -> None:
        """One request, repeated while it fails transiently.

        InfluxDB answered the request before this one (or none was sent yet), so
        the outage is timed from the start of the first failed attempt: not from
        the call's start (a long bisection is progress too), and not from the last
        answer (what the caller does between requests is not InfluxDB's time).
        """
        began: float | None = None
        for attempt in itertools.count(1):
            if self._before_attempt is not None:  # after a wait too: the run may be fenced by now
                self._before_attempt()
            sent_at = self._sender._clock()
            try:
                self._sender._writer.write(body, gzipped)
            except InfluxUnavailableError as exc:
                began = sent_at if began is None else began
                self.wait_or_give_up(attempt, lines, exc, began)
                continue
            return

    def wait_or_give_up(
        self, attempt: int, lines: int, exc: InfluxUnavailableError, began: float
    ) -> None:
        """Sleep before the next attempt, or raise when the deadline, counted from
        ``began`` (the outage's first failed attempt), does not allow one."""
        retry_after = getattr(exc, "retry_after", None)
        lasted = self._sender._clock() - began
        remaining = self.policy.deadline_s - lasted
        if remaining <= 0 or (retry_after or 0.0) > remaining:
            raise InfluxUnavailableError(
                f"InfluxDB still unavailable after {attempt} attempt(s) over {lasted:.0f}s "
                f"({self._sender._deadline} {self.policy.deadline_s:g}s without progress): {exc}"
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
