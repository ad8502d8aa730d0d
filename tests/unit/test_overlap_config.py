"""``promotion = overlap`` needs a driver that runs while the tasks stage: the data-source
sink (``format("twophase-influx")``), whose driver side runs only once they are done,
refuses it when Spark asks for its writer, naming the option; inline is accepted."""

from __future__ import annotations

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from twophase.errors import ConfigError
from twophase.spark.source import TwoPhaseInfluxDataSource, TwoPhaseStreamWriter

SCHEMA = StructType(
    [
        StructField("k", StringType()),
        StructField("v", LongType()),
        StructField("time", TimestampType()),
    ]
)
# Servers named but never reached: the writer is refused, or made, before any connection.
OPTIONS = {
    "sink_id": "s",
    "measurement": "m",
    "tags": "k",
    "staging_url": "postgresql+psycopg://u@localhost/db",
    "target_url": "http://localhost:8086",
}


def test_the_data_source_refuses_overlap_naming_promotion() -> None:
    source = TwoPhaseInfluxDataSource({**OPTIONS, "promotion": "overlap"})
    with pytest.raises(ConfigError) as caught:
        source.streamWriter(SCHEMA, False)
    assert caught.value.option == "promotion"
    assert str(caught.value).startswith("promotion: overlap ")
    assert "foreachBatch adapter" in str(caught.value)  # the way out


def test_the_data_source_accepts_inline() -> None:
    source = TwoPhaseInfluxDataSource({**OPTIONS, "promotion": "inline"})
    assert isinstance(source.streamWriter(SCHEMA, False), TwoPhaseStreamWriter)
