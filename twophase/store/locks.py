"""Session-level advisory locks, and the sessions' limits that keep a frozen holder from
wedging anyone.

A lock is PostgreSQL's session-level advisory lock on a session of its own, named
by a string whose 64-bit hash is the key. It is always *tried*, never waited for in
the server: between tries the waiter looks at who holds it, in its own database (an
advisory lock is a database's; another staging store on the server may hold one of
the same name). A session of a run that a newer run has fenced (I5) holds nothing any
run may wait for; the waiter ends that session (``pg_terminate_backend``, which a role
may do to its own sessions) and takes the lock. One of another role, which the waiter
may not end, never ends by itself: it is named once (a warning with the command or
grant that would end it) and given up after the deadline (FrozenHolderError). Any
other holder is waited for while ``between_tries`` lets the waiter go on (it raises to
give up), or up to a deadline.

Every session also gets limits ([`session_settings`][twophase.store.locks.session_settings],
[`client_keepalives`][twophase.store.locks.client_keepalives]): a row-lock wait gives up
after ``staging_lock_timeout`` (the step is retried), PostgreSQL ends a session idle in a
transaction, or whose peer went silent, after ``staging_session_timeout``. So a
frozen driver's row locks are released within that time, and its lock sessions are
ended by the run that fenced it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from twophase.config import StagingConfig
from twophase.errors import FrozenHolderError, LockLostError, StagingUnavailableError

log = logging.getLogger("twophase.store.locks")

# The seed of twophase's advisory lock keys ("tp"): a lock's key is the 64-bit hash of
# its name (hashtextextended). With a 32-bit hash, two of about 77,000 names collide
# with even odds, and an unrelated sink or target would wait on the other's lock.
LOCK_SEED = 0x7470
_TRY_EVERY_S = 0.2
# A lock session names the fencing token of the run it serves, so that a waiter can
# tell a fenced run's session from a live one's.
_APP_PREFIX = "twophase fencing token "

_TRY = "SELECT pg_try_advisory_lock(hashtextextended(%s, %s))"
# Who holds the lock now, the token their session names, and their role. An advisory lock is the
# database's (its key includes the database): pg_locks lists every database's, and
# another staging store on the server may hold a lock of the same name, for a sink of
# the same name, under tokens of its own.
_HOLDER = (
    "SELECT l.pid, a.application_name, a.usename FROM pg_locks l"
    " LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND (l.classid::int8 << 32 | l.objid::int8) = hashtextextended(%s, %s)"
)
# Ended only while the sink's current token is newer than the holder's: the check and
# the signal are one statement, so a holder is never ended on a stale reading.
_END_FENCED = (
    "SELECT pg_terminate_backend(%s) FROM twophase_sinks WHERE sink_id = %s AND fencing_token > %s"
)


@dataclass(frozen=True)
class LockOwner:
    """The run a lock is taken for: its sink and fencing token (I5)."""

    sink_id: str
    token: int

    @property
    def application_name(self) -> str:
        return f"{_APP_PREFIX}{self.token}"


def session_settings(config: StagingConfig) -> list[tuple[str, str]]:
    """PostgreSQL settings of every twophase session (name, value in ms or a count).

    ``lock_timeout`` bounds a row-lock wait (the step fails retryably and is tried
    again until ``staging_retry_deadline``). ``idle_in_transaction_session_timeout``
    ends a session that holds a transaction, and its row locks, without a statement:
    a frozen or paused process. The server's keepalives and ``tcp_user_timeout`` end a
    session whose client host is gone within about the same time, where Linux's
    defaults take over two hours."""
    out = [("lock_timeout", str(_ms(config.lock_timeout_s)))]
    session = config.session_timeout_s
    if session > 0:
        idle, interval, count = _keepalive(session)
        out += [
            ("idle_in_transaction_session_timeout", str(_ms(session))),
            ("tcp_keepalives_idle", str(idle)),
            ("tcp_keepalives_interval", str(interval)),
            ("tcp_keepalives_count", str(count)),
            ("tcp_user_timeout", str(_ms(session))),
        ]
    return out


def client_keepalives(config: StagingConfig, conninfo: str) -> dict[str, object]:
    """libpq's keepalive parameters, so that the client, too, gives up on a server host
    that went silent within ``staging_session_timeout``. Those the URL sets win."""
    session = config.session_timeout_s
    if session <= 0:
        return {}
    idle, interval, count = _keepalive(session)
    wanted: dict[str, object] = {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": count,
        "tcp_user_timeout": _ms(session),
    }
    given = conninfo_to_dict(conninfo)
    return {k: v for k, v in wanted.items() if k not in given}


def apply_settings(
    conn: psycopg.Connection, config: StagingConfig, more: Sequence[tuple[str, str]] = ()
) -> None:
    """Set [`session_settings`][twophase.store.locks.session_settings], and ``more``, on
    ``conn`` for the session (one round trip)."""
    settings = [*session_settings(config), *more]
    calls = ", ".join("set_config(%s, %s, false)" for _ in settings)
    conn.execute(f"SELECT {calls}", [v for pair in settings for v in pair])  # only placeholders


def take(
    conn: psycopg.Connection,
    name: str,
    owner: LockOwner,
    between_tries: Callable[[], None] | None,
    deadline_s: float,
) -> None:
    """Take lock ``name`` on ``conn``: tried every 0.2 s, a fenced run's holder ended at
    once; any other holder waited for while ``between_tries`` returns (it raises to
    give up), or, without it, for up to ``deadline_s`` (then StagingUnavailableError,
    retryable). A fenced run's holder this role may not end is waited for up to
    ``deadline_s`` whatever ``between_tries`` says (FrozenHolderError: it never ends by
    itself)."""
    start = time.monotonic()
    spared: dict[int, float] = {}  # fenced holders this role may not end: since when
    while True:
        row = conn.execute(_TRY, (name, LOCK_SEED)).fetchone()
        if row is not None and row[0]:
            return
        holder = _holder(conn, name)
        if holder is not None and _end_fenced_holder(conn, name, owner, holder, spared):
            continue
        if holder is not None and holder.pid in spared:
            _give_up_on_spared(conn, name, owner, holder, spared[holder.pid], deadline_s)
        if between_tries is not None:
            between_tries()
        elif time.monotonic() - start > deadline_s:
            raise StagingUnavailableError(
                f"lock {name!r} is held by another session of a live run for over {deadline_s:g}s"
            )
        time.sleep(_TRY_EVERY_S)


@dataclass(frozen=True)
class _Holder:
    """The session that holds a lock: its process id, the fencing token its name gives
    (None: not a twophase lock session), and its role."""

    pid: int
    token: int | None
    role: str | None


def _holder(conn: psycopg.Connection, name: str) -> _Holder | None:
    row = conn.execute(_HOLDER, (name, LOCK_SEED)).fetchone()
    if row is None:
        return None  # released meanwhile
    pid, application, role = row
    return _Holder(pid, _token_of(application), role)


def _end_fenced_holder(
    conn: psycopg.Connection,
    name: str,
    owner: LockOwner,
    holder: _Holder,
    spared: dict[int, float],
) -> bool:
    """End the holder's session if it serves a run of ``owner``'s sink older than the
    sink's current one (fenced). True when a session was ended. One this role may not
    end is added to ``spared`` (and said so, once)."""
    token = holder.token
    if token is None or token >= owner.token or holder.pid in spared:
        return False
    try:
        ended = conn.execute(_END_FENCED, (holder.pid, owner.sink_id, token)).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        # Another role's session: only that role, its members, a superuser or a member
        # of pg_signal_backend may end it (a sink's drivers share one role).
        spared[holder.pid] = time.monotonic()
        log.warning("%s; waiting for it", _unendable(conn, name, owner, holder))
        return False
    if ended is None or not ended[0]:
        return False
    log.warning(
        "ended PostgreSQL session %s, which held lock %r for a fenced run (fencing token %s) "
        "of sink %r",
        holder.pid,
        name,
        token,
        owner.sink_id,
    )
    _wait_released(conn, name)
    return True


def _give_up_on_spared(
    conn: psycopg.Connection,
    name: str,
    owner: LockOwner,
    holder: _Holder,
    since: float,
    deadline_s: float,
) -> None:
    """FrozenHolderError once a fenced holder this role may not end has been waited for
    ``deadline_s``: a frozen driver's lock session answers the server and never ends
    by itself, so no waiting would take the lock."""
    if time.monotonic() - since > deadline_s:
        raise FrozenHolderError(
            f"{_unendable(conn, name, owner, holder)}; gave up after {deadline_s:g}s "
            "(staging_retry_deadline)"
        )


def _unendable(conn: psycopg.Connection, name: str, owner: LockOwner, holder: _Holder) -> str:
    """What holds the lock, and the exact command or grant that would end it."""
    row = conn.execute("SELECT current_user").fetchone()
    me = sql.Identifier(row[0] if row else "").as_string(conn)
    theirs = sql.Identifier(holder.role).as_string(conn) if holder.role else "its role"
    return (
        f"lock {name!r} is held by PostgreSQL session {holder.pid} of a fenced run (fencing "
        f"token {holder.token}) of sink {owner.sink_id!r} under role {theirs}, which role {me} "
        f"may not end: end it as a superuser (SELECT pg_terminate_backend({holder.pid})), or "
        f"let role {me} end it (GRANT {theirs} TO {me}, or GRANT pg_signal_backend TO {me})"
    )


def _wait_released(conn: psycopg.Connection, name: str) -> None:
    """pg_terminate_backend only signals: wait (briefly) until the session is gone."""
    for _ in range(50):
        if _holder(conn, name) is None:
            return
        time.sleep(0.02)


def _token_of(application: str | None) -> int | None:
    if not application or not application.startswith(_APP_PREFIX):
        return None
    digits = application[len(_APP_PREFIX) :]
    return int(digits) if digits.isdigit() else None


class HeldLock:
    """A session-level advisory lock held on a session of its own."""

    def __init__(self, conn: psycopg.Connection, name: str, where: str) -> None:
        self._conn = conn
        self._name = name
        self._where = where

    def check(self) -> None:
        """LockLostError unless this session still holds the lock: a PostgreSQL restart,
        a connection cut, or a newer run that ended this fenced run's session releases
        it while its holder goes on; another process may then hold it. One round trip
        on the lock's own session (which is not the pool's)."""
        try:
            row = self._conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid = pg_backend_pid() AND granted AND objsubid = 1"
                " AND (classid::int8 << 32 | objid::int8) = hashtextextended(%s, %s))",
                (self._name, LOCK_SEED),
            ).fetchone()
        except psycopg.Error as exc:
            raise LockLostError(
                f"lock {self._name!r} lost with its session to {self._where}: {first_line(exc)}"
            ) from None
        if row is None or not row[0]:
            raise LockLostError(f"lock {self._name!r} is no longer held in {self._where}")


def first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


def _keepalive(session_s: float) -> tuple[int, int, int]:
    """(idle, interval, count) in whole seconds: silence is noticed after about half
    the timeout, and the peer is given up after about the whole of it."""
    idle = max(1, int(session_s / 2))
    interval = max(1, int(session_s / 6))
    return idle, interval, 3
