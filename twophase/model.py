"""The protocol's value types, shared by the executor side and the driver side.

Everything here is a frozen, picklable value (Spark ships commit messages
from executors to the driver) or a pure helper both sides must agree on
([`LineChecksum`][twophase.model.LineChecksum]). No I/O; of twophase it imports only the
errors, the bounds ([`twophase.bounded`][twophase.bounded]) and one constant of the settings.

Words (``docs/concepts/design.md``): a *sink* is one output; an *epoch* one
micro-batch of it (Spark's ``batchId``); a *write* one task attempt's staged
output for an epoch; a *run* one start of a query. A Spark *replay* is an
epoch Spark runs again after a crash; an operator's *resend* sends
COMMITTED epochs to a target again.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import struct
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from types import ModuleType
from typing import Any

from twophase.bounded import GZIP_WBITS, inflate
from twophase.config.settings import MAX_CHUNK_CHARS
from twophase.errors import ConfigError, InflateLimitError, PermanentError


class EpochState(str, Enum):
    """An epoch's state; a ``str`` so that the database keeps plain text.

    ``(none) -> PRECOMMITTED -> COMMITTED``, or ``PRECOMMITTED -> ABORTED`` by an
    operator's decision only.
    """

    PRECOMMITTED = "PRECOMMITTED"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"

    def __str__(self) -> str:  # the text, in messages and f-strings, on every Python
        return self.value


class Phase(str, Enum):
    """Where a dead letter was refused: at stage time (a row) or by a target (a point)."""

    STAGE = "stage"
    PROMOTE = "promote"

    def __str__(self) -> str:
        return self.value


def check_sink_id(sink_id: str, option: str = "sink_id") -> str:
    """``sink_id`` if PostgreSQL can hold it as text; ConfigError naming ``option`` if not.

    Any other text is data (quotes, SQL, any length): statements are parameterised.
    """
    if not isinstance(sink_id, str) or not sink_id:
        raise ConfigError(option, "must be a non-empty string")
    if "\x00" in sink_id:
        raise ConfigError(option, "contains a NUL character, which PostgreSQL text cannot hold")
    try:
        sink_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(option, "contains a lone surrogate, which is not valid UTF-8") from None
    return sink_id


@dataclass(frozen=True)
class Lease:
    """A run's claim on a sink. ``token`` is the fencing token of that run (I5)."""

    sink_id: str
    run_id: str
    query_id: str | None
    token: int


# The version of CommitMessage's fields. Spark pickles a message on an executor and
# unpickles it on the driver, which may run another twophase during an upgrade: the
# driver refuses a version it does not read rather than misread it.
COMMIT_MESSAGE_FORMAT = 1
UNVERSIONED = 0  # a message pickled by a twophase from before the format field


@dataclass(frozen=True)
class CommitMessage:
    """What a task tells the driver about its write (picklable; Spark ships it).

    ``format`` is [`COMMIT_MESSAGE_FORMAT`][twophase.model.COMMIT_MESSAGE_FORMAT] of the
    twophase that made it; the driver checks it (`check_format`).
    """

    sink_id: str
    epoch: int
    write_id: str
    partition_id: int
    attempt: int
    points: int
    rejected: int
    checksum: str
    run_id: str | None = None
    query_id: str | None = None
    store: str | None = None  # the staging store it went to (masked URL), to name a mismatch
    format: int = COMMIT_MESSAGE_FORMAT

    def __setstate__(self, state: Any) -> None:
        """Unpickling: a message pickled without ``format`` is
        [`UNVERSIONED`][twophase.model.UNVERSIONED] (the
        class's default would pass it off as this version)."""
        values: dict[str, Any] = {"format": UNVERSIONED}
        for part in state if isinstance(state, tuple) else (state,):  # (dict, slots) too
            values.update(part or {})
        self.__dict__.update(values)

    def check_format(self) -> CommitMessage:
        """The message itself if this twophase reads its format; PermanentError if not."""
        if self.format != COMMIT_MESSAGE_FORMAT:
            made = " (unversioned: an older twophase)" if self.format == UNVERSIONED else ""
            raise PermanentError(
                f"commit message format {self.format}{made} from an executor, this driver "
                f"reads format {COMMIT_MESSAGE_FORMAT}: run the same twophase version on the "
                "driver and the executors"
            )
        return self


@dataclass(frozen=True)
class DeadLetter:
    """A row (phase ``stage``) or point (phase ``promote``) that was not delivered, and why.

    ``id`` and ``created_at`` are the store's: None until the letter is recorded.
    """

    sink_id: str
    epoch: int
    write_id: str
    seq: int
    phase: Phase
    reason: str
    payload: str
    id: int | None = None
    created_at: datetime | None = None
    requeued_in: int | None = None  # the correction (epoch -n) that carried it again
    target: str = ""  # the target that refused the point ("": none, a stage-time letter)


@dataclass(frozen=True)
class WriteRef:
    """One decided write of an epoch: what promotion must read back (I1)."""

    write_id: str
    points: int
    checksum: str


@dataclass(frozen=True)
class EpochPlan:
    """The fixed writes of one decided epoch, in promotion order (I1, I4)."""

    sink_id: str
    epoch: int
    writes: tuple[WriteRef, ...]


class LineChecksum:
    """Order-sensitive digest of a write's staged chunks as stored; staging and
    promotion must agree (I1).

    ``add_joined(a + "\\n" + b)`` hashes what ``add(a); add(b)`` does, so the
    lines of a text chunk may be hashed one by one or a chunk at a time. A
    compressed chunk is hashed as its gzip member (``add_joined(chunk.stored)``):
    the bytes sent are the bytes checked.
    """

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)

    def add(self, line: str) -> None:
        self._hash.update(line.encode("utf-8"))
        self._hash.update(b"\n")

    def add_joined(self, data: bytes) -> None:
        """Add lines already joined by newlines and encoded as UTF-8 (or a chunk's
        gzip member)."""
        self._hash.update(data)
        self._hash.update(b"\n")

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def chunk_digest(write_id: str | uuid.UUID, first_seq: int, points: int, stored: bytes) -> bytes:
    """A staged chunk's digest: blake2b of its bytes as stored (``StagedChunk.stored``),
    bound to its write (the salt), its first seq and its count of lines (the
    personalisation), so that a chunk moved to another place, or whose count was
    changed, no longer matches. One pass over the bytes, as the write's checksum."""
    salt = (write_id if isinstance(write_id, uuid.UUID) else uuid.UUID(write_id)).bytes
    person = struct.pack(">qq", first_seq, points)
    return hashlib.blake2b(stored, digest_size=16, salt=salt, person=person).digest()


# One gzip member per chunk, at level 1: line protocol repeats its measurements and tag
# keys, so the cheapest level already takes most of the bytes out, and every staged point
# pays an executor's CPU for it; a higher level takes little more for several times the
# CPU. ISA-L's deflate (python-isal, in the spark extra) writes the same format several
# times faster than zlib (docs/performance.md); zlib where it is not installed. A member
# of either inflates the same.
GZIP_LEVEL = 1


def _deflate_module() -> ModuleType:
    try:
        from isal import isal_zlib
    except ImportError:  # the spark extra installs it
        return zlib
    return isal_zlib


_deflate = _deflate_module()
_GZIP_MAGIC = b"\x1f\x8b\x08"
_GZIP_MIN = 20  # header, an empty deflate block and the trailer


# The longest line staged (a longer one is a dead letter at staging): as long as the most a
# chunk of several lines holds, so no staged chunk inflates past MAX_CHUNK_BYTES.
MAX_LINE_BYTES = 4 * MAX_CHUNK_CHARS
MAX_CHUNK_BYTES = MAX_LINE_BYTES + 1  # a member holds its lines and one newline more


def gzip_member(data: bytes) -> bytes:
    """``data`` as one gzip member (no name, no time: the same bytes every time)."""
    compressor = _deflate.compressobj(GZIP_LEVEL, zlib.DEFLATED, GZIP_WBITS)
    member: bytes = compressor.compress(data) + compressor.flush()
    return member


@dataclass(frozen=True)
class StagedChunk:
    """Consecutive staged lines of one write, stored as one line-protocol body.

    The lines are kept in one of two forms. ``body`` (compression ``none``):
    the ``points`` lines joined by newlines. ``gz`` (compression ``gzip``):
    the same text and one newline more, as one gzip member -- what promotion
    sends as it is, since members joined end to end are one gzip stream of
    the chunks' lines. Exactly one of them is set. Line ``i`` has staged seq
    ``first_seq + i``. ``ends`` is None when no line holds a newline of its
    own -- the newlines are then the line boundaries -- and otherwise gives,
    for each line, the offset just past its newline in ``text + "\\n"``.
    (Storing ``ends`` for every chunk cost a good share of staging's CPU, for
    bounds the newlines already give: the study "No line bounds" in
    ``git show f5c61bb^:bench/README.md``.)
    """

    write_id: str
    first_seq: int
    points: int
    ends: Sequence[int] | None
    body: str | None
    lane: int = 0  # its promotion lane (twophase.protocol.stage.lanes)
    gz: bytes | None = None
    # its digest as staged (chunk_digest), checked before it is sent (I1); None: staged
    # before chunks had one, covered by its write's checksum alone
    checksum: bytes | None = None

    @classmethod
    def of_lines(
        cls,
        write_id: str,
        first_seq: int,
        lines: Sequence[str],
        lane: int = 0,
        *,
        compressed: bool = False,
    ) -> StagedChunk:
        body = "\n".join(lines)
        ends = None
        if body.count("\n") != len(lines) - 1:  # some line holds a newline: keep its bounds
            ends = list(itertools.accumulate(len(line) + 1 for line in lines))
        if compressed:
            gz = gzip_member(body.encode("utf-8") + b"\n")
            return cls(write_id, first_seq, len(lines), ends, None, lane, gz)
        return cls(write_id, first_seq, len(lines), ends, body, lane)

    @property
    def compressed(self) -> bool:
        return self.gz is not None

    @property
    def stored(self) -> bytes:
        """The chunk's lines as stored, sent and checksummed (I1): the gzip member, or
        the body in UTF-8 (encoded at each call: not kept beside the text)."""
        if self.gz is not None:
            return self.gz
        assert self.body is not None
        return self.body.encode("utf-8")

    @property
    def size(self) -> int:
        """Bytes of the lines joined by newlines, uncompressed (a request's size); a gzip
        member's trailer holds it (ISIZE), so nothing is decompressed."""
        if self.gz is None:
            return len(self.stored)
        return int.from_bytes(self.gz[-4:], "little") - 1

    @functools.cached_property
    def text(self) -> str:
        """The lines joined by newlines (a compressed chunk is decompressed, once).

        A gzip member is inflated to at most the size its trailer records (what the
        writer compressed, never over ``MAX_CHUNK_BYTES``): one that would inflate
        further is refused there (InflateLimitError), before the rest is allocated."""
        if self.body is not None:
            return self.body
        assert self.gz is not None
        recorded = self._recorded()
        try:
            return inflate(self.gz, recorded, "its gzip member").decode("utf-8")[:-1]
        except InflateLimitError as exc:  # damaged, or not what its writer made
            raise InflateLimitError(self._damaged(f"{exc} (its trailer's size)").args[0]) from None
        except (zlib.error, UnicodeDecodeError) as exc:
            raise self._damaged(f"its gzip member does not decompress ({exc})") from None

    def _recorded(self) -> int:
        """The bytes the gzip member's trailer says it holds (ISIZE); PermanentError when
        that is more than any staged chunk holds."""
        assert self.gz is not None
        recorded = int.from_bytes(self.gz[-4:], "little")
        if recorded > MAX_CHUNK_BYTES:
            raise InflateLimitError(
                f"staged chunk of write {self.write_id} at seq {self.first_seq} is damaged: "
                f"its gzip member records {recorded} bytes, more than a staged chunk holds "
                f"({MAX_CHUNK_BYTES}); not inflated"
            )
        return recorded

    @functools.cached_property
    def _lines(self) -> list[str]:
        text = self._fitting(self.text) if self.compressed else self.text
        if self.ends is None:
            return text.split("\n")
        starts = [0, *self.ends[:-1]]
        return [text[a : b - 1] for a, b in zip(starts, self.ends, strict=True)]

    def line(self, index: int) -> str:
        return self._lines[index]

    def lines(self, start: int = 0, stop: int | None = None) -> list[str]:
        return self._lines[start:stop]

    def check(self) -> StagedChunk:
        """The chunk itself, if its line bounds fit its body (PermanentError otherwise).

        A compressed chunk is not decompressed here: its form is checked, and its
        lines when they are read (its bytes are checksummed as they are sent, I1)."""
        if self.gz is None:
            self._fitting(self.text)
        elif not (
            self.body is None
            and self.points > 0
            and len(self.gz) >= _GZIP_MIN
            and self.gz.startswith(_GZIP_MAGIC)
        ):
            raise self._damaged("it is not one gzip member of its lines")
        else:
            self._recorded()
        return self

    def _fitting(self, text: str) -> str:
        if self.ends is None:
            fits = self.points > 0 and text.count("\n") == self.points - 1
        else:
            fits = len(self.ends) == self.points > 0 and self.ends[-1] == len(text) + 1
        if not fits:
            raise self._damaged(
                f"{self.points} line(s) do not fit its body of {len(text)} characters"
            )
        return text

    def _damaged(self, why: str) -> PermanentError:
        return PermanentError(
            f"staged chunk of write {self.write_id} at seq {self.first_seq} is damaged: {why}"
        )
