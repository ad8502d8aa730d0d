"""A PostgreSQL target's settings checked, its connections opened, its errors classified.

The target's URL (``postgresql://user@host:port/dbname?...``) never holds the password:
it comes from the password setting and is handed to libpq on its own, so no URL, log
line or error message ever carries it. TLS files become libpq parameters
(``sslrootcert``, ``sslcert``, ``sslkey``), and a host that is not loopback gets
verified TLS unless the URL chooses an ``sslmode``, as the staging store does
([`twophase.config.sslmode`][twophase.config.sslmode]).

Every session bounds its waits (``session_limits``): PostgreSQL ends it after
``IDLE_IN_TRANSACTION_S`` idle inside a transaction, so that a frozen delivery cannot
hold an epoch's locks for ever; and a statement gives up after ``target_lock_timeout``
waiting for a lock (a reader's on a table, another session's on a row) and after
``target_statement_timeout`` in all, so that a delivery never waits for ever on what
others hold: the epoch fails retryably and starts over, and a target that cannot
finish it in time is left lagging while the others go on.

Every failure leaves here as a class of [`twophase.errors`][twophase.errors]
(``classify``): what may pass (a lost connection, a server shutting down, too many
connections, a lock wait or a statement past its limit) as ``TransientWriteError``, or
``TransactionLostError`` when it ended an open transaction; credentials or privileges
refused as ``TargetAuthError``; a missing database as ``TargetNotFoundError``; anything
else as ``TargetRequestError``.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from twophase.config import sslmode, urls
from twophase.config.settings import SETTINGS, TARGET, env_name
from twophase.config.tls import staging_tls_error
from twophase.errors import (
    ConfigError,
    TargetAuthError,
    TargetNotFoundError,
    TargetRequestError,
    TransactionLostError,
    TransientWriteError,
    TwoPhaseError,
)

if TYPE_CHECKING:
    from twophase.config import TargetConfig

__all__ = [
    "SCHEMES",
    "check_settings",
    "classify",
    "connect",
    "create_tables",
    "display_url",
    "schema_of",
    "session_limits",
]

SCHEMES = ("postgresql", "postgres")  # the URL schemes that tell this kind
_ACCEPTED = (*SCHEMES, "postgresql+psycopg")  # also read, the staging URL's form
APPLICATION_NAME = "twophase target"
# How long a session may stand idle inside a transaction before PostgreSQL ends it (the
# epoch is then started over): far longer than a delivery waits between two requests.
IDLE_IN_TRANSACTION_S = 300.0
# Client keepalives: a target host that goes silent is given up within about a minute
# instead of TCP's default of hours (libpq's parameters; the URL's own win).
_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}

# SQLSTATEs: what may pass, and what says the credentials or privileges are wrong.
# 25006: a read-only server, a standby (after a failover, the next connection of a
# multi-host URL may find the new primary).
# 55P03: lock_not_available (past target_lock_timeout); 57014: query_canceled (past
# target_statement_timeout, or cancelled by an operator).
_TRANSIENT_STATES = (
    "57P01",
    "57P02",
    "57P03",
    "53300",
    "40001",
    "40P01",
    "55P03",
    "57014",
    "25006",
)
_LIMITS = {"55P03": "target_lock_timeout", "57014": "target_statement_timeout"}
_TRANSIENT_CLASSES = ("08", "53")  # connection exceptions, insufficient resources
_AUTH_STATES = ("42501",)  # insufficient_privilege
_AUTH_CLASSES = ("28",)  # invalid authorization specification
_NOT_FOUND_STATES = ("3D000", "3F000")  # invalid catalog (database) / schema name
# libpq's words when a connection is refused before any SQLSTATE is known.
_AUTH_WORDS = re.compile(
    r"password authentication failed|no pg_hba\.conf entry|role \".*\" does not exist|"
    r"authentication failed|no password supplied|permission denied",
    re.I,
)
_NOT_FOUND_WORDS = re.compile(r"database \".*\" does not exist", re.I)


def _setting_env(attr: str, fallback: str) -> str:
    """The environment variable of the target setting held in TargetConfig's ``attr``
    (the settings table names it; ``fallback`` when it does not)."""
    for setting in SETTINGS:
        if setting.section == TARGET and setting.attr == attr:
            return setting.env
    return env_name(fallback)


def url_setting() -> str:
    return _setting_env("url", "target_url")


def schema_of(config: TargetConfig) -> str:
    """The PostgreSQL schema of the target's tables (``target_schema``)."""
    return config.postgresql.schema


def create_tables(config: TargetConfig) -> bool:
    """Whether missing tables and field columns are created (``target_create_tables``)."""
    return config.postgresql.create_tables


def display_url(config: TargetConfig) -> str:
    """The URL for messages: any password masked (there should be none)."""
    return urls.mask(config.url)


def check_settings(config: TargetConfig) -> None:
    """Refuse settings a PostgreSQL target cannot work with, as ConfigError naming the
    setting: a URL that is not ``postgresql://...`` or holds a password (the password
    setting holds it), or an empty schema. Sends nothing."""
    option = url_setting()
    try:
        url = urls.DbUrl.parse(config.url)
    except urls.BadUrl as exc:
        raise ConfigError(option, f"{exc} (postgresql://user@host:5432/dbname)") from None
    if url.scheme not in _ACCEPTED:
        raise ConfigError(
            option, f"a PostgreSQL target's URL starts with postgresql://, not {url.scheme}://"
        )
    secrets = [*(["the user information"] if url.password is not None else [])]
    secrets += [f"?{name}=" for name in url.secret_params()]
    if secrets:
        raise ConfigError(
            option,
            f"{display_url(config)} holds a password ({', '.join(secrets)}): take it out and "
            f"set it with {_setting_env('password', 'target_password')} (or its _FILE form), "
            "so it never appears in a URL",
        )
    if not url.rest.lstrip("/").partition("?")[0]:
        raise ConfigError(option, f"{display_url(config)} names no database (.../dbname)")
    if not schema_of(config).strip():
        raise ConfigError(env_name("target_schema"), "must name a PostgreSQL schema")


def conninfo(config: TargetConfig) -> str:
    """The URL as libpq reads it: its TLS files as parameters, verified TLS for a host
    that is not loopback unless the URL chooses (no password: it is passed apart)."""
    url = urls.DbUrl.parse(config.url)
    given = url.params()
    sslmode.warn_weak_mode(display_url(config), url.hosts, given)
    params = {"sslrootcert": config.tls_ca, "sslcert": config.tls_cert, "sslkey": config.tls_key}
    params |= sslmode.tls_params(url.hosts, given, config.tls_ca)
    return url.with_params({k: v for k, v in params.items() if v}).render(scheme="postgresql")


def connect(config: TargetConfig, *, autocommit: bool = False) -> psycopg.Connection:
    """A new connection to the target; classified errors when it cannot be opened
    (TransientWriteError for what may pass). The password goes to libpq on its own."""
    info = conninfo(config)
    given = psycopg.conninfo.conninfo_to_dict(info)
    extra: dict[str, object] = {k: v for k, v in _KEEPALIVES.items() if k not in given}
    extra["connect_timeout"] = max(1, int(config.timeout_s))
    extra.setdefault("application_name", APPLICATION_NAME)
    if config.username:
        extra["user"] = config.username
    if config.password is not None:
        extra["password"] = config.password.reveal()
    try:
        conn = psycopg.connect(info, autocommit=autocommit, **extra)  # type: ignore[arg-type]
    except psycopg.Error as exc:
        raise classify(exc, config, in_transaction=False) from None
    try:
        limits = session_limits(config)
        calls = sql.SQL(", ").join([sql.SQL("set_config(%s, %s, false)")] * len(limits))
        conn.execute(sql.SQL("SELECT {}").format(calls), [v for pair in limits for v in pair])
        if not autocommit:
            conn.commit()
    except psycopg.Error as exc:
        conn.close()
        raise classify(exc, config, in_transaction=False) from None
    return conn


def session_limits(config: TargetConfig) -> list[tuple[str, str]]:
    """The settings bounding every wait of a target session (name, value in ms).

    A session left in a transaction (its process frozen, a run that does not know it
    was replaced) would hold an epoch's lock and its tables' locks for ever:
    PostgreSQL ends it after ``IDLE_IN_TRANSACTION_S``, and the epoch, never
    committed, starts over elsewhere. ``lock_timeout`` and ``statement_timeout``
    (``target_lock_timeout``, ``target_statement_timeout``; 0: none) end a statement
    that waits on a reader's lock or runs too long, instead of the commit waiting on
    it."""
    return [
        ("idle_in_transaction_session_timeout", f"{_ms(IDLE_IN_TRANSACTION_S)}ms"),
        ("lock_timeout", f"{_ms(config.postgresql.lock_timeout_s)}ms"),
        ("statement_timeout", f"{_ms(config.postgresql.statement_timeout_s)}ms"),
    ]


def _ms(seconds: float) -> int:
    """Whole milliseconds, rounded up: a limit under one is not none (0 is)."""
    return math.ceil(seconds * 1000) if seconds > 0 else 0


def classify(
    exc: psycopg.Error, config: TargetConfig, *, in_transaction: bool, broken: bool = False
) -> TwoPhaseError:
    """The error class a psycopg failure stands for (see the module's docstring);
    ``broken``: the connection is gone with it, whatever the server said."""
    where = f"PostgreSQL target {display_url(config)}"
    state = getattr(exc, "sqlstate", None) or ""
    text = _first_line(exc)
    if broken:
        return _lost(where, f"{text} ({state})" if state else text, in_transaction)
    if not state:
        return _without_state(exc, where, text, in_transaction)
    if state.startswith(_AUTH_CLASSES) or state in _AUTH_STATES:
        return TargetAuthError(f"{where} refused: {text} ({state})")
    if state in _NOT_FOUND_STATES:
        return TargetNotFoundError(f"{where}: {text} ({state})")
    if state.startswith(_TRANSIENT_CLASSES) or state in _TRANSIENT_STATES:
        return _lost(where, f"{text} ({state}){_limit(state, text, config)}", in_transaction)
    return TargetRequestError(f"{where} refused a statement: {text} ({state})")


def _limit(state: str, text: str, config: TargetConfig) -> str:
    """The setting a statement ended by its limit ran into, for the message ('' for
    any other failure: a statement an operator cancelled, say)."""
    option = _LIMITS.get(state)
    if option is None or "timeout" not in text:
        return ""
    seconds = (
        config.postgresql.lock_timeout_s
        if state == "55P03"
        else config.postgresql.statement_timeout_s
    )
    return f", past {option} {seconds:g}s"


def _without_state(
    exc: psycopg.Error, where: str, text: str, in_transaction: bool
) -> TwoPhaseError:
    """A failure with no SQLSTATE: libpq's, when connecting or when the connection
    broke. Its words tell a refused login, a missing database or TLS from an outage."""
    message = str(exc)
    if _AUTH_WORDS.search(message):
        return TargetAuthError(f"{where} refused the login: {text}")
    if _NOT_FOUND_WORDS.search(message):
        return TargetNotFoundError(f"{where}: {text}")
    tls = staging_tls_error(message)
    if tls is not None:
        return ConfigError(_tls_setting(tls.option), tls.problem)
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return _lost(where, text, in_transaction)
    return TargetRequestError(f"{where}: {text}")


def _lost(where: str, reason: str, in_transaction: bool) -> TwoPhaseError:
    if in_transaction:
        return TransactionLostError(
            f"{where}: the transaction was lost ({reason}); nothing of it was committed"
        )
    return TransientWriteError(f"{where}: {reason}")


def _tls_setting(staging_option: str) -> str:
    """The target's setting matching a staging TLS setting a libpq message points at."""
    attr = {"URL": "url", "TLS_CA": "tls_ca", "TLS_CERT": "tls_cert", "TLS_KEY": "tls_key"}
    suffix = staging_option.removeprefix(env_name("staging_"))
    return _setting_env(attr.get(suffix, "url"), f"target_{suffix.lower()}")


def _first_line(exc: BaseException) -> str:
    """The error's first line, with its detail when PostgreSQL sent one."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    diag = getattr(exc, "diag", None)
    detail = getattr(diag, "message_detail", None) if diag is not None else None
    return f"{line} ({detail})" if detail else line
