"""A job's chain of runs for the crash tests with real Spark: one sink's job, restarted
across crashes, the input it was given remembered; a crash point armed while the job is
idle, fired by new input, the job restarted and exact again; and the crash points a Spark
job reaches (``ON_INPUT``, ``AT_RESTART``)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from tests.e2e.harness import (
    KILL_TIMEOUT_S,
    MALFORMED,
    SINK,
    SINKS,
    Job,
    Target,
    arm,
    assert_exact,
    disarm,
    epochs,
    feed,
    fired,
    orphan_writes,
    start_job,
    wait_exact,
    wait_idle,
)

FILES_PER_STEP = 3  # input files that fire an armed point and keep its epoch busy


class Chain:
    """One sink's job, restarted across crashes; remembers what input it was given.
    ``extra_args``: the job's own arguments at every start."""

    extra_args: tuple[str, ...] = ()

    def __init__(self, target: Target, work: Path, event_files: list[Path], **env: str) -> None:
        self.target = target
        self.work = work
        self.pending = list(event_files)
        self.fed: list[Path] = []
        self.plan = work / "crash-plan.json"
        self.env = env  # settings of every start of the job
        self.job = self.start()

    def start(self, checkpoint: str = "checkpoint") -> Job:
        return start_job(
            self.target,
            self.work / "input",
            self.work / checkpoint,
            SINK,
            self.work / "logs",
            available_now=False,
            max_files=2,
            crash_plan=self.plan,
            extra_args=self.extra_args,
            **self.env,
        )

    def feed(self, count: int) -> None:
        new, self.pending = self.pending[:count], self.pending[count:]
        self.fed += new
        feed(self.work / "input", new)

    def wait_exact(self) -> None:
        wait_exact(self.job, self.target, self.fed, MALFORMED)

    def assert_exact(self) -> None:
        """Exact now, read once (the job idle, every epoch COMMITTED)."""
        wait_idle(self.job, self.target.staging_url, SINK)
        assert_exact(self.target, self.fed, MALFORMED)

    def epochs(self) -> dict[str, list[dict[str, Any]]]:
        return {sink: epochs(self.target.staging_url, sink) for sink in SINKS}


def crash_and_recover(chain: Chain, point: str) -> None:
    """Arm ``point``, feed input, see the whole job die there, restart, check exactness."""
    # Armed while idle, the point fires in the next data epoch, not in the empty
    # batch Spark runs after each data batch to advance the watermark.
    wait_idle(chain.job, chain.target.staging_url, SINK)
    orphans_before = orphan_writes(chain.target.staging_url)
    arm(chain.plan, f"{point}:1", "session")
    chain.feed(FILES_PER_STEP)
    code = chain.job.wait(KILL_TIMEOUT_S)
    assert code == -signal.SIGKILL, (point, chain.job.tail())
    assert fired(chain.plan).exists()
    at_crash = chain.epochs()
    in_flight = [
        (s, e["epoch"]) for s in SINKS for e in at_crash[s] if e["state"] == "PRECOMMITTED"
    ]
    if point in ("after_decide", "promote_batch", "after_promote"):
        assert in_flight, (point, at_crash)  # decided, not (fully) promoted
        assert all(
            e["points"] > 0
            for s, ep in in_flight
            if s == SINK
            for e in at_crash[s]
            if e["epoch"] == ep
        ), (point, at_crash)  # a data epoch, not an empty watermark batch
    if point == "after_stage":
        assert orphan_writes(chain.target.staging_url) > orphans_before  # staged, never voted on

    disarm(chain.plan)
    chain.job = chain.start()
    chain.wait_exact()
    # InfluxDB can be exact before the restarted job has re-run the epochs in flight:
    # a kill at promote_batch after an epoch's only request, or on the malformed sink,
    # whose dead letters are recorded when staged. Their replay comes next.
    chain.job.wait_for(
        "the epochs in flight at the crash to be re-run",
        lambda: all(
            e["state"] == "COMMITTED"
            for s, ep in in_flight
            for e in chain.epochs()[s]
            if e["epoch"] == ep
        ),
    )
    chain.assert_exact()  # still exact once they ran again
    after = chain.epochs()
    for sink, epoch in in_flight:  # recovered from its original writes, the re-run detected
        done = next(e for e in after[sink] if e["epoch"] == epoch)
        assert done["state"] == "COMMITTED" and done["replays"] >= 1, (point, done)
    if point != "after_stage":  # Spark re-ran the epoch it had not logged: a replay
        assert sum(e["replays"] for s in SINKS for e in after[s]) > sum(
            e["replays"] for s in SINKS for e in at_crash[s]
        ), (point, after)
    if point == "promote_batch":
        assert any(e["promote_attempts"] >= 2 for s in SINKS for e in after[s])


# Every crash point a Spark job reaches: a point fired by new input, or -- ``restart`` --
# by the restart that follows a kill at the first point (its claim, its recovery, its
# replay's discard). Not reached here:
# ``before_dead_letters`` (the stats are never refused: the integration matrix kills
# there), and the operators' ``in_reset``, ``in_requeue`` and ``in_remove`` (the CLI's
# tests do).
ON_INPUT = (
    "stage_rows",
    "in_stage",
    "after_stage",
    "in_decide",
    "after_decide",
    "promote_batch",
    "after_promote",
    "in_mark",
    "after_mark",
    "before_split_decide",
    "in_gc",
)
AT_RESTART = (
    ("after_decide", "in_begin_run"),
    ("after_decide", "after_begin_run"),
    ("after_decide", "in_plan"),
    ("after_decide", "in_discard"),  # recovered at the claim, the replay's writes discarded
)


def kill_on_input(chain: Chain, point: str) -> None:
    """Armed while idle, ``point`` kills the job's session in the next data epoch (one
    file; three for the automatic GC, due a second after a commit)."""
    wait_idle(chain.job, chain.target.staging_url, SINK)
    arm(chain.plan, f"{point}:1", "session")
    chain.feed(3 if point == "in_gc" else 1)
    assert chain.job.wait(KILL_TIMEOUT_S) == -signal.SIGKILL, (point, chain.job.tail())


def restart_exact(chain: Chain) -> None:
    disarm(chain.plan)
    chain.job = chain.start()
    chain.wait_exact()


def kill_at_every_point(chain: Chain, on_input: tuple[str, ...] = ON_INPUT) -> None:
    """Kill the job at each of ``on_input`` in turn, then at each of ``AT_RESTART``'s
    second points during the restart after a kill at its first, the job exact again
    after each restart."""
    for point in on_input:
        kill_on_input(chain, point)
        restart_exact(chain)
    for first, then in AT_RESTART:
        kill_on_input(chain, first)
        arm(chain.plan, f"{then}:1", "session")
        chain.job = chain.start()
        assert chain.job.wait(KILL_TIMEOUT_S) == -signal.SIGKILL, (then, chain.job.tail())
        restart_exact(chain)
    chain.assert_exact()  # the last kill's epochs ran again: still exact
