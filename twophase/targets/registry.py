"""Kinds of target found through the ``twophase.targets`` entry-point group.

A package adds a kind by naming its [`TargetKind`][twophase.targets.contract.TargetKind]
in its metadata::

    [project.entry-points."twophase.targets"]
    mystore = "mystore.twophase:KIND"

twophase's own kinds (``influxdb``, ``postgresql``) are registered the same way, and
are also known without the package's metadata (run from a source tree). A target's
kind is ``target_kind`` when it names one, else the kind whose ``schemes`` hold its
URL's scheme. A kind that fails to load is logged and left out: it breaks only the
targets that need it, which then fail naming ``target_kind``.
"""

from __future__ import annotations

import functools
import logging
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from twophase.config import env_name
from twophase.errors import ConfigError
from twophase.targets.contract import Readback, TargetKind, TargetWriter

if TYPE_CHECKING:
    from twophase.config import TargetConfig

__all__ = ["ENTRY_POINT_GROUP", "kind_of", "kinds", "make_readback", "make_writer"]

log = logging.getLogger("twophase.targets")

ENTRY_POINT_GROUP = "twophase.targets"
AUTO = "auto"  # target_kind: told by the URL's scheme
_BUILT_IN = {
    "influxdb": "twophase.influx.influxdb_kind:KIND",
    "postgresql": "twophase.postgresql.postgresql_kind:KIND",
}


@functools.cache
def kinds() -> dict[str, TargetKind]:
    """Every kind that loads, by name: the built-in ones, then the entry points (an
    installed package's kind of the same name replaces a built-in one)."""
    points = {name: EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in _BUILT_IN.items()}
    points |= {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}
    found = {}
    for name, point in points.items():
        kind = _load(point)
        if kind is not None:
            found[name] = kind
    return found


def _load(point: EntryPoint) -> TargetKind | None:
    try:
        kind = point.load()
    except Exception as exc:  # a broken plugin must not stop the kinds that work
        log.warning("kind of target %r (%s) did not load: %s", point.name, point.value, exc)
        return None
    if not isinstance(kind, TargetKind):
        log.warning("kind of target %r (%s) is not a TargetKind", point.name, point.value)
        return None
    return kind


def kind_of(config: TargetConfig) -> TargetKind:
    """The target's kind: ``target_kind``, or the one its URL's scheme tells. A
    ConfigError naming ``target_kind`` when none fits."""
    known = kinds()
    chosen = getattr(config, "kind", AUTO)
    if chosen != AUTO:
        if chosen not in known:
            raise ConfigError(
                env_name("target_kind"),
                f"{chosen!r} is not a kind of target here (installed: {', '.join(sorted(known))})",
            )
        return known[chosen]
    scheme = urlsplit(config.url).scheme.lower()
    for kind in known.values():
        if scheme in kind.schemes:
            return kind
    schemes = sorted(s for k in known.values() for s in k.schemes)
    raise ConfigError(
        env_name("target_kind"),
        f"no kind of target takes {scheme}:// URLs (known schemes: {', '.join(schemes)}); "
        "name the kind, or install the package that adds it",
    )


def make_writer(config: TargetConfig) -> TargetWriter:
    """A writer for the target, of its kind, its settings checked first."""
    kind = kind_of(config)
    kind.check(config)
    return kind.writer(config)


def make_readback(config: TargetConfig) -> Readback:
    """How verify reads the target back, of its kind."""
    kind = kind_of(config)
    kind.check(config)
    return kind.readback(config)
