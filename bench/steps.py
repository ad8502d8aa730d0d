"""``python -m bench.steps [--points N] [--repeats R]``: where one epoch's time goes.

Times each step of one twophase epoch on scratch databases -- stage (COPY),
decide, a read-only pass over the staged chunks, promote (send + mark) --
and the direct side's send of the same lines, R times, printing one line
per repeat. The findings in ``bench/README.md`` quote it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from bench.context import MAIN, TP_INFLUX, Context
from bench.lines import epoch_lines
from bench.plan import QUICK
from bench.servers import Servers, scratch


def one_epoch(ctx: Context, points: int, epoch: int) -> dict[str, float]:
    tp, direct = ctx.tp(), ctx.direct()
    lines = epoch_lines(points, ctx.seeds.take())
    lease = tp.ledger.begin_run("bench-steps", f"run-{epoch}", "steps")
    times = {"stage": time.perf_counter()}
    message = tp.stager.stage("bench-steps", epoch, lines)
    times["decide"] = time.perf_counter()
    tp.ledger.decide(lease, epoch, [message])
    times["read_only"] = time.perf_counter()
    chunks = sum(1 for _ in tp.reader.chunks(message.write_id))
    times["promote"] = time.perf_counter()
    tp.promoter.promote(lease, epoch)
    times["direct_send"] = time.perf_counter()
    direct.run(lines)
    times["end"] = time.perf_counter()
    marks = list(times.values())
    spans = {name: marks[i + 1] - marks[i] for i, name in enumerate(list(times)[:-1])}
    return {**spans, "chunks": chunks}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.steps", description=__doc__)
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    with scratch(Servers.from_env()) as made:
        ctx = Context(QUICK, made)
        made.config(MAIN, TP_INFLUX)
        try:
            for epoch in range(args.repeats):
                spans = one_epoch(ctx, args.points, epoch)
                print(
                    " ".join(f"{k} {v:.3f}" if k != "chunks" else f"({v:g} chunks)"
                             for k, v in spans.items())
                )  # fmt: skip
        finally:
            ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
