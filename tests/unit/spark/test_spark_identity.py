"""Who a task stages for, and which run a writer's query runs under: classic Spark's
local properties, and the job tag a foreachBatch writer sets under Spark Connect."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.fakes import FakeTaskContext
from twophase.errors import PermanentError
from twophase.spark import staging_task
from twophase.spark.foreach import (
    ForeachBatchWriter,
    _collected,
    _Driver,
    foreach_batch_writer,
    is_connect,
)
from twophase.spark.query_end import run_of
from twophase.spark.staging_task import batch_tag, current_task

CONNECT_TAGS = (
    "SparkConnect_OperationTag_User__Session_5f_Operation_e3,"
    "SparkConnect_SessionTag_User__Session_5f_Tag_{tag},"
    "spark-session-26-execution-root-id-6,spark-session-26"
)


def in_task(monkeypatch: pytest.MonkeyPatch, **properties: str) -> None:
    context = FakeTaskContext(**properties)
    monkeypatch.setattr(staging_task.TaskContext, "get", staticmethod(lambda: context))


def test_a_streaming_task_reads_the_local_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    in_task(
        monkeypatch,
        **{
            staging_task.BATCH_ID_PROPERTY: "7",
            staging_task.RUN_ID_PROPERTY: "r",
            staging_task.QUERY_ID_PROPERTY: "q",
        },
    )
    task = current_task()
    got = (task.epoch, task.partition_id, task.attempt, task.run_id, task.query_id)
    assert got == (7, 3, 1, "r", "q")


def test_under_connect_a_task_reads_the_writers_job_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    query_id = "0b5e8e4c-1d2f-4c1a-9a55-2f5a6d3c1e77"
    tags = CONNECT_TAGS.format(tag=batch_tag(12, "a1b2c3", query_id))
    in_task(monkeypatch, **{staging_task.JOB_TAGS_PROPERTY: tags})
    task = current_task()
    assert (task.epoch, task.run_id, task.query_id) == (12, "a1b2c3", query_id)


def test_a_query_id_of_the_users_own_may_hold_colons(monkeypatch: pytest.MonkeyPatch) -> None:
    tags = CONNECT_TAGS.format(tag=batch_tag(0, "run", "team:dash:v2"))
    in_task(monkeypatch, **{staging_task.JOB_TAGS_PROPERTY: tags})
    assert current_task().query_id == "team:dash:v2"


def test_explicit_values_win_over_the_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    tags = CONNECT_TAGS.format(tag=batch_tag(5, "tagged-run", "tagged-query"))
    in_task(monkeypatch, **{staging_task.JOB_TAGS_PROPERTY: tags})
    task = current_task(epoch=9, run_id="given-run", query_id="given-query")
    assert (task.epoch, task.run_id, task.query_id) == (9, "given-run", "given-query")


def test_a_streaming_batch_id_wins_over_a_stray_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    tags = CONNECT_TAGS.format(tag=batch_tag(5, "tagged-run", "tagged-query"))
    in_task(
        monkeypatch,
        **{
            staging_task.BATCH_ID_PROPERTY: "2",
            staging_task.RUN_ID_PROPERTY: "r",
            staging_task.QUERY_ID_PROPERTY: "q",
            staging_task.JOB_TAGS_PROPERTY: tags,
        },
    )
    task = current_task()
    assert (task.epoch, task.run_id, task.query_id) == (2, "r", "q")


def test_a_batch_write_without_batch_or_tag_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    in_task(monkeypatch, **{staging_task.JOB_TAGS_PROPERTY: "spark-session-26"})
    with pytest.raises(PermanentError, match="streaming queries only"):
        current_task()


class ClassicQuery:
    id, runId = "query-1", "spark-run-1"


class ConnectQuery(ClassicQuery):
    pass


ConnectQuery.__module__ = "pyspark.sql.connect.streaming.query"


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> ForeachBatchWriter:
    monkeypatch.setattr("twophase.spark.foreach.open_in_background", lambda sink: None)
    # validated, never reached: nothing here connects
    monkeypatch.setenv("TWOPHASE_STAGING_URL", "postgresql+psycopg://twophase@127.0.0.1:9/twophase")
    monkeypatch.setenv("TWOPHASE_TARGET_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("TWOPHASE_INFLUX_API", "v1")
    monkeypatch.setenv("TWOPHASE_INFLUX_DB", "db")
    return foreach_batch_writer("dash", measurement="m", tags=["t"], time="ts")


def test_a_classic_query_runs_under_its_run_id(writer: ForeachBatchWriter) -> None:
    assert not is_connect(ClassicQuery())
    run_id, options = run_of(ClassicQuery(), writer)
    assert (run_id, options) == ("spark-run-1", writer.sink)
    assert run_of(ClassicQuery(), {"sink_id": "dash", "measurement": "m"})[0] == "spark-run-1"


def test_a_connect_querys_writer_runs_under_the_writers_own_run(
    writer: ForeachBatchWriter,
) -> None:
    assert is_connect(ConnectQuery())
    run_id, _ = run_of(ConnectQuery(), writer)
    assert run_id != "spark-run-1" and run_id == writer.run_of(ConnectQuery())
    # The data source's sink runs under the query's run, Connect or not.
    assert run_of(ConnectQuery(), {"sink_id": "dash", "measurement": "m"})[0] == "spark-run-1"


class PlannedFrame:
    """A DataFrame whose optimizer estimates ``size`` bytes (None: no estimate)."""

    def __init__(self, size: int | None) -> None:
        self.size = size

    @property
    def _jdf(self) -> Any:
        if self.size is None:
            raise AttributeError("_jdf")  # a DataFrame without a JVM plan
        size = self.size
        stats = SimpleNamespace(sizeInBytes=lambda: size)
        plan = SimpleNamespace(stats=lambda: stats)
        return SimpleNamespace(queryExecution=lambda: SimpleNamespace(optimizedPlan=lambda: plan))


@pytest.mark.parametrize(
    ("size", "limit", "remote", "small"),
    [
        (1_000, 4_096, False, True),
        (4_096, 4_096, False, True),
        (4_097, 4_096, False, False),
        (1_000, 0, False, False),  # 0: always in tasks
        (1_000, 4_096, True, False),  # Spark Connect: no plan to read
        (None, 4_096, False, False),  # no estimate: in tasks
    ],
)
def test_a_batch_is_staged_from_the_driver_only_when_its_plan_says_it_is_small(
    size: int | None, limit: int, remote: bool, small: bool
) -> None:
    driver = _Driver("run", "query", 2, remote)
    assert driver.is_small(PlannedFrame(size), limit) is small


class CollectedFrame:
    """A DataFrame whose ``toArrow`` returns ``table`` or raises ``error``."""

    def __init__(self, table: Any = None, error: Exception | None = None) -> None:
        self.table, self.error = table, error

    def toArrow(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.table


def test_a_batch_that_outgrows_its_estimate_is_staged_in_tasks_instead() -> None:
    """Spark fails a collect past spark.driver.maxResultSize (its message, as PySpark
    4.3 raises it, names the setting): the batch goes to the tasks' path; any other
    failure of the collect is the batch's."""
    assert _collected(CollectedFrame(table="t"), 3) == "t"
    too_big = RuntimeError(
        "org.apache.spark.SparkException: Job aborted due to stage failure: Total size of "
        "serialized results of 2 tasks (1106.2 KiB) is bigger than spark.driver.maxResultSize "
        "(1024.0 KiB)"
    )
    assert _collected(CollectedFrame(error=too_big), 3) is None
    with pytest.raises(RuntimeError, match="lost executor"):
        _collected(CollectedFrame(error=RuntimeError("lost executor")), 3)
