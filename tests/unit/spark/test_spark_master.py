"""Which Spark masters retry a failed task, and the one warning for those that do not."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from twophase.spark import master_retries


@pytest.mark.parametrize(
    ("given", "instead"),
    [
        ("local", "local[1,4]"),
        ("local[2]", "local[2,4]"),
        ("local[*]", "local[*,4]"),
        ("local[2,1]", "local[2,4]"),  # one attempt: no retry either
        (" local[16] ", "local[16,4]"),
        ("local[2,4]", None),
        ("local[*, 3]", None),
        ("local-cluster[2,1,1024]", None),  # spark.task.maxFailures applies
        ("spark://host:7077", None),
        ("yarn", None),
        ("k8s://https://api:6443", None),
        ("localhost", None),
    ],
)
def test_masters_that_run_each_task_once_get_a_retrying_one(
    given: str, instead: str | None
) -> None:
    assert master_retries.retrying_master(given) == instead


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As in a new process: not checked yet."""
    monkeypatch.setattr(master_retries, "_checked", type(master_retries._checked)())
    yield


@pytest.mark.usefixtures("fresh")
def test_a_master_without_retries_is_warned_of_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(master_retries, "active_master", lambda: "local[2]")
    with caplog.at_level(logging.WARNING, logger="twophase"):
        master_retries.warn_without_task_retries()
        master_retries.warn_without_task_retries()
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        (
            "twophase.spark",
            "Spark master local[2] retries no failed task: one failed task (staging past "
            "its deadline, a lost worker) fails the query; use local[2,4]",
        )
    ]


@pytest.mark.usefixtures("fresh")
def test_a_master_that_cannot_be_read_is_checked_again_later(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    masters = iter([None, "local[*]"])
    monkeypatch.setattr(master_retries, "active_master", lambda: next(masters))
    with caplog.at_level(logging.WARNING, logger="twophase"):
        master_retries.warn_without_task_retries()  # no SparkContext yet: nothing said, not done
        assert caplog.records == []
        master_retries.warn_without_task_retries()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "Spark master local[*] retries no failed task"
    ]


@pytest.mark.usefixtures("fresh")
def test_a_retrying_master_is_not_warned_of(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(master_retries, "active_master", lambda: "local[2,4]")
    with caplog.at_level(logging.WARNING, logger="twophase"):
        master_retries.warn_without_task_retries()
    assert caplog.records == []
