"""The operator's operations as plain functions: take a config, return frozen data.

Like alembic's ``command`` module under its CLI: every ``twophase`` command
is one function here, usable from Python (a notebook, a scheduler, a
metrics exporter), and the CLI (:mod:`twophase.cli`) only parses arguments,
calls one of them and renders what it returns. Nothing here prints, reads a
terminal or exits; an operation talks to its caller through :class:`Hooks`
(progress, warnings, confirmation of destructive steps).

Store operations need only the staging settings (:mod:`.store`):
:func:`status`, :func:`epochs`, :func:`dead_letters`,
:func:`export_dead_letters`, :func:`abort`, :func:`gc`, :func:`reset`, and
:func:`target_states` (the targets of sinks that deliver to several InfluxDB
servers). Delivery operations also talk to InfluxDB (:mod:`.delivery`):
:func:`recover`, :func:`resend`, :func:`verify`, :func:`verify_targets`,
:func:`requeue`, and :func:`resync` of one target (:func:`target_config`
picks a configured target by name).
The exporter (:mod:`.metrics`): :func:`start_exporter`. The schema from the
installed package (:mod:`.migrate`): :func:`current_schema`, :func:`upgrade_schema`,
:func:`downgrade_schema`, :func:`schema_history`, and the SQL of a migration
without running it: :func:`upgrade_sql`, :func:`downgrade_sql`.

Errors are twophase's own (:mod:`twophase.errors`): ``UnknownSinkError`` and
``EpochRangeError`` for what is not recorded, ``UsageError`` for arguments that
cannot work together, ``RefusedError`` when a live run owns the sink (and
``Guard.force`` is off) or the caller declined a confirmation.
"""

from __future__ import annotations

from twophase.operations.delivery import (
    RequeueReport,
    ResendReport,
    ResyncReport,
    TargetVerifyReport,
    recover,
    requeue,
    resend,
    resync,
    target_config,
    verify,
    verify_targets,
)
from twophase.operations.hooks import LIVE_WINDOW_S, Guard, Hooks, Progress
from twophase.operations.metrics import start_exporter
from twophase.operations.migrate import (
    SchemaHistory,
    SchemaReport,
    SchemaRevision,
    SchemaSql,
    current_schema,
    downgrade_schema,
    downgrade_sql,
    schema_history,
    upgrade_schema,
    upgrade_sql,
)
from twophase.operations.store import (
    AbortReport,
    DeadLetterListing,
    EpochListing,
    ExportReport,
    GcSummary,
    ResetReport,
    abort,
    dead_letters,
    epochs,
    export_dead_letters,
    gc,
    reset,
    status,
    target_states,
)

__all__ = [
    "LIVE_WINDOW_S",
    "AbortReport",
    "DeadLetterListing",
    "EpochListing",
    "ExportReport",
    "GcSummary",
    "Guard",
    "Hooks",
    "Progress",
    "RequeueReport",
    "ResendReport",
    "ResetReport",
    "ResyncReport",
    "SchemaHistory",
    "SchemaReport",
    "SchemaRevision",
    "SchemaSql",
    "TargetVerifyReport",
    "abort",
    "current_schema",
    "dead_letters",
    "downgrade_schema",
    "downgrade_sql",
    "epochs",
    "export_dead_letters",
    "gc",
    "recover",
    "requeue",
    "resend",
    "reset",
    "resync",
    "schema_history",
    "start_exporter",
    "status",
    "target_config",
    "target_states",
    "upgrade_schema",
    "upgrade_sql",
    "verify",
    "verify_targets",
]
