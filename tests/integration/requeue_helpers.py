"""The requeue scenario: a conflicting write makes the sink's points dead letters, the
operator drops the conflict and requeues them."""

from __future__ import annotations

from typing import Any

from tests.staging import stage
from tests.support import begin_run, influx_rows
from twophase.config import TargetConfig
from twophase.influx.query import query_v1
from twophase.protocol.commit.runtime import TwoPhase

SINK = "rq-sink"


GOOD, CONFLICTED = "ok", "rq"


BASE = 1_700_000_000_000_000_000


EPOCHS, GOOD_PER_EPOCH, BAD_PER_EPOCH = 3, 6, 3


LEGACY = f'{CONFLICTED},e=legacy,n=0 v="text" {BASE + 999}'


def epoch_lines(epoch: int) -> list[str]:
    base = BASE + epoch * 1_000_000
    good = [
        f"{GOOD},e={epoch},n={i} v={epoch * 10 + i}.5 {base + i}" for i in range(GOOD_PER_EPOCH)
    ]
    bad = [
        f"{CONFLICTED},e={epoch},n={i} v={epoch * 10 + i}.25 {base + i}"
        for i in range(BAD_PER_EPOCH)
    ]
    return good + bad


def expected(measurement: str) -> list[tuple[Any, ...]]:
    rows = []
    for epoch in range(EPOCHS):
        count = GOOD_PER_EPOCH if measurement == GOOD else BAD_PER_EPOCH
        offset = 0.5 if measurement == GOOD else 0.25
        rows += [(epoch, i, epoch * 10 + i + offset) for i in range(count)]
    return sorted(rows)


def held(influx: TargetConfig, measurement: str) -> list[tuple[Any, ...]]:
    """(epoch, n, v) of every point InfluxDB holds, duplicates included (none may be)."""
    out = []
    for _, tags, fields in influx_rows(influx, measurement):
        tag = dict(tags)
        if tag["e"] != "legacy":
            out.append((int(tag["e"]), int(tag["n"]), dict(fields)["v"]))
    return sorted(out)


def rejected_store(tp: TwoPhase, influx: TargetConfig) -> int:
    """Commit the epochs after the conflicting write: their ``rq`` points are dead letters."""
    influx_write(influx, LEGACY)
    lease = begin_run(tp, SINK, "r1", "q1")
    for epoch in range(EPOCHS):
        lines = epoch_lines(epoch)
        tp.committer.commit(lease, epoch, stage(tp, SINK, epoch, [lines[:4], lines[4:]]))
    tp.runs.end(SINK, "r1", "stopped")
    return EPOCHS * BAD_PER_EPOCH


def influx_write(influx: TargetConfig, line: str) -> None:
    import urllib.request

    url = f"{influx.url}/write?db={influx.influxdb.database}&precision=ns"
    urllib.request.urlopen(urllib.request.Request(url, data=line.encode(), method="POST"))


def drop_conflicting(influx: TargetConfig) -> None:
    """The operator's fix: the measurement holding the conflicting field goes."""
    query_v1(
        influx.url, influx.influxdb.database, f'DROP MEASUREMENT "{CONFLICTED}"', method="POST"
    )
