"""The job reads each line once and splits the malformed ones off in the tasks that read
them: a line of each kind the generator makes reaches the dead-letter table exactly once,
with its reason, across a task failure and driver kills in the dead-letter sink's commit."""

from __future__ import annotations

import json
import random
import signal
from collections import Counter
from pathlib import Path

from jobs.generate_events import DEFAULT_START, MALFORMED_KINDS, malformed_line, random_event
from tests.e2e.harness import (
    KILL_TIMEOUT_S,
    MALFORMED,
    SINK,
    Job,
    Target,
    arm,
    disarm,
    epochs,
    feed,
    fired,
    orphan_writes,
    start_job,
    wait_exact,
    wait_idle,
)
from tests.support import staging_config_for
from twophase import operations as ops

EVENTS_PER_FILE = 40
REASONS = {
    "no_timestamp": "timestamp missing or not a number",
    "bytes_text": "bytes_p2p missing or not an integer",
    "bytes_float": "bytes_cdn missing or not an integer",
    "empty_stream": "stream_id missing or empty",
    "negative_bytes": "bytes_p2p is negative",
}
UNPARSED = ("truncated", "not_json", "bytes_text", "bytes_float")  # their line is the payload


def kinds_input(folder: Path, files: int) -> tuple[list[Path], dict[str, str]]:
    """Files of valid events, each with one malformed line of every kind; line -> kind."""
    folder.mkdir(parents=True)
    rng, paths, kinds = random.Random(5), [], {}
    for index in range(files):
        start = DEFAULT_START + index * 60
        events = [random_event(rng, start + i) for i in range(EVENTS_PER_FILE)]
        lines = [json.dumps(e) for e in events]
        for offset, kind in enumerate(MALFORMED_KINDS):
            line = malformed_line(kind, random_event(rng, start + offset + 0.5))
            kinds[line] = kind
            lines.insert(3 + offset * 5, line)
        path = folder / f"events-{index:05d}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths, kinds


def test_each_kind_of_malformed_line_is_dead_lettered_once(target: Target, work: Path) -> None:
    files, kinds = kinds_input(work / "source", 5)
    plan, fed = work / "crash-plan.json", list(files[:1])

    def start() -> Job:
        return start_job(
            target,
            work / "input",
            work / "checkpoint",
            SINK,
            work / "logs",
            available_now=False,
            crash_plan=plan,
        )

    # 1. A task of the split dies right after staging its dead letters: Spark retries it,
    #    and its partition has two complete writes, of which one is decided.
    arm(plan, "after_stage:1", "process", sink=MALFORMED)
    feed(work / "input", fed)
    job = start()
    job.wait_for("the task failure", fired(plan).exists, KILL_TIMEOUT_S)
    wait_exact(job, target, fed, MALFORMED)
    assert job.returncode is None  # the query survived the failed task
    # 2. to 4. The driver dies between the points' commit and the dead-letter epoch's
    #    decision, then right after deciding the dead-letter epoch, then right after
    #    marking it COMMITTED (before Spark logs the micro-batch): a restart re-runs it.
    kills = (
        ("before_split_decide:1", SINK, files[1]),
        ("after_decide:1", MALFORMED, files[2]),
        ("after_mark:1", MALFORMED, files[3]),
    )
    for point, sink, new_file in kills:
        wait_idle(job, target.staging_url, SINK)
        arm(plan, point, "session", sink=sink)
        fed.append(new_file)
        feed(work / "input", [new_file])
        assert job.wait(KILL_TIMEOUT_S) == -signal.SIGKILL, (point, job.tail())
        disarm(plan)
        job = start()
        wait_exact(job, target, fed, MALFORMED)
    fed.append(files[4])
    feed(work / "input", files[4:])
    wait_exact(job, target, fed, MALFORMED)
    # Dead letters count once their epoch is decided, still PRECOMMITTED. Spark logs the
    # micro-batch only after the dead-letter sink's epoch is COMMITTED too, so the job
    # is stopped once it has logged it: a kill inside the last commit is not what the
    # checks below are about.
    wait_idle(job, target.staging_url, SINK)
    job.kill()

    dead = epochs(target.staging_url, MALFORMED)
    assert {e["state"] for e in dead} == {"COMMITTED"}
    assert sum(e["replays"] for e in dead) >= 2  # the epochs in flight at the last two kills
    staging = staging_config_for(target.staging_url, orphan_grace="0s")
    letters = ops.dead_letters(staging, MALFORMED, limit=None)
    assert letters.total == len(fed) * len(MALFORMED_KINDS)
    seen = Counter(_kind_of(d.payload, kinds) for d in letters.dead_letters)
    assert seen == {kind: len(fed) for kind in MALFORMED_KINDS}  # each line exactly once
    for letter in letters.dead_letters:
        kind = _kind_of(letter.payload, kinds)
        assert letter.reason == REASONS.get(kind, letter.reason), (kind, letter)
    assert orphan_writes(target.staging_url, MALFORMED) > 0  # the retried task's first write
    ops.gc(staging, MALFORMED)
    assert orphan_writes(target.staging_url, MALFORMED) == 0


def _kind_of(payload: str, kinds: dict[str, str]) -> str:
    """The kind of the line a payload stands for: the line itself, or (for a line that
    parsed but broke a rule) the parsed event as JSON."""
    if payload in kinds:
        assert kinds[payload] in UNPARSED, payload
        return kinds[payload]
    event = json.loads(payload)
    matches = [
        kind
        for line, kind in kinds.items()
        if kind not in UNPARSED and _same_event(json.loads(line), event)
    ]
    assert len(matches) == 1, (payload, matches)
    return matches[0]


def _same_event(line: dict[str, object], parsed: dict[str, object]) -> bool:
    return all(parsed.get(key) == value for key, value in line.items())
