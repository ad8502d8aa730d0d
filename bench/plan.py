"""How much to measure: the quick plan (under two minutes) and the full plan."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """Sizes and repeat counts of one run. Every figure in the results names its plan."""

    name: str
    # metric 1: epoch size -> repeats per side
    throughput: tuple[tuple[int, int], ...]
    # metric 2: 10-point epochs per side
    fixed_epochs: int
    # metric 3: committed epochs already in the store, points retained per such epoch,
    # measured 10-point epochs per store
    history: tuple[int, int]
    history_points: int
    history_epochs: int
    # metric 4: epoch sizes whose promotion's peak RSS is measured, repeats per side
    memory_sizes: tuple[int, ...]
    memory_repeats: int
    # metric 5: PRECOMMITTED epochs x points each, repeats per side
    recovery_epochs: int
    recovery_points: int
    recovery_repeats: int
    # metric 6: Spark runs per side and setting (0: not run; at least 3 when run)
    spark_repeats: int
    # metric 8: (epoch size, epochs in a row, repeats per side)
    background: tuple[tuple[int, int, int], ...]
    # metric 9 (run with metric 6, repeats spark_repeats): events (= points) per file,
    # files per trigger, micro-batches per run
    spark_raw: tuple[int, int, int]
    # metric 10: (epoch size, epochs in a row, repeats per side), 20 ms from InfluxDB,
    # over a link of unlimited bandwidth and over one of 100 Mbit/s
    roundtrip: tuple[int, int, int]
    # metric 11: (points of the staging task, repeats per side)
    stage_memory: tuple[int, int]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(size for size, _ in self.throughput)


QUICK = Plan(
    name="quick",
    throughput=((1_000, 7), (10_000, 5), (100_000, 3), (1_000_000, 1)),
    fixed_epochs=40,
    history=(100, 10_000),
    history_points=10,
    history_epochs=30,
    memory_sizes=(10_000, 1_000_000),
    memory_repeats=1,
    recovery_epochs=20,
    recovery_points=50_000,
    recovery_repeats=1,
    spark_repeats=0,
    background=((100_000, 10, 1), (1_000_000, 2, 1)),
    roundtrip=(500_000, 1, 1),  # ten sides: about a minute
    spark_raw=(50_000, 6, 8),  # as in full mode: it runs only with --spark
    stage_memory=(1_000_000, 1),
)

FULL = Plan(
    name="full",
    throughput=((1_000, 15), (10_000, 9), (100_000, 5), (1_000_000, 3)),
    fixed_epochs=200,
    history=(100, 10_000),
    history_points=100,
    history_epochs=100,
    memory_sizes=(10_000, 1_000_000),
    memory_repeats=3,
    recovery_epochs=20,
    recovery_points=50_000,
    recovery_repeats=3,
    spark_repeats=3,
    background=((100_000, 10, 3), (1_000_000, 10, 3)),
    roundtrip=(1_000_000, 3, 3),
    spark_raw=(50_000, 6, 8),
    stage_memory=(1_000_000, 3),
)
