"""Retrying: backoff with jitter under a deadline, for the targets and for the staging store.

[`RetryPolicy`][twophase.retry.RetryPolicy] is the schedule (the sender uses it for a target).
[`StagingRetry`][twophase.retry.StagingRetry] repeats one step of the protocol while PostgreSQL is
unreachable (a restart, a failover, a dropped connection): every step it
wraps is safe to repeat -- a transaction that failed left nothing, and one
whose commit may have landed before the connection dropped is read back by
the step's ``again`` call rather than done twice (a decide). Past the
deadline the step raises [`StagingDeadlineError`][twophase.errors.StagingDeadlineError]
(retryable: a restart recovers), which an enclosing step does not retry again.

Both deadlines count from the last progress, not from the start of the work: a
long promotion that meets one dropped connection after minutes of sending gets the
whole deadline to ride it out, and a deadline error says how long the outage lasted.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from twophase.config import StagingConfig, TargetConfig
from twophase.errors import StagingDeadlineError, StagingUnavailableError

log = logging.getLogger("twophase.retry")
T = TypeVar("T")
# The staging store's backoff: a PostgreSQL restart takes about a second, a failover a
# few; steps are small transactions, so retrying often costs little.
STAGING_RETRY_INITIAL_S = 0.2
STAGING_RETRY_MAX_S = 5.0


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded by a deadline.

    ``jitter`` is the fraction of each backoff step that is randomised: 1.0 is
    "full jitter" (uniform in [0, step]), 0.0 none. ``deadline_s`` is how long
    a send keeps retrying without progress before giving up.
    """

    initial_s: float
    max_s: float
    deadline_s: float
    jitter: float = 1.0

    def __post_init__(self) -> None:
        if self.initial_s < 0 or self.max_s < 0 or self.deadline_s < 0:
            raise ValueError("retry times must not be negative")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter must be a fraction between 0 and 1")

    @classmethod
    def from_config(cls, config: TargetConfig) -> RetryPolicy:
        return cls(config.retry_initial_s, config.retry_max_s, config.retry_deadline_s)

    @classmethod
    def for_staging(cls, config: StagingConfig) -> RetryPolicy:
        return cls(STAGING_RETRY_INITIAL_S, STAGING_RETRY_MAX_S, config.retry_deadline_s)

    def delay(
        self,
        attempt: int,
        retry_after: float | None = None,
        rand: Callable[[], float] = random.random,
    ) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        The backoff step ``initial_s * 2**(attempt-1)`` is capped at ``max_s``
        and jittered downwards; the result is never below ``retry_after``
        (the server knows best when it will be back), even above ``max_s``.
        """
        exponent = min(max(attempt - 1, 0), 64)  # 2**64 * anything is past any cap
        step = min(self.max_s, self.initial_s * 2.0**exponent)
        wait = step * (1.0 - self.jitter * rand())
        return max(wait, retry_after or 0.0)


@dataclass(frozen=True)
class StagingRetry:
    """Repeats a protocol step while the staging store is unreachable, up to a deadline.

    Idempotency is the caller's: only steps that are safe to repeat are
    wrapped. ``sleep`` and ``clock`` are for unit tests.
    """

    policy: RetryPolicy
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    @classmethod
    def of(cls, config: StagingConfig) -> StagingRetry:
        return cls(RetryPolicy.for_staging(config))

    def __call__(
        self,
        what: str,
        call: Callable[[], T],
        *,
        again: Callable[[], T] | None = None,
        repeatable: Callable[[], bool] = lambda: True,
        progress: Progress | None = None,
    ) -> T:
        """``call()``, repeated while it raises StagingUnavailableError.

        ``again`` replaces ``call`` from the second attempt on (a step that
        reads back what a first attempt may have committed). When
        ``repeatable()`` is false after a failure (the step consumed input
        it cannot read again) the error is raised as it is.

        The deadline runs from the first failure of the current outage: the
        first failure, or the first after an attempt that reported to
        ``progress`` (a long step that got on, then lost its connection).
        """
        outage = _Outage(self.clock, progress)
        step = call
        while True:
            try:
                return step()
            except StagingDeadlineError:
                raise  # an inner step already waited its deadline
            except StagingUnavailableError as exc:
                if not repeatable():
                    raise
                outage.failed()
                self._wait(what, outage, exc)
            step = again or call

    def _wait(self, what: str, outage: _Outage, exc: Exception) -> None:
        lasted = outage.lasted()
        remaining = self.policy.deadline_s - lasted
        if remaining <= 0:
            raise StagingDeadlineError(
                f"{what}: the staging database stayed unavailable for {lasted:.0f}s, "
                f"{outage.failures} failed attempt(s) "
                f"(staging_retry_deadline {self.policy.deadline_s:g}s): {exc}"
            ) from None
        delay = min(self.policy.delay(outage.failures), remaining)
        log.warning(
            "%s failed (attempt %d); retrying in %.2fs: %s", what, outage.failures, delay, exc
        )
        self.sleep(delay)


class Progress:
    """What a long step wrapped by [`StagingRetry`][twophase.retry.StagingRetry] calls each time it
    gets on (a promotion: each request delivered), so that a failure after it begins a new
    outage with the whole deadline ahead. Lanes call it from their threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports = 0

    def __call__(self) -> None:
        with self._lock:
            self._reports += 1

    @property
    def reports(self) -> int:
        with self._lock:
            return self._reports


class _Outage:
    """One ``StagingRetry`` call's current outage: when its first failure was, and how
    many attempts have failed since."""

    def __init__(self, clock: Callable[[], float], progress: Progress | None) -> None:
        self._clock = clock
        self._progress = progress
        self._reports = self._reported()
        self.began: float | None = None
        self.failures = 0

    def failed(self) -> None:
        """Count a failure; the first one, or the first after progress, begins an outage.

        Measured from the failure, not from the attempt's start: an attempt that
        reported nothing may have worked for minutes before the connection dropped."""
        reports = self._reported()
        if self.began is None or reports != self._reports:
            self.began, self.failures, self._reports = self._clock(), 0, reports
        self.failures += 1

    def lasted(self) -> float:
        """Seconds from the outage's first failure to now."""
        return 0.0 if self.began is None else self._clock() - self.began

    def _reported(self) -> int:
        return 0 if self._progress is None else self._progress.reports
