"""Connections to the PostgreSQL staging store: a small pool, transactions, error mapping.

Every protocol step is one PostgreSQL transaction taken from here. Connection
failures become [`StagingUnavailableError`][twophase.errors.StagingUnavailableError] (retryable;
``Database.retry`` repeats a step through an outage, [`twophase.retry`][twophase.retry]);
the pool checks a connection before lending it, so a PostgreSQL restart
between epochs costs one reconnect, not an error. Opening a pool first makes
one connection, so that a login or TLS problem is reported at once with
libpq's reason (TLS ones as ConfigError naming the setting) rather than as a
pool timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from twophase.config import StagingConfig
from twophase.config.tls import staging_tls_error
from twophase.errors import LockLostError, SchemaError, StagingUnavailableError
from twophase.retry import StagingRetry

log = logging.getLogger("twophase.store.database")

# The Alembic head this code needs (a unit test keeps it equal to twophase/migrations'
# head) and Alembic's version table. Here rather than in twophase.store.schema so that
# executors, which stage through this module, never import SQLAlchemy.
SCHEMA_REVISION = "0009_every_sink_has_targets"
VERSION_TABLE = "twophase_alembic_version"
# The seed of twophase's advisory lock keys ("tp"): a lock's key is the 64-bit hash of
# its name (hashtextextended). With a 32-bit hash, two of about 77,000 names collide
# with even odds, and an unrelated sink or target would wait on the other's lock.
_LOCK_SEED = 0x7470

_UPGRADE_HINT = (
    "run `twophase db upgrade` (or `alembic upgrade head` from the twophase repository "
    "root) with TWOPHASE_STAGING_URL set to this database"
)


class Database:
    """A pool of connections to one staging database.

    Thread-safe. ``transaction()`` yields a cursor inside one transaction that
    commits on normal exit and rolls back on an exception.
    """

    def __init__(
        self, config: StagingConfig, *, max_size: int | None = None, check_schema: bool = True
    ):
        self.config = config
        self.retry = StagingRetry.of(config)  # for steps that ride out an outage
        conninfo = self._conninfo = config.psycopg_conninfo()
        _probe(conninfo, config)
        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            # default: a promotion's reader and its lanes' fence checks and dead letters,
            # beside the caller's own steps
            max_size=max_size or 3 + config.lanes,
            timeout=config.connect_timeout_s,
            check=ConnectionPool.check_connection,
            kwargs={"connect_timeout": max(1, int(config.connect_timeout_s))},
            configure=_configure,
            name="twophase",
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=config.connect_timeout_s)
        except PoolTimeout:
            self._pool.close()
            raise StagingUnavailableError(
                f"cannot connect to the staging database {config.display_url} "
                f"within {config.connect_timeout_s:g}s"
            ) from None
        if check_schema:
            self.check_schema()

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection (no transaction opened yet)."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout:
            raise StagingUnavailableError(
                f"no connection to the staging database {self.config.display_url}"
            ) from None
        except psycopg.OperationalError as exc:
            raise StagingUnavailableError(
                f"staging database {self.config.display_url}: {_first_line(exc)}"
            ) from None

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Cursor]:
        """One transaction: commit on normal exit, roll back on any exception."""
        with self.connection() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    @contextmanager
    def session_lock(
        self, name: str, between_tries: Callable[[], None] | None = None
    ) -> Iterator[HeldLock]:
        """Hold PostgreSQL's session-level advisory lock ``name`` for the block, waiting
        while another session (of any process) holds it.

        The lock lives on a connection of its own, outside the pool: a holder's steps
        inside the block and a waiter's wait must not take the pool's connections from
        each other. Taking it rides out an outage like any step (``retry``); if the
        connection drops inside the block, PostgreSQL releases the lock, as it does
        when the holder's process dies -- so the holder asks
        [`HeldLock.check`][twophase.store.database.HeldLock.check] before each step the
        lock orders, as it checks its lease. With ``between_tries`` the lock is tried
        rather than waited for, and ``between_tries`` runs (and may raise, to give up)
        between tries.
        """
        conn = self.retry("lock", lambda: self._locked_session(name, between_tries))
        try:
            yield HeldLock(conn, name, self.config.display_url)
        finally:
            conn.close()  # ends the session, and the lock with it

    def _locked_session(
        self, name: str, between_tries: Callable[[], None] | None
    ) -> psycopg.Connection:
        """A new session that holds the lock (StagingUnavailableError when it cannot)."""
        timeout = max(1, int(self.config.connect_timeout_s))
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=timeout)
            try:
                _take(conn, name, between_tries)
            except BaseException:
                conn.close()
                raise
        except psycopg.OperationalError as exc:
            raise StagingUnavailableError(
                f"staging database {self.config.display_url}: {_first_line(exc)}"
            ) from None
        return conn

    def schema_revision(self) -> str | None:
        """The Alembic revision the database is at, or None when the schema is absent."""
        with self.transaction() as cur:
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,))
            row = cur.fetchone()
            if not row or not row[0]:
                return None
            cur.execute(f"SELECT version_num FROM {VERSION_TABLE}")  # noqa: S608 constant name
            found = cur.fetchone()
            return found[0] if found else None

    def check_schema(self) -> None:
        """Fail fast, telling the user what to run, unless the schema is at head."""
        revision = self.schema_revision()
        if revision == SCHEMA_REVISION:
            return
        where = f"the staging database {self.config.display_url}"
        if revision is None:
            raise SchemaError(f"{where} has no twophase schema: {_UPGRADE_HINT}")
        raise SchemaError(
            f"{where} is at schema revision {revision!r}, this twophase needs "
            f"{SCHEMA_REVISION!r}: {_UPGRADE_HINT} (or install the twophase version "
            "that matches the database)"
        )


_LOCK = "(hashtextextended(%s, %s))"
_TRY_EVERY_S = 0.2


def _take(conn: psycopg.Connection, name: str, between_tries: Callable[[], None] | None) -> None:
    if between_tries is None:
        conn.execute(f"SELECT pg_advisory_lock{_LOCK}", (name, _LOCK_SEED))
        return
    while True:
        row = conn.execute(f"SELECT pg_try_advisory_lock{_LOCK}", (name, _LOCK_SEED)).fetchone()
        if row is not None and row[0]:
            return
        between_tries()
        time.sleep(_TRY_EVERY_S)


class HeldLock:
    """A session-level advisory lock held on a session of its own."""

    def __init__(self, conn: psycopg.Connection, name: str, where: str) -> None:
        self._conn = conn
        self._name = name
        self._where = where

    def check(self) -> None:
        """LockLostError unless this session still holds the lock: a PostgreSQL restart,
        or a connection cut, ends the session and releases the lock while its holder
        goes on; another process may then hold it. One round trip on the lock's own
        session (which is not the pool's)."""
        try:
            row = self._conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid = pg_backend_pid() AND granted AND objsubid = 1"
                " AND (classid::int8 << 32 | objid::int8) = hashtextextended(%s, %s))",
                (self._name, _LOCK_SEED),
            ).fetchone()
        except psycopg.Error as exc:
            raise LockLostError(
                f"lock {self._name!r} lost with its session to {self._where}: {_first_line(exc)}"
            ) from None
        if row is None or not row[0]:
            raise LockLostError(f"lock {self._name!r} is no longer held in {self._where}")


def _configure(conn: psycopg.Connection) -> None:
    """A pool connection's session: generic plans for its prepared statements. psycopg
    prepares a statement run five times on a connection; PostgreSQL would still plan
    each run of it afresh while custom plans look cheaper, and the protocol's statements
    are run with ever new epochs and ids, so the planning is paid again every time (a
    quarter of a millisecond per epoch for the mark's statements alone)."""
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.commit()


def _probe(conninfo: str, config: StagingConfig) -> None:
    """One connection, to fail fast with the reason (a pool that cannot connect only
    times out): a TLS problem as ConfigError naming the setting, anything else as
    StagingUnavailableError (retryable) with libpq's words."""
    try:
        psycopg.connect(conninfo, connect_timeout=max(1, int(config.connect_timeout_s))).close()
    except psycopg.OperationalError as exc:
        reason = _first_line(exc)
        raise staging_tls_error(str(exc)) or StagingUnavailableError(
            f"cannot connect to the staging database {config.display_url}: {reason}"
        ) from None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


_shared: dict[str, Database] = {}
_shared_lock = threading.Lock()


def shared_database(config: StagingConfig) -> Database:
    """One pool per staging URL per process (executors stage many tasks through it),
    opened once the store answers (waited for up to ``staging_retry_deadline``)."""
    key = config.url.reveal()
    with _shared_lock:
        db = _shared.get(key)
        if db is None:
            db = _shared[key] = StagingRetry.of(config)("connect", lambda: Database(config))
        return db
