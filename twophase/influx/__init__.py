"""InfluxDB: the writers (one attempt per call), error classification, API detection
and reading back.

* [`twophase.influx.writers`][twophase.influx.writers]: ``InfluxWriter`` and the 1.x / 2.x writers;
* [`twophase.influx.api`][twophase.influx.api]: ``make_writer`` and ``auto`` API detection;
* [`twophase.influx.classify`][twophase.influx.classify]: answers and transport failures as errors;
* [`twophase.influx.http`][twophase.influx.http]: one request, credentials in headers only;
* [`twophase.influx.query`][twophase.influx.query]: InfluxQL through ``/query``.
"""

from __future__ import annotations

from twophase.influx.api import make_writer, resolve_api
from twophase.influx.query import query_v1
from twophase.influx.writers import InfluxWriter

__all__ = ["InfluxWriter", "make_writer", "query_v1", "resolve_api"]
