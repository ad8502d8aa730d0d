"""Free loopback ports, and servers of one's own started on them (a test's or a benchmark's,
beside the development servers)."""

from __future__ import annotations

import socket
from pathlib import Path

from devkit.daemon import ServiceError
from devkit.servers import InfluxServer, VictoriaMetricsServer


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A free port whose neighbour +2 is free too (influxd binds its RPC port there)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port_is_free(port + 2):
            return port
    raise RuntimeError("no free pair of ports")


def start_own_influx(root: Path, database: str) -> InfluxServer:
    """A dedicated InfluxDB 1.x server on free ports, with ``database``; retried on a new
    port when another process grabbed the chosen one between the check and influxd's bind."""
    for attempt in range(3):
        server = InfluxServer(root / f"influxd-{attempt}", free_port())
        try:
            server.start()
        except ServiceError:
            server.kill()
            continue
        server.create_database(database)
        return server
    raise RuntimeError("influxd did not start on three pairs of free ports")


def start_own_victoria_metrics(root: Path, dedup_interval: str | None) -> VictoriaMetricsServer:
    """A dedicated VictoriaMetrics on a free port, ``-dedup.minScrapeInterval`` set to
    ``dedup_interval`` (None: deduplication off, every sample kept); retried on a new port
    like ``start_own_influx``."""
    for attempt in range(3):
        server = VictoriaMetricsServer(root / f"vm-{attempt}", free_port(), dedup_interval)
        try:
            server.start()
        except ServiceError:
            server.kill()
            continue
        return server
    raise RuntimeError("victoria-metrics did not start on three free ports")
