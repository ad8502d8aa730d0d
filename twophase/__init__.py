"""twophase: exactly-once delivery from Spark Structured Streaming into InfluxDB.

A micro-batch (an *epoch*) is staged into PostgreSQL, decided (PRECOMMITTED),
promoted to InfluxDB and marked COMMITTED, in the manner of Flink's two-phase
commit sink. ``docs/design.md`` in the repository holds the protocol, its
invariants I1-I8, the contracts and the module map.
"""

from __future__ import annotations

__version__ = "0.1.0"
