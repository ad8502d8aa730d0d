"""PostgreSQL URLs as users write them: checked, shown without the password, handed to psycopg.

``postgresql[+psycopg]://[user[:password]@][host[:port][,host[:port]...]]/db[?params]``:
the form SQLAlchemy's ``make_url`` and libpq both accept, several hosts
included (libpq tries them in turn, e.g. with
``target_session_attrs=read-write``). Parsed here with the standard library,
because every executor's Python worker reads the staging URL and importing
SQLAlchemy for it would add to every worker's start-up.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from urllib.parse import parse_qsl, quote, unquote, unquote_plus, unquote_to_bytes, urlencode

SCHEMES = ("postgresql", "postgresql+psycopg")
# Query parameters that hold a secret: libpq's password and sslpassword (the client
# key's passphrase); and p and token, InfluxDB's, since mask() shows http URLs too.
SECRET_PARAMS = frozenset({"password", "sslpassword", "p", "token"})
MASK = "***"


class BadUrl(ValueError):
    """The text is not a PostgreSQL URL; the message says why (without the password)."""


@dataclass(frozen=True)
class DbUrl:
    """The parts of a URL this code needs; ``rest`` is everything after the hosts."""

    scheme: str
    user: str | None
    password: str | None
    hosts: str
    rest: str

    @classmethod
    def parse(cls, text: str) -> DbUrl:
        scheme, sep, remainder = text.partition("://")
        if not sep or not scheme:
            raise BadUrl("is not a database URL (postgresql+psycopg://user@host/db)")
        # The user information ends at the last "@" before the query: a password may
        # hold an unencoded "/" (or "@"), which would otherwise end the authority early
        # and leave part of the password in the hosts, unmasked.
        before_query = remainder.partition("?")[0]
        userinfo, at, _ = before_query.rpartition("@")
        user = password = None
        if at:
            name, colon, secret = userinfo.partition(":")
            user, password = unquote(name) or None, unquote(secret) if colon else None
            remainder = remainder[len(userinfo) + 1 :]
        # The hosts end at the path, or at the query when there is no path.
        end = min((i for i in (remainder.find("/"), remainder.find("?")) if i >= 0), default=None)
        hosts, rest = remainder[:end], remainder[end:] if end is not None else ""
        return cls(scheme.lower(), user, password, hosts, rest)

    def check(self) -> DbUrl:
        """Itself, if it names PostgreSQL through psycopg; BadUrl otherwise."""
        if not self.scheme.startswith("postgresql"):
            raise BadUrl(f"must be a PostgreSQL URL, not {self.scheme!r}")
        if self.scheme not in SCHEMES:
            raise BadUrl("use the psycopg driver: postgresql+psycopg://...")
        return self

    def params(self) -> dict[str, str]:
        """The query parameters (``?sslmode=...&target_session_attrs=...``)."""
        return dict(parse_qsl(self.rest.partition("?")[2]))

    def with_params(self, params: dict[str, str]) -> DbUrl:
        """The URL with ``params`` added to its query (percent-encoded)."""
        if not params:
            return self
        joiner = "&" if "?" in self.rest else "?"
        # quote, not urlencode's quote_plus: libpq reads a "+" as itself, not a space.
        return replace(self, rest=f"{self.rest}{joiner}{urlencode(params, quote_via=quote)}")

    def secret_params(self) -> tuple[str, ...]:
        """The names of the query parameters that hold a secret (``?password=...``)."""
        return tuple(key for key, _ in _query_pairs(self.rest) if key in SECRET_PARAMS)

    def render(self, scheme: str | None = None, mask: bool = False) -> str:
        """The URL (the passwords quoted, the query's too); with ``mask``, every secret
        as ``***``."""
        userinfo = ""
        if self.user is not None or self.password is not None:
            userinfo = _quoted(self.user or "")
            if self.password is not None:
                userinfo += ":" + (MASK if mask else _quoted(self.password))
            userinfo += "@"
        rest = _masked_query(self.rest) if mask else _quoted_secrets(self.rest)
        return f"{scheme or self.scheme}://{userinfo}{self.hosts}{rest}"


def _query_pairs(text: str) -> list[tuple[str, str]]:
    """(name, raw piece) of each ``&``-separated parameter of the query in ``text``;
    the name decoded and in lower case."""
    query = text.partition("?")[2]
    return [(unquote_plus(p.partition("=")[0]).strip().lower(), p) for p in query.split("&")]


def _masked_query(text: str) -> str:
    """``text`` with the value of each secret query parameter replaced by ``***``."""
    before, question, _ = text.partition("?")
    if not question:
        return text
    shown = []
    for key, piece in _query_pairs(text):
        name, equals, _ = piece.partition("=")
        shown.append(f"{name}={MASK}" if key in SECRET_PARAMS and equals else piece)
    return before + question + "&".join(shown)


def _quoted_secrets(text: str) -> str:
    """``text`` with the value of each secret query parameter percent-encoded whole,
    as the user information's password is: a ``%`` not starting an escape is itself.
    libpq would otherwise refuse the URL with an error quoting the value, password
    and all (``invalid percent-encoded token: "..."``)."""
    before, question, _ = text.partition("?")
    if not question:
        return text
    pieces = []
    for key, piece in _query_pairs(text):
        name, equals, value = piece.partition("=")
        secret = key in SECRET_PARAMS and equals
        pieces.append(f"{name}={quote(unquote_to_bytes(value), safe='')}" if secret else piece)
    return before + question + "&".join(pieces)


def _quoted(text: str) -> str:
    return quote(text, safe="")


def mask(text: str) -> str:
    """The URL with any password replaced by ``***`` (for logs and errors): the one
    in the user information and those of the query (``?password=...&sslpassword=...``)."""
    try:
        return DbUrl.parse(text).render(mask=True)
    except BadUrl:
        return _masked_query(text.split("@")[-1] if "@" in text else text)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, without brackets) is loopback: 127.0.0.0/8,
    ::1 (and IPv4-mapped 127.x), ``localhost``. Any other name is not, whatever it
    resolves to now: it is not resolved (slow, may fail, may change later)."""
    name = host.rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:  # a name
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def has_password(text: str) -> bool:
    """Whether the URL holds a password: in its user information, or as a query
    parameter (``?password=...``, ``?sslpassword=...``)."""
    try:
        url = DbUrl.parse(text)
    except BadUrl:
        return False
    return url.password is not None or bool(url.secret_params())
