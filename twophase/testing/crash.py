"""The child process of the crash checks: it stages one epoch and commits it, and is
SIGKILLed at the crash point armed in its environment
([`twophase.faults`][twophase.faults]).

    python -m twophase.testing.crash JOB

``JOB`` is a file [`run`][twophase.testing.crash.run] wrote (a pickled
[`CrashJob`][twophase.testing.crash.CrashJob], readable by its owner only, holding the
target's settings): the child reads only the file its parent made for it.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from twophase.config import TwoPhaseConfig
from twophase.faults import CRASH_ENV, SINK_ENV

__all__ = ["CrashJob", "main", "run"]


@dataclass(frozen=True)
class CrashJob:
    """The epoch to stage (one staging call a part) and commit, under a run of its own."""

    config: TwoPhaseConfig
    sink: str
    epoch: int
    parts: tuple[tuple[str, ...], ...]


def run(
    job: CrashJob, point: str, folder: Path, env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    """The child run to its end with ``point`` armed for the job's sink; ``env`` is its
    environment (where it finds the kind of target: ``PYTHONPATH``), crash settings of
    its own left out."""
    path = folder / f"crash-job-{os.getpid()}-{point}.pickle"
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        pickle.dump(job, out)
    child = {k: v for k, v in env.items() if not k.startswith("TWOPHASE_CRASH")}
    child |= {CRASH_ENV: point, SINK_ENV: job.sink}
    return subprocess.run(
        [sys.executable, "-m", "twophase.testing.crash", str(path)],
        env=child,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def main(argv: list[str]) -> None:
    from twophase.protocol.commit.runtime import TwoPhase

    with open(argv[0], "rb") as source:
        job: CrashJob = pickle.load(source)  # the file the parent wrote for this child
    with TwoPhase.open(job.config) as tp:
        lease = tp.begin_run(job.sink, "crash-run", "crash-query")
        messages = [
            tp.stager.stage(
                job.sink,
                job.epoch,
                list(part),
                partition_id=number,
                run_id=lease.run_id,
                query_id="crash-query",
            )
            for number, part in enumerate(job.parts)
        ]
        tp.committer.commit(lease, job.epoch, messages)


if __name__ == "__main__":
    main(sys.argv[1:])
