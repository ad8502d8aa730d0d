"""The staging schema: SQLAlchemy metadata, the single source Alembic migrates from.

Tables (all prefixed ``twophase_`` so they can share a database with others):

* ``twophase_sinks``: one row per sink; its fencing token, owning run, bound query,
  running totals (``SINK_COUNTERS``) for metrics, and the floor of its compacted
  history (``compacted_through``: GC deleted the records of older epochs, every one
  of which that was decided is COMMITTED and delivered), and the generation its
  targets register in (``generation``: the last one given out for the sink; a reset and
  a ``targets resync --from-epoch`` each take the next).
* ``twophase_runs``: every start of a query against a sink (audit of fencing), and
  when and how it ended (``ended_at``, ``end_reason``) if it said so.
* ``twophase_epochs``: the epoch state machine (PRECOMMITTED/COMMITTED/ABORTED). Spark's
  batch ids are epochs 0, 1, 2...; an operator's *correction* (dead letters requeued,
  [`twophase.operations.requeuer`][twophase.operations.requeuer]) is epoch ``-n`` for the sink's
  n-th correction, so the two sequences never collide.
* ``twophase_writes``: one row per staged write (task attempt): its sink, epoch, counts.
* ``twophase_staged_chunks``: the line-protocol lines of each write, in chunks of
  consecutive lines keyed by ``(write_id, chunk)``. ``body`` is the chunk's
  ``points`` lines joined by newlines -- a target's request body as it is;
  line ``i`` has staged seq ``first_seq + i``. ``ends`` is NULL unless a line
  holds a newline of its own; then ``ends[i]`` is the offset just past line
  ``i``'s newline in ``body || '\n'``. One row per up to 5,000 lines instead of one
  per line spares the client and PostgreSQL a row's work per point
  (``docs/operations/capacity.md``). ``body`` is compressed with lz4 where the server
  has it, else stored uncompressed (set by the migration: pglz slowed COPY down more
  than it saved). A write names its sink and epoch, so rows carry only the write id.
  There is no foreign key on purpose (an RI trigger per row costs COPY
  time); the write row is inserted in the same transaction as the COPY.
  ``lane`` is the promotion lane of the chunk's lines
  ([`twophase.protocol.stage.lanes`][twophase.protocol.stage.lanes];
  0 with one connection).
  With ``compression`` gzip (the default), ``body`` is NULL and ``body_gz``
  holds the same text and one newline more as one gzip member, compressed on
  the executor and sent to a target as it is (stored uncompressed by
  PostgreSQL: ``STORAGE EXTERNAL``); exactly one of the two is set.
  ``checksum`` is the chunk's digest as stored, bound to its write, first seq
  and points (``StagedChunk.digest``): each chunk is checked against it before
  it is sent (I1). NULL for chunks staged before ``0012_chunk_checksums``,
  which their write's checksum covers.
* ``twophase_dead_letters``: rows and points that could not be delivered, with the reason
  (and, with several targets, the target that refused the point);
  ``requeued_in`` names the correction that carried a point again; ``reset_at`` marks a
  letter a reset kept (its write's epoch is forgotten, the letter stays the sink's).
* ``twophase_epoch_events``: the history of each epoch (decided, replay, committed, aborted...).
* ``twophase_targets``: per sink, each of its targets (the one ``target_url`` makes is
  named ``default``): its state (``TARGET_STATES``), the last epoch delivered to it in
  epoch order, the first epoch it is owed (a target added later starts at the next
  epoch), its URL as last registered (credentials removed), its last resync, and the
  *generation* of epoch numbers its deliveries are recorded under (``generation``: a
  transactional target's own record names it, so that the record of an epoch number a
  reset or a ``resync --from-epoch`` has given out again is inert).
* ``twophase_target_deliveries``: one row per target and epoch delivered to it.
* ``twophase_target_backlog`` (a view): each target's COMMITTED epochs past its cursor,
  and the COMMITTED corrections it is owed and has no delivery of.

``SCHEMA_REVISION`` is the Alembic head this code needs; a unit test keeps it
equal to ``twophase/migrations/versions``' head.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA

from twophase.model import EpochState, Phase
from twophase.store.database import SCHEMA_REVISION, VERSION_TABLE

__all__ = ["SCHEMA_REVISION", "VERSION_TABLE", "metadata"]

TABLE_PREFIX = "twophase_"

EPOCH_STATES = tuple(state.value for state in EpochState)
PHASES = tuple(phase.value for phase in Phase)
TARGET_STATES = ("live", "lagging", "quarantined")

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


# Running totals of a sink, kept by the ledger in the transactions that already lock
# its row, so that a metrics scrape reads one row per sink (twophase.operations.exporter).
# ``corrections`` is the number of the sink's last correction (epoch -n).
SINK_COUNTERS = (
    "epochs_committed",
    "epochs_aborted",
    "points_staged",
    "points_delivered",
    "points_rejected_stage",
    "points_rejected_promote",
    "points_requeued",
    "promote_attempts",
    "promote_retries",
    "fenced_attempts",
    "staged_bytes",
    "corrections",
)


def _counter(name: str) -> Column[int]:
    return Column(name, BigInteger, nullable=False, server_default="0")


def _created_at() -> Column[datetime]:
    return Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now())


sinks = Table(
    "twophase_sinks",
    metadata,
    Column("sink_id", Text, primary_key=True),
    Column("query_id", Text, nullable=True, comment="Spark queryId bound to the sink (I6)"),
    Column("owner_run_id", Text, nullable=True),
    Column("fencing_token", BigInteger, nullable=False, server_default="0"),
    Column("last_decided_epoch", BigInteger, nullable=True),
    Column("last_committed_epoch", BigInteger, nullable=True),
    Column("replays_detected", BigInteger, nullable=False, server_default="0"),
    Column("last_error", Text, nullable=True),
    _created_at(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    *(_counter(name) for name in SINK_COUNTERS),
    Column("last_committed_at", DateTime(timezone=True), nullable=True),
    Column(
        "compacted_through",
        BigInteger,
        nullable=True,
        comment="every Spark epoch up to it that was decided is COMMITTED and delivered (gc)",
    ),
    Column(
        "generation",
        BigInteger,
        nullable=False,
        server_default="0",
        comment="the sink's last generation given out: a target registered starts in it",
    ),
)

runs = Table(
    "twophase_runs",
    metadata,
    Column(
        "sink_id",
        Text,
        ForeignKey("twophase_sinks.sink_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("run_id", Text, primary_key=True),
    Column("query_id", Text, nullable=True),
    Column("fencing_token", BigInteger, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("end_reason", Text, nullable=True, comment="stopped or failed"),
)

epochs = Table(
    "twophase_epochs",
    metadata,
    Column(
        "sink_id",
        Text,
        ForeignKey("twophase_sinks.sink_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("epoch", BigInteger, nullable=False),
    Column("state", Text, nullable=False),
    Column("run_id", Text, nullable=True, comment="the run that decided the epoch"),
    Column("query_id", Text, nullable=True),
    Column("write_ids", ARRAY(Uuid), nullable=False),
    Column("checksum", Text, nullable=False),
    Column("points_staged", BigInteger, nullable=False),
    Column("points_rejected_stage", BigInteger, nullable=False, server_default="0"),
    Column("points_delivered", BigInteger, nullable=True),
    Column("points_rejected_promote", BigInteger, nullable=True),
    Column("promote_attempts", Integer, nullable=False, server_default="0"),
    Column("replays", Integer, nullable=False, server_default="0"),
    Column("last_error", Text, nullable=True),
    Column("decided_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("committed_at", DateTime(timezone=True), nullable=True),
    Column("aborted_at", DateTime(timezone=True), nullable=True),
    Column("purged_at", DateTime(timezone=True), nullable=True),
    Column("staged_bytes", BigInteger, nullable=False, server_default="0"),
    Column("target", Text, nullable=True, comment="a correction's one target"),
    PrimaryKeyConstraint("sink_id", "epoch"),
    CheckConstraint(f"state IN {EPOCH_STATES!r}", name="state"),
    Index(None, "state", "sink_id", "epoch", postgresql_where="state = 'PRECOMMITTED'"),
)

writes = Table(
    "twophase_writes",
    metadata,
    Column("write_id", Uuid, primary_key=True),
    Column("sink_id", Text, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("run_id", Text, nullable=True),
    Column("partition_id", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("points", BigInteger, nullable=False),
    Column("rejected", BigInteger, nullable=False),
    Column("checksum", Text, nullable=False),
    Column("staged_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index(None, "sink_id", "epoch"),
)

staged_chunks = Table(
    "twophase_staged_chunks",
    metadata,
    Column("write_id", Uuid, nullable=False),
    Column("chunk", Integer, nullable=False),
    Column("first_seq", Integer, nullable=False),
    Column("points", Integer, nullable=False),
    Column("ends", ARRAY(Integer), nullable=True),
    Column("body", Text, nullable=True),
    Column("lane", SmallInteger, nullable=False, server_default="0"),
    Column("body_gz", BYTEA, nullable=True, comment="the lines as one gzip member"),
    Column(
        "checksum",
        BYTEA,
        nullable=True,
        comment="blake2b of the chunk as stored, bound to its write, first seq and points (I1)",
    ),
    PrimaryKeyConstraint("write_id", "chunk"),
    CheckConstraint("(body IS NULL) <> (body_gz IS NULL)", name="one_body"),
)

_LETTER_TARGET = "the target that refused the point ('': none named: stage, or older letters)"
dead_letters = Table(
    "twophase_dead_letters",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("sink_id", Text, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("write_id", Uuid, nullable=False),
    Column("seq", Integer, nullable=False, comment="row index (stage) or staged seq (promote)"),
    Column("phase", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("payload", Text, nullable=False),
    _created_at(),
    Column(
        "requeued_in",
        BigInteger,
        nullable=True,
        comment="the correction (epoch -n) that carried it again",
    ),
    Column("requeued_at", DateTime(timezone=True), nullable=True),
    Column(
        "reset_at",
        DateTime(timezone=True),
        nullable=True,
        comment="the reset that forgot the epoch of its (decided) write; kept by gc",
    ),
    Column(
        "target",
        Text,
        nullable=False,
        server_default="",
        comment=_LETTER_TARGET,
    ),
    UniqueConstraint("write_id", "phase", "seq", "target"),
    CheckConstraint(f"phase IN {PHASES!r}", name="phase"),
    Index(None, "sink_id", "epoch"),
)

epoch_events = Table(
    "twophase_epoch_events",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("sink_id", Text, nullable=False),
    Column("epoch", BigInteger, nullable=True),
    Column("event", Text, nullable=False),
    Column("run_id", Text, nullable=True),
    Column("detail", Text, nullable=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index(None, "sink_id", "epoch"),
)

targets = Table(
    "twophase_targets",
    metadata,
    Column("sink_id", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("state", Text, nullable=False, server_default="live"),
    Column(
        "delivered_epoch",
        BigInteger,
        nullable=True,
        comment="every COMMITTED epoch from from_epoch up to it is in this target",
    ),
    Column("from_epoch", BigInteger, nullable=False, server_default="0"),
    Column("lagging_since", DateTime(timezone=True), nullable=True),
    Column("quarantined_at", DateTime(timezone=True), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("added_at", DateTime(timezone=True), server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), server_default=func.now()),
    Column("url", Text, nullable=True, comment="as last registered, credentials removed"),
    Column("url_changed_at", DateTime(timezone=True), nullable=True),
    Column("resynced_at", DateTime(timezone=True), nullable=True),
    Column(
        "generation",
        BigInteger,
        nullable=False,
        server_default="0",
        comment="the generation its deliveries are recorded under (resync --from-epoch: a new one)",
    ),
    PrimaryKeyConstraint("sink_id", "target"),
    CheckConstraint(f"state IN {TARGET_STATES!r}", name="state"),
)

target_deliveries = Table(
    "twophase_target_deliveries",
    metadata,
    Column("sink_id", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("delivered", BigInteger, nullable=False),
    Column("rejected", BigInteger, nullable=False),
    Column("run_id", Text, nullable=True),
    Column("at", DateTime(timezone=True), server_default=func.now()),
    PrimaryKeyConstraint("sink_id", "target", "epoch"),
)
