"""How an operation talks to whoever runs it, and the live-run guard they share."""

from __future__ import annotations

import getpass
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from twophase.errors import RefusedError
from twophase.store.views import LIVE_WINDOW_S, Views
from twophase.wording import age

__all__ = ["LIVE_WINDOW_S", "Guard", "Hooks", "Progress", "actor", "refuse_if_live"]


@dataclass(frozen=True)
class Progress:
    """How far a step of an operation got: ``done`` of ``total`` ``unit`` (cumulative)."""

    label: str
    unit: str
    done: int
    total: int
    note: str = ""


def _nothing(_: object) -> None:
    return None


@dataclass(frozen=True)
class Hooks:
    """The caller's side of an operation. The defaults are silent and ask nothing.

    ``confirm`` is called with a question before a destructive step; it
    raises (``RefusedError``) to decline.
    """

    progress: Callable[[Progress], None] = _nothing
    warn: Callable[[str], None] = _nothing
    confirm: Callable[[str], None] = _nothing


@dataclass(frozen=True)
class Guard:
    """Whether to act on a sink a live query owns (it would be fenced or raced).

    A run that updated its sink within ``live_window_s`` counts as live;
    ``force`` acts anyway (with a warning).
    """

    live_window_s: float = LIVE_WINDOW_S
    force: bool = False


SILENT = Hooks()  # the defaults of every operation: no progress, no warnings, no questions
UNFORCED = Guard()


def refuse_if_live(
    views: Views, sinks: Sequence[str], action: str, guard: Guard, hooks: Hooks
) -> None:
    """RefusedError naming the owner when a live run owns one of ``sinks``, unless forced."""
    for sink in sinks:
        owner = views.live_owner(sink, guard.live_window_s)
        if owner is None:
            continue
        run_id, active_at = owner
        idle = max(0.0, (datetime.now(timezone.utc) - active_at).total_seconds())
        what = (
            f"sink {sink!r} is owned by run {run_id}, active {age(idle)} ago "
            f"(within --live-window {age(guard.live_window_s)})"
        )
        if not guard.force:
            raise RefusedError(
                f"{what}: {action} would fence or race it; stop its query first, or pass --force"
            )
        hooks.warn(f"{what}; going ahead because of --force")


def actor() -> str:
    """Who acts, for the epochs' history: ``cli:<user>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name in a bare container
        return "cli:unknown"
