"""The operator's operations as plain functions: take a config, return frozen data.

Like alembic's ``command`` module under its CLI: every ``twophase`` command
is one function here, usable from Python (a notebook, a scheduler, a
metrics exporter), and the CLI ([`twophase.cli`][twophase.cli]) only parses arguments,
calls one of them and renders what it returns. Nothing here prints, reads a
terminal or exits; an operation talks to its caller through
[`Hooks`][twophase.operations.hooks.Hooks]
(progress, warnings, confirmation of destructive steps).

Store operations need only the staging settings
([`twophase.operations.store`][twophase.operations.store]):
[`status`][twophase.operations.store.status], [`epochs`][twophase.operations.store.epochs],
[`dead_letters`][twophase.operations.store.dead_letters],
[`export_dead_letters`][twophase.operations.store.export_dead_letters],
[`abort`][twophase.operations.store.abort], [`gc`][twophase.operations.store.gc],
[`reset`][twophase.operations.store.reset], and
[`target_states`][twophase.operations.store.target_states] (the targets of sinks that deliver to
several InfluxDB
servers). Delivery operations also talk to InfluxDB
([`twophase.operations.delivery`][twophase.operations.delivery]):
[`recover`][twophase.operations.delivery.recover], [`resend`][twophase.operations.delivery.resend],
[`verify`][twophase.operations.verify],
[`verify_targets`][twophase.operations.delivery.verify_targets],
[`requeue`][twophase.operations.delivery.requeue], and
[`resync`][twophase.operations.delivery.resync] of one target
([`target_config`][twophase.operations.delivery.target_config]
picks a configured target by name).
The exporter ([`twophase.operations.metrics`][twophase.operations.metrics]):
[`start_exporter`][twophase.operations.metrics.start_exporter]. The schema from the
installed package ([`twophase.operations.migrate`][twophase.operations.migrate]):
[`current_schema`][twophase.operations.migrate.current_schema],
[`upgrade_schema`][twophase.operations.migrate.upgrade_schema],
[`downgrade_schema`][twophase.operations.migrate.downgrade_schema],
[`schema_history`][twophase.operations.migrate.schema_history], and the SQL of a migration
without running it: [`upgrade_sql`][twophase.operations.migrate.upgrade_sql],
[`downgrade_sql`][twophase.operations.migrate.downgrade_sql].

Errors are twophase's own ([`twophase.errors`][twophase.errors]): ``UnknownSinkError`` and
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
