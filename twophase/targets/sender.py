"""Delivering request bodies through the writer of a target (its
[`TargetWriter`][twophase.targets.contract.TargetWriter]).

Retry with backoff, splitting on 413 and bisection on 400 -- all independent of HTTP,
so pure logic a fake writer can test. Correctness rests on one property of the kinds
that write through it: re-sending a point (same series and timestamp) overwrites it
with itself, so any body may be sent again, whole or in parts, without changing the
result. InfluxDB has it; VictoriaMetrics has it only when it runs with
``-dedup.minScrapeInterval`` (without it, it keeps every copy it is sent). A
transactional kind's epoch is repeated whole instead.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from twophase.config import TargetConfig
from twophase.errors import (
    BadPointsError,
    BatchTooLargeError,
    EpochStartOverError,
    TargetUnavailableError,
    TransactionLostError,
)
from twophase.retry import RetryPolicy
from twophase.targets.contract import TargetWriter

log = logging.getLogger("twophase.targets.sender")
T = TypeVar("T")
# Epochs started over at once in a row (EpochStartOverError): each brought a table a new
# column, which an epoch can need again only for as many bodies as bring new fields.
START_OVERS = 16


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
        writer: TargetWriter,
        config: TargetConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        on_attempt_failed: Callable[[RetryEvent], None] | None = None,
        rand: Callable[[], float] = random.random,
        deadline: str = "target_retry_deadline",
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

        Transient errors (TargetUnavailableError from the writer) are retried
        with backoff until ``policy.deadline_s`` has passed without progress --
        measured from the start of the first failed attempt since InfluxDB last
        answered (acknowledged or refused a body), so a long send that keeps
        getting answers is not cut off by one failure late in it -- then
        TargetUnavailableError is raised, saying how long the outage lasted:
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
        re-sent at once, no bisection needed. When it says every line of the
        part was refused (1.x: "dropped=N" with N its line count, or none of
        its lines parsed), they all are, without a request more. Taking one
        body apart makes at most ``SPLIT_REQUESTS`` requests: the lines still
        unresolved then are rejected with a reason saying so (1.x has written
        the good ones among them; a requeue sends them again). Auth, not-found
        and other permanent errors propagate at once.

        ``before_attempt`` runs before every attempt -- the first, each retry
        after its wait, each part of a split -- and stops the send by raising
        (a promoter's fencing check: a fenced run sends nothing more).
        """
        delivery = _Delivery(self, before_attempt)
        delivery.deliver_body(body, count, lambda: list(_encoded(lines())), gzipped)
        return sorted(delivery.rejected)

    def repeat(
        self,
        call: Callable[[], T],
        lines: int,
        before_attempt: Callable[[], None] | None = None,
    ) -> T:
        """``call()``, repeated from its start while it fails for a reason that may
        pass (the target unavailable, or a transactional target's transaction lost):
        a transactional target's whole epoch, which can only be sent again whole. The
        outage is timed and given up like one request's (``send``);
        ``before_attempt`` runs before each repeat. An epoch the target ended to make
        a table (EpochStartOverError) is repeated at once, up to ``START_OVERS`` times
        in a row: each made what it needed, so it is progress, not an outage."""
        delivery = _Delivery(self, before_attempt)
        began: float | None = None
        start_overs = 0
        for attempt in itertools.count(1):
            if attempt > 1 and before_attempt is not None:
                before_attempt()
            sent_at = self._clock()
            try:
                return call()
            except (TargetUnavailableError, TransactionLostError) as exc:
                if isinstance(exc, EpochStartOverError) and start_overs < START_OVERS:
                    start_overs += 1
                    log.info("%s", exc)
                    continue
                began = sent_at if began is None else began
                delivery.wait_or_give_up(attempt, lines, exc, began)
        raise AssertionError("unreachable")  # itertools.count never ends


_NAMED_REFUSALS = 8  # lines a part may have named and skipped in a row before it is bisected
# Requests taking one refused body apart may make: bisecting a body of n lines costs
# about 2 b log2(n / b) requests for b scattered bad lines, one for a part whose lines
# were all refused. Past the cap the lines not yet resolved are dead letters (CAPPED says
# why): a body of bad lines everywhere costs a bounded time, never a request per line.
SPLIT_REQUESTS = 1000
CAPPED = (
    "unresolved: the target refused a request holding this point, and taking the request "
    "apart reached its cap of {cap} requests before this point was found good or bad "
    "(a target that writes the good lines of a refused request, as InfluxDB 1.x does, "
    "holds it if it is good; requeue it once the cause is fixed): {reason}"
)
Lines = list[tuple[int, bytes]]


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


@dataclass(frozen=True)
class _Part:
    """Lines of a refused body still to send: ``named`` more refusals that name a line
    may be followed before the part is bisected."""

    lines: Lines
    named: int = _NAMED_REFUSALS


class _Delivery:
    """The state of one ``send`` call: the lines rejected so far, the requests left."""

    def __init__(self, sender: BatchSender, before_attempt: Callable[[], None] | None) -> None:
        self._sender = sender
        self._before_attempt = before_attempt
        self.policy = sender._policy
        self.rejected: list[tuple[int, str]] = []
        self.requests_left = SPLIT_REQUESTS

    def deliver_body(
        self,
        body: bytes,
        count: int,
        batch: Callable[[], Lines],
        gzipped: bool = False,
    ) -> None:
        """Send ``body`` (``count`` lines); take ``batch()`` apart when InfluxDB refuses
        it."""
        try:
            self.write_with_retry(body, count, gzipped)
        except (BatchTooLargeError, BadPointsError) as exc:
            self.take_apart(_Part(batch()), exc)

    def take_apart(self, refused: _Part, refusal: BatchTooLargeError | BadPointsError) -> None:
        """Settle every line of a refused part: sent again in parts, depth first, left
        part before right (the same requests every time), until each line is delivered
        or rejected; at most ``requests_left`` requests."""
        todo = self._parts(refused, refusal)[::-1]  # a stack: the next part last
        while todo:
            part = todo.pop()
            if not self.requests_left:
                self._give_up([part, *todo[::-1]], refusal)
                return
            self.requests_left -= 1
            try:
                self.write_with_retry(b"\n".join(text for _, text in part.lines), len(part.lines))
            except (BatchTooLargeError, BadPointsError) as exc:
                refusal = exc
                todo.extend(self._parts(part, exc)[::-1])

    def _parts(self, part: _Part, refusal: BatchTooLargeError | BadPointsError) -> list[_Part]:
        """What a refused part leaves to send; its lines the refusal settles rejected."""
        lines = part.lines
        if isinstance(refusal, BadPointsError):
            if refusal.every_line or refusal.dropped == len(lines):  # all refused: 1.x says
                self.rejected += [(index, refusal.reason) for index, _ in lines]
                return []
            line = _named_line(refusal, lines) if part.named else None
            if line is not None:  # InfluxDB 3 named it and wrote none: the others again
                self.rejected.append((lines[line][0], refusal.reason))
                rest = lines[:line] + lines[line + 1 :]
                return [_Part(rest, part.named - 1)] if rest else []
        if len(lines) == 1:
            self.rejected.append((lines[0][0], _reason(refusal)))
            return []
        middle = len(lines) // 2
        return [_Part(lines[:middle]), _Part(lines[middle:])]

    def _give_up(self, parts: list[_Part], refusal: BatchTooLargeError | BadPointsError) -> None:
        reason = CAPPED.format(cap=SPLIT_REQUESTS, reason=_reason(refusal))
        self.rejected += [(index, reason) for part in parts for index, _ in part.lines]
        log.warning(
            "taking a refused request apart reached its cap of %d requests: %d line(s) "
            "not resolved become dead letters (%s)",
            SPLIT_REQUESTS,
            sum(len(part.lines) for part in parts),
            _reason(refusal),
        )

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
            except TargetUnavailableError as exc:
                began = sent_at if began is None else began
                self.wait_or_give_up(attempt, lines, exc, began)
                continue
            return

    def wait_or_give_up(
        self,
        attempt: int,
        lines: int,
        exc: TargetUnavailableError | TransactionLostError,
        began: float,
    ) -> None:
        """Sleep before the next attempt, or raise when the deadline, counted from
        ``began`` (the outage's first failed attempt), does not allow one."""
        retry_after = getattr(exc, "retry_after", None)
        lasted = self._sender._clock() - began
        remaining = self.policy.deadline_s - lasted
        if remaining <= 0 or (retry_after or 0.0) > remaining:
            raise TargetUnavailableError(
                f"target still unavailable after {attempt} attempt(s) over {lasted:.0f}s "
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


def _reason(refusal: BatchTooLargeError | BadPointsError) -> str:
    return refusal.reason if isinstance(refusal, BadPointsError) else str(refusal)
