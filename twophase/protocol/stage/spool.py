"""A spool: what one staging call has encoded, kept so that the call can be repeated.

A task's input (Spark's row iterator) can be read only once, and a staging
call reads it inside its COPY. To repeat the call after a lost connection
without reading the input again, the stager keeps every chunk it encodes
(and every rejected row) here as it goes, and a repeat reads the spool.

Records are kept in named parts (the chunks, the rejected rows), each read
back in the order it was added. The first ``memory`` bytes of records (as
the caller sizes them) stay in memory; past them a part's records go,
pickled, to a temporary file of its own, created in ``directory`` (the
system's temporary directory when None). The files have no name from the
moment they are made, so nothing is left behind even when the process is
killed; [`Spool.close`][twophase.protocol.stage.spool.Spool.close] frees them.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Iterator
from typing import IO, Any


class _Part:
    """One part's records: those in memory first, then those in its file."""

    def __init__(self) -> None:
        self.memory: list[Any] = []
        self.file: IO[bytes] | None = None


class Spool:
    """Records in parts, in memory up to ``memory`` bytes in all, then in temporary files.

    Not thread-safe: one staging call uses it.
    """

    def __init__(self, memory: int, directory: str | None = None) -> None:
        self._memory = memory
        self._directory = directory
        self._used = 0
        self._parts: dict[str, _Part] = {}

    @property
    def spilled(self) -> bool:
        """Whether any record went to a file."""
        return any(part.file is not None for part in self._parts.values())

    def add(self, name: str, record: Any, size: int) -> None:
        """Append ``record`` (about ``size`` bytes in memory) to part ``name``."""
        part = self._parts.setdefault(name, _Part())
        # Once a part has a file every later record goes there: memory, then file, is
        # the part's order.
        if part.file is None and self._used + size <= self._memory:
            part.memory.append(record)
            self._used += size
            return
        if part.file is None:
            part.file = tempfile.TemporaryFile(dir=self._directory)  # noqa: SIM115 close()
        part.file.seek(0, os.SEEK_END)  # a read may have moved it (one call per record)
        pickle.dump(record, part.file, protocol=pickle.HIGHEST_PROTOCOL)

    def read(self, name: str) -> Iterator[Any]:
        """The records of part ``name`` in the order they were added."""
        part = self._parts.get(name)
        if part is None:
            return
        yield from part.memory
        if part.file is not None:
            yield from _records(part)

    def close(self) -> None:
        for part in self._parts.values():
            if part.file is not None:
                part.file.close()
        self._parts.clear()
        self._used = 0

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _records(part: _Part) -> Iterator[Any]:
    """The records of a part's file, from its start; records added while this reads are
    read too (each load starts where the last one ended)."""
    file = part.file
    assert file is not None
    offset = 0
    while offset < file.seek(0, os.SEEK_END):
        file.seek(offset)
        record = pickle.load(file)
        offset = file.tell()
        yield record
