"""The HTTP servers of the tests and the benchmark: InfluxDB 1.x, VictoriaMetrics, Prometheus."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devkit.daemon import HTTP, HttpDaemon, ServiceError, find_binary, http_status


class InfluxServer(HttpDaemon):
    """InfluxDB 1.x (tested with Debian's 1.6.7) with all state under ``root``."""

    name = "influxd"
    health_path = "/ping"
    healthy_status = 204

    def __init__(self, root: Path, port: int = 18086) -> None:
        super().__init__(root, port)
        self.config_file = self.root / "influxd.conf"

    def _prepare(self) -> None:
        for sub in ("meta", "data", "wal"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(self._config())

    def _config(self) -> str:
        # Unknown keys are ignored by influxd, so both spellings of the reporting switch are
        # written: upstream reads `reporting-disabled`, Debian's build `reporting-enabled`.
        # The top-level bind-address is the RPC (backup/restore) port; it defaults to :8088 and
        # would collide between instances, hence port + 2.
        return f"""\
reporting-disabled = true
reporting-enabled = false
bind-address = "127.0.0.1:{self.port + 2}"

[meta]
  dir = "{self.root / "meta"}"
  logging-enabled = false

[data]
  dir = "{self.root / "data"}"
  wal-dir = "{self.root / "wal"}"
  query-log-enabled = false

[monitor]
  store-enabled = false

[http]
  enabled = true
  bind-address = "127.0.0.1:{self.port}"
  log-enabled = false
  pprof-enabled = false

[continuous_queries]
  log-enabled = false

[logging]
  level = "warn"
  suppress-logo = true
"""

    def _command(self) -> list[str]:
        return [find_binary("influxd", "TWOPHASE_INFLUXD"), "-config", str(self.config_file)]

    def query(self, statement: str) -> int | None:
        """POST an InfluxQL statement to /query; returns the HTTP status."""
        body = urllib.parse.urlencode({"q": statement}).encode()
        return http_status(f"{self.url}/query", method="POST", data=body)

    def create_database(self, name: str) -> None:
        # CREATE DATABASE is idempotent in InfluxDB 1.x.
        quoted = name.replace("\\", "\\\\").replace('"', '\\"')
        status = self.query(f'CREATE DATABASE "{quoted}"')
        if status != 200:
            raise ServiceError(f"CREATE DATABASE {name!r} on {self.url} failed: HTTP {status}")


class VictoriaMetricsServer(HttpDaemon):
    """VictoriaMetrics single node; accepts InfluxDB line protocol on /write and /api/v2/write.

    ``dedup_interval`` is its ``-dedup.minScrapeInterval``: with the default ``1ms`` (its
    timestamps are milliseconds) a sample sent again for the same series and millisecond
    counts once, as twophase's exactly-once needs; ``None`` leaves deduplication off, and
    then it keeps every sample it is sent, duplicates too.
    """

    name = "victoria-metrics"
    health_path = "/health"
    healthy_status = 200

    def __init__(self, root: Path, port: int = 18428, dedup_interval: str | None = "1ms") -> None:
        super().__init__(root, port)
        self.data_dir = self.root / "data"
        self.dedup_interval = dedup_interval

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def _command(self) -> list[str]:
        # Without -dedup.minScrapeInterval a re-sent point is stored (and counted by every
        # query) twice; 1ms, its timestamps' precision, keeps one sample per series and
        # timestamp and never merges two timestamps.
        dedup = [f"-dedup.minScrapeInterval={self.dedup_interval}"] if self.dedup_interval else []
        return [
            find_binary("victoria-metrics", "TWOPHASE_VICTORIA_METRICS"),
            *dedup,
            f"-storageDataPath={self.data_dir}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            # Tests write points with old timestamps; the default retention (1 month) would
            # silently drop them.
            "-retentionPeriod=100y",
            # Tests read back what they just wrote: no 30s visibility delay, no stale cache.
            "-search.latencyOffset=0s",
            "-search.disableCache",
        ]


class PrometheusServer(HttpDaemon):
    """Prometheus (tested with Debian's 2.42) scraping ``scrape_targets`` ("host:port").

    Not one of :func:`default_servers`: each test starts its own with its own targets.
    """

    name = "prometheus"
    health_path = "/-/ready"
    healthy_status = 200

    def __init__(
        self,
        root: Path,
        port: int,
        scrape_targets: Sequence[str] = (),
        scrape_interval_s: float = 1.0,
        rule_files: Sequence[Path] = (),
        external_labels: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(root, port)
        self.scrape_targets = tuple(scrape_targets)
        self.scrape_interval_s = scrape_interval_s
        self.rule_files = tuple(Path(f).resolve() for f in rule_files)
        self.external_labels = dict(external_labels or {})
        self.config_file = self.root / "prometheus.yml"
        self.data_dir = self.root / "data"

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(self._config())

    def _config(self) -> str:
        # JSON strings are YAML strings: no YAML library needed, and paths stay quoted.
        interval = f"{max(1, round(self.scrape_interval_s * 1000))}ms"
        rules = "".join(f"  - {json.dumps(str(f))}\n" for f in self.rule_files)
        targets = ", ".join(json.dumps(t) for t in self.scrape_targets)
        labels = ", ".join(f"{k}: {json.dumps(v)}" for k, v in self.external_labels.items())
        return f"""\
global:
  scrape_interval: {interval}
  scrape_timeout: {interval}
  evaluation_interval: {interval}
  external_labels: {{{labels}}}

rule_files:{"" if rules else " []"}
{rules}
scrape_configs:
  - job_name: twophase
    static_configs:
      - targets: [{targets}]
"""

    def _command(self) -> list[str]:
        return [
            find_binary("prometheus", "TWOPHASE_PROMETHEUS"),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
        ]

    def _api(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with HTTP.open(url, timeout=10) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:  # 400/422/503: the error is in the JSON body
            raw = exc.read()
        except OSError as exc:
            raise ServiceError(f"{path} on {self.url}: {exc}") from exc
        try:
            body = json.loads(raw)
        except ValueError:
            raise ServiceError(f"{path} on {self.url}: not JSON: {raw[:200]!r}") from None
        if body.get("status") != "success":
            raise ServiceError(f"{path} on {self.url}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """PromQL instant query (at ``at``, Unix seconds, else now): ``data.result``."""
        params = {"query": expr}
        if at is not None:
            params["time"] = repr(at)
        return list(self._api("/api/v1/query", params)["result"])

    def query_range(
        self, expr: str, start: float, end: float, step_s: float = 1.0
    ) -> list[dict[str, Any]]:
        """PromQL range query over [start, end] (Unix seconds): ``data.result``."""
        params = {"query": expr, "start": repr(start), "end": repr(end), "step": repr(step_s)}
        return list(self._api("/api/v1/query_range", params)["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """The pending and firing alerts, with their annotations rendered: ``data.alerts``."""
        return list(self._api("/api/v1/alerts", {})["alerts"])
