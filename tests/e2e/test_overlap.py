"""``promotion = overlap`` with real Spark: the foreachBatch adapter sends a micro-batch's
committed writes to InfluxDB while its staging job still runs, before the epoch is
decided; a SIGKILL of the whole driver then, and once the batch is decided,
leaves InfluxDB exact after the restart (the replay stages the same points again and
InfluxDB overwrites those sent early).

One chain (three job starts). Small chunks make a staging task commit its rows as
several writes (four chunks each), each of which the driver may send at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chain import Chain, crash_and_recover
from tests.e2e.harness import (
    EXACT_FIELDS,
    KILL_TIMEOUT_S,
    SINK,
    Key,
    Target,
    arm,
    disarm,
    epochs,
    expected_stats,
    fired,
    influx_stats,
    query,
    wait_idle,
)

# A staging task that committed its first write sleeps this long: far longer than the
# test waits for the early points, so the epoch cannot be decided before the kill.
PAUSE_S = 600.0
EARLY_TIMEOUT_S = 60.0


@pytest.mark.timeout(900)
def test_points_sent_before_the_decision_survive_kills(
    target: Target, work: Path, event_files: list[Path]
) -> None:
    chain = Chain(
        target,
        work,
        event_files,
        TWOPHASE_PROMOTION="overlap",
        TWOPHASE_STAGING_CHUNK_POINTS="1",  # writes of four points: several per task
    )
    chain.feed(2)
    chain.wait_exact()
    kill_while_points_travel_undecided(chain)
    # Decided, some of its points sent early, none by the commit: the restart's claim
    # delivers it. (Every other step: the crash matrix in this mode, and with --full
    # test_exactly_once.py's kill at every point on Spark.)
    crash_and_recover(chain, "after_decide")
    chain.job.kill()


def kill_while_points_travel_undecided(chain: Chain) -> None:
    """A staging task pauses right after committing a write: the job cannot end its
    staging, so the epoch stays undecided, yet the driver's thread sends the committed
    writes. Once InfluxDB holds some of the batch's points, kill the whole job; the
    restart replays the batch and InfluxDB is exact."""
    url = chain.target.staging_url
    wait_idle(chain.job, url, SINK)
    before = influx_stats(chain.target.influx)
    last_decided = max(e["epoch"] for e in epochs(url, SINK))
    arm(chain.plan, "after_stage:1", "process", sink=SINK, pause_s=PAUSE_S)
    chain.feed(1)  # one file: one micro-batch, whose windows' values are known
    chain.job.wait_for("a staging task to pause", fired(chain.plan).exists, KILL_TIMEOUT_S)
    chain.job.wait_for(
        "points of the undecided batch in InfluxDB",
        lambda: bool(changed(chain, before)) and undecided(url, last_decided) != [],
        EARLY_TIMEOUT_S,
    )
    chain.job.kill()

    # Nothing runs any more: what the kill left.
    pending = undecided(url, last_decided)
    assert len(pending) == 1, pending  # the paused batch's epoch, staged in part
    (epoch,) = pending
    early = changed(chain, before)
    assert early, "no point of the batch reached InfluxDB before the kill"
    want = expected_stats(chain.fed)  # the values once this batch is counted
    for key, fields in early.items():
        assert key in want, (key, fields)
        assert {f: fields.get(f) for f in EXACT_FIELDS} == want[key], key

    disarm(chain.plan)
    chain.job = chain.start()
    chain.wait_exact()
    chain.job.wait_for(
        f"epoch {epoch} to be committed",
        lambda: any(e["epoch"] == epoch and e["state"] == "COMMITTED" for e in epochs(url, SINK)),
    )


def changed(chain: Chain, before: dict[Key, dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """The points InfluxDB holds now that it did not hold, or held with other values."""
    now = influx_stats(chain.target.influx)
    return {key: fields for key, fields in now.items() if before.get(key) != fields}


def undecided(url: str, after: int) -> list[int]:
    """The sink's epochs after ``after`` that have staged writes and no decision."""
    rows = query(
        url,
        "SELECT DISTINCT w.epoch FROM twophase_writes w WHERE w.sink_id = %s AND w.epoch > %s"
        " AND NOT EXISTS (SELECT 1 FROM twophase_epochs e"
        " WHERE e.sink_id = w.sink_id AND e.epoch = w.epoch) ORDER BY w.epoch",
        SINK,
        after,
    )
    return [int(row[0]) for row in rows]
