#!/usr/bin/env python3
"""Local PostgreSQL, InfluxDB 1.x, VictoriaMetrics and Prometheus servers for dev and tests.

Everything lives under a root folder (by default ``<repo>/.local``), never in system paths,
so several instances can coexist and tests can start, kill and restart their own copies.

Stdlib only: this module must run before the virtualenv exists (``scripts/dev.sh setup``)
and must be importable from tests as ``from scripts.services import InfluxServer``.

CLI::

    python scripts/services.py start|stop|status|env
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOCAL_DIR = REPO_ROOT / ".local"

PG_USER = "twophase"
PG_PASSWORD = "twophase"
PG_DATABASE = "twophase"
PG_SUPERUSER = "postgres"
INFLUX_DATABASE = "twophase"

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0

# A proxy-free opener: CI machines often export http_proxy, and urllib would otherwise send
# requests for 127.0.0.1 through it.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServiceError(RuntimeError):
    """A local server could not be started, stopped or queried."""


def _log(message: str) -> None:
    # stderr, so that `services.py env` output stays eval-able.
    print(f"[services] {message}", file=sys.stderr, flush=True)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        content = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(content[-lines:])


def _tcp_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _http_status(url: str, method: str = "GET", data: bytes | None = None) -> int | None:
    """HTTP status of ``url``, or None when nothing answers."""
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with _HTTP.open(request, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie (a killed child we have not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the parenthesised command name, which may contain spaces.
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _pid_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _find_binary(name: str, env_var: str) -> str:
    explicit = os.environ.get(env_var)
    if explicit:
        return explicit
    found = shutil.which(name)
    if found is None:
        raise ServiceError(
            f"{name} not found on PATH; run `scripts/dev.sh setup` (or set {env_var})"
        )
    return found


# --------------------------------------------------------------------------------------------
# Detached HTTP daemons (InfluxDB, VictoriaMetrics, Prometheus)
# --------------------------------------------------------------------------------------------


class _HttpDaemon:
    """A server binary started detached, tracked by a pid file, probed over HTTP."""

    name = "daemon"
    health_path = "/"
    healthy_status = 200

    def __init__(self, root: Path, port: int) -> None:
        self.root = Path(root).resolve()
        self.port = port
        self.pid_file = self.root / f"{self.name}.pid"
        self.log_file = self.root / f"{self.name}.log"
        # Only set when this object started the process: lets us reap it (no zombies).
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- to be provided by subclasses ---------------------------------------------------------
    def _prepare(self) -> None:
        """Create folders / config files before the first start."""

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        """The process's environment (None: this process's)."""
        return None

    # -- state --------------------------------------------------------------------------------
    def is_reachable(self) -> bool:
        """Something healthy answers on our port (it may not be our process)."""
        return _http_status(self.url + self.health_path) == self.healthy_status

    def pid(self) -> int | None:
        """Pid of *our* process if it is alive; guards against pid reuse via its cmdline."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        self._reap()
        if not _pid_alive(pid) or str(self.root) not in " ".join(_pid_cmdline(pid)):
            return None
        return pid

    def is_running(self) -> bool:
        return self.pid() is not None

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        if self.is_reachable():
            return  # idempotent: already up (ours from an earlier run, or someone else's)
        if self.is_running():
            self._wait_healthy(timeout)  # our process is still booting
            return
        if _tcp_open(self.port):
            raise ServiceError(f"port {self.port} is taken by something that is not {self.name}")
        self.root.mkdir(parents=True, exist_ok=True)
        self._prepare()
        self._spawn()
        self._wait_healthy(timeout)

    def _spawn(self) -> None:
        with open(self.log_file, "ab") as log, open(os.devnull, "rb") as devnull:
            # New session: the server must outlive the shell/CLI that started it and must not
            # receive the terminal's Ctrl-C meant for pytest.
            self._proc = subprocess.Popen(
                self._command(),
                env=self._env(),
                stdin=devnull,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
                close_fds=True,
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")

    def _wait_healthy(self, timeout: float) -> None:
        def ready() -> bool:
            # While we are its parent, ask the process handle: /proc/<pid>/cmdline can
            # read empty around exec, which made a healthy server look "exited".
            proc = self._proc
            alive = proc.poll() is None if proc is not None else self.is_running()
            if not alive:
                raise ServiceError(
                    f"{self.name} on port {self.port} exited during start-up; log "
                    f"{self.log_file}:\n{_tail(self.log_file)}"
                )
            return self.is_reachable()

        if not _wait_until(ready, timeout):
            raise ServiceError(f"{self.name} on port {self.port} not healthy after {timeout}s")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Graceful stop (SIGTERM), escalating to SIGKILL after ``timeout``."""
        self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """Hard crash (SIGKILL), to simulate an outage without a clean shutdown."""
        self._signal_and_wait(signal.SIGKILL, STOP_TIMEOUT_S)

    def restart(self) -> None:
        self.stop()
        self.start()

    def _signal_and_wait(self, sig: signal.Signals, timeout: float) -> None:
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, sig)
        if not _wait_until(lambda: not self.is_running(), timeout):
            os.kill(pid, signal.SIGKILL)
            _wait_until(lambda: not self.is_running(), timeout)
        # The port may linger a moment after exit; a restart must not see "already running".
        _wait_until(lambda: not _tcp_open(self.port), timeout)
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()

    def status(self) -> str:
        pid = self.pid()
        state = "running" if pid else ("foreign" if self.is_reachable() else "stopped")
        return f"{self.name:<17} {state:<8} port={self.port} pid={pid or '-'} root={self.root}"


class InfluxServer(_HttpDaemon):
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
        return [_find_binary("influxd", "TWOPHASE_INFLUXD"), "-config", str(self.config_file)]

    def query(self, statement: str) -> int | None:
        """POST an InfluxQL statement to /query; returns the HTTP status."""
        body = urllib.parse.urlencode({"q": statement}).encode()
        return _http_status(f"{self.url}/query", method="POST", data=body)

    def create_database(self, name: str) -> None:
        # CREATE DATABASE is idempotent in InfluxDB 1.x.
        quoted = name.replace("\\", "\\\\").replace('"', '\\"')
        status = self.query(f'CREATE DATABASE "{quoted}"')
        if status != 200:
            raise ServiceError(f"CREATE DATABASE {name!r} on {self.url} failed: HTTP {status}")


class VictoriaMetricsServer(_HttpDaemon):
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
            _find_binary("victoria-metrics", "TWOPHASE_VICTORIA_METRICS"),
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


class PrometheusServer(_HttpDaemon):
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
            _find_binary("prometheus", "TWOPHASE_PROMETHEUS"),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
        ]

    def _api(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with _HTTP.open(url, timeout=10) as response:
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


class _SparkDaemon(_HttpDaemon):
    """A standalone Spark master or worker from the pip-installed PySpark, on loopback.

    ``port`` is its web UI (the health check reads ``/json/``); ``rpc_port`` the one
    Spark speaks on. Its logs and work directory live under ``root``.
    """

    health_path = "/json/"
    healthy_status = 200

    def __init__(self, root: Path, port: int, rpc_port: int) -> None:
        super().__init__(root, port)
        self.rpc_port = rpc_port

    def _env(self) -> dict[str, str]:
        home = spark_home()
        # A worker's environment is its executors': it must not carry the staging store of
        # whoever started it (tests pass theirs to executors through spark.executorEnv.*).
        inherited = {
            k: v for k, v in os.environ.items() if not k.startswith(("TWOPHASE_", "PGPASSWORD"))
        }
        return {
            **inherited,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_WORKER_DIR": str(self.root / "work"),
        }

    def _spark_class(self, main: str, *args: str) -> list[str]:
        # --properties-file names our root: pid() recognises the JVM by it.
        conf = self.root / "spark.conf"
        conf.write_text("spark.ui.showConsoleProgress false\n")
        bin_ = spark_home() / "bin" / "spark-class"
        return [str(bin_), main, *args, "--properties-file", str(conf)]


class SparkMasterServer(_SparkDaemon):
    name = "spark-master"

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.rpc_port}"

    def _command(self) -> list[str]:
        return self._spark_class(
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.rpc_port)),
            *("--webui-port", str(self.port)),
        )

    def alive_workers(self) -> int:
        try:
            with _HTTP.open(self.url + "/json/", timeout=5) as response:
                return int(json.loads(response.read()).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0


class SparkWorkerServer(_SparkDaemon):
    name = "spark-worker"

    def __init__(
        self, root: Path, port: int, rpc_port: int, master_url: str, cores: int = 1
    ) -> None:
        super().__init__(root, port, rpc_port)
        self.master_url = master_url
        self.cores = cores

    def _prepare(self) -> None:
        (self.root / "work").mkdir(parents=True, exist_ok=True)

    def _command(self) -> list[str]:
        return self._spark_class(
            "org.apache.spark.deploy.worker.Worker",
            self.master_url,
            *("--host", "127.0.0.1", "--port", str(self.rpc_port)),
            *("--webui-port", str(self.port), "--cores", str(self.cores), "--memory", "1g"),
            *("--work-dir", str(self.root / "work")),
        )


class SparkConnectServer(_SparkDaemon):
    """A Spark Connect server (the driver of its clients' queries) on loopback.

    ``port`` is its driver UI (the health check reads ``/api/v1/applications``),
    ``rpc_port`` the gRPC port clients reach as ``sc://127.0.0.1:PORT``. ``env``
    is what the driver needs beyond a clean environment (``TWOPHASE_*``: the server,
    not the client, runs the protocol); ``python`` runs its Python workers.
    """

    name = "spark-connect"
    health_path = "/api/v1/applications"

    def __init__(
        self,
        root: Path,
        port: int,
        rpc_port: int,
        *,
        master: str = "local[2,4]",
        python: str = sys.executable,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(root, port, rpc_port)
        self.master, self.python, self.extra_env = master, python, dict(env or {})

    @property
    def remote_url(self) -> str:
        return f"sc://127.0.0.1:{self.rpc_port}"

    def is_reachable(self) -> bool:
        # The UI answers seconds before the gRPC service listens.
        return super().is_reachable() and _tcp_open(self.rpc_port)

    def _env(self) -> dict[str, str]:
        return {**super()._env(), **self.extra_env, "PYSPARK_PYTHON": self.python}

    def _command(self) -> list[str]:
        home = spark_home()
        (jar,) = sorted((home / "jars").glob("spark-connect_*.jar"))[-1:]
        conf = self.root / "spark.conf"  # names our root: pid() recognises the JVM by it
        conf.write_text(
            "spark.ui.showConsoleProgress false\n"
            f"spark.ui.port {self.port}\n"
            "spark.connect.grpc.binding.address 127.0.0.1\n"
            f"spark.connect.grpc.binding.port {self.rpc_port}\n"
            f"spark.pyspark.python {self.python}\n"
            f"spark.local.dir {self.root / 'tmp'}\n"
        )
        return [
            str(home / "bin" / "spark-submit"),
            *("--master", self.master, "--properties-file", str(conf)),
            *("--class", "org.apache.spark.sql.connect.service.SparkConnectServer", str(jar)),
        ]


def spark_home() -> Path:
    """The pip-installed PySpark's folder: it holds bin/spark-class and the jars."""
    explicit = os.environ.get("SPARK_HOME")
    if explicit:
        return Path(explicit)
    found = subprocess.run(
        [sys.executable, "-c", "import pyspark, os; print(os.path.dirname(pyspark.__file__))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise ServiceError("pyspark is not installed in this Python: run `scripts/dev.sh setup`")
    return Path(found.stdout.strip())


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------


def _pg_bindir() -> Path:
    """Folder with initdb/pg_ctl; Debian keeps them out of PATH in /usr/lib/postgresql/N/bin."""
    explicit = os.environ.get("TWOPHASE_PG_BINDIR")
    if explicit:
        return Path(explicit)
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).resolve().parent
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if not candidates:
        raise ServiceError("PostgreSQL binaries not found; run `scripts/dev.sh setup`")
    return candidates[-1].parent


def _require_postgres_user() -> None:
    try:
        pwd.getpwnam(PG_SUPERUSER)
    except KeyError:
        raise ServiceError(
            f"running as root needs the `{PG_SUPERUSER}` system user (Debian package postgresql)"
        ) from None


class PostgresServer:
    """A private PostgreSQL cluster under ``root`` listening on 127.0.0.1:``port`` only."""

    name = "postgres"

    def __init__(self, root: Path, port: int = 55432) -> None:
        self.root = Path(root).resolve()
        self.port = port
        self.password = PG_PASSWORD  # the twophase role's, in url_for()
        self._as_root = os.geteuid() == 0

    # -- layout -------------------------------------------------------------------------------
    # Lazy: deciding the folder may shell out to runuser, which `url`/`env` must not need.
    @functools.cached_property
    def base(self) -> Path:
        """Where the cluster lives: ``root``, unless the postgres user cannot reach it."""
        if not self._as_root:
            return self.root
        _require_postgres_user()
        self.root.mkdir(parents=True, exist_ok=True)
        if self._postgres_can_traverse(self.root.parent):
            return self.root
        # e.g. pytest's tmp_path sits under /tmp/pytest-of-root (mode 0700). Pick a stable
        # folder per root so a new PostgresServer(root) finds the same cluster again.
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        fallback = Path("/tmp") / f"twophase-pg-{digest}"
        note = self.root / "CLUSTER_LOCATION"
        if not note.exists():
            _log(f"user postgres cannot traverse {self.root.parent}; cluster lives in {fallback}")
            note.write_text(f"{fallback}\n")
        return fallback

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base / "run"

    @property
    def log_file(self) -> Path:
        return self.base / "postgres.log"

    @staticmethod
    def _postgres_can_traverse(folder: Path) -> bool:
        # `test -x` resolves the whole chain, so it checks every ancestor too (folder exists:
        # `base` just created it).
        probe = ["runuser", "-u", PG_SUPERUSER, "--", "test", "-x", str(folder)]
        return subprocess.run(probe, cwd="/", check=False).returncode == 0

    def _ensure_layout(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        sock_path = self.socket_dir / f".s.PGSQL.{self.port}"
        if len(str(sock_path)) > 100:  # sun_path is 108 bytes; PostgreSQL refuses longer paths
            raise ServiceError(f"socket path too long ({sock_path}); use a shorter root folder")
        if self._as_root:
            # PostgreSQL refuses to run as root: the server runs as `postgres` and owns its files.
            for path in (self.base, self.socket_dir):
                shutil.chown(path, PG_SUPERUSER, PG_SUPERUSER)
            os.chmod(self.base, 0o700)

    # -- subprocess helpers -------------------------------------------------------------------
    def _as_server_user(self, args: list[str]) -> list[str]:
        return ["runuser", "-u", PG_SUPERUSER, "--", *args] if self._as_root else args

    def _run(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        # cwd=base: runuser keeps our cwd, which may be unreadable for postgres (e.g. /root).
        result = subprocess.run(
            args,
            cwd=self.base,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and result.returncode != 0:
            raise ServiceError(
                f"{shlex.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
                f"\nlog {self.log_file}:\n{_tail(self.log_file)}"
            )
        return result

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(_pg_bindir() / "pg_ctl"), "-D", str(self.data_dir), *args]
        return self._run(self._as_server_user(cmd), check=check)

    def _psql(self, sql: str, database: str = "postgres", **variables: str) -> str:
        """Run SQL as the superuser over the private unix socket (trust auth)."""
        args = [
            str(_pg_bindir() / "psql"),
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            str(self.socket_dir),
            "-p",
            str(self.port),
            "-U",
            PG_SUPERUSER,
            "-d",
            database,
        ]
        for key, value in variables.items():
            args += ["-v", f"{key}={value}"]
        # SQL on stdin (not -c) so that psql interpolates :'var' safely.
        result = subprocess.run(
            args, input=sql, cwd=self.base, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise ServiceError(f"psql failed on port {self.port}: {result.stderr.strip()}")
        return result.stdout

    # -- state --------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.url_for(PG_DATABASE)

    def url_for(self, database: str) -> str:
        """SQLAlchemy URL (psycopg 3 driver) for ``database`` as the twophase role."""
        return f"postgresql+psycopg://{PG_USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def set_password(self, password: str) -> None:
        """Give the twophase role ``password`` (tests grep their output for a distinctive
        one); url_for() names it from then on."""
        self._psql(
            "SELECT format('ALTER ROLE %I PASSWORD %L', :'role', :'pw')\\gexec\n",
            role=PG_USER,
            pw=password,
        )
        self.password = password

    def is_reachable(self) -> bool:
        pg_isready = _pg_bindir() / "pg_isready"
        if not pg_isready.exists():
            return _tcp_open(self.port)
        probe = [str(pg_isready), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-t", "2"]
        return subprocess.run(probe, check=False).returncode == 0

    def is_running(self) -> bool:
        """Our postmaster is alive (reads postmaster.pid; root may read the 0700 data dir)."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return False
        return _pid_alive(pid)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        if self.is_reachable():
            return  # idempotent: already up (ours from an earlier run, or someone else's)
        self._ensure_layout()
        fresh = not (self.data_dir / "PG_VERSION").exists()
        if fresh:
            self._initdb()
        if not self.is_running():
            self._pg_ctl(
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                str(int(timeout)),
                "-o",
                self._server_options(),
                "start",
            )
        if not _wait_until(self.is_reachable, timeout):
            raise ServiceError(f"postgres on port {self.port} not ready:\n{_tail(self.log_file)}")
        self._bootstrap()

    def _initdb(self) -> None:
        started = time.monotonic()
        initdb = str(_pg_bindir() / "initdb")
        self._run(
            self._as_server_user(
                [
                    initdb,
                    "-D",
                    str(self.data_dir),
                    "-U",
                    PG_SUPERUSER,
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "--no-instructions",
                ]
            )
        )
        _log(f"initdb {self.data_dir} took {time.monotonic() - started:.1f}s")

    def _server_options(self) -> str:
        # pg_ctl hands -o to /bin/sh, hence the quoting. Settings are passed on every start
        # (not written to postgresql.conf) so the port stays a constructor parameter.
        return shlex.join(
            [
                "-c",
                "listen_addresses=127.0.0.1",
                "-p",
                str(self.port),
                "-c",
                f"unix_socket_directories={self.socket_dir}",
            ]
        )

    def _bootstrap(self) -> None:
        # Runs on every start of our cluster: cheap, and repairs a half-finished first start.
        # CREATEROLE: tests/integration/test_privileges.py runs the protocol under roles of
        # least privilege it creates (and drops); ALTER gives it to a cluster made before (a
        # standby has it from its primary, and is read-only).
        self._psql(
            "SELECT format('CREATE ROLE %I LOGIN CREATEDB CREATEROLE PASSWORD %L',"
            " :'role', :'pw')\n"
            "WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role')\\gexec\n"
            "SELECT format('ALTER ROLE %I CREATEROLE', :'role') WHERE NOT pg_is_in_recovery()"
            " AND NOT (SELECT rolcreaterole FROM pg_roles WHERE rolname = :'role')\\gexec\n",
            role=PG_USER,
            pw=PG_PASSWORD,
        )
        self.create_database(PG_DATABASE)

    def create_database(self, name: str) -> None:
        """Create ``name`` owned by the twophase role unless it exists (tests: isolated DBs)."""
        try:
            self._psql(
                "SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'owner')\n"
                "WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db')\\gexec\n",
                db=name,
                owner=PG_USER,
            )
        except ServiceError as exc:
            if "already exists" not in str(exc):  # lost a race with a concurrent creator
                raise

    def drop_database(self, name: str) -> None:
        self._psql(
            "SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE)', :'db')\\gexec\n", db=name
        )

    def destroy(self) -> None:
        """Crash-stop and delete the cluster (tests running as root may get a /tmp fallback)."""
        self.kill()
        shutil.rmtree(self.base, ignore_errors=True)
        if self.base != self.root:
            shutil.rmtree(self.root, ignore_errors=True)

    def stop(self, mode: str = "fast") -> None:
        """Stop our cluster; mode "immediate" is a crash-like stop (recovery on next start)."""
        if self.is_running():
            self._pg_ctl("-m", mode, "-w", "-t", str(int(STOP_TIMEOUT_S)), "stop")

    def kill(self) -> None:
        # Not SIGKILL of the postmaster: orphaned backends would keep the shared memory busy
        # and block the next start for a while. "immediate" is PostgreSQL's crash equivalent.
        self.stop(mode="immediate")

    def restart(self) -> None:
        self.stop()
        self.start()

    def status(self) -> str:
        state = (
            "running" if self.is_running() else ("foreign" if self.is_reachable() else "stopped")
        )
        return f"{self.name:<17} {state:<8} port={self.port} root={self.base}"


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _port(env_var: str, default: int) -> int:
    return int(os.environ.get(env_var, default))


def _local_dir() -> Path:
    return Path(os.environ.get("TWOPHASE_LOCAL_DIR", DEFAULT_LOCAL_DIR))


@contextlib.contextmanager
def _cli_lock() -> Iterator[None]:
    # Two `dev.sh test` runs started together must not both run initdb on the same folder.
    _local_dir().mkdir(parents=True, exist_ok=True)
    with open(_local_dir() / ".services.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def default_servers() -> tuple[PostgresServer, InfluxServer, VictoriaMetricsServer]:
    """The development servers; ports via TWOPHASE_*_PORT, folder via TWOPHASE_LOCAL_DIR."""
    local = _local_dir()
    return (
        PostgresServer(local / "postgres", _port("TWOPHASE_PG_PORT", 55432)),
        InfluxServer(local / "influxdb", _port("TWOPHASE_INFLUX_PORT", 18086)),
        VictoriaMetricsServer(local / "victoria-metrics", _port("TWOPHASE_VM_PORT", 18428)),
    )


def env_lines() -> list[str]:
    pg, influx, vm = default_servers()
    values = {
        "TWOPHASE_STAGING_URL": pg.url,
        "TWOPHASE_INFLUX_URL": influx.url,
        "TWOPHASE_INFLUX_API": "v1",
        "TWOPHASE_INFLUX_DB": INFLUX_DATABASE,
        "TWOPHASE_TEST_VM_URL": vm.url,
    }
    return [f"export {key}={shlex.quote(value)}" for key, value in values.items()]


def _cmd_start() -> int:
    pg, influx, vm = default_servers()
    with _cli_lock():
        for server in (pg, influx, vm):
            server.start()
        influx.create_database(INFLUX_DATABASE)
    return _cmd_status()


def _cmd_stop() -> int:
    servers = default_servers()
    with _cli_lock():
        for server in servers:
            server.stop()
            print(server.status())
    # Success means none of *our* processes is left; a foreign server on a port is not ours.
    return 1 if any(server.is_running() for server in servers) else 0


def _cmd_status() -> int:
    servers = default_servers()
    for server in servers:
        print(server.status())
    return 0 if all(server.is_reachable() for server in servers) else 1


def _cmd_env() -> int:
    print("\n".join(env_lines()))
    return 0


COMMANDS = {"start": _cmd_start, "stop": _cmd_stop, "status": _cmd_status, "env": _cmd_env}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in COMMANDS:
        print(f"usage: {Path(__file__).name} {{{'|'.join(COMMANDS)}}}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]]()
    except ServiceError as exc:
        _log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
