"""What a kind of target is: the contract between the protocol and a store.

A kind is a [`TargetKind`][twophase.targets.contract.TargetKind]: a name, the URL schemes
that tell it, what a re-sent epoch does on its store, a factory of writers and one of
read-backs. The protocol needs nothing else of a store:

* Staged chunks are line protocol, the neutral interchange: a writer is handed bodies
  of line protocol (ns precision, gzip members end to end when ``gzipped``); a kind
  whose store wants rows parses them
  ([`twophase.points.lineproto.parse_line`][twophase.points.lineproto.parse_line]).
* Every failure is raised classified, whatever the store: ``TransientWriteError``
  (may pass: retried with backoff), ``BatchTooLargeError`` (the body is split),
  ``BadPointsError`` with the store's reason (the body is taken apart; the refused
  lines become the target's dead letters), ``TargetAuthError``,
  ``TargetNotFoundError`` or ``TargetRequestError`` (retrying cannot help), and, for a
  transactional kind, ``TransactionLostError`` (the epoch starts over). Secrets never
  appear in a message.
* What a re-sent epoch does is declared, not assumed (``resend``):
  [`OVERWRITE`][twophase.targets.contract.OVERWRITE] (a re-sent body changes nothing: the
  store overwrites a point with itself, as InfluxDB does) or
  [`TRANSACTION`][twophase.targets.contract.TRANSACTION] (the writer is an
  [`EpochWriter`][twophase.targets.contract.EpochWriter]: an epoch's bodies and a record
  that it was delivered commit in one transaction, and a re-sent epoch is skipped by
  that record, when it names the epoch's generation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from twophase.config import TargetConfig

__all__ = ["OVERWRITE", "TRANSACTION", "EpochWriter", "Readback", "TargetKind", "TargetWriter"]

OVERWRITE = "overwrite"  # a re-sent body changes nothing on the store
TRANSACTION = "transaction"  # an epoch commits whole, once, with its delivered record


class TargetWriter(Protocol):
    """Sends bodies of line protocol to one target, one attempt per call.

    ``write`` never retries: the sender
    ([`twophase.targets.sender`][twophase.targets.sender]) retries, splits and bisects.
    For a kind that overwrites, the same body written again (a retry, a promotion
    repeated after a crash, an operator's resend) changes nothing. Thread-safe when
    the kind allows several lanes (an overwriting kind's lanes write at once).
    """

    def write(self, body: bytes, gzipped: bool = False) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class EpochWriter(Protocol):
    """A transactional kind's writer: one epoch's bodies inside one transaction.

    ``begin`` opens the transaction for the sink's epoch on this target. It returns
    None when the epoch is to be sent, or, when the target's own record says the epoch
    was delivered already *in this generation*, the ``(delivered, rejected)`` counts
    that record holds (then nothing is sent and no transaction stays open).
    ``generation`` numbers the sink's epoch numbers on this target, as the staging store
    gives it: a ``twophase reset`` (the next query numbers its epochs from 0 again) and
    a ``targets resync --from-epoch`` start a new one. The record is keyed on it with
    the sink, the target and the epoch, and a record of another generation is inert:
    it never skips an epoch (the staging store cannot clear a record kept in the
    target's own store). ``again`` (an operator's resend)
    sends the epoch even so: its record is replaced at the commit. ``write`` adds a
    body to the open transaction (refused lines raise ``BadPointsError`` and leave the
    transaction as it was before that body). ``commit`` records the epoch as delivered
    with its counts and commits: the epoch's rows and its record become visible
    together, or not at all. ``rollback`` ends an open transaction without a trace
    (safe to call when none is open). A lost connection raises
    ``TransactionLostError`` from any step (``EpochStartOverError`` when the writer
    ended the transaction on purpose: the epoch is sent again at once). No step waits
    without bound on what other sessions hold: it fails, as one that may pass, so that
    a held-up target lags rather than holds the commit. One epoch at a time: the epoch
    is sent over one lane.

    Idempotent: an epoch delivered twice in one generation is committed once; the
    second ``begin`` finds its record.
    """

    def begin(
        self, sink_id: str, epoch: int, target: str, again: bool = False, *, generation: int = 0
    ) -> tuple[int, int] | None: ...

    def write(self, body: bytes, gzipped: bool = False) -> None: ...

    def commit(self, delivered: int, rejected: int) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...


class Readback(Protocol):
    """How ``twophase verify`` reads a target back, a window at a time.

    ``window`` gives the points of one measurement between two times (inclusive, ns)
    as series: ``{"name": measurement, "tags": {...}, "columns": ["time", field...],
    "values": [[time_ns, value...], ...]}``, lazily when it can, a series possibly in
    several pieces; empty tags and null fields may be left out. ``probe`` fails at once
    when the store cannot be read (unreachable, refused, or unsupported: a
    ``PermanentError`` saying so).
    """

    def window(self, measurement: str, start: int, end: int) -> Iterable[dict[str, Any]]: ...

    def probe(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class TargetKind:
    """A kind of target, registered under ``name`` in the ``twophase.targets``
    entry-point group ([`twophase.targets.registry`][twophase.targets.registry]).

    ``schemes``: the URL schemes that tell this kind when ``target_kind`` is ``auto``
    (a scheme belongs to one kind). ``resend``: ``OVERWRITE`` or ``TRANSACTION``.
    ``writer`` and ``readback`` make a target's writer and read-back from its settings
    (an ``EpochWriter`` for a transactional kind). ``check`` refuses settings the kind
    cannot work with, as ``ConfigError`` naming the setting, before anything is sent.
    ``time_resolution_ns``: the finest time the store keeps (PostgreSQL: 1,000, a
    microsecond); verify compares times at that resolution. ``lanes``: whether a
    target of this kind may take an epoch over several connections at once.
    """

    name: str
    schemes: tuple[str, ...]
    resend: str
    writer: Callable[[TargetConfig], TargetWriter]
    readback: Callable[[TargetConfig], Readback]
    check: Callable[[TargetConfig], None] = lambda config: None
    time_resolution_ns: int = 1

    def __post_init__(self) -> None:
        if self.resend not in (OVERWRITE, TRANSACTION):
            raise ValueError(f"kind {self.name!r}: resend must be {OVERWRITE!r} or {TRANSACTION!r}")

    @property
    def transactional(self) -> bool:
        return self.resend == TRANSACTION

    @property
    def lanes(self) -> bool:
        return not self.transactional
