"""The exporter as an operation: serve the store's metrics until stopped."""

from __future__ import annotations

import dataclasses

from twophase.config import StagingConfig
from twophase.operations.exporter import DEFAULT_PORT, Exporter, start
from twophase.operations.hooks import LIVE_WINDOW_S
from twophase.store.database import Database

# A scrape must answer within Prometheus's default 10 s scrape timeout -- with
# twophase_store_up 0 when the store is away -- rather than time out itself.
SCRAPE_CONNECT_TIMEOUT_S = 3.0


def start_exporter(
    config: StagingConfig,
    port: int = DEFAULT_PORT,
    host: str = "0.0.0.0",
    live_window_s: float = LIVE_WINDOW_S,
) -> Exporter:
    """Serve every sink's metrics on ``host:port`` (``/metrics``) from a daemon thread.

    Fails fast when the store cannot be reached or its schema is behind; once
    running, a store that goes away shows as ``twophase_store_up 0`` until it
    is back. ``Exporter.close()`` stops it.
    """
    timeout = min(config.connect_timeout_s, SCRAPE_CONNECT_TIMEOUT_S)
    db = Database(dataclasses.replace(config, connect_timeout_s=timeout), max_size=1)
    return start(db, port, host, live_window_s)
