"""The PostgreSQL target kind: what the registry finds as ``postgresql``.

A transactional kind ([`TRANSACTION`][twophase.targets.contract.TRANSACTION]): an epoch's
rows and its delivered record commit in one transaction, so an epoch is written
exactly once (a re-sent one is skipped by its record). Told by the URL schemes
``postgresql://`` and ``postgres://``; times kept to the microsecond.
"""

from __future__ import annotations

from twophase.postgresql.connect import SCHEMES, check_settings
from twophase.postgresql.readback import PostgresReadback
from twophase.postgresql.writer import PostgresWriter
from twophase.targets.contract import TRANSACTION, TargetKind

__all__ = ["KIND", "TIME_RESOLUTION_NS"]

TIME_RESOLUTION_NS = 1000  # timestamptz keeps microseconds

KIND = TargetKind(
    "postgresql",
    SCHEMES,
    TRANSACTION,
    writer=PostgresWriter,
    readback=PostgresReadback,
    check=check_settings,
    time_resolution_ns=TIME_RESOLUTION_NS,
)
