"""One exception hierarchy for everything twophase raises on purpose.

Callers branch on the class, never on the message:

* ``RetryableError``: the same call may succeed later (a target or PostgreSQL
  down, deadline passed). The protocol state is consistent; recovery resumes.
* ``PermanentError``: retrying the same call cannot help (bad credentials,
  missing database, fenced run, reset checkpoint, invalid transition).
* ``ConfigError``: a configuration value is missing or wrong; ``option`` names
  the option or environment variable.
* ``PointError``: one row cannot become a point (a dead letter, not a failure).
* ``UsageError``: an operation was asked for in a way that cannot work.

Every exception class of twophase is defined here, so the hierarchy reads in
one place.

Messages never contain secrets: anything that may carry a password or token
is masked before it reaches an exception.
"""

from __future__ import annotations

from twophase.deprecation import warn_deprecated


class TwoPhaseError(Exception):
    """Base of every error twophase raises on purpose.

    ``http_status`` is the status of the target's HTTP answer it stands for, when
    there was one (for the driver's metrics,
    [`twophase.targets.metering`][twophase.targets.metering]).
    """

    http_status: int | None = None


class ConfigError(TwoPhaseError, ValueError):
    """A configuration value is missing or invalid.

    ``option`` is the name the user wrote it under (an environment variable or
    an option name), so the message can point straight at it.
    """

    def __init__(self, option: str, problem: str) -> None:
        self.option = option
        self.problem = problem
        super().__init__(f"{option}: {problem}")


class RetryableError(TwoPhaseError):
    """A transient failure; the operation may be repeated later unchanged."""


class TargetUnavailableError(RetryableError):
    """A target could not be reached or kept failing until the retry deadline."""


class StagingUnavailableError(RetryableError):
    """The PostgreSQL staging store could not be reached."""


class LockLostError(RetryableError):
    """A session-level lock that orders a target's deliveries was lost with its session
    (a PostgreSQL restart, a cut connection) while its holder was delivering: the
    delivery stops before its next request, and starts again under the lock."""


class RecoveryLockLostError(RetryableError):
    """The sink's recovery lock was lost with its session (a PostgreSQL restart, a cut
    connection, an ended session) while its holder was recovering: the recovery stops
    before its next request, since another process of the run may now be recovering
    the sink (I3). Not a target's failure: the whole recovery stops; the epoch stays
    PRECOMMITTED for the next recovery, under the lock."""


class TargetOrderError(RetryableError):
    """A target's delivery could not be recorded in epoch order: its cursor is no longer
    just below the epoch (a resync moved it, or another delivery recorded it first).
    Nothing is recorded; the target is owed the epoch still. ``target`` names it."""

    def __init__(self, message: str, target: str = "") -> None:
        super().__init__(message)
        self.target = target


class StagingDeadlineError(StagingUnavailableError):
    """The staging store stayed unreachable past ``staging_retry_deadline``.

    Still retryable (a restart recovers); a step that wraps another does not
    retry it again, so the deadline is not spent twice.
    """


class PermanentError(TwoPhaseError):
    """Retrying the same call cannot succeed without a change by a person."""


class SchemaError(PermanentError):
    """The staging schema is missing or not at the revision this code needs."""


class InflateLimitError(PermanentError):
    """Compressed data (a staged chunk, a server's answer) inflates past the most its
    writer could have made: refused once the bound is reached, before the rest is
    inflated. A staged chunk that does is damaged (I1); the epoch is left for an
    operator."""


class TargetAuthError(PermanentError):
    """A target refused the credentials or the permission (InfluxDB's 401 or 403)."""


class TargetNotFoundError(PermanentError):
    """A target has no such database, table, retention policy, bucket or org (InfluxDB's
    404)."""


class TargetRequestError(PermanentError):
    """A target rejected a request for a reason that retrying cannot fix."""


class FencedError(PermanentError):
    """A newer run owns the sink; this (zombie) run may no longer decide or mark (I5)."""


class FrozenHolderError(PermanentError):
    """A lock is held by the session of a fenced run (a frozen driver's) under another
    role, which this role may not end (``pg_terminate_backend``): given up after
    ``staging_retry_deadline``, since that session does not end by itself. The message
    names the session, and the command or grant that ends it."""


class CheckpointResetError(PermanentError):
    """A query restarted below the sink's epochs under a new query id (I6)."""


class StateError(PermanentError):
    """A transition the epoch state machine does not allow, or an unknown sink/epoch."""


class UnknownSinkError(StateError):
    """The sink id names no sink of this staging store (a usage error for the CLI)."""


class EpochRangeError(StateError):
    """The epochs asked for are not recorded for the sink (a usage error for the CLI)."""


class UsageError(TwoPhaseError):
    """An operation was asked for in a way that cannot work (the CLI exits 2)."""


class RefusedError(PermanentError):
    """An operation will not act: a live run owns the sink, or the operator declined."""


class PointError(TwoPhaseError):
    """A row cannot become a point; ``reason`` says why, for a person."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class LineProtocolError(TwoPhaseError, ValueError):
    """A line that is not valid InfluxDB line protocol."""


class TransientWriteError(TargetUnavailableError):
    """One attempt failed for a reason that may pass (network, overload, restart).

    ``retry_after`` is the server's Retry-After in seconds, when it sent one.
    Nothing is known about which points of the body arrived.
    """

    def __init__(
        self, message: str, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class BatchTooLargeError(TargetRequestError):
    """413: the body exceeds the server's limit; smaller bodies may pass."""


class TransactionLostError(RetryableError):
    """A transactional target lost the transaction an epoch was being delivered in (its
    connection dropped, the server restarted): nothing of the epoch was committed, and
    the delivery starts the epoch over in a new transaction. Never retried request by
    request, which would commit an epoch missing the requests sent before the loss."""


class EpochStartOverError(TransactionLostError):
    """A transactional target ended an epoch's transaction on purpose: a table it had
    written to needed a new column, which is added in a transaction of its own and
    could not be while the epoch's held the table. Nothing of the epoch was committed;
    the delivery starts it over at once, the column there."""


class TargetTableError(TargetRequestError, ConfigError):
    """A target's table cannot take what the sink writes (a key column of the wrong
    type, no unique key...): a person must change the table. A ConfigError whose
    ``option`` is the table, the problem naming the column; a target's refusal too, so
    that the other targets go on while this one lags (I10)."""

    def __init__(self, table: str, problem: str) -> None:
        ConfigError.__init__(self, table, problem)


class BadPointsError(TargetRequestError):
    """Some points were refused (InfluxDB's 400 or 422); ``reason`` is the target's own
    message.

    With 1.x ("partial write: ... dropped=N") the other points of the body
    were written; which ones were refused is only known by re-sending parts.
    ``line`` is the refused line's index in the body when the server names it
    (InfluxDB 3, which then wrote none of the body), and ``original`` the
    server's copy of that line when it sent one; None otherwise. ``dropped`` is
    1.x's N: points of the body it parsed and refused (lines it could not parse
    are not counted), None when it did not say; ``every_line``: 1.x refused the
    body whole because it could parse none of its lines.
    """

    def __init__(
        self,
        message: str,
        reason: str,
        line: int | None = None,
        original: str | None = None,
        *,
        dropped: int | None = None,
        every_line: bool = False,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.line = line
        self.original = original
        self.dropped = dropped
        self.every_line = every_line


# What one target of a sink may answer that leaves it lagging rather than failing the
# commit (twophase.protocol.commit.promoter), once min_targets targets hold the epoch: that
# server is down, refuses the credentials, lacks the database or refuses the request;
# or the lock ordering its deliveries was lost, or its cursor moved meanwhile. Anything
# else (fencing, a damaged epoch, the staging store) fails the commit.
TARGET_FAILURES: tuple[type[TwoPhaseError], ...] = (
    TargetUnavailableError,
    LockLostError,
    TargetOrderError,
    TargetAuthError,
    TargetNotFoundError,
    TargetRequestError,
)


# The names the target errors had while InfluxDB was the only kind of target: still
# importable, as the same classes (an ``except`` or ``isinstance`` with either name
# catches both), each use warning until they go.
FORMER_NAMES: dict[str, type[TwoPhaseError]] = {
    "InfluxUnavailableError": TargetUnavailableError,
    "InfluxAuthError": TargetAuthError,
    "InfluxNotFoundError": TargetNotFoundError,
    "InfluxRequestError": TargetRequestError,
}


def former_name(module: str, name: str, stacklevel: int) -> type[TwoPhaseError]:
    """The class the former name ``name`` stands for, after a DeprecationWarning naming
    its current name; AttributeError for any other name. ``stacklevel`` is counted as
    ``warnings.warn`` counts it where this is called, so the warning names the code that
    used the name (the filters match its module)."""
    current = FORMER_NAMES.get(name)
    if current is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warn_deprecated(
        f"{module}.{name}", f"{current.__name__} (the same class)", stacklevel=stacklevel + 1
    )
    return current


def __getattr__(name: str) -> type[TwoPhaseError]:
    # PEP 562: only a name the module does not define gets here (a former name).
    return former_name(__name__, name, stacklevel=2)
