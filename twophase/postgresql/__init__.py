"""PostgreSQL (and TimescaleDB) as a target: an epoch written exactly once, by transaction.

* [`twophase.postgresql.postgresql_kind`][twophase.postgresql.postgresql_kind]: ``KIND``, the kind
  the registry finds as ``postgresql``;
* [`twophase.postgresql.writer`][twophase.postgresql.writer]: ``PostgresWriter``, an
  epoch's bodies and its delivered record in one transaction;
* [`twophase.postgresql.streamed`][twophase.postgresql.streamed]: a plain body turned
  into ``COPY`` rows by one pattern, without reading its points in Python;
* [`twophase.postgresql.tables`][twophase.postgresql.tables]: a measurement's table,
  read, checked or created;
* [`twophase.postgresql.record`][twophase.postgresql.record]: the delivered record in
  the target's database;
* [`twophase.postgresql.readback`][twophase.postgresql.readback]: ``PostgresReadback``,
  a target read back for ``verify``;
* [`twophase.postgresql.connect`][twophase.postgresql.connect]: settings checked,
  connections opened, errors classified.

The guide is the PostgreSQL target page of the documentation.
"""

from __future__ import annotations

from twophase.postgresql.connect import check_settings
from twophase.postgresql.postgresql_kind import KIND
from twophase.postgresql.readback import PostgresReadback
from twophase.postgresql.record import RECORD_TABLE, record_ddl
from twophase.postgresql.writer import PostgresWriter

__all__ = [
    "KIND",
    "RECORD_TABLE",
    "PostgresReadback",
    "PostgresWriter",
    "check_settings",
    "record_ddl",
]
