"""The CUDA harness's inputs and build: the written cases agree with the NumPy oracle, and the harness compiles with
nvcc and passes its host checks. The kernels themselves run only on a CUDA device (`make cuda-check`)."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.subprocess_runner import ROOT, execute, tail

import write_cases
from tf_fusedrec.ops import reference

HARNESS = ROOT / "build" / "cuda" / "harness"
EXIT_NO_DEVICE = 3


@pytest.fixture(scope="module")
def cases_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda_cases")
    write_cases.write_cases(str(out))
    return out


def manifest(cases_dir):
    rows = {}
    for line in (cases_dir / "cases.txt").read_text().splitlines():
        name, *fields = line.split()
        rows[name] = dict(field.split("=", 1) for field in fields)
    return rows


def read(cases_dir, name, array, dtype):
    return np.fromfile(cases_dir / name / f"{array}.bin", dtype=np.dtype(dtype).newbyteorder("<"))


def test_manifest_lists_every_case_with_the_issue_shapes(cases_dir):
    rows = manifest(cases_dir)
    assert len(rows) == len(write_cases.correctness_cases())
    for shape in ("random", "zipf", "empty", "one", "all_equal", "extremes", "many_segments", "ragged_tail"):
        for dtype in ("int32", "int64"):
            assert rows[f"{shape}_{dtype}"]["dtype"] == dtype
    assert rows["int64_max"]["category_packed"] == "bad_key:0"
    assert rows["negative_segment_int64"]["segment_unique"] == "bad_segment:61"
    assert rows["segment_too_large_int32"]["segment_unique"] == "ok"
    assert rows["segment_too_large_int32"]["category_hashed"] == "bad_segment:80"
    assert rows["extremes_int32"]["category_packed"] == "bad_key:1"


@pytest.mark.parametrize("name,keys,segments,num_segments,num_ranks", write_cases.correctness_cases(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_written_case_round_trips_and_matches_the_oracle(cases_dir, name, keys, segments, num_segments, num_ranks):
    row = manifest(cases_dir)[name]
    kdt = np.dtype(row["dtype"])
    assert kdt == keys.dtype
    got_keys = read(cases_dir, name, "keys", kdt)
    got_segments = read(cases_dir, name, "segment_ids", np.int32)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_segments, np.asarray(segments, np.int32))
    assert int(row["num_segments"]) == num_segments and int(row["num_ranks"]) == num_ranks

    np.testing.assert_array_equal(read(cases_dir, name, "owner_of", np.int32), reference.owner_of(got_keys, num_ranks))
    part = reference.partition_by_owner(got_keys, num_ranks, got_segments)
    np.testing.assert_array_equal(read(cases_dir, name, "partition.keys", kdt), part.keys)
    np.testing.assert_array_equal(read(cases_dir, name, "partition.segment_ids", np.int32), part.segment_ids)
    np.testing.assert_array_equal(read(cases_dir, name, "partition.splits", np.int32), part.splits)
    np.testing.assert_array_equal(read(cases_dir, name, "partition.order", np.int32), part.order)

    if row["segment_unique"] == "ok":
        su = reference.segment_unique(got_keys, got_segments)
        for field in su._fields:
            dtype = kdt if field == "unique_keys" else np.int32
            np.testing.assert_array_equal(read(cases_dir, name, f"segment_unique.{field}", dtype), getattr(su, field))
    else:
        kind, pos = row["segment_unique"].split(":")
        assert kind == "bad_segment" and got_segments[int(pos)] < 0 and (got_segments[: int(pos)] >= 0).all()
        with pytest.raises(ValueError):
            reference.segment_unique(got_keys, got_segments)
        assert not (cases_dir / name / "segment_unique.inverse.bin").exists()

    for encoding in ("packed", "hashed"):
        op = f"category_{encoding}"
        if row[op] == "ok":
            cu = reference.category_unique(got_keys, got_segments, num_segments, encoding)
            np.testing.assert_array_equal(read(cases_dir, name, f"{op}.unified_keys", np.int64), cu.unified_keys)
            np.testing.assert_array_equal(read(cases_dir, name, f"{op}.inverse", np.int32), cu.inverse)
            np.testing.assert_array_equal(read(cases_dir, name, f"{op}.unique_segment_ids", np.int32),
                                          cu.unique_segment_ids)
            np.testing.assert_array_equal(read(cases_dir, name, f"{op}.segment_counts", np.int32), cu.segment_counts)
        else:
            with pytest.raises(ValueError):
                reference.category_unique(got_keys, got_segments, num_segments, encoding)
            assert not (cases_dir / name / f"{op}.inverse.bin").exists()


def _nvcc():
    found = shutil.which("nvcc")
    if found is None and os.environ.get("CUDA_HOME"):
        candidate = Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
        found = str(candidate) if candidate.exists() else None
    return found


@pytest.fixture(scope="module")
def harness():
    if _nvcc() is None:
        message = "nvcc is not on PATH or in $CUDA_HOME/bin: the CUDA harness cannot be compiled here"
        if os.environ.get("CI", "").lower() == "true":  # CI machines have nvcc: its absence is a broken install
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    rc, out, _ = execute(["make", "--no-print-directory", "cuda-harness"], timeout=600, merge_stderr=True)
    assert rc == 0, tail(out)
    assert HARNESS.exists()
    return HARNESS


def test_harness_compiles_and_passes_its_host_checks(harness, cases_dir):
    rc, out, _ = execute([str(harness), str(cases_dir), "--compile-only"], timeout=300, merge_stderr=True)
    assert rc == 0, tail(out)
    assert "host checks" in out and "all equal" in out
    assert "no CUDA device: compiled only" in out


def test_harness_without_flag_runs_the_kernels_or_says_it_could_not(harness, cases_dir):
    rc, out, _ = execute([str(harness), str(cases_dir)], timeout=600, merge_stderr=True)
    if rc == EXIT_NO_DEVICE:
        assert "no CUDA device: compiled only" in out
    else:
        assert rc == 0, tail(out)
        assert "kernels vs oracle" in out and "MISMATCH" not in out


def test_harness_host_checks_catch_a_wrong_expected_file(harness, cases_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(cases_dir, broken)
    owners = broken / "zipf_int64" / "owner_of.bin"
    data = np.fromfile(owners, dtype="<i4")
    data[17] += 1
    data.tofile(owners)
    rc, out, _ = execute([str(harness), str(broken), "--compile-only"], timeout=300, merge_stderr=True)
    assert rc == 1, tail(out)
    assert "MISMATCH zipf_int64 owner_of: [17]" in out
