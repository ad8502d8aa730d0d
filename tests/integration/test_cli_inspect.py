"""status, epochs and dead-letters on a staging store in a known state."""

from __future__ import annotations

import csv
import json
import stat
from pathlib import Path

import pytest

from tests.integration.cli_helpers import (
    BAD_POINT,
    OTHER,
    SINK,
    Cli,
    known_store,
    make_cli,
    make_idle,
    sql,
)
from twophase.config import TargetConfig
from twophase.points.builder import Rejected
from twophase.protocol.commit.runtime import TwoPhase

STATUS_KEYS = {
    "sink_id",
    "targets",
    "query_id",
    "owner_run_id",
    "owner_live",
    "owner_state",
    "owner_end_reason",
    "fencing_token",
    "updated_at",
    "last_decided_epoch",
    "last_committed_epoch",
    "precommitted_epochs",
    "oldest_precommitted_epoch",
    "oldest_precommitted_age_s",
    "staged_points",
    "staged_bytes",
    "dead_letters",
    "replays_detected",
    "last_error",
    "corrections",
    "compacted_through",
}
EPOCH_KEYS = {
    "sink_id",
    "epoch",
    "state",
    "run_id",
    "writes",
    "points_staged",
    "points_delivered",
    "points_rejected_stage",
    "points_rejected_promote",
    "promote_attempts",
    "replays",
    "decided_at",
    "committed_at",
    "aborted_at",
    "purged_at",
    "last_error",
}
DEAD_LETTER_KEYS = {
    "id",
    "sink_id",
    "epoch",
    "write_id",
    "seq",
    "phase",
    "reason",
    "payload",
    "created_at",
    "requeued_in",
    "target",  # "": the sink's one target (or a row rejected at staging)
}


@pytest.fixture
def cli(tp: TwoPhase, staging_url: str, influx: TargetConfig) -> Cli:
    known_store(tp)
    return make_cli(staging_url, influx)


def test_status_table_and_json(cli: Cli, staging_url: str) -> None:
    text = cli("status")
    assert text.code == 0, text.err
    header, row_s, row_t = text.out.splitlines()
    assert header.split()[:3] == ["SINK", "OWNER", "RUN"]
    assert row_s.split()[:9] == [SINK, "r1", "live", "3", "2", "1", "3", "(0s", "old)"]
    assert row_t.split()[:3] == [OTHER, "r9", "live"]

    result = cli("status", "--json")
    data = result.json()
    assert list(data) == ["sinks"]
    s, t = data["sinks"]
    assert set(s) == STATUS_KEYS
    assert s["sink_id"] == SINK and s["owner_run_id"] == "r1" and s["owner_live"] is True
    assert (s["last_decided_epoch"], s["last_committed_epoch"]) == (3, 2)
    assert (s["precommitted_epochs"], s["oldest_precommitted_epoch"]) == (1, 3)
    stored = sql(
        staging_url,
        "SELECT sum(octet_length(c.body_gz)) FROM twophase_staged_chunks c"
        " JOIN twophase_writes w USING (write_id) WHERE w.sink_id = %s",
        SINK,
    )[0][0]
    assert s["staged_points"] == 41 and s["staged_bytes"] == stored > 0  # as stored: gzip
    assert s["dead_letters"] == 2  # one row at stage, one point at promote
    assert s["updated_at"].endswith("Z")
    assert t["precommitted_epochs"] == 0 and t["oldest_precommitted_age_s"] is None
    assert result.out == json.dumps(data, sort_keys=True, indent=2) + "\n"  # stable form


def test_status_of_one_sink_and_idle_owner(cli: Cli, staging_url: str) -> None:
    make_idle(staging_url)
    data = cli("status", "--sink", SINK, "--json").json()
    assert [s["sink_id"] for s in data["sinks"]] == [SINK]
    assert data["sinks"][0]["owner_live"] is False
    bad = cli("status", "--sink", "nope")
    assert bad.code == 2
    assert "unknown sink 'nope' (known sinks: s, t)" in bad.one_line_error()


def test_epochs(cli: Cli) -> None:
    text = cli("epochs", "--sink", SINK)
    assert text.code == 0, text.err
    rows = [line.split() for line in text.out.splitlines()[1:]]
    assert [r[:6] for r in rows] == [
        ["0", "COMMITTED", "10", "10", "0", "1"],
        ["1", "COMMITTED", "10", "10", "1", "1"],
        ["2", "COMMITTED", "11", "10", "1", "1"],
        ["3", "PRECOMMITTED", "10", "-", "0", "0"],
    ]
    data = cli("--json", "epochs", "--sink", SINK, "--from", "1", "--to", "2").json()
    assert set(data) == {"sink_id", "epochs", "compacted_through"}
    assert [e["epoch"] for e in data["epochs"]] == [1, 2]
    assert set(data["epochs"][0]) == EPOCH_KEYS
    assert data["epochs"][1]["points_rejected_promote"] == 1
    last = cli("epochs", "--sink", SINK, "--last", "2", "--json").json()
    assert [e["epoch"] for e in last["epochs"]] == [2, 3]


def test_one_epoch_shows_its_history(cli: Cli) -> None:
    data = cli("epochs", "--sink", SINK, "--epoch", "2", "--json").json()
    assert [e["event"] for e in data["events"]] == ["decided", "committed"]
    assert set(data["events"][0]) == {"at", "event", "run_id", "detail"}
    text = cli("epochs", "--sink", SINK, "--epoch", "2").out
    assert "history of epoch 2:" in text and "committed" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epoch", "9"], "sink 's' has epochs 0..3; epoch 9 is not recorded"),
        (["--from", "5", "--to", "3"], "--from 5 is after --to 3"),
        (["--from", "7"], "epochs 7.. is not recorded"),
        (["--epoch", "-1"], "argument --epoch: '-1' is not an epoch (an integer >= 0, or cN"),
        (["--epoch", "1", "--to", "2"], "--epoch cannot be combined with --from/--to"),
        (["--last", "1", "--from", "2"], "--last cannot be combined"),
    ],
)
def test_epochs_out_of_range_is_a_usage_error(cli: Cli, args: list[str], message: str) -> None:
    result = cli("epochs", "--sink", SINK, *args)
    assert result.code == 2
    assert message in result.one_line_error()


def test_dead_letters_list(tp: TwoPhase, cli: Cli) -> None:
    # a failed task attempt rejected a row too; its write is an orphan: not listed or counted
    tp.stager.stage(SINK, 1, [Rejected(0, "from a failed attempt", "{}")], attempt=1)
    text = cli("dead-letters", "--sink", SINK)
    assert text.code == 0, text.err
    _, stage_row, promote_row = text.out.splitlines()
    assert stage_row.split()[:2] == ["1", "stage"] and "field 'v' is null" in stage_row
    assert promote_row.split()[:2] == ["2", "promote"] and "partial write" in promote_row
    data = cli("dead-letters", "--sink", SINK, "--epoch", "2", "--json").json()
    assert data["total"] == 1 and set(data["dead_letters"][0]) == DEAD_LETTER_KEYS
    assert data["dead_letters"][0]["payload"] == BAD_POINT
    limited = cli("dead-letters", "--sink", SINK, "--limit", "1")
    assert "... 1 more" in limited.out
    none = cli("dead-letters", "--sink", OTHER)
    assert none.out == "no dead letters for sink 't'\n"


def test_dead_letters_export(cli: Cli, tmp_path: Path) -> None:
    jsonl, table = tmp_path / "dl.jsonl", tmp_path / "dl.csv"
    done = cli("dead-letters", "--sink", SINK, "--export", str(jsonl), "--json")
    assert done.code == 0 and done.json() == {"exported": 2, "file": str(jsonl)}
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(r["epoch"], r["phase"]) for r in records] == [(1, "stage"), (2, "promote")]
    assert set(records[0]) == DEAD_LETTER_KEYS and records[0]["created_at"].endswith("Z")
    assert cli("dead-letters", "--sink", SINK, "--export", str(table)).code == 0
    with table.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["payload"] for r in rows] == [records[0]["payload"], BAD_POINT]
    assert set(tmp_path.iterdir()) == {jsonl, table}  # no partial file left behind
    # Payloads are the pipeline's data: the owner's alone, whatever the umask.
    assert {stat.S_IMODE(path.stat().st_mode) for path in (jsonl, table)} == {0o600}
    bad = cli("dead-letters", "--sink", SINK, "--export", str(tmp_path / "dl.xlsx"))
    assert bad.code == 2 and "--export" in bad.one_line_error()
