"""In-process metrics of the process that promotes (the Spark driver): its requests to targets.

Off unless ``metrics_port`` is set (``TWOPHASE_METRICS_PORT`` or the sink option): then
[`serve`][twophase.targets.metering.serve] starts one Prometheus endpoint per process (on
``metrics_host``, loopback unless told; https with ``metrics_tls_cert`` and
``metrics_tls_key``, mutual TLS with ``metrics_tls_client_ca``:
[`twophase.serving`][twophase.serving]), and
[`MeteredWriter`][twophase.targets.metering.MeteredWriter] wraps each target's writer so that
every request is measured, labelled with the target (``target``: its name in ``targets``, or
``default`` for the one ``target_url`` names): its latency, its answer by status class
(``2xx``, ``4xx``, ``5xx``, or ``transport`` when none came), the bytes sent; and the
retries the sender makes by reason (``throttled``: 429; ``unavailable``: 5xx;
``transport``), over all targets.

The metrics live in [`REGISTRY`][twophase.targets.metering.REGISTRY], not in
prometheus-client's global one, so that importing twophase adds nothing to an application's
own ``/metrics``; embed them with ``REGISTRY`` where wanted. What the store knows (epochs,
points, dead letters) comes from the exporter
([`twophase.operations.exporter`][twophase.operations.exporter]), which any process can run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, Metric
from prometheus_client.registry import Collector

from twophase.config import DEFAULT_TARGET, EndpointConfig
from twophase.deprecation import REMOVED_IN
from twophase.errors import TransientWriteError, TwoPhaseError
from twophase.serving import Served
from twophase.serving import serve as serve_registry
from twophase.targets.contract import TargetWriter
from twophase.targets.sender import RetryEvent

REGISTRY = CollectorRegistry(auto_describe=True)
# The names the request metrics had when only InfluxDB was metered, still served beside the
# new ones so that dashboards and alerts keep working until they are renamed.
FORMER_PREFIX = "twophase_influx_"
PREFIX = "twophase_target_"
# Request latencies from a loopback write (ms) to a request that waits out a timeout.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

REQUEST_SECONDS = Histogram(
    f"{PREFIX}request_duration_seconds",
    "Duration of one write request to a target, answered or failed.",
    ["target"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
RESPONSES = Counter(
    f"{PREFIX}responses",
    "Write requests to a target by the class of their answer (transport: no answer).",
    ["target", "status_class"],
    registry=REGISTRY,
)
RETRIES = Counter(
    f"{PREFIX}retries",
    "Write attempts the sender retries, by reason (throttled, unavailable, transport).",
    ["reason"],
    registry=REGISTRY,
)
SENT_BYTES = Counter(
    f"{PREFIX}sent_bytes",
    "Bytes of request bodies sent to a target (each attempt counts).",
    ["target"],
    registry=REGISTRY,
)
METRICS = (REQUEST_SECONDS, RESPONSES, RETRIES, SENT_BYTES)
STATUS_CLASSES = ("2xx", "4xx", "5xx", "transport")
RETRY_REASONS = ("throttled", "unavailable", "transport")

_served: dict[int, Served] = {}
_lock = threading.Lock()


def status_class(error: BaseException | None) -> str:
    """The class of a target's answer: ``2xx`` for no error, ``transport`` for none."""
    if error is None:
        return "2xx"
    status = error.http_status if isinstance(error, TwoPhaseError) else None
    return f"{status // 100}xx" if status else "transport"


def retry_reason(error: BaseException) -> str:
    status = error.status if isinstance(error, TransientWriteError) else None
    if status == 429:
        return "throttled"
    return "unavailable" if status else "transport"


class FormerNames(Collector):
    """The request metrics again under their former names (``twophase_influx_*``), each
    described as deprecated: the same samples, computed when scraped, served until
    the version in which every former name goes."""

    def collect(self) -> Iterator[Metric]:
        for metric in METRICS:
            for family in metric.collect():
                yield _renamed(family, family.name.replace(PREFIX, FORMER_PREFIX, 1))


def _renamed(family: Metric, name: str) -> Metric:
    exposed = family.name + ("_total" if family.type == "counter" else "")
    help_text = f"Deprecated name of {exposed}, removed in {REMOVED_IN}. {family.documentation}"
    renamed = Metric(name, help_text, family.type)
    renamed.samples = [s._replace(name=name + s.name[len(family.name) :]) for s in family.samples]
    return renamed


REGISTRY.register(FormerNames())


class MeteredWriter:
    """A [`TargetWriter`][twophase.targets.contract.TargetWriter] that measures each request of
    the one it wraps, the writer of ``target``.

    Same contract as the wrapped writer (one attempt, classified errors, a
    re-sent body as the server keeps it): it only observes.
    """

    def __init__(self, inner: TargetWriter, target: str = DEFAULT_TARGET) -> None:
        self._inner = inner
        self._target = target
        # The target's series, looked up once (a ``labels`` call per metric and request
        # cost more than the rest of the metering); a status class's when first seen,
        # so that no series shows before its first request.
        self._seconds = REQUEST_SECONDS.labels(target=target)
        self._bytes = SENT_BYTES.labels(target=target)
        self._responses: dict[str, Counter] = {}

    @property
    def inner(self) -> TargetWriter:
        """The writer measured (a transactional kind's epochs go to it directly)."""
        return self._inner

    def write(self, body: bytes, gzipped: bool = False) -> None:
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            self._inner.write(body, gzipped)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._seconds.observe(time.perf_counter() - started)
            self._response(status_class(error)).inc()
            self._bytes.inc(len(body))

    def _response(self, status: str) -> Counter:
        counter = self._responses.get(status)
        if counter is None:
            counter = self._responses[status] = RESPONSES.labels(
                target=self._target, status_class=status
            )
        return counter

    def read(self, statement: str) -> Iterable[dict[str, Any]]:
        # a read back is not a delivery: not metered (the statement is the kind's own query)
        reader: Any = self._inner  # a writer that reads back (InfluxDB's), whatever its class
        result: Iterable[dict[str, Any]] = reader.read(statement)
        return result

    def close(self) -> None:
        self._inner.close()


def count_retry(event: RetryEvent) -> None:
    """The sender's ``on_attempt_failed`` hook."""
    RETRIES.labels(retry_reason(event.error)).inc()


def serve(endpoint: EndpointConfig) -> Served:
    """Start this process's metrics endpoint once per port (the first configuration of a
    port is the one served); ConfigError when it cannot listen or its TLS files do not
    work."""
    with _lock:
        if endpoint.port not in _served:
            _served[endpoint.port] = serve_registry(REGISTRY, endpoint)
        return _served[endpoint.port]
