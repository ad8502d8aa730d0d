"""The development kit the tests and the benchmark share (not part of the twophase wheel).

Local servers, each with all its state under a folder of its own: PostgreSQL
(:mod:`devkit.postgres`), InfluxDB 1.x, VictoriaMetrics and Prometheus
(:mod:`devkit.servers`, on the daemon base of :mod:`devkit.daemon`), a Spark master,
worker and Connect server (:mod:`devkit.spark`); free ports and servers of one's own
started on them (:mod:`devkit.ports`); a TCP proxy that injects network faults
(:mod:`devkit.faultproxy`); and the command behind ``scripts/dev.sh start|stop|status|env``
(:mod:`devkit.cli`, ``python -m devkit``). Stdlib only: ``scripts/dev.sh`` runs it before
the virtualenv exists.
"""

from devkit.cli import default_servers, env_lines
from devkit.daemon import (
    INFLUX_DATABASE,
    PG_DATABASE,
    PG_PASSWORD,
    PG_SUPERUSER,
    PG_USER,
    HttpDaemon,
    ServiceError,
)
from devkit.faultproxy import CUT, DROP_REPLY, PASS, STALL, FaultProxy
from devkit.ports import free_port, port_is_free, start_own_influx, start_own_victoria_metrics
from devkit.postgres import PostgresServer
from devkit.servers import InfluxServer, PrometheusServer, VictoriaMetricsServer
from devkit.spark import SparkConnectServer, SparkMasterServer, SparkWorkerServer

__all__ = [
    "CUT",
    "DROP_REPLY",
    "INFLUX_DATABASE",
    "PASS",
    "PG_DATABASE",
    "PG_PASSWORD",
    "PG_SUPERUSER",
    "PG_USER",
    "STALL",
    "FaultProxy",
    "HttpDaemon",
    "InfluxServer",
    "PostgresServer",
    "PrometheusServer",
    "ServiceError",
    "SparkConnectServer",
    "SparkMasterServer",
    "SparkWorkerServer",
    "VictoriaMetricsServer",
    "default_servers",
    "env_lines",
    "free_port",
    "port_is_free",
    "start_own_influx",
    "start_own_victoria_metrics",
]
