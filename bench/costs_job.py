"""``bench.costs``'s pipeline: CSV files in, one InfluxDB point per row, three sinks.

::

    python -m bench.costs_job --input DIR --checkpoint DIR [--max-files-per-trigger N]
        [--available-now] [--master local[2,4]] --sink plain|twophase|noop
        [--sink-id ID] [--profile FILE]

The pipeline of the project's README, on CSV: Spark's CSV source with a
header and a schema (``time`` in milliseconds, tags ``host`` and ``region``,
fields ``cpu``, ``mem``, ``requests``), every row one point of ``host_stats``.

* ``--sink twophase``: ``twophase.spark.foreach_batch_writer`` as the README
  teaches it (measurement, tags, time column, precision; every other column a
  field), ``end_query`` after the query.
* ``--sink plain``: the ``foreachBatch`` a user writes without twophase, on its
  own: ``foreachPartition`` formats each row with an f-string and POSTs 5,000
  lines a request with urllib3 (at-least-once). It adds up, in accumulators,
  the seconds its partitions spent and the seconds of their POSTs (the rest is
  Spark handing rows to Python and the formatting): ``STAGES`` at the end.
* ``--sink noop``: the same read, written to Spark's ``noop`` format: what the
  pipeline costs without a writer, the base both writers' CPU is counted from.

At the end, before Spark stops, it prints ``CPU`` with the CPU seconds of the
driver (this process), the JVM and the Python workers (the JVM's Python
descendants, with the workers they reaped). ``--profile FILE`` runs every
``foreachBatch`` call under ``cProfile`` (on the thread Spark calls it on) and
writes the stats there. Prints ``STARTED``, one ``PROGRESS`` line per
micro-batch and ``DONE``, like the other bench jobs.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.spark_plain import emit, end_job, parser, report_progress, session
from bench.spark_plain import start as start_query

QUERY = "costs"
MEASUREMENT = "host_stats"
TAGS = ("host", "region")
FIELDS = ("cpu", "mem", "requests")
TIME = "time"
SCHEMA = "time BIGINT, host STRING, region STRING, cpu DOUBLE, mem BIGINT, requests BIGINT"
COLUMNS = ("time", "host", "region", "cpu", "mem", "requests")
PER_REQUEST = 5000
PLAIN, TWOPHASE, NOOP = "plain", "twophase", "noop"
_TICKS = os.sysconf("SC_CLK_TCK")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = parser("python -m bench.costs_job")
    ap.add_argument("--sink", choices=(PLAIN, TWOPHASE, NOOP), default=PLAIN)
    ap.add_argument("--profile", type=Path, default=None, help="cProfile of foreachBatch")
    return ap.parse_args(argv)


def rows(spark: Any, args: argparse.Namespace) -> Any:
    reader = spark.readStream.schema(SCHEMA).option("header", "true")
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
    return reader.csv(args.input)


# -- the plain writer: what a user writes ------------------------------------------------


def plain_sink(spark: Any) -> tuple[Callable[[Any, int], None], Callable[[], dict[str, Any]]]:
    """The plain ``foreachBatch`` function, and what its accumulators add up to."""
    url, db = os.environ["TWOPHASE_TARGET_URL"], os.environ["TWOPHASE_INFLUX_DB"]
    target = f"{url}/write?db={db}&precision=ms"
    spent, posting = spark.sparkContext.accumulator(0.0), spark.sparkContext.accumulator(0.0)

    def write(partition: Iterable[Any]) -> None:
        import urllib3

        began, posted = time.perf_counter(), 0.0
        http = urllib3.PoolManager()
        lines: list[str] = []
        for r in partition:
            lines.append(
                f"host_stats,host={r.host},region={r.region} "
                f"cpu={r.cpu},mem={r.mem}i,requests={r.requests}i {r.time}"
            )
            if len(lines) == PER_REQUEST:
                posted += _post(http, target, lines)
                lines = []
        if lines:
            posted += _post(http, target, lines)
        spent.add(time.perf_counter() - began)
        posting.add(posted)

    def each_batch(df: Any, batch_id: int) -> None:
        df.foreachPartition(write)

    def stages() -> dict[str, Any]:
        return {"partitions_s": spent.value, "post_s": posting.value}

    return each_batch, stages


def _post(http: Any, target: str, lines: list[str]) -> float:
    began = time.perf_counter()
    answer = http.request("POST", target, body="\n".join(lines).encode())
    if answer.status >= 300:
        raise RuntimeError(f"InfluxDB refused a write ({answer.status}): {answer.data!r}")
    return time.perf_counter() - began


def noop_sink(df: Any, batch_id: int) -> None:
    df.write.format("noop").mode("overwrite").save()


def twophase_sink(sink_id: str) -> Any:
    from twophase.spark import foreach_batch_writer

    return foreach_batch_writer(
        sink_id, measurement=MEASUREMENT, tags=list(TAGS), time=TIME, precision="ms"
    )


# -- measuring ---------------------------------------------------------------------------


class Profiled:
    """``sink`` with every call under one ``cProfile.Profile`` (Spark calls foreachBatch
    functions on a thread of its own, which a profile of the main thread misses)."""

    def __init__(self, sink: Callable[[Any, int], None]) -> None:
        self.sink, self.profile, self._lock = sink, cProfile.Profile(), threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        with self._lock:
            self.profile.enable()
            try:
                self.sink(df, batch_id)
            finally:
                self.profile.disable()


def _stat(pid: int) -> tuple[int, list[str]] | None:
    """(parent pid, the fields after the command name) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            tree.setdefault(stat[0], []).append(int(name))
    return tree


def _below(tree: dict[int, list[int]], pid: int) -> Iterator[int]:
    for child in tree.get(pid, []):
        yield child
        yield from _below(tree, child)


def _cpu(pid: int, reaped: bool) -> float:
    """User + system seconds of a process (with ``reaped``: of its waited-for children)."""
    stat = _stat(pid)
    if stat is None:
        return 0.0
    fields = stat[1]
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICKS


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def process_cpu() -> dict[str, float]:
    """CPU seconds so far of the driver, the JVM and the Python workers."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    tree = _children()
    jvms = [p for p in _below(tree, os.getpid()) if _command(p) == "java"]
    workers = [p for jvm in jvms for p in _below(tree, jvm) if _command(p).startswith("python")]
    return {
        "driver": round(usage.ru_utime + usage.ru_stime, 3),
        "jvm": round(sum(_cpu(p, reaped=False) for p in jvms), 3),
        "workers": round(sum(_cpu(p, reaped=True) for p in workers), 3),
    }


# -- the job ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    writer = twophase_sink(args.sink_id) if args.sink == TWOPHASE else None  # opens meanwhile
    spark = session(args, f"costs-{args.sink}")
    listener = report_progress(spark, started)
    stages: Callable[[], dict[str, Any]] = dict
    sink: Callable[[Any, int], None] = noop_sink
    if writer is not None:
        sink = writer
    elif args.sink == PLAIN:
        sink, stages = plain_sink(spark)
    profiled = Profiled(sink) if args.profile else None
    query = start_query(rows(spark, args).writeStream.foreachBatch(profiled or sink), QUERY, args)

    def records() -> None:
        emit("STAGES", **stages())
        emit("CPU", **process_cpu())
        if profiled is not None:
            profiled.profile.dump_stats(str(args.profile))

    return end_job(spark, query, listener, started, writer, records)


if __name__ == "__main__":
    sys.exit(main())
