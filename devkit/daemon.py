"""What every local server shares: its settings, the errors, the process and HTTP probes,
and :class:`HttpDaemon`, a server binary started detached and probed over HTTP.

Everything lives under a root folder (by default ``<repo>/.local``), never in system paths,
so several instances can coexist and tests can start, kill and restart their own copies.
Stdlib only, like all of :mod:`devkit`: ``scripts/dev.sh`` runs it before the virtualenv
exists.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

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
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServiceError(RuntimeError):
    """A local server could not be started, stopped or queried."""


def log(message: str) -> None:
    # stderr, so that `services.py env` output stays eval-able.
    print(f"[services] {message}", file=sys.stderr, flush=True)


def tail(path: Path, lines: int = 30) -> str:
    try:
        content = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(content[-lines:])


def tcp_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_status(url: str, method: str = "GET", data: bytes | None = None) -> int | None:
    """HTTP status of ``url``, or None when nothing answers."""
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with HTTP.open(request, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie (a killed child we have not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the parenthesised command name, which may contain spaces.
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def pid_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def find_binary(name: str, env_var: str) -> str:
    explicit = os.environ.get(env_var)
    if explicit:
        return explicit
    found = shutil.which(name)
    if found is None:
        raise ServiceError(
            f"{name} not found on PATH; run `scripts/dev.sh setup` (or set {env_var})"
        )
    return found


class HttpDaemon:
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
        return http_status(self.url + self.health_path) == self.healthy_status

    def pid(self) -> int | None:
        """Pid of *our* process if it is alive; guards against pid reuse via its cmdline."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        self._reap()
        if not pid_alive(pid) or str(self.root) not in " ".join(pid_cmdline(pid)):
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
        if tcp_open(self.port):
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
                    f"{self.log_file}:\n{tail(self.log_file)}"
                )
            return self.is_reachable()

        if not wait_until(ready, timeout):
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
        if not wait_until(lambda: not self.is_running(), timeout):
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not self.is_running(), timeout)
        # The port may linger a moment after exit; a restart must not see "already running".
        wait_until(lambda: not tcp_open(self.port), timeout)
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()

    def status(self) -> str:
        pid = self.pid()
        state = "running" if pid else ("foreign" if self.is_reachable() else "stopped")
        return f"{self.name:<17} {state:<8} port={self.port} pid={pid or '-'} root={self.root}"
