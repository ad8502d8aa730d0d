"""Whether the Spark master retries a failed task, and a warning when it does not.

Spark's ``local``, ``local[N]`` and ``local[*]`` masters run each task once: one
failed task fails the query. A task whose staging a dropped PostgreSQL connection cut
after it had read its rows can only be repeated by Spark running the task again, so
on such a master one connection blip ends the query. ``local[N,F]`` gives a task F
attempts; a cluster master gives it ``spark.task.maxFailures`` (4 unless set).
"""

from __future__ import annotations

import logging
import re
import sys
import threading

log = logging.getLogger("twophase.spark")

TASK_ATTEMPTS = 4  # what a cluster master allows by default (spark.task.maxFailures)
# Spark's own forms (SparkContext.createTaskScheduler): local, local[N], local[*],
# local[N,F], local[*,F]. local-cluster[...] and cluster masters are not matched.
_LOCAL = re.compile(r"local(?:\[([0-9]+|\*)(?:\s*,\s*([0-9]+))?\])?")

_checked = threading.Event()
_warning = threading.Lock()


def retrying_master(master: str) -> str | None:
    """The local master to use instead of ``master`` when ``master`` runs each task
    once; None when it retries failed tasks (any cluster master does)."""
    match = _LOCAL.fullmatch(master.strip())
    if match is None:
        return None
    threads, attempts = match.group(1) or "1", match.group(2)
    if attempts is not None and int(attempts) > 1:
        return None
    return f"local[{threads},{TASK_ATTEMPTS}]"


def active_master() -> str | None:
    """``spark.master`` of this process's SparkContext; None when it has none: a Spark
    Connect client or server Python, a Python worker (a data source's commit runs in
    one), or a process without PySpark."""
    if "pyspark" not in sys.modules:  # no Spark here: nothing to ask, nothing to import
        return None
    try:
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        return None if context is None else str(context.master)
    except Exception as exc:  # a Connect-only PySpark, or a context stopping meanwhile
        log.debug("cannot read the Spark master: %s", exc)
        return None


def warn_without_task_retries() -> None:
    """Log one warning per process when this process's Spark master retries no
    failed task; nothing when the master cannot be read here."""
    if _checked.is_set():
        return
    master = active_master()
    if master is None:
        return
    with _warning:
        if _checked.is_set():
            return
        _checked.set()
    better = retrying_master(master)
    if better is not None:
        log.warning(
            "Spark master %s retries no failed task: one failed task (staging past its "
            "deadline, a lost worker) fails the query; use %s",
            master,
            better,
        )
