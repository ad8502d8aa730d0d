"""What every metric gets: the plan, scratch databases, fresh seeds, shared open parts."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.lines import Seeds
from bench.plan import Plan
from bench.servers import Scratch, Servers, scratch
from bench.sides import DirectSide
from twophase.protocol.commit.runtime import TwoPhase

MAIN = "main"  # the staging database of metrics 1, 2, 4 and 5
TP_INFLUX, DIRECT_INFLUX = "tp", "direct"  # one InfluxDB database per side, same points


@dataclass
class Context:
    plan: Plan
    scratch: Scratch
    seeds: Seeds = field(default_factory=Seeds)
    started: float = field(default_factory=time.monotonic)
    _tp: TwoPhase | None = None
    _direct: DirectSide | None = None

    def log(self, message: str) -> None:
        print(f"[bench {time.monotonic() - self.started:6.1f}s] {message}", file=sys.stderr)

    def tp(self) -> TwoPhase:
        """The protocol's parts over the main staging database and the twophase InfluxDB db."""
        if self._tp is None:
            self._tp = TwoPhase.open(self.scratch.config(MAIN, TP_INFLUX))
        return self._tp

    def direct(self) -> DirectSide:
        if self._direct is None:
            self._direct = DirectSide(self.scratch.influx(DIRECT_INFLUX))
        return self._direct

    def close(self) -> None:
        if self._tp is not None:
            self._tp.close()
            self._tp = None
        if self._direct is not None:
            self._direct.close()
            self._direct = None


def run_alone(plan: Plan, measure: Callable[[Context], dict[str, Any]]) -> int:
    """One metric run by itself (``python -m bench <metric>``), against scratch databases
    of its own: its results printed as JSON."""
    with scratch(Servers.from_env()) as made:
        ctx = Context(plan, made)
        try:
            result = measure(ctx)
        finally:
            ctx.close()
    print(json.dumps(result, indent=2))
    return 0
