"""Following a directory of arriving files (data.follow): files written while the stream reads are read in name order
once complete, half-written ones never; a resumed stream, also on another worker count and after older files were
deleted, equals the uninterrupted one; 2 workers under horovodrun take the same files."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

import tf_fusedrec  # noqa: F401

from tests.data.test_file_readers import FORMATS, _small_schema, _write
from tf_fusedrec.data.files import FilePosition
from tf_fusedrec.data.follow import Follower, FollowSettings, Listing, name_hash
from tf_fusedrec.data.readers import FileBatches

pytest.importorskip("pyarrow")

FAST = FollowSettings(poll_seconds=0.02, idle_timeout_seconds=0.5)


def _records(first, n):
    return [{"user": i, "city": f"c{i % 3}", "tags": list(range(i % 3)), "x": i / 2, "y": float(i % 2)}
            for i in range(first, first + n)]


def _land(fmt, directory, name, first, n):
    """Writes records first.. first + n - 1 as `name` the way a committer does: under a hidden name, then renamed."""
    hidden = directory / f".{name}.inprogress"
    _write(fmt, hidden, _records(first, n))
    os.rename(hidden, directory / name)


def _follow(fmt, directory, batch_size=3, settings=FAST, **kw):
    return FileBatches(fmt, str(directory), _small_schema(fmt), batch_size, follow=settings, **kw)


def _users(batches):
    return [int(u) for f, _ in batches for u in f["user"].numpy()]


@pytest.mark.parametrize("fmt", FORMATS)
def test_files_written_while_reading_are_read_in_name_order(tmp_path, fmt):
    _land(fmt, tmp_path, f"part-000.{fmt}", 0, 7)
    reader = _follow(fmt, tmp_path, settings=FollowSettings(poll_seconds=0.02, idle_timeout_seconds=2.0))
    it = iter(reader.dataset())
    got = [next(it)]  # the stream has started on the first file

    def writer():
        for k, (first, n) in enumerate([(7, 5), (12, 9), (21, 4)], start=1):
            time.sleep(0.1)
            _land(fmt, tmp_path, f"part-{k:03d}.{fmt}", first, n)

    thread = threading.Thread(target=writer)
    thread.start()
    got += list(it)  # ends 2 s after the last file
    thread.join()
    assert _users(got) == list(range(24))  # 25 records: the last one is not a whole batch
    assert reader.position_after(len(got)) == FilePosition(0, 3, 3, 0, name_hash(f"part-003.{fmt}"))


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_incomplete_files_are_not_read(tmp_path, fmt):
    _land(fmt, tmp_path, f"a.{fmt}", 0, 6)
    _write(fmt, tmp_path / f".b.{fmt}.inprogress", _records(6, 6))  # Flink's in-progress part file
    (tmp_path / "_temporary" / "0").mkdir(parents=True)
    _write(fmt, tmp_path / "_temporary" / "0" / f"c.{fmt}", _records(12, 6))  # Spark's task output before commit
    half = tmp_path / f".d.{fmt}"
    _write(fmt, half, _records(18, 6))
    half.write_bytes(half.read_bytes()[: half.stat().st_size // 2])  # a half-written file under a hidden name
    assert _users(_follow(fmt, tmp_path).dataset()) == list(range(6))


def test_marker_makes_a_partition_complete(tmp_path):
    for hour in ("00", "01"):
        (tmp_path / f"hour={hour}").mkdir()
    _write("parquet", tmp_path / "hour=00" / "part-0.parquet", _records(0, 6))
    _write("parquet", tmp_path / "hour=01" / "part-0.parquet", _records(6, 6))
    (tmp_path / "hour=00" / "_SUCCESS").touch()
    marker = FollowSettings(poll_seconds=0.02, idle_timeout_seconds=0.5, marker="_SUCCESS")
    assert _users(_follow("parquet", tmp_path, settings=marker).dataset()) == list(range(6))
    (tmp_path / "hour=01" / "_SUCCESS").touch()
    assert _users(_follow("parquet", tmp_path, settings=marker).dataset()) == list(range(12))


def test_listing_and_late_files(tmp_path):
    for name in ("b.csv", "d.csv", "_SUCCESS", ".c.csv.crc"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "e.csv").write_text("x")
    assert [n for n, _ in Listing(str(tmp_path)).complete()] == ["b.csv", "d.csv", "sub/e.csv"]
    assert [n for n, _ in Listing(str(tmp_path / "*.csv")).complete()] == ["b.csv", "d.csv"]
    follower = Follower(Listing(str(tmp_path / "*.csv")), FollowSettings(0.01, 0.05))
    assert follower.next_after(None)[0] == "b.csv"
    assert follower.next_after("b.csv")[0] == "d.csv"
    (tmp_path / "c.csv").write_text("x")  # sorts before d.csv, which was taken: late
    assert follower.next_after("d.csv") is None
    assert follower.late == ["c.csv"]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_resume_after_new_files_equals_the_uninterrupted_stream(tmp_path, fmt, batches_equal):
    parts = [(0, 10), (10, 7), (17, 11), (28, 8)]
    whole_dir, dir_ = tmp_path / "whole", tmp_path / "resumed"
    whole_dir.mkdir()
    dir_.mkdir()
    for k, (first, n) in enumerate(parts):
        _land(fmt, whole_dir, f"part-{k}.{fmt}", first, n)
    whole = list(_follow(fmt, whole_dir, skip_records=2).dataset())
    assert _users(whole) == list(range(2, 35))

    for k, (first, n) in enumerate(parts[:2]):
        _land(fmt, dir_, f"part-{k}.{fmt}", first, n)
    first = _follow(fmt, dir_, skip_records=2)
    it = iter(first.dataset())
    for _ in range(4):
        next(it)
    position = first.position_after(4)  # 2 + 12 records: 4 into the second file
    assert position == FilePosition(0, 1, 4, 0, name_hash(f"part-1.{fmt}"))
    for k, (first_record, n) in enumerate(parts[2:], start=2):  # new files arrive; the first one is deleted
        _land(fmt, dir_, f"part-{k}.{fmt}", first_record, n)
    os.remove(dir_ / f"part-0.{fmt}")
    resumed = list(_follow(fmt, dir_, position=position, skip_records=2).dataset())
    assert len(resumed) == len(whole) - 4
    for a, b in zip(whole[4:], resumed):
        batches_equal(a, b)


def test_resume_on_another_worker_count_reads_each_record_once(tmp_path):
    for k, (first, n) in enumerate([(0, 10), (10, 7), (17, 11)]):
        _land("parquet", tmp_path, f"part-{k}.parquet", first, n)
    two = [_follow("parquet", tmp_path, 2, rank=r, num_ranks=2) for r in range(2)]
    read = []
    for reader in two:
        it = iter(reader.dataset())
        read += _users([next(it) for _ in range(3)])  # 3 steps of 2 x 2 records
    assert two[0].position_after(3) == two[1].position_after(3) == FilePosition(0, 1, 2, 0, name_hash("part-1.parquet"))
    one = _follow("parquet", tmp_path, 5, position=two[0].position_after(3))
    read += _users(one.dataset())
    assert sorted(read) == list(range(12 + 15))  # 16 records left: 3 batches of 5, 1 left for a later run


def test_a_resumed_file_must_still_be_there(tmp_path):
    _land("csv", tmp_path, "part-0.csv", 0, 4)
    position = FilePosition(0, 3, 1, 0, name_hash("gone.csv"))
    reader = _follow("csv", tmp_path, position=position, settings=FollowSettings(0.01, 0.1))
    with pytest.raises(Exception, match="not among the complete files"):
        list(reader.dataset())
    with pytest.raises(ValueError, match="written by a run that did not follow"):
        _follow("csv", tmp_path, position=FilePosition(0, 1, 3))


def test_two_workers_agree_on_the_files(tmp_path):
    """horovodrun -np 2: both workers follow a directory that a thread fills while they read; they take the same
    files (the same positions after every batch) and together read every record of the whole batches once."""
    from tests.subprocess_runner import execute, tail, worker_command

    pytest.importorskip("horovod.tensorflow")
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out.mkdir()
    parts = [(0, 9), (9, 14), (23, 5), (28, 12)]
    _land("parquet", data, "part-0.parquet", *parts[0])
    script = os.path.join(os.path.dirname(__file__), "follow_scenario.py")
    result = {}

    def run():
        result["run"] = execute(worker_command([script, "--data", data, "--out", out], 2), timeout=240,
                                merge_stderr=True)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 200
    while not (out / "started0").exists() or not (out / "started1").exists():  # both read the first batch
        assert time.monotonic() < deadline and thread.is_alive(), result.get("run")
        time.sleep(0.1)
    for k, part in enumerate(parts[1:], start=1):
        time.sleep(0.3)
        _land("parquet", data, f"part-{k}.parquet", *part)
    thread.join()
    rc, log, _ = result["run"]
    assert rc == 0, tail(log)
    ranks = [np.load(out / f"rank{r}.npz") for r in range(2)]
    np.testing.assert_array_equal(ranks[0]["positions"], ranks[1]["positions"])
    assert ranks[0]["positions"][-1].tolist() == [0, 3, 8, 0, name_hash("part-3.parquet")]
    users = np.concatenate([ranks[0]["users"], ranks[1]["users"]])
    assert sorted(users.tolist()) == list(range(36))  # 40 records, global batches of 2 x 3: 36
    assert ranks[0]["users"][:3].tolist() == [0, 2, 4]


def test_follow_config_keys(tmp_path):
    from tf_fusedrec.config import parse_config

    raw = {"name": "t", "features": [{"name": n, "dim": 4, "combiner": "sum"} for n in ("user", "city", "tags")],
           "data": {"source": "parquet", "path": str(tmp_path), "follow": True, "poll_seconds": 0.5,
                    "idle_timeout_seconds": 60, "follow_marker": "_SUCCESS", "schema": {
                        "label": "y", "dense": ["x"], "features": {"user": {}, "city": {"type": "string"},
                                                                   "tags": {"shape": "list"}}}}}
    data = parse_config(raw).data
    assert (data.follow, data.poll_seconds, data.idle_timeout_seconds, data.follow_marker) == \
        (True, 0.5, 60, "_SUCCESS")
    for change, match in [({"poll_seconds": 0}, "config.data.poll_seconds: must be a number in \\(0, 3600\\]"),
                          ({"idle_timeout_seconds": -1}, "config.data.idle_timeout_seconds: must be a number >= 0"),
                          ({"follow_marker": "a/b"}, "config.data.follow_marker: must be a file name"),
                          ({"path": [str(tmp_path)]}, "config.data.path: data.follow takes one directory or one glob"),
                          ({"follow": False}, "config.data.poll_seconds: only with data.follow: true"),
                          ({"follow": "yes"}, "config.data.follow: must be true or false")]:
        with pytest.raises(ValueError, match=match):
            parse_config({**raw, "data": {**raw["data"], **change}})
    with pytest.raises(ValueError, match="config.data.follow: only for the file sources"):
        parse_config({**raw, "data": {"source": "synthetic", "follow": True}})


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
