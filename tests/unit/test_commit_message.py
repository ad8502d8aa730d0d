"""The commit message's format version: an executor's message of another version (a newer
format, or a twophase from before the version) is refused by the driver with a message
naming both versions, before anything is decided; never an AttributeError."""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import Any

import pytest

from twophase.errors import PermanentError
from twophase.model import COMMIT_MESSAGE_FORMAT, CommitMessage
from twophase.spark import driver_commit
from twophase.spark.foreach import message_of
from twophase.spark.options import parse_options
from twophase.spark.source import TwoPhaseCommitMessage, TwoPhaseStreamWriter

MESSAGE = CommitMessage(
    sink_id="dash",
    epoch=4,
    write_id="4a0d3c52-6f0e-4a8c-9d5e-2b8f5d0c7e11",
    partition_id=1,
    attempt=0,
    points=10,
    rejected=0,
    checksum="0" * 32,
    run_id="r1",
    query_id="q1",
    store="postgresql+psycopg://u@localhost/db",
)
SAME_VERSION = "run the same twophase version on the driver and the executors"


@pytest.fixture(autouse=True)
def no_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers named by the sink are not there: the check comes before any use."""
    monkeypatch.setenv("TWOPHASE_STAGING_URL", "postgresql+psycopg://u@localhost/db")
    monkeypatch.setenv("TWOPHASE_TARGET_URL", "http://localhost:8086")

    def reached(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the commit reached the store")

    monkeypatch.setattr(driver_commit, "two_phase", reached)


def newer_pickle() -> bytes:
    """A message as a newer twophase (format 2, one more field) pickles it."""
    newer = replace(MESSAGE, format=COMMIT_MESSAGE_FORMAT + 1)
    object.__setattr__(newer, "spooled_bytes", 1024)
    return pickle.dumps(newer)


def unversioned_pickle() -> bytes:
    """A message as a twophase from before the format field pickled it: the same class,
    its state without ``format`` (these bytes are what such a twophase writes)."""
    old = object.__new__(CommitMessage)
    old.__dict__.update({k: v for k, v in vars(MESSAGE).items() if k != "format"})
    data = pickle.dumps(old)
    assert b"format" not in data
    return data


def test_a_message_carries_the_format_and_round_trips() -> None:
    assert MESSAGE.format == COMMIT_MESSAGE_FORMAT == 1
    again = message_of(pickle.dumps(MESSAGE))
    assert again == MESSAGE and again.check_format() is again


@pytest.mark.parametrize(
    ("data", "found"),
    [
        (newer_pickle(), "commit message format 2 from an executor"),
        (unversioned_pickle(), "commit message format 0 (unversioned: an older twophase)"),
    ],
    ids=["newer", "unversioned"],
)
def test_the_foreach_batch_commit_refuses_another_format(data: bytes, found: str) -> None:
    message = message_of(data)  # loads: the format is the commit's to judge
    sink = parse_options({"sink_id": "dash", "measurement": "m"})
    with pytest.raises(PermanentError) as caught:
        driver_commit.commit_epoch(sink, 4, [message], ("r1", "q1"))
    text = str(caught.value)
    assert found in text and f"this driver reads format {COMMIT_MESSAGE_FORMAT}" in text
    assert SAME_VERSION in text


@pytest.mark.parametrize("data", [newer_pickle(), unversioned_pickle()], ids=["newer", "old"])
def test_the_data_source_commit_refuses_another_format(data: bytes) -> None:
    """Spark unpickles the data source's messages itself; the commit checks them."""
    shipped = TwoPhaseCommitMessage(pickle.loads(data))
    writer = TwoPhaseStreamWriter(parse_options({"sink_id": "dash", "measurement": "m"}))
    with pytest.raises(PermanentError, match=r"format \d.* this driver reads format 1"):
        writer.commit([shipped], 4)


def test_a_message_this_twophase_cannot_load_is_refused_by_name() -> None:
    """A class an executor's twophase has and this one lacks: PermanentError, saying so."""
    data = b"ctwophase.model\nCommitMessageV9\n."
    with pytest.raises(PermanentError, match=rf"cannot read a commit message.*{SAME_VERSION}"):
        message_of(data)
    with pytest.raises(PermanentError, match="returned dict, not a commit message"):
        message_of(pickle.dumps({"write_id": "w"}))
