"""Spark Structured Streaming integration: a streaming sink and a foreachBatch adapter.

* :func:`register` makes ``df.writeStream.format("twophase-influx")`` available
  (a PySpark 4 Python data source: stage in ``write``, decide and promote in
  ``commit``, discard in ``abort``).
* :func:`foreach_batch_writer` gives the same protocol to ``foreachBatch``
  pipelines.
* :func:`claim_query` lets a driver claim the sink right after ``start()``,
  so a second query or a reset checkpoint is refused before it computes.
* :func:`ship_package` adds a zip of ``twophase`` to the executors' path.

Importing this package needs PySpark; the core (``twophase``) does not.
"""

from __future__ import annotations

from typing import Any

from twophase.model import Lease
from twophase.spark.commit import claim
from twophase.spark.foreach import foreach_batch_writer
from twophase.spark.options import SinkOptions, parse_options
from twophase.spark.ship import package_zip, ship_package
from twophase.spark.source import FORMAT, TwoPhaseInfluxDataSource, register

__all__ = [
    "FORMAT",
    "SinkOptions",
    "TwoPhaseInfluxDataSource",
    "claim_query",
    "foreach_batch_writer",
    "package_zip",
    "parse_options",
    "register",
    "ship_package",
]


def claim_query(query: Any, options: dict[str, str]) -> Lease:
    """Claim the sink of a started query for its run (``query.runId``).

    ``options`` are the sink's options as given to ``.option(...)``. Fences
    older runs of the same query (I5) and raises CheckpointResetError when
    the sink belongs to another query (I6). Optional: the first commit
    claims anyway; this only refuses earlier.
    """
    return claim(parse_options(options), str(query.runId), str(query.id))
