"""The exactly-once demo: run the session-metrics job, kill its driver, restart, check.

::

    scripts/dev.sh demo                 # sets everything up, then runs this
    python jobs/demo.py [--files 24] [--events-per-file 400] [--kill-at after_decide:3] \
        [--master 'local[*,4]'] [--log-format text|json]

1. Generates seeded session events (with malformed lines) into a fresh input
   directory, and a fresh sink id and InfluxDB database for this run.
2. Runs ``jobs/session_metrics.py`` with ``--available-now`` and a crash point
   armed: the whole driver (Python, JVM, workers) is SIGKILLed while an epoch is
   PRECOMMITTED but not yet promoted.
3. Restarts the job from its checkpoint until the input is consumed.
4. Prints the aggregates computed from the input files without Spark beside
   what InfluxDB holds, the row counts, mismatches (must be zero), replays
   detected and skipped, and the dead-lettered malformed lines.

Exit status 0 when InfluxDB is exact, 1 on any mismatch or failure. The
staging database and InfluxDB come from the ``TWOPHASE_*`` variables. Each run of
the job appends its output to ``job.log`` in the work directory, with twophase's log
lines (commits, replays detected, recoveries) in the ``--log-format`` form.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jobs.generate_events import Expected, event_files, expected, generate  # noqa: E402
from jobs.session_metrics import DEFAULT_MASTER  # noqa: E402
from twophase import logs  # noqa: E402
from twophase.config import load_config  # noqa: E402
from twophase.errors import ConfigError  # noqa: E402
from twophase.influx.query import query_v1  # noqa: E402

STATS_QUERY = 'SELECT * FROM "stream_stats" GROUP BY *'  # InfluxQL, a constant
FIELDS = ("events", "bytes_p2p", "bytes_cdn")
Key = tuple[int, str, str]


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def run_job(
    args: argparse.Namespace, work: Path, sink: str, env: dict[str, str], crash: str | None
) -> int:
    """One run of the job in a session of its own; SIGKILL leftovers of a killed run."""
    run_env = dict(env)
    if crash:
        run_env.update(TWOPHASE_CRASH_AT=crash, TWOPHASE_CRASH_SCOPE="session")
    cmd = [
        sys.executable,
        str(REPO / "jobs" / "session_metrics.py"),
        "--input",
        str(work / "input"),
        "--checkpoint",
        str(work / "checkpoint"),
        "--sink-id",
        sink,
        "--available-now",
        "--max-files-per-trigger",
        str(args.files_per_batch),
        "--master",
        args.master,
        "--conf",
        "spark.ui.enabled=false",
        "--log-format",
        args.log_format,
    ]
    with (work / "job.log").open("ab") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=run_env, stdout=log, stderr=log, start_new_session=True
        )
        code = proc.wait()
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # a killed driver's JVM and workers, if any left
    return code


def influx_stats(url: str, database: str) -> dict[Key, dict[str, Any]]:
    stats: dict[Key, dict[str, Any]] = {}
    for series in query_v1(url, database, STATS_QUERY):
        tags = series["tags"]
        columns = series["columns"]
        for values in series["values"]:
            point = dict(zip(columns, values, strict=True))
            key = (point.pop("time") // 1_000_000_000, tags["stream_id"], tags["isp"])
            stats[key] = point
    return stats


def mismatches(want: Expected, got: dict[Key, dict[str, Any]]) -> list[str]:
    problems = [f"missing in InfluxDB: {k}" for k in sorted(set(want.stats) - set(got))]
    problems += [f"not expected: {k} {got[k]}" for k in sorted(set(got) - set(want.stats))]
    for key in sorted(set(want.stats) & set(got)):
        for name in FIELDS:
            if got[key].get(name) != getattr(want.stats[key], name):
                problems.append(
                    f"{key} {name}: InfluxDB {got[key].get(name)}, "
                    f"expected {getattr(want.stats[key], name)}"
                )
    return problems


def staging_facts(conninfo: str, sink: str) -> dict[str, Any]:
    with psycopg.connect(conninfo) as conn:
        replays = conn.execute(
            "SELECT COALESCE(sum(replays_detected), 0) FROM twophase_sinks WHERE sink_id = ANY(%s)",
            ([sink, sink + ".malformed"],),
        ).fetchone()
        epochs = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'COMMITTED'),"
            " count(*) FILTER (WHERE state = 'PRECOMMITTED') FROM twophase_epochs"
            " WHERE sink_id = %s",
            (sink,),
        ).fetchone()
        dead = conn.execute(
            "SELECT count(*) FROM twophase_dead_letters d JOIN twophase_epochs e"
            " ON e.sink_id = d.sink_id AND e.epoch = d.epoch AND d.write_id = ANY(e.write_ids)"
            " WHERE d.sink_id = %s",
            (sink + ".malformed",),
        ).fetchone()
    assert replays and epochs and dead
    return {
        "replays": int(replays[0]),
        "committed": epochs[0],
        "precommitted": epochs[1],
        "dead": dead[0],
    }


def precommitted(conninfo: str, sink: str) -> list[int]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT epoch FROM twophase_epochs WHERE sink_id = %s AND"
            " state = 'PRECOMMITTED' ORDER BY epoch",
            (sink,),
        ).fetchall()
    return [r[0] for r in rows]


def print_table(want: Expected, got: dict[Key, dict[str, Any]], limit: int) -> None:
    head = f"{'window end (UTC)':<20} {'stream':<6} {'isp':<8} " + " ".join(
        f"{f + ' exp':>13} {f + ' influx':>16}" for f in FIELDS
    )
    print(head)
    for key in sorted(want.stats)[:limit]:
        end = time.strftime("%Y-%m-%d %H:%M", time.gmtime(key[0]))
        cells = " ".join(
            f"{getattr(want.stats[key], f):>13} {got.get(key, {}).get(f, '-')!s:>16}"
            for f in FIELDS
        )
        print(f"{end:<20} {key[1]:<6} {key[2]:<8} {cells}")
    if len(want.stats) > limit:
        print(f"... {len(want.stats) - limit} more rows (all compared)")


def main() -> int:
    ap = argparse.ArgumentParser(prog="demo", description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=24)
    ap.add_argument("--events-per-file", type=int, default=400)
    ap.add_argument("--files-per-batch", type=int, default=2)
    ap.add_argument(
        "--kill-at",
        default="after_decide:3",
        help="crash point (and hit) at which the first run's driver is killed",
    )
    ap.add_argument("--workdir", type=Path, default=REPO / ".local" / "demo")
    ap.add_argument("--max-restarts", type=int, default=5)
    ap.add_argument(
        "--master",
        default=DEFAULT_MASTER,
        help=f"Spark master of the job (default {DEFAULT_MASTER}: a failed task is tried up "
        "to 4 times; with local[N] one failed task fails the run)",
    )
    ap.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=logs.TEXT,
        help="twophase's log lines (the demo's on stderr, the job's in job.log): text or JSON",
    )
    args = ap.parse_args()
    try:
        logs.configure(args.log_format)
    except ConfigError as exc:  # json without python-json-logger: the message says what to install
        say(f"error: {exc}")
        return 1

    config = load_config()
    stamp = time.strftime("%Y%m%dT%H%M%S")
    sink, database = f"demo-{stamp}", f"demo_{stamp}"
    work = args.workdir / stamp
    shutil.rmtree(work, ignore_errors=True)
    (work / "events").mkdir(parents=True)
    generate(work / "events", files=args.files, events_per_file=args.events_per_file)
    shutil.copytree(work / "events", work / "input")
    query_v1(config.target.url, None, f'CREATE DATABASE "{database}"', method="POST")
    env = {
        **os.environ,
        "TWOPHASE_INFLUX_DB": database,
        "TWOPHASE_INFLUX_API": "v1",
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
    }
    conninfo = config.staging.psycopg_conninfo()
    say(f"sink {sink}, InfluxDB database {database}, work dir {work} (log: job.log)")

    code = run_job(args, work, sink, env, crash=args.kill_at)
    if code != -signal.SIGKILL:
        say(f"the armed crash point {args.kill_at} was not reached (exit {code})")
        return 1
    say(
        f"driver SIGKILLed at {args.kill_at}; PRECOMMITTED epochs left: "
        f"{precommitted(conninfo, sink) or 'none'}"
    )
    for attempt in range(1, args.max_restarts + 1):
        say(f"restart {attempt} from the checkpoint")
        code = run_job(args, work, sink, env, crash=None)
        if code == 0:
            break
    else:
        say(f"the job did not finish after {args.max_restarts} restarts (exit {code})")
        return 1

    want = expected(event_files(work / "events"))
    got = influx_stats(config.target.url, database)
    problems = mismatches(want, got)
    facts = staging_facts(conninfo, sink)
    print()
    print_table(want, got, limit=12)
    print()
    summary = [
        ("rows expected (window, stream, isp)", len(want.stats)),
        ("points in InfluxDB", len(got)),
        ("mismatches", len(problems)),
        ("epochs committed", facts["committed"]),
        ("epochs left PRECOMMITTED", facts["precommitted"]),
        ("replays detected and skipped", facts["replays"]),
        ("malformed lines in the input", want.malformed),
        ("malformed lines dead-lettered", facts["dead"]),
    ]
    for label, value in summary:
        print(f"{label:<38} {value:>8}")
    for problem in problems[:20]:
        print("MISMATCH", problem)
    exact = not problems and facts["dead"] == want.malformed and facts["precommitted"] == 0
    print("\nRESULT:", "exactly once" if exact else "NOT EXACT")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
