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

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from twophase.config import StagingConfig
from twophase.config.tls import staging_tls_error
from twophase.errors import SchemaError, StagingUnavailableError
from twophase.retry import StagingRetry
from twophase.store import locks
from twophase.store.locks import HeldLock, LockOwner, first_line

log = logging.getLogger("twophase.store.database")

# The Alembic head this code needs (a unit test keeps it equal to twophase/migrations'
# head) and Alembic's version table. Here rather than in twophase.store.schema so that
# executors, which stage through this module, never import SQLAlchemy.
SCHEMA_REVISION = "0011_generations"
VERSION_TABLE = "twophase_alembic_version"

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
        self._connect_kwargs: dict[str, object] = {
            "connect_timeout": max(1, int(config.connect_timeout_s)),
            **locks.client_keepalives(config, conninfo),
        }
        _probe(conninfo, config)
        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            # default: a promotion's reader and its lanes' dead letters, beside the
            # caller's own steps (the fencing reads have a session of their own)
            max_size=max_size or 3 + config.lanes,
            timeout=config.connect_timeout_s,
            check=ConnectionPool.check_connection,
            kwargs=self._connect_kwargs,
            configure=functools.partial(_configure, config=config),
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
        except psycopg.errors.LockNotAvailable:
            # Retryable like an outage: the holder may be a frozen session PostgreSQL
            # ends after staging_session_timeout, or a fenced run's.
            raise StagingUnavailableError(
                f"staging database {self.config.display_url}: a row lock was held by "
                f"another session for over {self.config.lock_timeout_s:g}s "
                "(staging_lock_timeout)"
            ) from None
        except psycopg.errors.IdleInTransactionSessionTimeout:
            # This process stood still inside a transaction (a pause, a long GC) and
            # PostgreSQL ended the session: nothing of the transaction landed.
            raise StagingUnavailableError(
                f"staging database {self.config.display_url}: the session was idle in a "
                f"transaction for over {self.config.session_timeout_s:g}s "
                "(staging_session_timeout) and PostgreSQL ended it"
            ) from None
        except psycopg.OperationalError as exc:
            raise StagingUnavailableError(
                f"staging database {self.config.display_url}: {first_line(exc)}"
            ) from None

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Cursor]:
        """One transaction: commit on normal exit, roll back on any exception."""
        with self.connection() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    @contextmanager
    def session_lock(
        self, name: str, owner: LockOwner, between_tries: Callable[[], None] | None = None
    ) -> Iterator[HeldLock]:
        """Hold PostgreSQL's session-level advisory lock ``name`` for the block, for the
        run ``owner`` (its sink's lock), waiting while another session holds it.

        The lock lives on a connection of its own, outside the pool: a holder's steps
        inside the block and a waiter's wait must not take the pool's connections from
        each other. Taking it rides out an outage like any step (``retry``); if the
        connection drops inside the block, PostgreSQL releases the lock, as it does
        when the holder's process dies -- so the holder asks
        [`HeldLock.check`][twophase.store.locks.HeldLock.check] before each step the
        lock orders, as it checks its lease. A holder serving a fenced run of the sink is
        ended; any other is waited for while ``between_tries`` returns (it raises to
        give up), or without it up to ``staging_retry_deadline``
        ([`locks.take`][twophase.store.locks.take]).
        """
        conn = self.retry("lock", lambda: self._locked_session(name, owner, between_tries))
        try:
            yield HeldLock(conn, name, self.config.display_url)
        finally:
            conn.close()  # ends the session, and the lock with it

    def _locked_session(
        self, name: str, owner: LockOwner, between_tries: Callable[[], None] | None
    ) -> psycopg.Connection:
        """A new session that holds the lock (StagingUnavailableError when it cannot)."""
        conn = self.session(owner.application_name)
        try:
            locks.take(conn, name, owner, between_tries, self.config.retry_deadline_s)
        except psycopg.OperationalError as exc:
            conn.close()
            raise StagingUnavailableError(
                f"staging database {self.config.display_url}: {first_line(exc)}"
            ) from None
        except BaseException:
            conn.close()
            raise
        return conn

    def session(self, application_name: str | None = None) -> psycopg.Connection:
        """A new autocommit session outside the pool, with the pooled sessions' settings
        (``_configure``): the caller's own, to close. StagingUnavailableError (with
        libpq's reason, never the URL's password) when it cannot be opened."""
        named: dict[str, object] = (
            {} if application_name is None else {"application_name": application_name}
        )
        try:
            conn = psycopg.connect(
                self._conninfo,
                autocommit=True,
                **named,  # type: ignore[arg-type]
                **self._connect_kwargs,  # type: ignore[arg-type]
            )
            try:
                _configure(conn, self.config)
            except BaseException:
                conn.close()
                raise
        except psycopg.OperationalError as exc:
            raise StagingUnavailableError(
                f"staging database {self.config.display_url}: {first_line(exc)}"
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


def _configure(conn: psycopg.Connection, config: StagingConfig) -> None:
    """A pool connection's session: its limits (lock waits, idle transactions, silent
    peers: [`locks.session_settings`][twophase.store.locks.session_settings]), and generic
    plans for its prepared statements. psycopg prepares a statement run five times on a
    connection; PostgreSQL would still plan each run of it afresh while custom plans
    look cheaper, and the protocol's statements are run with ever new epochs and ids,
    so the planning is paid again every time (a quarter of a millisecond per epoch for
    the mark's statements alone)."""
    locks.apply_settings(conn, config, [("plan_cache_mode", "force_generic_plan")])
    conn.commit()


def _probe(conninfo: str, config: StagingConfig) -> None:
    """One connection, to fail fast with the reason (a pool that cannot connect only
    times out): a TLS problem as ConfigError naming the setting, anything else as
    StagingUnavailableError (retryable) with libpq's words."""
    try:
        psycopg.connect(conninfo, connect_timeout=max(1, int(config.connect_timeout_s))).close()
    except psycopg.OperationalError as exc:
        reason = first_line(exc)
        raise staging_tls_error(str(exc)) or StagingUnavailableError(
            f"cannot connect to the staging database {config.display_url}: {reason}"
        ) from None


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
