"""Deterministic line protocol for the bench: the same lines for both sides of a comparison.

Lines look like what ``jobs/session_metrics.py`` writes (measurement
``stream_stats``, tags ``isp`` and ``stream_id``, four integer fields) and
are byte-identical to what :class:`twophase.points.builder.PointBuilder` makes from
such rows (sorted tags and fields, ``i`` suffix, nanosecond time). 300 series
(100 streams x 3 ISPs). Each ``seed`` owns its own 1000-second time range, so
two epochs never write the same point unless they use the same seed.
"""

from __future__ import annotations

from collections.abc import Iterator

BASE_NS = 1_700_000_000_000_000_000  # 2023-11-14T22:13:20Z
SEED_SPAN_NS = 1_000 * 1_000_000_000
STEP_NS = 1_000  # between consecutive points of an epoch (1M points span one second)
ISPS = ("acme", "globex", "initech")
STREAMS = 100
MEASUREMENT = "stream_stats"


def line(i: int, start_ns: int) -> str:
    """Point ``i`` of an epoch whose first point is at ``start_ns``."""
    return (
        f"{MEASUREMENT},isp={ISPS[i % 3]},stream_id=s{(i // 3) % STREAMS} "
        f"bytes_cdn={i * 7 % 100_000}i,bytes_p2p={i * 13 % 100_000}i,"
        f"events={i % 500}i,users={i % 97}i {start_ns + i * STEP_NS}"
    )


def start_of(seed: int) -> int:
    return BASE_NS + seed * SEED_SPAN_NS


def iter_lines(count: int, seed: int) -> Iterator[str]:
    """The ``count`` lines of epoch ``seed``, lazily (bounded memory)."""
    start = start_of(seed)
    return (line(i, start) for i in range(count))


def epoch_lines(count: int, seed: int) -> list[str]:
    """The same lines, prebuilt (so building them is outside every timing)."""
    return list(iter_lines(count, seed))


class Seeds:
    """Hands out fresh seeds, so no two measured epochs of a run overwrite each other."""

    def __init__(self, first: int = 0) -> None:
        self._next = first

    def take(self) -> int:
        seed = self._next
        self._next += 1
        return seed
