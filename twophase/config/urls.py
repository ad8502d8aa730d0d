"""PostgreSQL URLs as users write them: checked, shown without the password, handed to psycopg.

``postgresql[+psycopg]://[user[:password]@][host[:port][,host[:port]...]]/db[?params]``:
the form SQLAlchemy's ``make_url`` and libpq both accept, several hosts
included (libpq tries them in turn, e.g. with
``target_session_attrs=read-write``). Parsed here with the standard library,
because every executor's Python worker reads the staging URL and importing
SQLAlchemy for it cost each worker 0.1 s (measured with ``-X importtime``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from urllib.parse import parse_qsl, unquote, urlencode

SCHEMES = ("postgresql", "postgresql+psycopg")


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
        location, slash, path = remainder.partition("/")
        userinfo, at, hosts = location.rpartition("@")
        user = password = None
        if at:
            name, colon, secret = userinfo.partition(":")
            user, password = unquote(name) or None, unquote(secret) if colon else None
        return cls(scheme.lower(), user, password, hosts, slash + path)

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
        return replace(self, rest=f"{self.rest}{joiner}{urlencode(params)}")

    def render(self, scheme: str | None = None, mask: bool = False) -> str:
        userinfo = ""
        if self.user is not None or self.password is not None:
            userinfo = _quoted(self.user or "")
            if self.password is not None:
                userinfo += ":" + ("***" if mask else _quoted(self.password))
            userinfo += "@"
        return f"{scheme or self.scheme}://{userinfo}{self.hosts}{self.rest}"


def _quoted(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def mask(text: str) -> str:
    """The URL with any password replaced by ``***`` (for logs and errors)."""
    try:
        return DbUrl.parse(text).render(mask=True)
    except BadUrl:
        return text.split("@")[-1] if "@" in text else text


def has_password(text: str) -> bool:
    try:
        return DbUrl.parse(text).password is not None
    except BadUrl:
        return False
