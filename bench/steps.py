"""``python -m bench steps [--points N] [--writes W] [--repeats R]``: where one epoch's time goes.

Times each step of one twophase epoch of N points staged as W writes (as W
Spark tasks would) on scratch databases -- stage (COPY), decide, a
read-only pass over the staged chunks (in one query, and with a query per
write as promotion did at first), promote (send + mark) -- and the
direct side's send of the same lines, R times, printing one line per
repeat. The findings in ``bench/README.md`` quote it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from bench.context import MAIN, TP_INFLUX, Context
from bench.lines import epoch_lines
from bench.plan import QUICK
from bench.servers import Servers, scratch


def one_epoch(ctx: Context, points: int, writes: int, epoch: int) -> dict[str, float]:
    tp, direct = ctx.tp(), ctx.direct()
    lines = epoch_lines(points, ctx.seeds.take())
    lease = tp.begin_run("bench-steps", f"run-{epoch}", "steps")
    times = {"stage": time.perf_counter()}
    messages = [
        tp.stager.stage("bench-steps", epoch, lines[part::writes], partition_id=part)
        for part in range(writes)
    ]
    times["decide"] = time.perf_counter()
    tp.ledger.decide(lease, epoch, messages)
    times["read_only"] = time.perf_counter()
    chunks = sum(1 for _ in tp.reader.chunks_of([m.write_id for m in messages]))
    times["read_per_write"] = time.perf_counter()  # a cursor per write, as before 0002
    assert chunks == sum(1 for m in messages for _ in tp.reader.chunks_of([m.write_id]))
    times["promote"] = time.perf_counter()
    tp.promoter.promote(lease, epoch)
    times["direct_send"] = time.perf_counter()
    direct.run(lines)
    times["end"] = time.perf_counter()
    marks = list(times.values())
    spans = {name: marks[i + 1] - marks[i] for i, name in enumerate(list(times)[:-1])}
    return {**spans, "chunks": chunks}


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench steps", description=__doc__)
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--writes", type=int, default=1, help="staged writes (tasks) per epoch")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    with scratch(Servers.from_env()) as made:
        ctx = Context(QUICK, made)
        made.config(MAIN, TP_INFLUX)
        try:
            for epoch in range(args.repeats):
                spans = one_epoch(ctx, args.points, args.writes, epoch)
                print(
                    " ".join(
                        f"{k} {v:.3f}" if k != "chunks" else f"({v:g} chunks)"
                        for k, v in spans.items()
                    )
                )
        finally:
            ctx.close()
    return 0
