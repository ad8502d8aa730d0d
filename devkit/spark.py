"""A standalone Spark master and worker, and a Spark Connect server, from the pip-installed
PySpark, on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devkit.daemon import HTTP, HttpDaemon, ServiceError, tcp_open


class SparkDaemon(HttpDaemon):
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


class SparkMasterServer(SparkDaemon):
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
            with HTTP.open(self.url + "/json/", timeout=5) as response:
                return int(json.loads(response.read()).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0


class SparkWorkerServer(SparkDaemon):
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


class SparkConnectServer(SparkDaemon):
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
        return super().is_reachable() and tcp_open(self.rpc_port)

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
