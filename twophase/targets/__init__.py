"""Kinds of target: the small interface a store implements to receive a sink's epochs.

* [`twophase.targets.contract`][twophase.targets.contract]: ``TargetKind`` (what a kind
  declares: its URL schemes, what a re-sent epoch does on its store, its writer and
  its read-back), ``TargetWriter``, ``EpochWriter`` (a transactional kind's epoch in
  one transaction) and ``Readback`` (how ``verify`` reads a target);
* [`twophase.targets.registry`][twophase.targets.registry]: kinds found through the
  ``twophase.targets`` entry-point group, a target's kind told by its URL's scheme or
  by ``target_kind``.
"""

from __future__ import annotations

from twophase.targets.contract import (
    OVERWRITE,
    TRANSACTION,
    EpochWriter,
    Readback,
    TargetKind,
    TargetWriter,
)
from twophase.targets.registry import ENTRY_POINT_GROUP, kind_of, kinds, make_readback, make_writer

__all__ = [
    "ENTRY_POINT_GROUP",
    "OVERWRITE",
    "TRANSACTION",
    "EpochWriter",
    "Readback",
    "TargetKind",
    "TargetWriter",
    "kind_of",
    "kinds",
    "make_readback",
    "make_writer",
]
