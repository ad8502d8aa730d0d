"""A query's run records its end, so operators can tell a stopped query from a live one.

Two ways, for the ``twophase`` data source and the foreachBatch adapter
alike (both run on the driver, where the query object is):

* [`end_query`][twophase.spark.query_end.end_query] after the query stopped (``awaitTermination``
  returned or raised): synchronous, so a script that exits right after it has recorded the
  end. ``jobs/session_metrics.py`` does this.
* [`watch_query`][twophase.spark.query_end.watch_query] right after ``start()``: a
  ``StreamingQueryListener``
  records the end when Spark reports the query terminated (clean stop,
  failure, or the end of an ``availableNow`` run). Listener events are
  delivered asynchronously: a process that exits at once may not see it.

Ending is advisory and never raises: a store that cannot be reached leaves
the run looking live until ``--live-window`` passes, as a killed driver's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from twophase.errors import TwoPhaseError
from twophase.logs import fields
from twophase.protocol.ledger.runs import FAILED, STOPPED
from twophase.spark.driver_commit import drain, two_phase
from twophase.spark.foreach import ForeachBatchWriter
from twophase.spark.options import SinkOptions, parse_options

log = logging.getLogger("twophase.spark")


# What names a sink: its options (the data source's), parsed or not, or the
# foreachBatch writer (whose run under Spark Connect is its own, not the query's).
Sink = SinkOptions | Mapping[str, str] | ForeachBatchWriter


def end_query(query: Any, sink: Sink) -> None:
    """Record that ``query``'s run ended for the sink (and its ``dead_letter_sink``):
    ``failed`` when the query has an exception or its last background promotion
    failed ([`drain_query`][twophase.spark.query_end.drain_query], logged), else ``stopped``.
    Idempotent."""
    try:
        reason = FAILED if query.exception() is not None else STOPPED
    except Exception as exc:  # Spark gone: the query stopped, how is unknown
        log.debug("no exception status for query %s: %s", query.id, exc)
        reason = STOPPED
    run_id, options = run_of(query, sink)
    try:
        drain_query(options)
    except Exception as exc:  # its epoch stays PRECOMMITTED: the next start promotes it
        log.error(
            "sink %s: the last background promotion failed: %s",
            options.sink_id,
            exc,
            extra=fields(options.sink_id, run_id=run_id),
        )
        reason = FAILED
    end_run(run_id, options, reason)


def drain_query(sink: Sink) -> None:
    """Wait for the epochs this process still promotes in the background for the sink
    (``promotion = background``; nothing when inline). Raises the first failure, its
    epoch left PRECOMMITTED. Call it once the query stopped, before the process exits."""
    drain(sink.sink if isinstance(sink, ForeachBatchWriter) else _options(sink))


def watch_query(spark: Any, query: Any, sink: Sink) -> Any:
    """Add a listener to ``spark`` that records the end of ``query``'s run; returns it
    (``spark.streams.removeListener`` takes it off)."""
    run_id, options = run_of(query, sink)
    listener = _listener(str(query.id), run_id, options)
    spark.streams.addListener(listener)
    return listener


def run_of(query: Any, sink: Sink) -> tuple[str, SinkOptions]:
    """The run ``query`` writes the sink under, and the sink's options."""
    if isinstance(sink, ForeachBatchWriter):
        return sink.run_of(query), sink.sink
    return str(query.runId), _options(sink)


def _options(sink: SinkOptions | Mapping[str, str]) -> SinkOptions:
    return sink if isinstance(sink, SinkOptions) else parse_options(sink)


def end_run(run_id: str, sink: SinkOptions, reason: str) -> None:
    """Record the end of ``run_id`` for the sink and its dead-letter sink; log, never raise."""
    sinks = [sink] if sink.dead_letter_sink is None else [sink, sink.dead_letters()]
    for one in sinks:
        about = fields(one.sink_id, run_id=run_id)
        try:
            if two_phase(one).runs.end(one.sink_id, run_id, reason):
                log.info("sink %s: run %s %s", one.sink_id, run_id, reason, extra=about)
        except TwoPhaseError as exc:
            log.warning(
                "sink %s: could not record that run %s ended: %s",
                one.sink_id,
                run_id,
                exc,
                extra=about,
            )


def _listener(query_id: str, run_id: str, sink: SinkOptions) -> Any:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class RunEnds(StreamingQueryListener):
        """Ends the run of one query when Spark reports it terminated."""

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            if str(event.id) == query_id:
                end_run(run_id, sink, FAILED if event.exception else STOPPED)

    return RunEnds()
