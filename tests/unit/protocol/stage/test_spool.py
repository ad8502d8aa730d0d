"""The spool a staging call keeps its encoded chunks and rejected rows in: memory up to
its bound, then a temporary file per part, read back in order, and nothing left after."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from twophase.protocol.stage.spool import Spool


def open_files_in(folder: Path) -> list[str]:
    """This process's open files in ``folder`` (the spool's have no name there)."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(folder)):
            found.append(target)
    return found


def test_records_stay_in_memory_up_to_the_bound_then_go_to_a_file(tmp_path: Path) -> None:
    with Spool(memory=100, directory=str(tmp_path)) as spool:
        for n in range(2):
            spool.add("chunks", f"record {n}", 50)
        assert not spool.spilled and open_files_in(tmp_path) == []
        for n in range(2, 6):
            spool.add("chunks", f"record {n}", 50)
        assert spool.spilled and len(open_files_in(tmp_path)) == 1
        assert list(spool.read("chunks")) == [f"record {n}" for n in range(6)]
        assert list(tmp_path.iterdir()) == []  # the file has no name
    assert open_files_in(tmp_path) == []


def test_parts_share_the_bound_and_keep_their_own_order(tmp_path: Path) -> None:
    with Spool(memory=10, directory=str(tmp_path)) as spool:
        spool.add("chunks", "c0", 8)
        spool.add("rejects", ["r0"], 8)  # over the shared bound: to a file of its own
        spool.add("chunks", "c1", 8)
        spool.add("rejects", ["r1"], 1)  # would fit, but the part went to its file: order
        spool.add("chunks", "c2", 1)
        assert list(spool.read("chunks")) == ["c0", "c1", "c2"]
        assert list(spool.read("rejects")) == [["r0"], ["r1"]]
        assert list(spool.read("none")) == []
        assert len(open_files_in(tmp_path)) == 2


def test_a_part_reads_the_same_every_time_and_records_added_after_a_read(
    tmp_path: Path,
) -> None:
    """A repeat reads the spool again, in part, then the stager adds what it encodes next."""
    records = [{"seq": n, "body": "x" * n} for n in range(20)]
    with Spool(memory=0, directory=str(tmp_path)) as spool:
        for record in records[:10]:
            spool.add("chunks", record, 100)
        cut = spool.read("chunks")
        assert [next(cut) for _ in range(3)] == records[:3]  # an attempt cut mid-way
        spool.add("chunks", records[10], 100)  # added while a read is under way
        assert list(cut) == records[3:11]
        for record in records[11:]:
            spool.add("chunks", record, 100)
        assert list(spool.read("chunks")) == records
        assert list(spool.read("chunks")) == records


@pytest.mark.parametrize("memory", [0, 1_000, 10**9])
def test_whatever_the_bound_everything_comes_back(tmp_path: Path, memory: int) -> None:
    bodies = ["\n".join(f"m,k={n} v={i}i {i}" for i in range(n)) for n in range(1, 60)]
    with Spool(memory=memory, directory=str(tmp_path)) as spool:
        for body in bodies:
            spool.add("chunks", body, len(body))
        assert list(spool.read("chunks")) == bodies
        assert spool.spilled == (memory < sum(map(len, bodies)))


def test_close_frees_the_files_and_an_exception_closes_too(tmp_path: Path) -> None:
    spool = Spool(memory=0, directory=str(tmp_path))
    spool.add("chunks", "a", 1)
    spool.add("rejects", ["b"], 1)
    assert len(open_files_in(tmp_path)) == 2
    spool.close()
    assert open_files_in(tmp_path) == [] and list(spool.read("chunks")) == []
    with pytest.raises(RuntimeError), Spool(memory=0, directory=str(tmp_path)) as failing:
        failing.add("chunks", "a", 1)
        raise RuntimeError("the staging call failed")
    assert open_files_in(tmp_path) == []


def test_without_a_directory_the_system_temporary_directory_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with Spool(memory=0) as spool:
        spool.add("chunks", "a", 1)
        assert len(open_files_in(tmp_path)) == 1
        assert list(spool.read("chunks")) == ["a"]


def test_in_a_spark_task_the_spool_goes_to_one_of_sparks_local_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from twophase.spark.staging_task import local_dir

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{first},{tmp_path / 'gone'},{second}")
    assert {local_dir() for _ in range(64)} == {str(first), str(second)}  # spread over both
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "gone"))
    assert local_dir() is None
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    assert local_dir() is None  # not in Spark: the system's temporary directory
