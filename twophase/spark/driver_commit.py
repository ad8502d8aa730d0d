"""Phase 2 on the driver: claim the sink for a run, decide and promote an epoch, abort.

Spark calls a streaming sink's ``commit(messages, batchId)`` in a Python
process of the driver that has no task context, so the run and query ids
come from the commit messages the tasks sent. Per process, the protocol's
parts are opened once per configuration and a run claims its sink once
([`claim`][twophase.spark.driver_commit.claim]), so a long-lived commit process pays for neither per
epoch.

Contracts:

* [`commit_epoch`][twophase.spark.driver_commit.commit_epoch] is idempotent per epoch: a replayed
  epoch is detected by the core and skipped (COMMITTED) or completed from its original
  writes (PRECOMMITTED); older PRECOMMITTED epochs are promoted first (I3).
* [`claim`][twophase.spark.driver_commit.claim] recovers: a run's first claim in a process promotes
  the epochs older runs left PRECOMMITTED, whether it comes from
  [`twophase.spark.claim_query`][twophase.spark.claim_query] at the query's start or from a commit.
* Errors propagate unchanged (the query fails with the twophase message):
  FencedError for a zombie run, CheckpointResetError for a reset checkpoint
  or a second query on the sink, TargetUnavailableError past the retry
  deadline (the epoch stays PRECOMMITTED; a restart recovers it).
* [`abort_epoch`][twophase.spark.driver_commit.abort_epoch] never raises for a staging problem:
  what it cannot delete now, GC removes later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from twophase.errors import ConfigError, PermanentError, TwoPhaseError
from twophase.faults import crash_point
from twophase.logs import fields
from twophase.model import CommitMessage, Lease
from twophase.protocol.commit.committer import CommitOutcome
from twophase.protocol.commit.runtime import TwoPhase
from twophase.retry import StagingRetry
from twophase.spark.master_retries import warn_without_task_retries
from twophase.spark.options import SinkOptions

log = logging.getLogger("twophase.spark")

_lock = threading.Lock()
_parts: dict[tuple[tuple[str, str], ...], TwoPhase] = {}
_leases: dict[tuple[str, str], Lease] = {}
# How long a foreachBatch function under Spark Connect waits for its client's claim:
# the client claims right after start() returns, while the first batch still plans.
CLAIM_WAIT_S = 60.0
_CLAIM_POLL_S = 0.1


def two_phase(sink: SinkOptions) -> TwoPhase:
    """The protocol's parts for the sink's settings, opened once per process; the
    first opening warns of a Spark master that retries no failed task."""
    with _lock:
        parts = _parts.get(sink.settings)
        if parts is None:
            warn_without_task_retries()
            config = sink.config()
            parts = _parts[sink.settings] = StagingRetry.of(config.staging)(
                "connect", lambda: TwoPhase.open(config, serve_metrics=True)
            )
        return parts


def open_in_background(sink: SinkOptions) -> None:
    """Start opening the sink's parts (connection pool, schema check, the targets' writers)
    in a thread, so that the first micro-batch finds them ready.

    Idempotent: [`two_phase`][twophase.spark.driver_commit.two_phase] opens them once per process,
    and a caller that needs them first waits for the opening. A failure is left to that
    caller, which meets it again with its message.
    """

    def opening() -> None:
        try:
            two_phase(sink)
        except Exception as exc:  # reported by the first real use, not from a thread
            log.debug(
                "opening sink %s in the background failed: %s",
                sink.sink_id,
                exc,
                extra=fields(sink.sink_id),
            )

    threading.Thread(target=opening, name="twophase-open", daemon=True).start()


def claim(sink: SinkOptions, run_id: str, query_id: str | None, *, recover: bool = True) -> Lease:
    """Begin ``run_id`` on the sink once per process (fences older runs, I5), and
    promote what older runs left PRECOMMITTED (`Committer.claim`; ``recover``
    False: claim only, for a process that does not promote).

    Raises CheckpointResetError when the sink belongs to another query that
    has decided epochs (a second query on the same sink id, or a restart
    from a deleted checkpoint, I6), and a recovery's failure as a commit
    raises it; the lease is then not kept, so the next claim recovers again.
    """
    key = (sink.sink_id, run_id)
    with _lock:
        lease = _leases.get(key)
    if lease is not None:
        return lease
    warn_without_task_retries()  # the parts may have been opened before the SparkContext
    parts = two_phase(sink)
    if recover:
        lease = parts.committer.claim(sink.sink_id, run_id, query_id)
    else:
        lease = parts.ledger.begin_run(sink.sink_id, run_id, query_id)
    with _lock:
        return _leases.setdefault(key, lease)


def drain(sink: SinkOptions) -> None:
    """Wait for the sink's epochs promoting in the background in this process (nothing
    when inline, or when this process never committed); raises the first failure, its
    epoch left PRECOMMITTED for the next start or ``twophase recover``."""
    with _lock:
        parts = _parts.get(sink.settings)
    if parts is not None:
        parts.committer.drain()


def await_claim(sink: SinkOptions, run_id: str, timeout: float = CLAIM_WAIT_S) -> str:
    """The query id that ``run_id`` claimed the sink with, once it has.

    For a driver that cannot read its query's id (a foreachBatch function
    under Spark Connect runs in the server's Python, without the streaming
    thread's properties): the client claims the run with the query's id
    ([`twophase.spark.claim_query`][twophase.spark.claim_query]), and nothing is decided before, so
    that I6 holds. Read-only; raises ConfigError after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        query_id = two_phase(sink).runs.query_of(sink.sink_id, run_id)
        if query_id is not None:
            return query_id
        if time.monotonic() >= deadline:
            raise ConfigError(
                "query_id",
                f"sink {sink.sink_id!r}: under Spark Connect the foreachBatch function cannot "
                "read its query's id, and the client did not claim the sink for it within "
                f"{timeout:g}s: call twophase.spark.claim_query(query, writer) right after "
                "start(), or pass query_id= to foreach_batch_writer",
            )
        time.sleep(_CLAIM_POLL_S)


def commit_epoch(
    sink: SinkOptions,
    epoch: int,
    messages: Sequence[CommitMessage],
    identity: tuple[str, str | None] | None = None,
    staged_s: float | None = None,
) -> CommitOutcome | None:
    """Decide and promote ``epoch`` from its tasks' messages; None if it had no task.
    ``staged_s`` is how long the staging job took, when the caller ran it (foreachBatch):
    the commit's log line gives it beside the commit's own steps.

    With a ``dead_letter_sink``, the rows split off upstream
    ([`twophase.spark.dead_letter_split`][twophase.spark.dead_letter_split]) are decided next, as
    that sink's epoch.
    ``identity`` is the run and query when the caller knows them (foreachBatch);
    otherwise the messages carry them. A message of a format this twophase does
    not read (an executor running another version) is a PermanentError.
    """
    for message in messages:
        message.check_format()
    if identity is None and messages:
        identity = _identity(sink, epoch, messages)
    if identity is None and sink.dead_letter_sink is not None:
        # Rows may have been split off in this batch, and only the run finds them.
        raise PermanentError(
            f"sink {sink.sink_id!r} epoch {epoch}: no task reported its run, so the rows "
            f"split off to {sink.dead_letter_sink!r} cannot be decided"
        )
    if identity is None:
        log.info(
            "sink %s epoch %d had no tasks: nothing to decide",
            sink.sink_id,
            epoch,
            extra=fields(sink.sink_id, epoch),
        )
        return None
    # The run's first claim in this process recovers what older runs left, also when
    # the batch has nothing to decide (a foreachBatch writer's empty first batch).
    lease = claim(sink, *identity)
    outcome = two_phase(sink).committer.commit(lease, epoch, messages) if messages else None
    # The points first, then the rows split off upstream: a crash between them
    # leaves the dead letters to the replay of this micro-batch.
    if sink.dead_letter_sink is not None:
        crash_point("before_split_decide", sink.sink_id)
        _commit_split(sink.dead_letters(), epoch, *identity)
    if outcome is None:
        return None
    steps = ((("stage", staged_s),) if staged_s is not None else ()) + outcome.steps
    log.info(
        "sink %s epoch %d: %s%s, recovered %s, %d points delivered (%s)",
        sink.sink_id,
        epoch,
        outcome.state,
        " (replay)" if outcome.replay else "",
        list(outcome.recovered) or "none",
        outcome.promoted.delivered if outcome.promoted else 0,
        ", ".join(f"{step} {seconds * 1000:.0f} ms" for step, seconds in steps),
        extra={
            **fields(sink.sink_id, epoch, identity[0]),
            "steps_ms": {step: round(seconds * 1000, 1) for step, seconds in steps},
        },
    )
    return outcome


def _commit_split(dead: SinkOptions, epoch: int, run_id: str, query_id: str | None) -> None:
    """Decide the dead-letter sink's epoch from the writes this run's tasks split off."""
    parts = two_phase(dead)
    lease = claim(dead, run_id, query_id)
    messages = parts.reader.partition_writes(dead.sink_id, epoch, run_id, query_id)
    if messages:
        parts.committer.commit(lease, epoch, messages)


def abort_epoch(sink: SinkOptions, epoch: int, messages: Sequence[CommitMessage]) -> int:
    """Discard the staged writes of a failed epoch attempt; how many were removed.

    Writes that a decision already chose are never touched (the core's
    guarantee), so this is safe after a commit that failed half-way.
    """
    write_ids = [m.write_id for m in messages]
    if not write_ids:
        return 0
    about = fields(sink.sink_id, epoch, messages[0].run_id or None)
    try:
        removed = two_phase(sink).gc.discard(write_ids)
    except TwoPhaseError as exc:
        log.warning(
            "sink %s epoch %d: abort could not discard %d writes (GC will): %s",
            sink.sink_id,
            epoch,
            len(write_ids),
            exc,
            extra=about,
        )
        return 0
    log.info(
        "sink %s epoch %d aborted: %d writes discarded", sink.sink_id, epoch, removed, extra=about
    )
    return removed


def _identity(
    sink: SinkOptions, epoch: int, messages: Sequence[CommitMessage]
) -> tuple[str, str | None]:
    """The one run and query all messages of the epoch name; PermanentError otherwise."""
    wrong = [m for m in messages if m.sink_id != sink.sink_id or m.epoch != epoch]
    if wrong:
        raise PermanentError(
            f"sink {sink.sink_id!r} epoch {epoch}: a task staged for sink "
            f"{wrong[0].sink_id!r} epoch {wrong[0].epoch}"
        )
    runs = {(m.run_id, m.query_id) for m in messages}
    if len(runs) != 1:
        raise PermanentError(
            f"sink {sink.sink_id!r} epoch {epoch}: tasks name different runs "
            f"{sorted(map(repr, runs))}"
        )
    run_id, query_id = runs.pop()
    if not run_id:
        raise PermanentError(
            f"sink {sink.sink_id!r} epoch {epoch}: the tasks did not know their run id "
            "(no spark.jobGroup.id in the task context)"
        )
    return run_id, query_id
