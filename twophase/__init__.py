"""twophase: exactly-once delivery from Spark Structured Streaming into InfluxDB.

A micro-batch (an *epoch*) is staged into PostgreSQL, decided (PRECOMMITTED),
promoted to InfluxDB and marked COMMITTED, in the manner of Flink's two-phase
commit sink. See DESIGN.md for the protocol and its invariants.
"""

from __future__ import annotations

__version__ = "0.1.0"
