"""The exporter as an operation: serve the store's metrics until stopped."""

from __future__ import annotations

import dataclasses

from twophase.config import ExporterConfig, StagingConfig
from twophase.operations.exporter import Exporter, start
from twophase.operations.hooks import LIVE_WINDOW_S
from twophase.store.database import Database

# A scrape must answer within Prometheus's default 10 s scrape timeout -- with
# twophase_store_up 0 when the store is away -- rather than time out itself.
SCRAPE_CONNECT_TIMEOUT_S = 3.0


def start_exporter(
    config: StagingConfig,
    port: int | None = None,
    host: str | None = None,
    live_window_s: float = LIVE_WINDOW_S,
    *,
    exporter: ExporterConfig | None = None,
) -> Exporter:
    """Serve every sink's metrics at ``/metrics`` from a daemon thread, where and how
    ``exporter`` says (default: the settings' defaults: ``127.0.0.1:9464``, plain
    http; [`load_exporter_config`][twophase.config.loading.load_exporter_config] reads
    ``TWOPHASE_EXPORTER_*``); ``port`` (0: any free) and ``host`` replace its own.

    Fails fast when the store cannot be reached or its schema is behind, or when it
    cannot listen there (ConfigError naming the setting); once running, a store that
    goes away shows as ``twophase_store_up 0`` until it is back. ``Exporter.close()``
    stops it.
    """
    timeout = min(config.connect_timeout_s, SCRAPE_CONNECT_TIMEOUT_S)
    db = Database(dataclasses.replace(config, connect_timeout_s=timeout), max_size=1)
    try:
        return start(db, port, host, live_window_s, config=exporter)
    except BaseException:
        db.close()
        raise
