"""A private PostgreSQL cluster under a folder of its own, on 127.0.0.1 only."""

from __future__ import annotations

import functools
import hashlib
import os
import pwd
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from devkit.daemon import (
    PG_DATABASE,
    PG_PASSWORD,
    PG_SUPERUSER,
    PG_USER,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServiceError,
    log,
    pid_alive,
    tail,
    tcp_open,
    wait_until,
)


def pg_bindir() -> Path:
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
            log(f"user postgres cannot traverse {self.root.parent}; cluster lives in {fallback}")
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
                f"\nlog {self.log_file}:\n{tail(self.log_file)}"
            )
        return result

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(pg_bindir() / "pg_ctl"), "-D", str(self.data_dir), *args]
        return self._run(self._as_server_user(cmd), check=check)

    def _psql(self, sql: str, database: str = "postgres", **variables: str) -> str:
        """Run SQL as the superuser over the private unix socket (trust auth)."""
        args = [
            str(pg_bindir() / "psql"),
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
        pg_isready = pg_bindir() / "pg_isready"
        if not pg_isready.exists():
            return tcp_open(self.port)
        probe = [str(pg_isready), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-t", "2"]
        return subprocess.run(probe, check=False).returncode == 0

    def is_running(self) -> bool:
        """Our postmaster is alive (reads postmaster.pid; root may read the 0700 data dir)."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return False
        return pid_alive(pid)

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
        if not wait_until(self.is_reachable, timeout):
            raise ServiceError(f"postgres on port {self.port} not ready:\n{tail(self.log_file)}")
        self._bootstrap()

    def _initdb(self) -> None:
        started = time.monotonic()
        initdb = str(pg_bindir() / "initdb")
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
        log(f"initdb {self.data_dir} took {time.monotonic() - started:.1f}s")

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
