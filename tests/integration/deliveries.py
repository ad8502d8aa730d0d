"""What the crash driver's target was sent, request by request (a recording fault proxy in
front of it: ``devkit.faultproxy``), checked against what the protocol allows.

A target's read-back cannot show a point delivered twice (InfluxDB overwrites it with
itself), so the crash matrices read the recording instead. Each epoch's points reach a
target exactly once, except where a kill leaves an epoch decided with some of its
requests acknowledged and its delivery not recorded (its mark, or a target's delivery
record, uncommitted): that epoch alone may be sent again, whole and in its order (I4),
after the restart. A point the target refuses is taken apart (bisection): its requests
are refused (4xx), and each good point of the refused body is in one acknowledged part,
so the acknowledged requests hold each point once all the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from devkit.faultproxy import FaultProxy, Recorded, wait_until
from tests.integration.crash_driver import PARTITIONS, POINTS_PER_PARTITION, epoch_lines
from twophase.config import TargetConfig

_BASE_NS = 1_600_000_000_000_000_000  # the crash driver's times: see epoch_lines
_EPOCH_NS = 10_000_000_000
WHOLE = PARTITIONS * POINTS_PER_PARTITION  # the points of an epoch a target takes


@dataclass(frozen=True)
class Recording:
    """A target behind a fault proxy that records every write request: the target's
    settings pointed at the proxy (``target``), and the proxy."""

    target: TargetConfig
    proxy: FaultProxy


@contextlib.contextmanager
def recorded(influx: TargetConfig) -> Iterator[Recording]:
    """``influx`` behind a recording fault proxy, while inside."""
    with FaultProxy.for_url(influx.url) as proxy:
        proxy.record = True
        yield Recording(dataclasses.replace(influx, url=proxy.url), proxy)


def settled(proxy: FaultProxy) -> list[Recorded]:
    """What ``proxy`` recorded, once a killed or finished client's connections are closed
    (what it sent before it died read to the end)."""
    assert wait_until(lambda: proxy.open_connections == 0, 30, 0.02), "a connection stays open"
    return proxy.recorded()


def epoch_of(line: bytes) -> int:
    """The crash driver's epoch of a line, from its time."""
    return (int(line.rsplit(b" ", 1)[1]) - _BASE_NS) // _EPOCH_NS


def points(epoch: int) -> list[bytes]:
    """The points of ``epoch`` a target takes, in the order one lane sends them (its
    writes in partition order, each write's lines in order; the refused point left
    out). Never perturbed: the driver perturbs only what was already decided."""
    lines = [line for p in range(PARTITIONS) for line in epoch_lines(epoch, p)]
    return [line.encode() for line in lines if '"' not in line]


def _epoch(request: Recorded) -> int:
    epochs = {epoch_of(line) for line in request.lines}
    assert len(epochs) == 1, f"a request holds points of epochs {sorted(epochs)}"
    return epochs.pop()


def by_epoch(requests: Sequence[Recorded]) -> dict[int, list[Recorded]]:
    """The requests of each epoch, in the order they came (each holds one epoch's)."""
    found: dict[int, list[Recorded]] = {}
    for request in requests:
        found.setdefault(_epoch(request), []).append(request)
    return found


def acknowledged(requests: Sequence[Recorded]) -> dict[int, int]:
    """Per epoch, the points of the acknowledged requests: where a kill landed."""
    return {
        epoch: sum(len(r.lines) for r in each if r.acknowledged)
        for epoch, each in sorted(by_epoch(requests).items())
    }


@dataclass(frozen=True)
class Landing:
    """Where a kill landed, read from what the target acknowledged before it: every
    epoch before ``epoch`` whole, and ``low`` to ``high`` points of ``epoch`` (a range:
    other lanes' requests still under way at the kill may have been answered)."""

    epoch: int
    low: int
    high: int | None = None  # None: ``low`` exactly

    def check(self, before: Sequence[Recorded]) -> None:
        got = acknowledged(before)
        high = self.low if self.high is None else self.high
        whole = {e: len(points(e)) for e in range(self.epoch)}
        landed = got.get(self.epoch, 0)
        assert {e: n for e, n in got.items() if e != self.epoch} == whole, (self, got)
        assert self.low <= landed <= high, (self, got)


def check_deliveries(
    before: Sequence[Recorded],
    after: Sequence[Recorded],
    epochs: int,
    resend: int | None,
    ordered: bool = True,
) -> None:
    """AssertionError unless ``before`` (what a killed run sent) then ``after`` (what its
    restart sent) deliver each of ``epochs`` epochs once; ``resend``, the epoch the kill
    left with part of it acknowledged and its delivery unrecorded, may have been sent
    before in part, and then again whole after. ``ordered``: one lane, whose requests go
    in the epoch's order (several lanes keep the order of each series only)."""
    first, then = by_epoch(before), by_epoch(after)
    assert set(first) | set(then) <= set(range(epochs)), (sorted(first), sorted(then))
    for epoch in range(epochs):
        sent = [r for r in first.get(epoch, []) if r.acknowledged]
        again = [r for r in then.get(epoch, []) if r.acknowledged]
        if epoch == resend and first.get(epoch) and then.get(epoch):
            _whole(epoch, again, ordered, "re-sent after the restart")
            _part(epoch, sent, ordered)
        else:
            if first.get(epoch) and then.get(epoch):
                raise AssertionError(
                    f"epoch {epoch} sent before the kill and again after it, which only"
                    f" epoch {resend} may be"
                )
            _whole(epoch, sent + again, ordered, "delivered")


def _lines(requests: Sequence[Recorded]) -> list[bytes]:
    return [line for r in requests for line in r.lines]


def _whole(epoch: int, requests: Sequence[Recorded], ordered: bool, what: str) -> None:
    got, want = _lines(requests), points(epoch)
    twice = [line for line, n in Counter(got).items() if n > 1]
    assert not twice, f"epoch {epoch} {what}: {len(twice)} point(s) twice, e.g. {twice[0]!r}"
    missing, extra = Counter(want) - Counter(got), Counter(got) - Counter(want)
    assert not missing and not extra, (
        f"epoch {epoch} {what}: {sum(missing.values())} point(s) missing,"
        f" {sum(extra.values())} not its own"
    )
    _in_order(epoch, got, ordered, what)


def _part(epoch: int, requests: Sequence[Recorded], ordered: bool) -> None:
    """Before the kill: each point of the epoch at most once, in order."""
    got = _lines(requests)
    over = Counter(got) - Counter(points(epoch))
    assert not over, (
        f"epoch {epoch} before the kill: {sum(over.values())} point(s) twice or not its own"
    )
    _in_order(epoch, got, ordered, "before the kill")


def _in_order(epoch: int, got: list[bytes], ordered: bool, what: str) -> None:
    """``got`` in the epoch's order (several lanes: each series in its order)."""
    taken = set(got)
    want = [line for line in points(epoch) if line in taken]
    if ordered:
        assert got == want, f"epoch {epoch} {what}: its points out of their order"
    else:  # a series goes over one lane
        assert _by_series(got) == _by_series(want), f"epoch {epoch} {what}: a series out of order"


def _by_series(lines: list[bytes]) -> dict[bytes, list[bytes]]:
    series: dict[bytes, list[bytes]] = {}
    for line in lines:
        series.setdefault(line.split(b" ", 1)[0], []).append(line)
    return series
