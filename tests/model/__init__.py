"""A reference model of one sink and its targets, in plain Python (no twophase import).

It says what each target must hold after any sequence of actions, the way a person
reads the protocol's pages: an epoch is decided once (its first decided point set
wins; a replay that computes other values changes nothing), and a target takes the
COMMITTED epochs in epoch order, each point key overwritten by the later epoch (last
write of a key wins). The stateful test (``tests/integration/test_stateful.py``)
drives the real implementation and this model side by side and compares them after
every step.

What the model keeps:

* the sink: the current query's decided epochs (their points), which are COMMITTED
  and which PRECOMMITTED, ``min_targets``, the number of resets;
* each target: whether it is up, its cursor (the highest epoch of the current query
  it holds), what it holds (key -> value), the keys it refuses (its dead letters);
* a clock: retention and history (compaction) pass only when the clock is moved past
  them (``expire``), so the model knows which epochs GC may purge and compact.

Each action returns what the real call must do (``Outcome``): commit, fail (fewer
than ``min_targets`` owed targets up), or skip a replay.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Value = float | str
Points = Mapping[str, Value]  # point key -> value, in the order staged

COMMITTED = "COMMITTED"
PRECOMMITTED = "PRECOMMITTED"
FAILED = "FAILED"  # nothing decided (the commit raised before its decision)
REPLAY = "REPLAY"  # an epoch decided before: nothing changes


@dataclass
class TargetModel:
    """One target of the sink."""

    name: str
    up: bool = True
    from_epoch: int = 0  # the first epoch of the current query owed to it
    delivered: set[int] = field(default_factory=set)  # epochs of the current query it holds
    holds: dict[str, Value] = field(default_factory=dict)  # what a read-back finds
    strict: bool = True  # its store refuses a string value (a float field or column)
    dead: dict[str, Value] = field(default_factory=dict)  # refused, not requeued since
    configured: bool = True  # False: the sink has it, the configuration no longer names it
    registered: bool = True  # False: not the sink's since a reset (its dead letters stay)

    def cursor(self, committed: Iterable[int]) -> int | None:
        """The highest COMMITTED epoch such that it holds every owed one up to it."""
        last = None
        for epoch in sorted(e for e in committed if e >= self.from_epoch):
            if epoch not in self.delivered:
                break
            last = epoch
        return last

    def take(self, epoch: int, points: Points) -> None:
        """Deliver an epoch (or a correction): every point it does not refuse."""
        self.delivered.add(epoch)
        for key, value in points.items():
            if self.strict and isinstance(value, str):
                self.dead[key] = value
            else:
                self.holds[key] = value


@dataclass
class SinkModel:
    """The sink as the protocol's pages describe it."""

    min_targets: int = 1
    targets: dict[str, TargetModel] = field(default_factory=dict)
    decided: dict[int, dict[str, Value]] = field(default_factory=dict)
    committed: set[int] = field(default_factory=set)
    resets: int = 0
    purged: set[int] = field(default_factory=set)  # staged points gone (past retention)
    compacted: set[int] = field(default_factory=set)  # records gone (past history)
    corrections: int = 0  # corrections decided (epochs -1, -2, ...)

    # --- targets -----------------------------------------------------------------------

    def add_target(self, name: str) -> None:
        """A target new to the sink, registered at the next claim: it is owed the epochs
        after the highest COMMITTED one (an epoch PRECOMMITTED then is owed to it)."""
        start = max(self.committed, default=-1) + 1
        self.targets[name] = TargetModel(name, from_epoch=start)

    def rename_target(self, old: str, new: str) -> None:
        """A configured target's name changed: the sink keeps the old name, which nothing
        delivers to any more (it holds GC back until removed), and gets a new one (same
        store, so it holds what the old name held); the old name keeps its letters."""
        before = self.targets[old]
        self.add_target(new)
        fresh = self.targets[new]
        fresh.holds, fresh.strict, fresh.up = dict(before.holds), before.strict, before.up
        before.configured, before.up = False, False

    def remove_target(self, name: str) -> None:
        """Removed from the sink (``twophase targets remove``): its dead letters go with
        it, and it holds nothing back any more."""
        del self.targets[name]

    def set_up(self, name: str, up: bool) -> None:
        self.targets[name].up = up

    def owed(self, epoch: int) -> list[TargetModel]:
        return [t for t in self.targets.values() if t.configured and t.from_epoch <= epoch]

    def up_targets(self) -> list[TargetModel]:
        return [t for t in self.targets.values() if t.up]

    # --- epochs ----------------------------------------------------------------------

    @property
    def pending(self) -> list[int]:
        return sorted(e for e in self.decided if e not in self.committed)

    def last_committed(self) -> int | None:
        return max((e for e in self.committed if e >= 0), default=None)

    def decide(self, epoch: int, points: Points) -> bool:
        """The vote: False for a replay (the first decided point set stays)."""
        if epoch in self.decided or epoch in self.compacted:
            return False
        self.decided[epoch] = dict(points)
        return True

    def promote(self, epoch: int) -> bool:
        """Send the epoch to every owed target that is up and lacks it (a lagging one is
        caught up first, in epoch order); COMMITTED once ``min_targets`` owed hold it
        (all of them when fewer are owed)."""
        owed = self.owed(epoch)
        for target in owed:
            if target.up:
                self._catch_up(target, below=epoch)
                if epoch not in target.delivered:
                    target.take(epoch, self.decided[epoch])
        holding = sum(1 for t in owed if epoch in t.delivered)
        if holding >= min(self.min_targets, len(owed)) and (holding or not owed):
            self.committed.add(epoch)
            return True
        return False

    def recover(self) -> bool:
        """Promote the PRECOMMITTED epochs in order; False at the first that fails."""
        return all(self.promote(epoch) for epoch in self.pending)

    def commit(self, epoch: int, points: Points) -> str:
        """A run's commit: recover what is pending, decide, promote."""
        if not self.recover():
            return FAILED
        if not self.decide(epoch, points):
            return REPLAY
        return COMMITTED if self.promote(epoch) else PRECOMMITTED

    def catch_up(self) -> None:
        """Every target that is up takes the COMMITTED epochs it lacks, in order."""
        for target in self.up_targets():
            self._catch_up(target)

    def _catch_up(self, target: TargetModel, below: int | None = None) -> None:
        for epoch in sorted(self.committed):
            if below is not None and epoch >= below:
                break
            if epoch >= target.from_epoch and epoch not in target.delivered:
                if epoch in self.purged:
                    target.delivered.add(epoch)  # skipped: its points are gone
                    continue
                target.take(epoch, self.decided[epoch])

    # --- operators -------------------------------------------------------------------

    def requeue(self, name: str) -> bool:
        """A correction of the target's dead letters: the keys it accepts now land on it
        (their latest staged value); the others become dead letters again. False when
        there is nothing to requeue."""
        target = self.targets[name]
        if not target.dead:
            return False
        values, target.dead = dict(sorted(target.dead.items())), {}
        self.corrections += 1
        correction = -self.corrections
        target.take(correction, values)
        return True

    def retained(self) -> list[int]:
        """The COMMITTED epochs whose points GC has not purged, in order (corrections,
        whose purge the model does not follow, left out)."""
        return sorted(e for e in self.committed if e >= 0 and e not in self.purged)

    def resend(self, order: Iterable[str]) -> bool:
        """``twophase resend`` of every retained epoch, to the targets named in
        ``order``, one after the other: each takes the epochs it holds again, in order
        (what it refused before and takes now lands; its dead letter stays listed).
        False when it stops at a target that is down and holds one of them (the targets
        after it get nothing), or when it is refused: no epoch is retained, or one is
        PRECOMMITTED."""
        retained = self.retained()
        if not retained or self.pending:  # refused: nothing to send, or recover first
            return False
        for name in order:
            target = self.targets[name]
            epochs = [e for e in retained if e in target.delivered]
            if epochs and not target.up:
                return False
            for epoch in epochs:
                for key, value in self.decided[epoch].items():
                    if not (target.strict and isinstance(value, str)):
                        target.holds[key] = value
        return True

    def reset(self) -> None:
        """A new query: the epochs and the targets' cursors are forgotten; the targets
        keep what they hold and the configured ones are registered again at the next
        claim, from epoch 0 (a name the configuration no longer has is the sink's no
        more)."""
        if self.pending:
            raise ValueError("reset refused while epochs are PRECOMMITTED")
        self.resets += 1
        self.decided, self.committed = {}, set()
        self.purged, self.compacted = set(), set()
        for target in self.targets.values():
            target.delivered, target.from_epoch = set(), 0
            target.registered = target.configured

    def expire(self) -> None:
        """The clock moved past retention and history, and GC ran: the staged points of
        every COMMITTED epoch that every target holds go; the records go too, in epoch
        order up to the first epoch some target lacks, and never the last COMMITTED
        epoch's (a target added later starts after it)."""
        done = sorted(e for e in self.committed if e >= 0)
        for epoch in done:
            if not self._lacking(epoch):
                self.purged.add(epoch)
        for epoch in done:
            if epoch >= done[-1] or epoch not in self.purged:
                break
            self.compacted.add(epoch)

    def _lacking(self, epoch: int) -> bool:
        return any(
            epoch >= t.from_epoch and epoch not in t.delivered
            for t in self.targets.values()
            if t.registered
        )

    def floor(self) -> int | None:
        """The highest compacted epoch (every epoch up to it is compacted)."""
        return max(self.compacted, default=None)

    # --- what the targets must hold ----------------------------------------------------

    def expected(self, name: str) -> dict[str, Value]:
        return dict(self.targets[name].holds)

    def caught_up(self, name: str) -> bool:
        target = self.targets[name]
        owed = [e for e in self.committed if e >= target.from_epoch]
        return all(e in target.delivered for e in owed)
