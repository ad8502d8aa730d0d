"""What the conformance checks build on, without pytest: the points they write, what a
target holds read back in one comparable form, a scratch staging store, and a target's
configuration pointed at a port nothing listens on.

Points are written with times a millisecond apart and recent (the coarsest store that
takes line protocol keeps milliseconds, and some drop old points), with float fields:
every store keeps a float as it was sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from twophase.config import TargetConfig, load_staging_config
from twophase.operations.migrate import upgrade_schema
from twophase.points.lineproto import parse_line
from twophase.targets import Readback

__all__ = [
    "Case",
    "Held",
    "closed_port",
    "difference",
    "expected",
    "held",
    "normalized",
    "scratch_staging",
    "unreachable",
]

_MS = 1_000_000
# (time ns, sorted tags, sorted fields): a point as the checks compare it
Held = tuple[int, tuple[tuple[str, str], ...], tuple[tuple[str, Any], ...]]


@dataclass(frozen=True)
class Case:
    """One check's names and points: a sink and a measurement of its own, and times from
    ``base_ns`` (a whole second, ten minutes ago)."""

    sink: str
    measurement: str
    base_ns: int

    @classmethod
    def new(cls) -> Case:
        tag = uuid.uuid4().hex[:10]
        base_s = int(time.time()) - 600
        return cls(f"conformance-{tag}", f"conformance_{tag}", base_s * 1_000_000_000)

    def lines(self, epoch: int, count: int, host: str = "a") -> list[str]:
        """``count`` points of epoch ``epoch``, distinct from every other epoch's."""
        start = self.base_ns + (epoch + 1) * 1000 * _MS
        return [
            f"{self.measurement},host={host},n={i % 3} v={epoch * 1000 + i + 0.5} {start + i * _MS}"
            for i in range(count)
        ]

    def last(self, epoch: int) -> str:
        """The one point every epoch writes, with its number: the later epoch's value
        is the one a target that got the epochs in order holds."""
        return f"{self.measurement},host=last v={float(epoch)} {self.base_ns}"

    @property
    def window(self) -> tuple[int, int]:
        """Times (inclusive, ns) that hold every point of the case."""
        return self.base_ns - 1000 * _MS, self.base_ns + 600 * 1000 * _MS


def _value(value: Any) -> Any:
    """Numbers compared as floats: a store may give ``2`` for ``2.0``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return float(value)


def normalized(series: Iterable[dict[str, Any]]) -> list[Held]:
    """Read-back series as sorted points; empty tags and null fields left out (a
    ``Readback`` may give them or not). A point held twice is listed twice."""
    found: list[Held] = []
    for each in series:
        tags = tuple(sorted((k, v) for k, v in (each.get("tags") or {}).items() if v))
        names = each["columns"][1:]
        for row in each.get("values") or []:
            fields = tuple(
                sorted((n, _value(v)) for n, v in zip(names, row[1:], strict=True) if v is not None)
            )
            found.append((int(row[0]), tags, fields))
    return sorted(found, key=repr)


def expected(lines: Sequence[str]) -> list[Held]:
    """What a store holds once it took ``lines`` in their order, each point once: a
    point written again overwrites the fields it carries."""
    points: dict[tuple[int, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
    for line in lines:
        point = parse_line(line)
        assert point.time_ns is not None, line
        key = (point.time_ns, tuple(sorted((k, v) for k, v in point.tags if v)))
        points.setdefault(key, {}).update({k: _value(v) for k, v in point.fields.items()})
    return sorted(
        ((when, tags, tuple(sorted(fields.items()))) for (when, tags), fields in points.items()),
        key=repr,
    )


def difference(got: list[Held], want: list[Held]) -> str:
    """What a target holds that it should not, and what it lacks, for a person."""
    extra, missing = Counter(got) - Counter(want), Counter(want) - Counter(got)
    twice = [p for p, n in Counter(got).items() if n > 1]
    lines = [f"the target holds {len(got)} point(s), {len(want)} expected"]
    lines += [f"  held more than once: {p}" for p in twice[:5]]
    lines += [f"  not expected: {p}" for p in list(extra)[:5]]
    lines += [f"  missing: {p}" for p in list(missing)[:5]]
    return "\n".join(lines)


def held(readback: Readback, case: Case) -> list[Held]:
    """What the target holds of the case's measurement, read back; the read-back closed."""
    try:
        return normalized(readback.window(case.measurement, *case.window))
    finally:
        readback.close()


def closed_port() -> int:
    """A loopback port nothing listens on (taken from the system, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def unreachable(config: TargetConfig) -> TargetConfig:
    """The target's configuration with its URL's host and port made a loopback port
    nothing listens on (user, path and query kept), given up on within a second."""
    parts = urlsplit(config.url)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@" if user else ""
    url = urlunsplit(parts._replace(netloc=f"{netloc}127.0.0.1:{closed_port()}"))
    return dataclasses.replace(
        config, url=url, timeout_s=2, retry_deadline_s=1, retry_initial_s=0.05, retry_max_s=0.2
    )


@contextlib.contextmanager
def scratch_staging(base_url: str) -> Iterator[str]:
    """A staging store of its own beside ``base_url``'s database (same server and
    role, which may create databases), migrated to the head; dropped afterwards."""
    name = f"twophase_conformance_{uuid.uuid4().hex[:10]}"
    admin = load_staging_config(env={}, staging_url=base_url).psycopg_conninfo()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(base_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade_schema(load_staging_config(env={}, staging_url=url))
        yield url
    finally:
        _drop(admin, name)


def _drop(admin: str, name: str, attempts: int = 20) -> None:
    """DROP DATABASE ... WITH (FORCE); an autovacuum worker in it (a superuser's process
    the role may not end) refuses it for a moment: tried again."""
    statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    for attempt in range(attempts):
        try:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(statement)
            return
        except psycopg.errors.InsufficientPrivilege:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)
