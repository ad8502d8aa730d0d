"""verify's pure parts: the expected state, query windows, and the comparison."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from twophase.cli.console import json_chunks
from twophase.errors import StateError
from twophase.influx.query import quote_ident, window_query
from twophase.operations.resender import plan_resend
from twophase.operations.verify import (
    Comparison,
    Expected,
    SeriesDiff,
    Share,
    Window,
    actual_points,
    choose_epochs,
    compare,
    compare_series,
    read_back,
    same_value,
    when,
    windows,
)
from twophase.store.views import EpochInfo

NOW = datetime(2024, 1, 1, tzinfo=timezone.utc)
A: Any = ("m", (("host", "a"),))


def epoch(number: int, state: str = "COMMITTED", purged: bool = False) -> EpochInfo:
    return EpochInfo(
        sink_id="s",
        epoch=number,
        state=state,
        run_id="r1",
        writes=1,
        points_staged=10,
        points_delivered=10,
        points_rejected_stage=0,
        points_rejected_promote=0,
        promote_attempts=1,
        replays=0,
        decided_at=NOW,
        committed_at=NOW,
        aborted_at=None,
        purged_at=NOW if purged else None,
        last_error=None,
    )


def test_expected_merges_fields_as_influxdb_does() -> None:
    expected = Expected()
    assert expected.add(["m,host=a v=1,w=2 10", "m,host=a v=3 10", "m,host=a v=4 20"]) == 3
    assert expected.points == {A: {10: {"v": 3.0, "w": 2.0}, 20: {"v": 4.0}}}
    # later epochs only update points already expected
    expected.add(["m,host=a w=9 10", "m,host=a v=5 30", "m,host=b v=1 10"], only_known=True)
    assert expected.points == {A: {10: {"v": 3.0, "w": 9.0}, 20: {"v": 4.0}}}
    assert expected.size() == 2


def test_unparseable_lines_are_counted_not_skipped_silently() -> None:
    expected = Expected()
    expected.add(["m v=1", "garbage", "m v=1 5"])
    assert expected.unparseable == 2 and len(expected.examples) == 2
    assert "no timestamp" in expected.examples[0]


def test_windows_cover_every_span_contiguously() -> None:
    points: Any = {
        ("m", ()): {t: {} for t in (1, 2, 3, 10, 11)},
        ("m", (("k", "v"),)): {5: {}},
        ("n", ()): {7: {}},
    }
    assert windows(points, per_query=2) == [
        Window("m", 1, 2),
        Window("m", 3, 9),
        Window("m", 10, 11),
        Window("n", 7, 7),
    ]


def test_queries_quote_names() -> None:
    query = window_query('we"ird\\', 1, 2, "r p")
    assert query == 'SELECT * FROM "r p"."we\\"ird\\\\" WHERE time >= 1 AND time <= 2 GROUP BY *'
    assert quote_ident("plain") == '"plain"'


def test_influxdb_answer_is_read_without_empty_tags_and_nulls() -> None:
    answer = [
        {
            "name": "m",
            "tags": {"host": "a", "dc": ""},
            "columns": ["time", "v", "w"],
            "values": [[10, 1, None], [20, None, "x"]],
        }
    ]
    assert list(actual_points(answer)) == [(A, 10, {"v": 1}), (A, 20, {"w": "x"})]


def test_read_back_compares_only_expected_series_as_the_answer_streams() -> None:
    answer = [
        {"name": "m", "tags": {"host": "a"}, "columns": ["time", "v"], "values": [[10, 1]]},
        {"name": "m", "tags": {"host": "z"}, "columns": ["time", "v"], "values": [[10, 1]]},
        {"name": "m", "tags": {"host": "a"}, "columns": ["time", "v"], "values": [[20, 2]]},
    ]
    seen: list[tuple[str, int, int]] = []

    class Answer:
        def window(self, measurement: str, start: int, end: int) -> Any:
            seen.append((measurement, start, end))
            yield from answer  # a chunk at a time: a series may come in several

        def probe(self) -> None: ...

        def close(self) -> None: ...

    comparison = Comparison({A: {10: {"v": 1.0}, 20: {"v": 3.0}}})
    read_back(Answer(), [Window("m", 0, 99)], comparison)
    [diff] = comparison.differences()
    assert (diff.points_held, diff.different, diff.missing, diff.extra) == (2, 1, 0, 0)
    assert len(seen) == 1


def _lines(series: int, per_series: int) -> list[str]:
    return [
        f"m,host=h{s},dc=d{s % 3} v={s * t}i {t}" for t in range(per_series) for s in range(series)
    ]


@pytest.mark.parametrize("passes", [2, 3, 7])
def test_passes_over_shares_of_the_series_add_up_to_one_pass(passes: int) -> None:
    """Each series in exactly one share: the passes' points and differences are one
    pass's, and an unparseable line is counted once."""
    lines = [*_lines(40, 5), "garbage"]
    actual = {
        (("m", (("dc", f"d{s % 3}"), ("host", f"h{s}"))), t): {"v": s * t}
        for s in range(40)
        for t in range(5)
    }
    del actual[(("m", (("dc", "d1"), ("host", "h7"))), 3)]  # one point missing in the target

    def differences(expected: Expected) -> Any:
        have: dict[Any, dict[int, dict[str, Any]]] = {}
        for (series, stamp), values in actual.items():
            have.setdefault(series, {})[stamp] = values
        return compare(expected.points, have)

    whole = Expected()
    whole.add(lines)
    shares = [Expected(share=Share(i, passes)) for i in range(passes)]
    for share in shares:
        share.add(lines)
    assert sum(e.size() for e in shares) == whole.size() == 200
    assert all(e.size() < whole.size() for e in shares)
    by_series = sorted((d for e in shares for d in differences(e)), key=lambda d: d.tags["host"])
    assert by_series == sorted(differences(whole), key=lambda d: d.tags["host"])
    assert sum(e.unparseable for e in shares) == whole.unparseable == 1


@pytest.mark.parametrize(
    ("expected", "actual", "same"),
    [
        (1.0, 1, True),  # JSON drops ".0"
        (5, 5, True),
        (2**62 + 1, 2**62 + 1, True),
        (True, True, True),
        (True, 1, False),
        (1, True, False),
        ("1", 1, False),
        (0.1, 0.1, True),
        (0.1, 0.10000000000000002, False),
    ],
)
def test_same_value(expected: Any, actual: Any, same: bool) -> None:
    assert same_value(expected, actual) is same


def test_compare_series_counts_missing_different_and_extra() -> None:
    want: Any = {10: {"v": 1.0}, 20: {"v": 2.0}, 30: {"v": 3.0}}
    have: Any = {5: {"v": 0}, 10: {"v": 1, "other": 7}, 20: {"v": 2.5}, 25: {"v": 9}, 99: {}}
    diff = compare_series(A, want, have)
    assert diff is not None
    assert (diff.points_expected, diff.points_held) == (3, 3)  # 5 and 99 are outside the span
    assert (diff.missing, diff.different, diff.extra) == (1, 1, 1)
    assert diff.examples == (
        "1970-01-01T00:00:00.000000020Z: field 'v' expected 2.0, the target has 2.5",
        "1970-01-01T00:00:00.000000030Z: missing in the target",
        "1970-01-01T00:00:00.000000025Z: extra point in the target, not staged",
    )
    assert compare_series(A, {10: {"v": 1.0}}, {10: {"v": 1, "w": 2}}) is None
    assert compare({A: want}, {}) and not compare({A: {10: {"v": 1.0}}}, {A: {10: {"v": 1}}})


def test_when_is_exact_to_the_nanosecond() -> None:
    assert when(1_700_000_000_000_000_001) == "2023-11-14T22:13:20.000000001Z"
    assert when(-1) == "1969-12-31T23:59:59.999999999Z"


def test_choose_epochs_for_verify() -> None:
    chosen, notes = choose_epochs(
        "s", [epoch(0, purged=True), epoch(1), epoch(2, "ABORTED"), epoch(3, "PRECOMMITTED")]
    )
    assert chosen == [1]
    assert notes == [
        "not verified: epoch 3 is PRECOMMITTED (not delivered yet; run `twophase recover`)",
        "not verified: epoch 0 is past retention (staged points purged)",
        "not verified: epoch 2 is ABORTED (never delivered)",
    ]
    with pytest.raises(StateError, match="nothing to verify"):
        choose_epochs("s", [epoch(0, purged=True)])


def test_plan_resend() -> None:
    plan = plan_resend("s", [epoch(0, purged=True), epoch(1), epoch(2, "ABORTED"), epoch(3)], True)
    assert (plan.epochs, plan.points, plan.skipped_aborted, plan.skipped_purged) == (
        (1, 3),
        20,
        (2,),
        (0,),
    )
    with pytest.raises(StateError, match=r"epochs 0-1 are past retention"):
        plan_resend("s", [epoch(0, purged=True), epoch(1, purged=True), epoch(2)], False)
    with pytest.raises(StateError, match="epoch 4 is PRECOMMITTED"):
        plan_resend("s", [epoch(3), epoch(4, "PRECOMMITTED")], True)
    with pytest.raises(StateError, match=r"no COMMITTED epoch to re-send \(aborted: 2\)"):
        plan_resend("s", [epoch(2, "ABORTED")], False)


def test_a_diff_keeps_its_former_key_in_json_and_warns_on_its_former_name() -> None:
    diff = SeriesDiff("m", {"h": "a"}, 3, 2, 1, 0, 0, ())
    printed = json.loads("".join(json_chunks([diff])))[0]
    assert (printed["points_held"], printed["points_influx"]) == (2, 2)
    with pytest.warns(DeprecationWarning, match="points_held"):
        assert diff.points_influx == 2
