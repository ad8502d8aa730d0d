"""Named crash points, so tests can SIGKILL a real process at an exact protocol step.

Set ``TWOPHASE_CRASH_AT=<name>`` (or ``<name>:<n>`` to crash on the n-th time the
point is reached) in a process's environment and that process kills itself
with SIGKILL when it gets there: no cleanup, no ``finally``, no atexit, just
like a power cut or an OOM kill. Unset, a crash point costs one dict lookup.

Points: ``stage_rows`` (mid-COPY), ``after_stage``, ``after_decide``,
``promote_batch`` (after each acknowledged InfluxDB batch), ``after_promote``
(all batches acknowledged, epoch not yet marked), ``after_mark``.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "TWOPHASE_CRASH_AT"
_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILL this process if ``TWOPHASE_CRASH_AT`` names this point (and count)."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    target, _, count = spec.partition(":")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
