"""Spark Structured Streaming integration: a streaming sink and a foreachBatch adapter.

* [`register`][twophase.spark.source.register] makes
  ``df.writeStream.format("twophase")`` available (a PySpark 4 Python data source:
  stage in ``write``, decide and promote in ``commit``, discard in ``abort``), and its
  former name ``twophase-influx`` until 0.12.0.
* [`foreach_batch_writer`][twophase.spark.foreach.foreach_batch_writer] gives the same
  protocol to ``foreachBatch`` pipelines.
* [`split_dead_letters`][twophase.spark.dead_letter_split.split_dead_letters] sends the rows a job
  classified as bad to the dead-letter table from the tasks that read them, decided with the
  sink's epochs (no second query over the input).
* [`claim_query`][twophase.spark.claim_query] lets a driver claim the sink right after ``start()``,
  so a second query or a reset checkpoint is refused before it computes and
  what a crashed run left PRECOMMITTED is delivered even if no batch comes
  (under Spark Connect, a foreachBatch writer needs it: see
  [`twophase.spark.foreach`][twophase.spark.foreach]).
* [`end_query`][twophase.spark.query_end.end_query] (after the query stopped) or
  [`watch_query`][twophase.spark.query_end.watch_query] (a listener) records that the query's run
  ended, so operators' commands tell a stopped query from a live one;
  [`drain_query`][twophase.spark.query_end.drain_query] waits for the last background promotion
  (``promotion = background``).
* [`ship_package`][twophase.spark.executor_package.ship_package] adds a zip of ``twophase`` to the
  executors' path.

Importing this package needs PySpark; the core (``twophase``) does not.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from twophase.model import Lease
    from twophase.spark.dead_letter_split import split_dead_letters
    from twophase.spark.executor_package import package_zip, ship_package
    from twophase.spark.foreach import ForeachBatchWriter, foreach_batch_writer
    from twophase.spark.options import SinkOptions, parse_options
    from twophase.spark.query_end import drain_query, end_query, watch_query
    from twophase.spark.source import (
        FORMAT,
        TwoPhaseDataSource,
        TwoPhaseInfluxDataSource,
        register,
    )

# Name -> module, imported on first use: an executor that unpickles a staging
# function imports only what staging needs, not the driver's protocol, whose imports
# every Python worker would otherwise pay for (-X importtime shows them).
_LAZY = {
    "FORMAT": "source",
    "TwoPhaseDataSource": "source",
    "TwoPhaseInfluxDataSource": "source",
    "register": "source",
    "ForeachBatchWriter": "foreach",
    "foreach_batch_writer": "foreach",
    "SinkOptions": "options",
    "parse_options": "options",
    "package_zip": "executor_package",
    "ship_package": "executor_package",
    "split_dead_letters": "dead_letter_split",
    "end_query": "query_end",
    "drain_query": "query_end",
    "watch_query": "query_end",
}
__all__ = [
    "FORMAT",
    "ForeachBatchWriter",
    "SinkOptions",
    "TwoPhaseDataSource",
    "TwoPhaseInfluxDataSource",
    "claim_query",
    "drain_query",
    "end_query",
    "foreach_batch_writer",
    "package_zip",
    "parse_options",
    "register",
    "ship_package",
    "split_dead_letters",
    "watch_query",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'twophase.spark' has no attribute {name!r}")
    return getattr(importlib.import_module(f"twophase.spark.{module}"), name)


def claim_query(query: Any, sink: Mapping[str, str] | ForeachBatchWriter) -> Lease:
    """Claim the sink of a started query for its run, and deliver what a crashed run
    left: the epochs older runs left PRECOMMITTED are promoted before it returns.

    ``sink`` is the sink's options as given to ``.option(...)`` (the data
    source), or the [`ForeachBatchWriter`][twophase.spark.foreach.ForeachBatchWriter] given to
    ``foreachBatch``.
    Fences older runs of the same query (I5) and raises CheckpointResetError
    when the sink belongs to another query (I6). With classic Spark the
    first commit claims and recovers anyway; calling this right after
    ``start()`` refuses earlier, and recovers even when no batch comes (an
    available-now query with no new input, a quiet stream). A recovery that
    fails raises as a commit's does (TargetUnavailableError past the retry
    deadline). Under Spark Connect a foreachBatch writer's batches wait for
    it: only the client knows the query's id there
    ([`twophase.spark.foreach`][twophase.spark.foreach]); the client claims without recovering (it
    need not reach the targets), and the server's first batch recovers.
    Idempotent.
    """
    from twophase.spark.driver_commit import claim
    from twophase.spark.foreach import is_connect
    from twophase.spark.query_end import run_of

    run_id, options = run_of(query, sink)
    query_id = str(query.id)
    recover = not is_connect(query)
    if options.dead_letter_sink is not None:
        claim(options.dead_letters(), run_id, query_id, recover=recover)
    return claim(options, run_id, query_id, recover=recover)
