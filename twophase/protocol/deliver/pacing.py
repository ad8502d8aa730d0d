"""Pacing a catch-up: a token bucket of points, waited on before each request.

A target that comes back after an outage owes a backlog that may be hours of
the sink's points; sent as fast as it takes them, the catch-up can swamp the
server that just recovered. ``target_catch_up_rate`` bounds it, per target:
[`TokenBucket`][twophase.protocol.deliver.pacing.TokenBucket] lets a request go while the
bucket is not in debt, and each request sent takes its points from it (the
bucket goes into debt by a request larger than what it holds, which the next
request waits off). A request's size is known only once it is cut, so it is
paid for after it is sent: over any stretch longer than one request the points
sent keep to the rate. Lanes sending side by side each wait for the bucket, so
a burst is at most one request per lane.

At most ``burst_s`` seconds of points (one by default) are saved up while
nothing is sent, so the time a request spends on the wire, or the bookkeeping
between two epochs, counts towards the next request; a catch-up that begins
(``start``) forgets what was saved before it, so a backlog found after a quiet
hour starts at the rate, not with a second's worth at once.

The wait holds no lock of its own while it sleeps; its caller's ``between``
runs every ``_SLICE_S`` at most, so a closing worker, or a commit that no
longer needs the target, stops it at once by raising.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["TokenBucket", "counted"]

_SLICE_S = 0.1  # the longest sleep between two looks at whether the wait should stop
# A debt shorter than this is paid: a clock's rounding must not leave a wait that
# sleeps for nothing, for ever.
_EPSILON_S = 1e-6


def _nothing() -> None:
    """A wait nobody stops."""


class TokenBucket:
    """``rate`` points per second; at most ``burst_s`` seconds' worth saved up while
    idle.

    Thread-safe: lanes of one delivery share it. ``clock`` and ``sleep`` are
    ``time.monotonic`` and ``time.sleep`` unless a test gives its own."""

    def __init__(
        self,
        rate: float,
        *,
        burst_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"a token bucket's rate must be positive, not {rate}")
        if burst_s < 0:
            raise ValueError(f"a token bucket's burst must not be negative, not {burst_s}")
        self.rate = rate
        self._burst = rate * burst_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = 0.0
        self._at = clock()

    def start(self) -> None:
        """A catch-up begins: the points saved up since the last one are forgotten (what
        it still owes is not)."""
        with self._lock:
            self._refill()
            self._tokens = min(self._tokens, 0.0)

    def delay(self) -> float:
        """Seconds before the next request may go (0: now)."""
        with self._lock:
            self._refill()
            delay = -self._tokens / self.rate
            return delay if delay > _EPSILON_S else 0.0

    def take(self, points: int) -> None:
        """A request of ``points`` was sent: they are paid for (into debt if need be)."""
        with self._lock:
            self._refill()
            self._tokens -= points

    def wait(self, between: Callable[[], None] = _nothing) -> float:
        """Sleep until a request may go; ``between`` runs before each sleep and stops
        the wait by raising. Returns the seconds waited (0: none)."""
        began = self._clock()
        while (delay := self.delay()) > 0:
            between()
            self._sleep(min(delay, _SLICE_S))
        return self._clock() - began

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self.rate)
        self._at = now


def counted(bucket: TokenBucket) -> Callable[[int], None]:
    """An ``on_batch`` callback of a delivery (the running count of points it sent)
    that pays for each request's points as it is reported. A count that falls (the
    send started over, after a staging outage) is a new send's: its points are
    sent again, and paid for again."""
    lock = threading.Lock()
    seen = [0]

    def sent(total: int) -> None:
        with lock:
            added = total - seen[0] if total >= seen[0] else total
            seen[0] = total
        bucket.take(added)

    return sent
