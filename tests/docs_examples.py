"""The code examples of the documentation site's getting-started and guide pages.

Each page's ```python blocks are one program, in order (a later block may use what an
earlier one made). Pages whose examples need a SparkSession get a prelude that makes
``spark`` and a streaming DataFrame ``stats`` (the columns the examples name), and an
epilogue that stops what is still running; the examples' own code runs as written.
tests/integration/test_docs_examples.py runs the pages without Spark against the test
servers, tests/e2e/test_docs_examples.py the Spark ones; tests/tooling/test_docs.py parses
every ``twophase`` command the pages show.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

# the repository root from this file (tests.support imports this module: no cycle)
DOCS = Path(__file__).resolve().parent.parent / "docs"
EXAMPLE_PAGES = sorted(
    [*DOCS.glob("getting-started/*.md"), *DOCS.glob("guides/*.md")]
)  # the examples run
SITE_PAGES = sorted(DOCS.rglob("*.md"))  # every page of the site
# the pages whose commands are checked: the examples', the concepts', the operations'
COMMAND_PAGES = [
    *EXAMPLE_PAGES,
    *sorted(DOCS.glob("concepts/*.md")),
    *sorted(DOCS.glob("operations/**/*.md")),
]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", flags=re.M | re.S)

# The names the Spark examples use: `spark`; `events`, a streaming file source over JSON
# lines the prelude writes; `aggregate(frame)`, 5-minute windows per stream and ISP; and
# `stats`, the aggregated events.
SPARK_PRELUDE = """
import json, os, pathlib
from pyspark.sql import SparkSession, functions as F

spark = (
    SparkSession.builder.master("local[2,4]")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
_input = pathlib.Path("input")
_input.mkdir(exist_ok=True)
with open(_input / "events.json", "w") as _f:
    for _i in range(200):
        _f.write(json.dumps({"stream_id": f"s{_i % 5}", "isp": ["acme", "globex"][_i % 2],
                             "ts": 1_764_072_000 + _i, "bytes": _i}) + "\\n")
events = (
    spark.readStream.schema("stream_id string, isp string, ts long, bytes long")
    .option("maxFilesPerTrigger", 1).json(str(_input))
    .withColumn("ts", F.col("ts").cast("timestamp"))
)


def aggregate(frame):
    return (
        frame.withWatermark("ts", "10 minutes")
        .groupBy(F.window("ts", "5 minutes"), "stream_id", "isp")
        .agg(F.count("*").alias("events"), F.sum("bytes").alias("bytes"))
        .select("stream_id", "isp", F.col("window.end").alias("window_end"), "events", "bytes")
    )


stats = aggregate(events)
"""

SPARK_EPILOGUE = """
for _query in spark.streams.active:
    _query.processAllAvailable()
    _query.stop()
spark.stop()
"""


# Spark's Kafka connector and a broker cannot be fetched on the test machines: the Kafka
# page's source block is replaced by a file source with the Kafka source's schema (the
# records' values, some malformed, in JSON files), and its sink half runs as written.
KAFKA_RECORDS = 300  # good events: 3 streams x 2 ISPs x 50 seconds
KAFKA_MALFORMED = ["not json", '{"isp": "acme", "ts": 1764072000}', '{"stream_id": "s1"}']
KAFKA_STAND_IN = f"""
import json as _json, pathlib as _pathlib
from pyspark.sql import functions as _F

_topic = _pathlib.Path("topic")
_topic.mkdir(exist_ok=True)
_values = [
    _json.dumps({{"stream_id": f"s{{_i % 3}}", "isp": ["acme", "globex"][_i % 2],
                 "ts": 1_764_072_000 + _i // 6, "bytes": _i}})
    for _i in range({KAFKA_RECORDS})
] + {KAFKA_MALFORMED!r}
for _file in range(3):
    with open(_topic / f"part-{{_file}}.json", "w") as _out:
        for _offset, _value in enumerate(_values[_file::3]):
            _record = {{"value": _value, "offset": _offset, "partition": _file}}
            _out.write(_json.dumps(_record) + "\\n")
kafka = (
    spark.readStream.schema("value string, offset long, partition int")
    .option("maxFilesPerTrigger", 1).json(str(_topic))
    .select(
        _F.lit(None).cast("binary").alias("key"),
        _F.col("value").cast("binary").alias("value"),
        _F.lit("telemetry").alias("topic"),
        "partition",
        "offset",
        _F.current_timestamp().alias("timestamp"),
        _F.lit(0).alias("timestampType"),
    )
)
"""


def blocks(page: Path, language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(page.read_text()) if lang == language]


def needs_spark(code: str) -> bool:
    return "spark" in re.sub(r"^\s*#.*$", "", code, flags=re.M).replace("twophase.spark", "")


def program(page: Path) -> str | None:
    """The page's Python examples as one program (with the Spark prelude where they need
    it), or None when the page has none."""
    code = "\n".join(
        KAFKA_STAND_IN if '.format("kafka")' in block else block for block in blocks(page, "python")
    )
    if not code.strip():
        return None
    if needs_spark(code) or "stats." in code:
        return SPARK_PRELUDE + code + SPARK_EPILOGUE
    return code


# The example pages with code, split by whether they need Spark: the integration tests
# run the ones without (tests/integration/test_docs_examples.py), the e2e tests the others.
PAGES_WITHOUT_SPARK = [p for p in EXAMPLE_PAGES if (code := program(p)) and not needs_spark(code)]
PAGES_WITH_SPARK = [p for p in EXAMPLE_PAGES if (code := program(p)) and needs_spark(code)]

_INLINE = re.compile(r"`(twophase [^`]+)`")
# Placeholders the pages use, and a value of the right kind for each.
_CONCRETE = {"N": "1", "E": "1", "S": "dashboard", "T": "a", "NAME": "a"}
# Inline mentions that are not whole commands: a usage pattern, a part of a command.
_NOT_A_COMMAND = re.compile(r"\[|\.\.\.|\||COMMAND|FILE|<")


def twophase_commands() -> list[tuple[str, list[str]]]:
    """Every ``twophase ...`` command in the pages' shell blocks and inline code (of the
    getting-started, guide and operations pages, and the failures), placeholders made concrete."""
    found = []
    for page in COMMAND_PAGES:
        lines = [
            line.strip().removeprefix("$ ")
            for body in blocks(page, "bash") + blocks(page, "console")
            for line in body.splitlines()
        ]
        # Inline, a command with a flag (a bare `twophase reset` names the command).
        lines += [c for c in _INLINE.findall(page.read_text()) if " --" in c]
        for line in lines:
            line = line.split(" #")[0].strip()
            if not line.startswith("twophase ") or _NOT_A_COMMAND.search(line):
                continue
            if line == "twophase --version":
                continue
            words = shlex.split(line)[1:]
            found.append((page.name, [_CONCRETE.get(w, w) for w in words]))
    return found
