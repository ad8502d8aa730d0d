"""twophase: exactly-once delivery from Spark Structured Streaming into InfluxDB, PostgreSQL
and other kinds of target.

A micro-batch (an *epoch*) is staged into PostgreSQL, decided (PRECOMMITTED),
promoted to the sink's targets and marked COMMITTED, in the manner of Flink's two-phase
commit sink. ``docs/concepts/design.md`` in the repository and the pages it lists hold
the protocol, its invariants I1-I10, the contracts and the module map.

The names in `__all__` are the Python API:

    from twophase import DriverCommitter, PointBuilder, PointSpec, load_config

The Spark sink is [`twophase.spark`][twophase.spark] (``twophase.spark.register(spark)``) and the
operator's commands are the functions of [`twophase.operations`][twophase.operations].

Each name is imported on first use (PEP 562): ``import twophase`` itself imports
nothing, so a Spark executor that unpickles a staging task pays only for what
staging needs, never for the driver's protocol, SQLAlchemy or the InfluxDB client.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

__version__ = "0.10.0"
logging.getLogger(__name__).addHandler(logging.NullHandler())  # output is the application's choice

if TYPE_CHECKING:
    from twophase.config import (
        StagingConfig,
        TargetConfig,
        TwoPhaseConfig,
        load_config,
        load_staging_config,
        load_target_config,
    )
    from twophase.errors import (
        CheckpointResetError,
        ConfigError,
        FencedError,
        PermanentError,
        PointError,
        RetryableError,
        StagingUnavailableError,
        StateError,
        TargetUnavailableError,
        TwoPhaseError,
    )
    from twophase.model import CommitMessage, DeadLetter, EpochState, Lease
    from twophase.points.builder import PointBuilder, PointSpec
    from twophase.protocol.commit.committer import CommitOutcome
    from twophase.roles import DriverCommitter, ExecutorStager

# Public name -> the module that defines it.
_HOMES = {
    "StagingConfig": "twophase.config",
    "TargetConfig": "twophase.config",
    "TwoPhaseConfig": "twophase.config",
    "load_config": "twophase.config",
    "load_staging_config": "twophase.config",
    "load_target_config": "twophase.config",
    "CheckpointResetError": "twophase.errors",
    "ConfigError": "twophase.errors",
    "FencedError": "twophase.errors",
    "PermanentError": "twophase.errors",
    "PointError": "twophase.errors",
    "RetryableError": "twophase.errors",
    "StagingUnavailableError": "twophase.errors",
    "StateError": "twophase.errors",
    "TargetUnavailableError": "twophase.errors",
    "TwoPhaseError": "twophase.errors",
    "CommitMessage": "twophase.model",
    "DeadLetter": "twophase.model",
    "EpochState": "twophase.model",
    "Lease": "twophase.model",
    "PointBuilder": "twophase.points.builder",
    "PointSpec": "twophase.points.builder",
    "CommitOutcome": "twophase.protocol.commit.committer",
    "DriverCommitter": "twophase.roles",
    "ExecutorStager": "twophase.roles",
}

__all__ = [
    "CheckpointResetError",
    "CommitMessage",
    "CommitOutcome",
    "ConfigError",
    "DeadLetter",
    "DriverCommitter",
    "EpochState",
    "ExecutorStager",
    "FencedError",
    "Lease",
    "PermanentError",
    "PointBuilder",
    "PointError",
    "PointSpec",
    "RetryableError",
    "StagingConfig",
    "StagingUnavailableError",
    "StateError",
    "TargetConfig",
    "TargetUnavailableError",
    "TwoPhaseConfig",
    "TwoPhaseError",
    "__version__",
    "load_config",
    "load_staging_config",
    "load_target_config",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        return _former(name)
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def _former(name: str) -> Any:
    """A name of a former version (a configuration's, an error's, the protocol's parts),
    with its DeprecationWarning; never cached here, so that each use warns."""
    from twophase.config.former import FORMER
    from twophase.config.former import former_name as former_config
    from twophase.errors import former_name as former_error

    if name == "TwoPhase":  # every part of the protocol, now inside DriverCommitter
        from twophase.deprecation import warn_deprecated
        from twophase.protocol.commit.runtime import TwoPhase

        warn_deprecated(
            "twophase.TwoPhase", "DriverCommitter (and its stager() for executors)", stacklevel=3
        )
        return TwoPhase
    former = former_config if name in FORMER else former_error
    return former(__name__, name, stacklevel=3)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
