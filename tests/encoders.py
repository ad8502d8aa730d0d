"""The staging path's two encoders, for tests that run on both: the row builder over
rows, and the columnar encoder over the same rows as Arrow record batches."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from twophase.points.builder import PointBuilder, Rejected
from twophase.points.columnar import ColumnarEncoder

ENCODERS = ("rows", "columnar")


def as_batches(rows: list[dict[str, Any]]) -> list[Any]:
    """The rows as Arrow batches: each run of rows with the same columns one batch; a
    run Arrow cannot hold (mixed or unsupported types) a batch per row, and a row it
    cannot hold stays a mapping (the encoder takes both)."""
    data: list[Any] = []
    for _, run in itertools.groupby(rows, key=lambda row: tuple(row)):
        group = list(run)
        try:
            data.append(pa.RecordBatch.from_pylist(group))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            data += [_batch_or_row(row) for row in group]
    return data


def _batch_or_row(row: dict[str, Any]) -> Any:
    try:
        return pa.RecordBatch.from_pylist([row])
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return row


def encode(
    builder: PointBuilder, rows: list[dict[str, Any]], encoder: str
) -> Iterator[str | Rejected]:
    """``builder``'s items for ``rows`` through ``encoder`` (one of ENCODERS)."""
    if encoder == "rows":
        return builder.convert(rows)
    return ColumnarEncoder(builder).convert(as_batches(rows))
