"""The sink refuses what it cannot do, before a row is staged: secrets as options,
unknown options, columns the query does not produce, update mode; and it writes
an append-mode stream exactly once. One in-process Spark session for the module."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from devkit.ports import free_port, start_own_influx
from tests.e2e.harness import epochs, feed, query, without_password
from tests.support import influx_count, influx_rows
from twophase.config import InfluxDBSettings, TargetConfig
from twophase.errors import ConfigError
from twophase.spark import foreach_batch_writer, parse_options
from twophase.spark.options import DEAD_LETTERS

SECRET = "hunter2-do-not-print"


@pytest.fixture(scope="module")
def spark(base_staging_url: str) -> Iterator[Any]:
    """The session; its processes get the staging password as users should pass it."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    password = make_url(base_staging_url).password
    if password:
        os.environ["PGPASSWORD"] = str(password)
    from pyspark.sql import SparkSession

    import twophase.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("twophase-e2e-options")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    twophase.spark.register(session)
    yield session
    session.stop()


def start(spark: Any, checkpoint: Path, mode: str = "append", **options: str) -> Any:
    frame = spark.readStream.format("rate").option("rowsPerSecond", "5").load()
    writer = frame.selectExpr("CAST(value % 3 AS STRING) AS k", "value AS v", "timestamp")
    stream = writer.writeStream.format("twophase").outputMode(mode)
    return stream.options(**options).option("checkpointLocation", str(checkpoint)).start()


def failure(spark: Any, checkpoint: Path, mode: str = "append", **options: str) -> str:
    """The error text of a query that must fail at its first micro-batch."""
    from pyspark.errors import StreamingQueryException

    try:
        query = start(spark, checkpoint, mode, **options)
    except Exception as exc:  # refused by start() itself (analysis)
        return str(exc)
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination(120)
    return str(caught.value)


@pytest.mark.parametrize("option", ["target_password", "influx_token"])
def test_secret_option_is_refused_without_showing_it(
    spark: Any, tmp_path: Path, option: str
) -> None:
    text = failure(spark, tmp_path, sink_id="s", measurement="m", tags="k", **{option: SECRET})
    assert "ConfigError" in text and f"{option}: is a secret" in text
    assert SECRET not in text


def test_unknown_option_and_missing_column_are_refused(spark: Any, tmp_path: Path) -> None:
    text = failure(spark, tmp_path / "a", sink_id="s", measurement="m", tag="k")
    assert "tag: unknown option of the twophase sink" in text
    text = failure(spark, tmp_path / "b", sink_id="s", measurement="m", tags="k,host")
    assert "tags: column 'host' is not in the query's output" in text


def test_background_promotion_is_refused_by_the_data_source(spark: Any, tmp_path: Path) -> None:
    """Its commit runs in a Python worker that may end once commit returns."""
    text = failure(spark, tmp_path, sink_id="s", measurement="m", tags="k", promotion="background")
    assert "ConfigError" in text and "promotion: background promotion needs" in text


def test_update_mode_is_refused_by_spark(spark: Any, tmp_path: Path) -> None:
    """PySpark's Python data sources support append and complete mode only; update mode
    goes through foreach_batch_writer (the job does so)."""
    text = failure(spark, tmp_path, "update", sink_id="s", measurement="m", tags="k")
    assert "does not support Update mode" in text


def test_options_are_validated_without_spark(staging_url: str) -> None:
    with pytest.raises(ConfigError, match="staging_url: must not contain a password"):
        parse_options({"sink_id": "s", "measurement": "m", "staging_url": staging_url})
    with pytest.raises(ConfigError, match="sink_id: is required"):
        parse_options({"measurement": "m"})
    with pytest.raises(ConfigError, match="measurement: only applies to mode=points"):
        parse_options({"sink_id": "s", "mode": DEAD_LETTERS, "measurement": "m"})
    with pytest.raises(ConfigError, match="influx_token: is a secret"):
        foreach_batch_writer("s", measurement="m", influx_token=SECRET)
    with pytest.raises(ConfigError, match="dead_letter_sink: must differ from sink_id 's'"):
        parse_options({"sink_id": "s", "measurement": "m", "dead_letter_sink": "s"})
    with pytest.raises(ConfigError, match="dead_letter_sink: must have no surrounding spaces"):
        parse_options({"sink_id": "s", "measurement": "m", "dead_letter_sink": " d"})
    with pytest.raises(ConfigError, match="dead_letter_sink: only applies to mode=points"):
        parse_options({"sink_id": "s", "mode": DEAD_LETTERS, "dead_letter_sink": "d"})
    with pytest.raises(ConfigError, match="dead_letter_sink: is not set for sink 's'"):
        parse_options({"sink_id": "s", "measurement": "m"}).dead_letters()
    split = parse_options({"sink_id": "s", "measurement": "m", "dead_letter_sink": "d"})
    assert (split.dead_letters().sink_id, split.dead_letters().mode) == ("d", DEAD_LETTERS)
    assert split.dead_letters().settings == split.settings
    sink = parse_options(
        {
            "Sink_Id": "s",
            "MEASUREMENT": "m",
            "tags": "a, b",
            "time": "t",
            "precision": "s",
            "checkpointLocation": "/x",
        }
    )
    assert sink.spec is not None and sink.spec.tag_columns == ("a", "b")
    assert SECRET not in repr(sink)


def test_append_stream_is_written_once_per_epoch(
    spark: Any, tmp_path: Path, staging_url: str, influx: TargetConfig, event_files: list[Path]
) -> None:
    """Raw events through the data source (append mode, row time from the event); the
    driver serves its InfluxDB request metrics on ``metrics_port``."""
    from pyspark.sql import functions as F

    from twophase.targets.metering import REGISTRY

    sent = ("twophase_target_sent_bytes_total", {"target": "default"})
    sent_before = REGISTRY.get_sample_value(*sent) or 0.0
    port = free_port()
    no_password = without_password(staging_url)
    feed(tmp_path / "input", event_files[:2])
    lines = spark.readStream.format("text").option("maxFilesPerTrigger", "1")
    events = (
        lines.load(str(tmp_path / "input"))
        .select(
            F.from_json("value", "timestamp double, stream_id string, user_id string").alias("e")
        )
        .select("e.*")
        .where("timestamp IS NOT NULL AND stream_id IS NOT NULL")
    )
    query_ = (
        events.selectExpr(
            "stream_id", "user_id", "CAST(timestamp * 1000 AS BIGINT) AS ms", "1 AS seen"
        )
        .writeStream.format("twophase")
        .options(
            sink_id="raw",
            measurement="raw",
            tags="stream_id,user_id",
            time="ms",
            precision="ms",
            staging_url=no_password,
            influx_db=str(influx.influxdb.database),
            influx_api="v1",
            influx_url=influx.url,
            metrics_port=str(port),
        )
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query_.awaitTermination(180)
    assert query_.exception() is None
    decided = epochs(staging_url, "raw")
    assert [e["state"] for e in decided] == ["COMMITTED", "COMMITTED"]
    staged = sum(e["points"] for e in decided)
    fed = fed_points(event_files[:2], ("stream_id", "user_id"))
    assert staged > 0 and held_points(influx, "raw", ("stream_id", "user_id")) == fed
    assert influx_count(influx, "raw") == len(fed)  # each point once
    (writes,) = query(staging_url, "SELECT count(*) FROM twophase_writes WHERE sink_id = 'raw'")
    assert writes[0] == sum(e["writes"] for e in decided)  # no orphan: nothing failed
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        scraped = {
            s.name: s.value
            for family in text_string_to_metric_families(answer.read().decode())
            for s in family.samples
            if s.labels.get("status_class") in (None, "2xx")
        }
    assert scraped["twophase_target_sent_bytes_total"] > sent_before
    assert scraped["twophase_target_responses_total"] >= 2  # one request per epoch at least


def fed_points(files: list[Path], tags: tuple[str, ...]) -> set[tuple[Any, ...]]:
    """The keys of the points the tests' queries write of the events in ``files``, read
    from the files: each tag's value (None: no tag) and the time in ms, of every line
    ``from_json`` reads with a numeric ``timestamp`` and a ``stream_id``, and no tag
    an empty string (that row is a dead letter)."""
    keys = set()
    for path in files:
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # from_json: null, filtered out
            if not isinstance(event, dict) or not isinstance(event.get("stream_id"), str):
                continue
            if "" in (event.get(t) for t in tags):  # a dead letter: no empty tag is stored
                continue
            stamp = event.get("timestamp")
            if isinstance(stamp, int | float) and not isinstance(stamp, bool):
                # CAST(timestamp * 1000 AS BIGINT): truncated
                keys.add((*(event.get(t) for t in tags), int(stamp * 1000)))
    return keys


def held_points(
    influx: TargetConfig, measurement: str, tags: tuple[str, ...]
) -> set[tuple[Any, ...]]:
    """The keys of the points InfluxDB holds of ``measurement``, as ``fed_points``."""
    return {
        (*(dict(held).get(t) for t in tags), time_ns // 1_000_000)
        for time_ns, held, _ in influx_rows(influx, measurement)
    }


def test_a_watched_query_records_the_end_of_its_run(
    spark: Any, tmp_path: Path, staging_url: str, influx: TargetConfig
) -> None:
    """``watch_query``: Spark's termination event ends the run (a stopped query), so
    ``status`` shows it ended and ``recover`` needs no --force."""
    import twophase.spark
    from twophase import operations as ops
    from twophase.config import load_config

    settings = {
        "staging_url": without_password(staging_url),
        "influx_db": str(influx.influxdb.database),
        "influx_api": "v1",
        "target_url": influx.url,
    }
    write = foreach_batch_writer("watched", measurement="m", tags=["k"], **settings)
    frame = spark.readStream.format("rate").option("rowsPerSecond", "5").load()
    rows = frame.selectExpr("CAST(value % 3 AS STRING) AS k", "value AS v")
    query_ = (
        rows.writeStream.foreachBatch(write)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    twophase.spark.watch_query(spark, query_, write.sink)
    config = load_config(None, **(settings | {"staging_url": staging_url}))
    staging = config.staging
    deadline = time.monotonic() + 120
    while not any(e["state"] == "COMMITTED" for e in epochs(staging_url, "watched")):
        assert time.monotonic() < deadline and query_.exception() is None
        time.sleep(0.5)
    assert ops.status(staging, "watched")[0].owner_state == "live"
    query_.stop()
    while ops.status(staging, "watched")[0].owner_state != "ended":
        assert time.monotonic() < deadline, ops.status(staging, "watched")
        time.sleep(0.2)
    ended = ops.status(staging, "watched")[0]
    assert (ended.owner_run_id, ended.owner_end_reason) == (str(query_.runId), "stopped")
    assert ops.recover(config, "watched").recovered == ()


def test_the_data_source_delivers_each_epoch_to_two_targets(
    spark: Any, tmp_path: Path, staging_url: str, influx: TargetConfig, event_files: list[Path]
) -> None:
    """The data source's commit (in a Python worker of its own) fans out: option
    ``targets`` names the dev InfluxDB and a server of the test's own, with the same
    database on both; each epoch lands in both, recorded per target. Written under the
    format's former name, which must deliver as the current one does until it goes."""
    from pyspark.sql import functions as F

    own = start_own_influx(tmp_path / "influxd", str(influx.influxdb.database))
    try:
        feed(tmp_path / "input", event_files[:2])
        lines = spark.readStream.format("text").option("maxFilesPerTrigger", "1")
        events = (
            lines.load(str(tmp_path / "input"))
            .select(F.from_json("value", "timestamp double, stream_id string").alias("e"))
            .select("e.*")
            .where("timestamp IS NOT NULL AND stream_id IS NOT NULL")
        )
        query_ = (
            events.selectExpr("stream_id", "CAST(timestamp * 1000 AS BIGINT) AS ms", "1 AS seen")
            .writeStream.format("twophase-influx")
            .options(
                sink_id="fan",
                measurement="fan",
                tags="stream_id",
                time="ms",
                precision="ms",
                staging_url=without_password(staging_url),
                influx_db=str(influx.influxdb.database),
                influx_api="v1",
                targets=f"a={influx.url},b={own.url}",
            )
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query_.awaitTermination(180)
        assert query_.exception() is None
        decided = epochs(staging_url, "fan")
        assert [e["state"] for e in decided] == ["COMMITTED", "COMMITTED"]
        other = TargetConfig(
            url=own.url, influxdb=InfluxDBSettings(api="v1", database=influx.influxdb.database)
        )
        fed = fed_points(event_files[:2], ("stream_id",))
        for each in (influx, other):  # read back, against what was fed
            assert held_points(each, "fan", ("stream_id",)) == fed
            assert influx_count(each, "fan") == len(fed)
        rows = query(
            staging_url,
            "SELECT target, count(*) FROM twophase_target_deliveries WHERE sink_id = 'fan'"
            " GROUP BY target ORDER BY target",
        )
        assert rows == [("a", 2), ("b", 2)]
    finally:
        own.stop()


@pytest.mark.parametrize("driver_staging_bytes", ["0", "4194304"])
def test_a_foreach_batch_writer_stages_the_same_points_in_tasks_or_from_the_driver(
    spark: Any, tmp_path: Path, staging_url: str, influx: TargetConfig, driver_staging_bytes: str
) -> None:
    """A batch Spark's plan puts under ``driver_staging_bytes`` is collected once and
    staged from the driver as one write; with 0, each of the batch's two partitions is
    staged by its task. Either way the target holds the rows' points, every field type
    and the timestamps as written (the driver's Arrow and the tasks' Arrow encode alike)."""
    rows = [
        f"h{i % 3},{i * 1.5},{i},{str(i % 2 == 0).lower()},s{i},2026-01-01T00:00:{i:02d}Z"
        for i in range(40)
    ]
    (tmp_path / "input").mkdir()
    for part in range(2):
        (tmp_path / "input" / f"part-{part}.csv").write_text("\n".join(rows[part::2]) + "\n")
    measurement = f"fb_{driver_staging_bytes}"
    settings = {
        "staging_url": without_password(staging_url),
        "influx_db": str(influx.influxdb.database),
        "influx_api": "v1",
        "target_url": influx.url,
        "driver_staging_bytes": driver_staging_bytes,
    }
    write = foreach_batch_writer(
        measurement, measurement=measurement, tags=["h"], time="t", **settings
    )
    schema = "h STRING, f DOUBLE, n BIGINT, b BOOLEAN, s STRING, t TIMESTAMP"
    frame = spark.readStream.schema(schema).option("maxFilesPerTrigger", "1")
    query_ = (
        frame.csv(str(tmp_path / "input"))
        .repartition(2)
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query_.awaitTermination(300)
    assert query_.exception() is None
    decided = epochs(staging_url, measurement)
    assert [e["points"] for e in decided] == [20, 20]
    assert {e["writes"] for e in decided} == ({1} if driver_staging_bytes != "0" else {2})
    held = {
        time_ns: (tags, dict(fields)) for time_ns, tags, fields in influx_rows(influx, measurement)
    }
    day = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
    assert held == {
        day + i * 10**9: (
            (("h", f"h{i % 3}"),),
            {"b": i % 2 == 0, "f": i * 1.5, "n": i, "s": f"s{i}"},
        )
        for i in range(40)
    }
