"""Small epochs through one version of twophase, in a process of its own: the
``versions`` scenario runs this file in a checkout of the version measured, with that
checkout first on ``PYTHONPATH``, so it imports nothing of the bench and only what
every version since the configuration's environment names has: ``twophase.TwoPhase``,
``twophase.load_config``, ``TwoPhase.begin_run``, ``Stager.stage``, ``Committer.commit``.

The staging store and the target come from the ``TWOPHASE_*`` environment. Prints one
JSON line: the milliseconds of each measured epoch (staged and committed, one target).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any


def builtin_kinds_only() -> None:
    """Hide the installed distribution's kinds of target: its entry points name the
    modules of the checkout it was installed from, which an older version on
    ``PYTHONPATH`` may not have; such a version finds its kinds in its own table."""
    import importlib.metadata as metadata

    everything = metadata.entry_points

    def entry_points(**params: str) -> Any:
        if params.get("group") == "twophase.targets":
            return metadata.EntryPoints(())
        return everything(**params)

    metadata.entry_points = entry_points  # type: ignore[assignment]


def epoch_lines(epoch: int, points: int) -> list[str]:
    """``points`` lines of a series each, at timestamps no other epoch writes."""
    ts = 1_700_000_000_000_000_000 + epoch * 1_000_000
    return [f"fixed,s=s{i} v={epoch}i {ts + i}" for i in range(points)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sink", required=True)
    ap.add_argument("--points", type=int, default=10)
    ap.add_argument("--warm", type=int, default=20, help="epochs run before the clock")
    ap.add_argument("--epochs", type=int, default=100, help="epochs measured")
    ap.add_argument("--offset", type=int, default=0, help="epochs run by earlier processes")
    ap.add_argument("--builtin-kinds", action="store_true", help="see builtin_kinds_only")
    args = ap.parse_args()
    if args.builtin_kinds:
        builtin_kinds_only()
    from twophase import TwoPhase, load_config

    millis = []
    with TwoPhase.open(load_config()) as tp:
        lease = tp.begin_run(args.sink, uuid.uuid4().hex, "bench-versions")
        for number in range(args.warm + args.epochs):
            epoch = args.offset + number
            lines = epoch_lines(epoch, args.points)
            started = time.perf_counter()
            message = tp.stager.stage(args.sink, epoch, lines)
            outcome = tp.committer.commit(lease, epoch, [message])
            elapsed = time.perf_counter() - started
            if outcome.promoted is None or outcome.promoted.delivered != args.points:
                raise SystemExit(f"epoch {epoch}: {outcome.state}, not delivered whole")
            if number >= args.warm:
                millis.append(round(elapsed * 1000, 4))
    print(json.dumps({"ms": millis}))


if __name__ == "__main__":
    main()
