"""Named crash points, so tests and the demo can SIGKILL real processes at an exact step.

Arm a point in one of two ways:

* ``TWOPHASE_CRASH_AT=<name>[:<n>]`` in a process's environment: the process
  kills itself the n-th time it reaches ``<name>`` (default the first).
* ``TWOPHASE_CRASH_PLAN=<file>``: the point is read from that JSON file at
  every check, ``{"at": "<name>[:<n>]", "scope": "process" | "session",
  "sink": "<sink id>"}``, so a running job can be armed from outside. A plan
  fires once across all processes that read it: the first to fire creates
  ``<file>.fired`` and writes its pid there. With ``"pause_s": <seconds>`` the process does not die:
  it sleeps there that long (after creating the marker), so that a test can
  break a server while a step is under way.

With a sink (``"sink"`` in a plan, ``TWOPHASE_CRASH_SINK`` for the
environment form), only that sink's steps count: a job whose driver commits
two sinks per micro-batch can be killed in either one's protocol. Steps that
serve no one sink (``in_discard``; ``in_gc`` of a collection of every sink)
never count then.

Scope ``process`` (default; ``TWOPHASE_CRASH_SCOPE`` for the environment form)
kills only the process that got there — in Spark, a task failure the
scheduler retries. Scope ``session`` kills every process of the session (a
job started with its own session: Python driver, JVM, Python daemons and
workers) — a power cut of the whole driver, with no ``abort`` and no
shutdown hook. Only use ``session`` for a process started in a session of its
own (``start_new_session=True``): it kills everything in that session.
Unarmed, a crash point costs a few environment lookups.

Points, in protocol order (``in_*``: the step's rows are written, its
transaction not yet committed):

* a run's claim: ``in_begin_run`` (the new fencing token), ``after_begin_run``
  (claimed, nothing older recovered yet);
* staging, in a task: ``stage_rows`` (mid-COPY), ``in_stage`` (the write is
  recorded), ``after_stage``;
* the decision: ``in_decide`` (the vote), ``after_decide``;
* promotion: ``in_plan`` (an attempt counted, for a promotion that did not
  start with its decision: recovery, a retry), ``promote_batch`` (after each
  acknowledged request to a target; also in an operator's resend),
  ``before_dead_letters`` (a request acknowledged with rejections that are not
  yet recorded; only such a request reaches it), ``after_promote`` (all
  requests acknowledged, epoch not yet marked), ``in_deliver`` (several targets:
  one target's delivery of the epoch recorded, not committed; also in the
  catch-up of a lagging target), ``in_mark`` (COMMITTED written), ``after_mark``;
* ``drain`` (background promotion: a caller is about to wait for a handed-off
  epoch, which may still be promoting; never reached with inline promotion);
* ``before_split_decide`` (Spark: the points sink's epoch committed, or handed
  off, the dead-letter sink's epoch of rows split off upstream not yet decided);
* ``in_discard`` (a replay's or Spark's aborted attempt's writes deleted);
* operators and GC: ``in_gc`` (a GC batch deleted: expired points purged or
  orphans removed), ``in_reset``, ``in_requeue`` (a correction decided),
  ``in_remove`` (a target removed from its sink: ``twophase targets remove``).

With background promotion ``after_decide`` is the moment between the decision
and the hand-off to the promoter thread, and the ``promote_*``/``after_*``
points fire in that thread; ``in_gc`` fires in the automatic GC's thread too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

CRASH_ENV = "TWOPHASE_CRASH_AT"
SCOPE_ENV = "TWOPHASE_CRASH_SCOPE"
SINK_ENV = "TWOPHASE_CRASH_SINK"
PLAN_ENV = "TWOPHASE_CRASH_PLAN"
CRASH_POINTS = (
    "in_begin_run",
    "after_begin_run",
    "stage_rows",
    "in_stage",
    "after_stage",
    "in_decide",
    "after_decide",
    "in_plan",
    "promote_batch",
    "before_dead_letters",
    "after_promote",
    "in_deliver",
    "before_target_commit",
    "after_target_commit",
    "in_mark",
    "after_mark",
    "drain",
    "before_split_decide",
    "in_discard",
    "in_gc",
    "in_reset",
    "in_requeue",
    "in_remove",
)
_hits: dict[str, int] = {}


def crash_point(name: str, sink_id: str | None = None) -> None:
    """SIGKILL this process (or its whole session) if a crash point is armed here, in
    the step of sink ``sink_id``."""
    plan = os.environ.get(PLAN_ENV)
    pause_s = None
    if plan:
        at, scope, sink, pause_s = _read_plan(plan)
    else:
        at, scope = os.environ.get(CRASH_ENV), os.environ.get(SCOPE_ENV, "process")
        sink = os.environ.get(SINK_ENV)
    if not at or (sink is not None and sink != sink_id):
        return
    target, _, count = at.partition(":")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] < int(count or 1):
        return
    if plan and not _claim(plan):
        return  # another process fired this plan already
    if pause_s is not None:
        time.sleep(pause_s)
        return
    _kill(scope)


def _read_plan(path: str) -> tuple[str | None, str, str | None, float | None]:
    try:
        plan = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None, "process", None, None  # not armed (yet), or being rewritten
    return plan.get("at"), plan.get("scope", "process"), plan.get("sink"), plan.get("pause_s")


def _claim(plan: str) -> bool:
    """True for the first process to fire this plan (atomic create of the marker). The
    marker holds that process's pid: a test can then find the executor that runs it."""
    try:
        marker = os.open(plan + ".fired", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    try:
        os.write(marker, str(os.getpid()).encode())
    finally:
        os.close(marker)
    return True


def _kill(scope: str) -> None:
    if scope == "session":
        me, session = os.getpid(), os.getsid(0)
        for pid in _session_members(session):
            if pid != me:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _session_members(session: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry)) == session:
                    pids.append(int(entry))
    return pids
