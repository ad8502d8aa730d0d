"""One exception hierarchy for everything twophase raises on purpose.

Callers branch on the class, never on the message:

* ``RetryableError``: the same call may succeed later (InfluxDB or PostgreSQL
  down, deadline passed). The protocol state is consistent; recovery resumes.
* ``PermanentError``: retrying the same call cannot help (bad credentials,
  missing database, fenced run, reset checkpoint, invalid transition).
* ``ConfigError``: a configuration value is missing or wrong; ``option`` names
  the option or environment variable.

Messages never contain secrets: anything that may carry a password or token
is masked before it reaches an exception.
"""

from __future__ import annotations


class TwoPhaseError(Exception):
    """Base of every error twophase raises on purpose."""


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


class InfluxUnavailableError(RetryableError):
    """InfluxDB could not be reached or kept failing until the retry deadline."""


class StagingUnavailableError(RetryableError):
    """The PostgreSQL staging store could not be reached."""


class PermanentError(TwoPhaseError):
    """Retrying the same call cannot succeed without a change by a person."""


class SchemaError(PermanentError):
    """The staging schema is missing or not at the revision this code needs."""


class InfluxAuthError(PermanentError):
    """InfluxDB refused the credentials (401) or the permission (403)."""


class InfluxNotFoundError(PermanentError):
    """InfluxDB has no such database, retention policy, bucket or org (404)."""


class InfluxRequestError(PermanentError):
    """InfluxDB rejected a request for a reason that retrying cannot fix."""


class FencedError(PermanentError):
    """A newer run owns the sink; this (zombie) run may no longer decide or mark (I5)."""


class CheckpointResetError(PermanentError):
    """A query restarted below the sink's epochs under a new query id (I6)."""


class StateError(PermanentError):
    """A transition the epoch state machine does not allow, or an unknown sink/epoch."""
