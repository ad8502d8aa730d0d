"""The operator's operations as plain functions: take a config, return frozen data.

Like alembic's ``command`` module under its CLI: every ``twophase`` command
is one function here, usable from Python (a notebook, a scheduler, a
metrics exporter), and the CLI ([`twophase.cli`][twophase.cli]) only parses arguments,
calls one of them and renders what it returns. Nothing here prints, reads a
terminal or exits; an operation talks to its caller through
[`Hooks`][twophase.operations.hooks.Hooks]
(progress, warnings, confirmation of destructive steps).

Store operations need only the staging settings
([`twophase.operations.store_only`][twophase.operations.store_only]):
[`status`][twophase.operations.store_only.status],
[`epochs`][twophase.operations.store_only.epochs],
[`dead_letters`][twophase.operations.store_only.dead_letters],
[`export_dead_letters`][twophase.operations.store_only.export_dead_letters],
[`abort`][twophase.operations.store_only.abort], [`gc`][twophase.operations.store_only.gc],
[`reset`][twophase.operations.store_only.reset], and
[`target_states`][twophase.operations.store_only.target_states] (each sink's targets).
Delivery operations also talk to the targets, one module each:
[`recover`][twophase.operations.recover.recover]
([`twophase.operations.recover`][twophase.operations.recover]),
[`resend`][twophase.operations.resend.resend]
([`twophase.operations.resend`][twophase.operations.resend]),
[`verify`][twophase.operations.verify.verify]
([`twophase.operations.verify`][twophase.operations.verify], with the comparison they run),
[`requeue`][twophase.operations.requeue.requeue]
([`twophase.operations.requeue`][twophase.operations.requeue]), and
[`resync`][twophase.operations.resync.resync] of one target
([`twophase.operations.resync`][twophase.operations.resync]);
[`remove_target`][twophase.operations.removal.remove_target] decommissions one
([`twophase.operations.removal`][twophase.operations.removal], staging settings and the
configured targets' names only);
[`target_config`][twophase.operations.target_choice.target_config]
([`twophase.operations.target_choice`][twophase.operations.target_choice])
picks a configured target by name.
The exporter ([`twophase.operations.metrics`][twophase.operations.metrics]):
[`start_exporter`][twophase.operations.metrics.start_exporter]. The schema from the
installed package ([`twophase.operations.migrate`][twophase.operations.migrate]):
[`current_schema`][twophase.operations.migrate.current_schema],
[`upgrade_schema`][twophase.operations.migrate.upgrade_schema],
[`downgrade_schema`][twophase.operations.migrate.downgrade_schema],
[`schema_history`][twophase.operations.migrate.schema_history], and the SQL of a migration
without running it: [`upgrade_sql`][twophase.operations.migrate.upgrade_sql],
[`downgrade_sql`][twophase.operations.migrate.downgrade_sql]. The grants of the roles
of least privilege ([`twophase.operations.role_grants`][twophase.operations.role_grants]):
[`grant_sql`][twophase.operations.role_grants.grant_sql] (printed) and
[`apply_grants`][twophase.operations.role_grants.apply_grants].

The types these functions take and return are exported here too, those defined
elsewhere included: [`EpochRange`][twophase.store.views.EpochRange] (the epochs to act on),
[`RequeueFilter`][twophase.operations.requeuer.RequeueFilter] (the dead letters to requeue),
[`RoleNames`][twophase.store.least_privilege.RoleNames] (the roles to grant to),
[`SinkStatus`][twophase.store.views.SinkStatus], [`EpochInfo`][twophase.store.views.EpochInfo],
[`TargetState`][twophase.protocol.ledger.target_ledger.TargetState],
[`VerifyReport`][twophase.operations.verify.VerifyReport] and
[`SeriesDiff`][twophase.operations.verify.SeriesDiff]; a caller (the CLI) needs no other module.

Errors are twophase's own ([`twophase.errors`][twophase.errors]): ``UnknownSinkError`` and
``EpochRangeError`` for what is not recorded, ``UsageError`` for arguments that
cannot work together, ``RefusedError`` when a live run owns the sink (and
``Guard.force`` is off) or the caller declined a confirmation.
"""

from __future__ import annotations

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
from twophase.operations.recover import CaughtUp, RecoverReport, StillBehind, recover
from twophase.operations.removal import RemoveReport, remove_target
from twophase.operations.requeue import RequeueReport, requeue
from twophase.operations.requeuer import RequeueFilter
from twophase.operations.resend import ResendReport, resend
from twophase.operations.resync import ResyncReport, resync
from twophase.operations.role_grants import (
    GrantReport,
    GrantSql,
    RoleNames,
    apply_grants,
    grant_sql,
)
from twophase.operations.store_only import (
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
from twophase.operations.target_choice import target_config
from twophase.operations.verify import (
    SeriesDiff,
    TargetVerifyReport,
    VerifyReport,
    verify,
)
from twophase.protocol.ledger.target_ledger import TargetState
from twophase.store.views import EpochInfo, EpochRange, SinkStatus

__all__ = [
    "LIVE_WINDOW_S",
    "AbortReport",
    "CaughtUp",
    "DeadLetterListing",
    "EpochInfo",
    "EpochListing",
    "EpochRange",
    "ExportReport",
    "GcSummary",
    "GrantReport",
    "GrantSql",
    "Guard",
    "Hooks",
    "Progress",
    "RecoverReport",
    "RemoveReport",
    "RequeueFilter",
    "RequeueReport",
    "ResendReport",
    "ResetReport",
    "ResyncReport",
    "RoleNames",
    "SchemaHistory",
    "SchemaReport",
    "SchemaRevision",
    "SchemaSql",
    "SeriesDiff",
    "SinkStatus",
    "StillBehind",
    "TargetState",
    "TargetVerifyReport",
    "VerifyReport",
    "abort",
    "apply_grants",
    "current_schema",
    "dead_letters",
    "downgrade_schema",
    "downgrade_sql",
    "epochs",
    "export_dead_letters",
    "gc",
    "grant_sql",
    "recover",
    "remove_target",
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
]
