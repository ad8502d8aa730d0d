"""What every bench job shares, without twophase: its options, its Spark session, and
the CSV input of the one-point-per-row pipelines (``host_stats``: a timestamp, tags
``host`` and ``region``, fields of four types)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

CSV_SCHEMA = (
    "time TIMESTAMP, host STRING, region STRING, cpu DOUBLE, requests BIGINT, "
    "healthy BOOLEAN, status STRING"
)
MEASUREMENT = "host_stats"


def parse_args(argv: Sequence[str], *extra: str) -> argparse.Namespace:
    """``--input --checkpoint [--max-files-per-trigger N] [--master M]`` and ``extra``
    options taking a value (``--sink-id``...)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--max-files-per-trigger", type=int, default=1)
    ap.add_argument("--master", help="when started with python (spark-submit: its --master)")
    for name in extra:
        ap.add_argument(name, required=True)
    return ap.parse_args(argv)


def session(args: argparse.Namespace, app: str) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(args.master) if args.master else SparkSession.builder
    spark = (
        builder.appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


def read_csv(spark: Any, args: argparse.Namespace) -> Any:
    """The CSV files, ``--max-files-per-trigger`` a micro-batch; quotes doubled inside
    quoted values, as Python's csv module and spreadsheets write them."""
    return (
        spark.readStream.schema(CSV_SCHEMA)
        .option("header", "true")
        .option("escape", '"')
        .option("maxFilesPerTrigger", args.max_files_per_trigger)
        .csv(args.input)
    )
