"""One point per CSV row through ``format("twophase")``, as the README writes it.

::

    python bench/jobs/twophase_points.py --input DIR --checkpoint DIR --sink-id ID

The target (InfluxDB or PostgreSQL) and the staging store come from ``TWOPHASE_*``.
Trigger availableNow; the run's end recorded with ``end_query``.
"""

from __future__ import annotations

import sys

from bench.jobs.common import MEASUREMENT, parse_args, read_csv, session


def main() -> int:
    import twophase.spark

    args = parse_args(sys.argv[1:], "--sink-id")
    spark = session(args, "twophase-points")
    twophase.spark.register(spark)
    opts = {"sink_id": args.sink_id, "measurement": MEASUREMENT, "tags": "host,region"}
    opts["time"] = "time"
    query = (
        read_csv(spark, args)
        .writeStream.format("twophase")
        .options(**opts)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    twophase.spark.claim_query(query, opts)
    query.awaitTermination()
    twophase.spark.end_query(query, opts)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
