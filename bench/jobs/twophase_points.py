"""One point per CSV row through twophase, as the README writes it.

::

    python bench/jobs/twophase_points.py --input DIR --checkpoint DIR --sink-id ID \
        --writer source|foreach

``source``: ``format("twophase")``, the data source; ``foreach``:
``foreachBatch(twophase.spark.foreach_batch_writer(...))``. The target (InfluxDB or
PostgreSQL) and the staging store come from ``TWOPHASE_*``. Trigger availableNow; the
run's end recorded with ``end_query``.
"""

from __future__ import annotations

import sys
from typing import Any

from bench.jobs.common import MEASUREMENT, parse_args, read_csv, session


def main() -> int:
    import twophase.spark

    args = parse_args(sys.argv[1:], "--sink-id", "--writer")
    spark = session(args, f"twophase-points-{args.writer}")
    stream = read_csv(spark, args).writeStream
    if args.writer == "foreach":
        writer: Any = twophase.spark.foreach_batch_writer(
            args.sink_id, measurement=MEASUREMENT, tags=["host", "region"], time="time"
        )
        stream = stream.foreachBatch(writer)
    else:
        twophase.spark.register(spark)
        writer = {"sink_id": args.sink_id, "measurement": MEASUREMENT, "tags": "host,region"}
        writer["time"] = "time"
        stream = stream.format("twophase").options(**writer)
    query = stream.option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start()
    twophase.spark.claim_query(query, writer)
    query.awaitTermination()
    twophase.spark.end_query(query, writer)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
