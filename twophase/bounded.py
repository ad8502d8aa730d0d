"""Memory bounds every role shares: a cache counted in bytes, and decompression with a ceiling.

[`SizedCache`][twophase.bounded.SizedCache] keeps what a hot path computes from user data
(a tag value's escaped text, a series' lane) within a byte budget: each entry's key and
value are counted, a full cache is emptied, and an entry over a small size is never kept
(a cache of large unique values would hold memory and hit nothing).
[`inflate`][twophase.bounded.inflate] and [`Inflater`][twophase.bounded.Inflater]
decompress gzip or zlib data through ``zlib.decompressobj`` with ``max_length``, so
data that inflates past a ceiling is refused
([`InflateLimitError`][twophase.errors.InflateLimitError]) having allocated at most
that ceiling, never what it would have inflated to.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Generic, TypeVar

from twophase.errors import InflateLimitError

K = TypeVar("K")
V = TypeVar("V")

# What an entry costs beyond the characters of its key and value: two str objects' headers
# (49 bytes each) and the dict's slot with the room it keeps spare (tracemalloc: 21 to 38).
ENTRY_BYTES = 160


class SizedCache(Generic[K, V]):
    """A dict of at most ``budget`` bytes, emptied when it would hold more; an entry of
    more than ``max_entry`` bytes is not kept.

    An entry's bytes are what the caller says its key and value hold (their ``len``,
    which a str keeps: characters, so text of 2- or 4-byte characters may take up to 4
    times the budget) and ``ENTRY_BYTES``. Reads go to ``entries`` itself
    (``cache.entries.get(key)``): a hit costs one dict lookup, as an unbounded dict's
    does, and a miss a ``put`` of what it computed. A full cache is emptied at once
    rather than entry by entry, oldest or least used first: the values a hot path keeps
    meeting are computed again once per fill of the budget, which it barely notices.
    Evicting the oldest entry on each miss (an ``OrderedDict``), or counting
    ``sys.getsizeof`` of each key and value, made every miss dearer (the figures:
    "Memory bounds" in ``docs/concepts/scaling.md``). Not thread-safe.
    """

    def __init__(self, budget: int, max_entry: int) -> None:
        if not 0 < max_entry <= budget:
            raise ValueError("max_entry must be positive and within the budget")
        self.budget = budget
        self.max_entry = max_entry
        self.entries: dict[K, V] = {}
        self.used = 0

    def put(self, key: K, value: V, size: int) -> V:
        """Keep ``value`` under ``key`` (a key not in ``entries``: a miss), ``size`` the
        bytes they hold, unless the entry is too large; the cache is emptied first if it
        would pass its budget. Returns ``value``."""
        size += ENTRY_BYTES
        if size > self.max_entry:
            return value
        self.used += size
        if self.used > self.budget:
            self.entries.clear()
            self.used = size
        self.entries[key] = value
        return value

    def __len__(self) -> int:
        return len(self.entries)


GZIP_WBITS = 31  # zlib's window with a gzip header and trailer
_STEP = 1 << 20  # bytes inflated per call: a ceiling is checked at least this often


def inflate(data: bytes, limit: int, what: str, wbits: int = GZIP_WBITS) -> bytes:
    """``data`` decompressed whole (gzip by default), at most ``limit`` bytes of it.

    Raises InflateLimitError, naming ``what``, as soon as the output would pass
    ``limit`` (having inflated at most ``limit`` bytes), and ``zlib.error`` for data
    that is not whole (damaged, cut, or followed by anything but another member).
    """
    inflater = Inflater(limit, what, wbits)
    out = inflater.feed(data)
    inflater.finish()
    return out


class Inflater:
    """Incremental bounded decompression: ``feed`` the compressed bytes as they come.

    gzip members end to end (as staged chunks are sent) are read as one stream.
    Memory is bounded twice: ``pieces`` inflates at most ``_STEP`` bytes at a time,
    and the total output by ``limit`` (None: no total, for a stream read piece by
    piece), past which InflateLimitError is raised before the excess is inflated.
    """

    def __init__(self, limit: int | None, what: str, wbits: int = GZIP_WBITS) -> None:
        self._limit = limit
        self._what = what
        self._wbits = wbits
        self._obj = zlib.decompressobj(wbits)
        self.total = 0

    def feed(self, data: bytes) -> bytes:
        """What ``data`` (the next compressed bytes) inflates to."""
        return b"".join(self.pieces(data))

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """What ``data`` inflates to, in pieces of at most ``_STEP`` bytes."""
        while True:
            step = _STEP if self._limit is None else min(self._limit - self.total + 1, _STEP)
            out = self._obj.decompress(data, step)
            self.total += len(out)
            if self._limit is not None and self.total > self._limit:
                raise InflateLimitError(
                    f"{self._what} inflates past {self._limit} bytes, more than its writer "
                    "could have made; refused before inflating the rest"
                )
            if out:
                yield out
            data = self._obj.unconsumed_tail
            if self._obj.eof:  # a member ended: what follows is a stream of its own
                data = self._obj.unused_data + data
                if not data:
                    return
                self._obj = zlib.decompressobj(self._wbits)
            elif not data and len(out) < step:  # all taken in, and nothing held back
                return

    def finish(self) -> None:
        """Raise ``zlib.error`` if the data fed so far ends inside a member."""
        if not self._obj.eof:
            raise zlib.error("the data ends before its compressed stream does")
