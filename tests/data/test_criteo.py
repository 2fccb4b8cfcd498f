"""Criteo TSV reader: every parsed value against a pure-Python parse, worker sharding, files, errors."""

from __future__ import annotations

import gzip
import math
import random

import numpy as np
import pytest

import tf_fusedrec  # noqa: F401
import tensorflow as tf

from tf_fusedrec.data import CRITEO_DENSE, CRITEO_SPARSE, criteo_dataset


def _make_lines(n, seed=0, start=0):
    """n Criteo lines; dense I1 holds the global line index so lines can be identified after parsing."""
    rnd = random.Random(seed)
    lines = []
    for i in range(start, start + n):
        dense = [str(i)]
        for _ in range(12):
            r = rnd.random()
            dense.append("" if r < 0.25 else str(rnd.randint(-3, -1)) if r < 0.35 else str(rnd.randint(0, 10 ** 6)))
        cats = []
        for _ in range(26):
            cats.append("" if rnd.random() < 0.25 else "%08x" % rnd.choice([rnd.getrandbits(32), 0x68fd1e64]))
        lines.append("\t".join([str(rnd.randint(0, 1))] + dense + cats))
    # Special cases: everything missing, last field missing, huge dense value.
    if n >= 3:
        lines[1] = "\t".join(["1", str(start + 1)] + [""] * 12 + [""] * 26)
        f = lines[2].split("\t")
        f[-1] = ""
        f[5] = str(2 ** 40)
        lines[2] = "\t".join(f)
    return lines


def _hash(s):
    return int(tf.strings.to_hash_bucket_fast([s], 2 ** 62).numpy()[0])


def _reference(line):
    """Pure-Python parse of one line (the hash of a string is computed one string at a time)."""
    f = line.rstrip("\r").split("\t")
    assert len(f) == 40
    label = float(int(f[0]))
    dense = tuple(math.log1p(max(0, int(x))) if x else 0.0 for x in f[1:14])
    sparse = {f"C{j + 1}": ([_hash(x)] if x else []) for j, x in enumerate(f[14:])}
    return dense, sparse, label


def _check_rows(rows, lines):
    assert len(rows) == len(lines)
    for (features, label), line in zip(rows, lines):
        dense, sparse, want_label = _reference(line)
        assert label == want_label
        np.testing.assert_allclose(features["dense"], np.float32(dense), rtol=1e-6, err_msg=line)
        for name in CRITEO_SPARSE:
            assert features[name] == sparse[name], (name, line)


def _write(path, lines, newline="\n"):
    path.write_text("".join(l + newline for l in lines))
    return str(path)


def test_constants():
    assert CRITEO_SPARSE == [f"C{i}" for i in range(1, 27)] and len(CRITEO_DENSE) == 13


def test_every_value_matches_a_python_parse(tmp_path, rows_of):
    lines = _make_lines(24)
    path = _write(tmp_path / "day.tsv", lines)
    ds = criteo_dataset(path, batch_size=4)
    features, label = next(iter(ds))
    assert sorted(features) == sorted(CRITEO_SPARSE + ["dense"])
    assert features["dense"].dtype == tf.float32 and features["dense"].shape == [4, 13]
    assert label.dtype == tf.float32 and label.shape == [4]
    for name in CRITEO_SPARSE:
        assert isinstance(features[name], tf.RaggedTensor) and features[name].dtype == tf.int64
    rows, batches = rows_of(ds)
    assert batches == 6
    _check_rows(rows, lines)
    # Missing values: empty rows; present values: one id in [0, 2**62); equal strings, equal ids.
    all_missing = rows[1][0]
    assert all(all_missing[name] == [] for name in CRITEO_SPARSE) and all_missing["dense"][1:] == (0.0,) * 12
    assert rows[2][0]["C26"] == []
    assert rows[2][0]["dense"][4] == pytest.approx(math.log1p(2 ** 40), rel=1e-6)
    ids = [i for f, _ in rows for name in CRITEO_SPARSE for i in f[name]]
    assert min(ids) >= 0 and max(ids) < 2 ** 62
    assert ids.count(_hash("68fd1e64")) > 1
    # Negative dense values were clipped to 0 somewhere in these lines.
    assert any("\t-" in l for l in lines)


def test_drop_remainder_and_empty_result(tmp_path, rows_of):
    lines = _make_lines(26)
    path = _write(tmp_path / "a.tsv", lines)
    rows, batches = rows_of(criteo_dataset(path, batch_size=4))
    assert batches == 6
    _check_rows(rows, lines[:24])
    assert rows_of(criteo_dataset(path, batch_size=27))[1] == 0


@pytest.mark.parametrize("num_ranks", [2, 3])
def test_sharding_partitions_the_lines(tmp_path, rows_of, num_ranks):
    lines = _make_lines(30)
    path = _write(tmp_path / "a.tsv", lines)
    seen = []
    for rank in range(num_ranks):
        rows, batches = rows_of(criteo_dataset(path, batch_size=5, rank=rank, num_ranks=num_ranks))
        want = lines[rank::num_ranks]
        want = want[:len(want) // 5 * 5]
        _check_rows(rows, want)
        seen.extend(int(round(math.expm1(f["dense"][0]))) for f, _ in rows)
    assert len(seen) == len(set(seen))                  # disjoint
    if num_ranks == 2:
        assert sorted(seen) == list(range(30))          # and the union is every line


def test_several_files_globs_gzip_and_crlf(tmp_path, rows_of):
    a, b, c = _make_lines(8, seed=1), _make_lines(8, seed=2, start=8), _make_lines(8, seed=3, start=16)
    _write(tmp_path / "day_0.tsv", a)
    with gzip.open(tmp_path / "day_1.gz", "wt") as f:
        f.write("".join(l + "\n" for l in b))
    _write(tmp_path / "day_2.tsv", c, newline="\r\n")
    files = [str(tmp_path / "day_0.tsv"), str(tmp_path / "day_1.gz"), str(tmp_path / "day_2.tsv")]
    rows, _ = rows_of(criteo_dataset(files, batch_size=4))
    _check_rows(rows, a + b + c)
    rows, _ = rows_of(criteo_dataset(str(tmp_path / "day_*"), batch_size=4))
    _check_rows(rows, a + b + c)
    # Order follows the list.
    rows, _ = rows_of(criteo_dataset(files[::-1], batch_size=4))
    _check_rows(rows, c + b + a)


def test_shuffle_is_a_seeded_permutation(tmp_path, rows_of):
    files = []
    for d in range(3):
        files.append(_write(tmp_path / f"d{d}.tsv", _make_lines(20, seed=d, start=20 * d)))
    lines = sum((_make_lines(20, seed=d, start=20 * d) for d in range(3)), [])

    def order(seed, rank=0, num_ranks=1):
        rows, _ = rows_of(criteo_dataset(files, 5, rank=rank, num_ranks=num_ranks, shuffle=True, seed=seed,
                                         shuffle_buffer=16))
        return [int(round(math.expm1(f["dense"][0]))) for f, _ in rows], rows

    o1, rows = order(0)
    assert sorted(o1) == list(range(60)) and o1 != list(range(60))
    _check_rows(rows, [lines[i] for i in o1])
    assert order(0)[0] == o1
    assert order(1)[0] != o1
    shares = [set(order(5, r, 2)[0]) for r in range(2)]
    assert not shares[0] & shares[1] and len(shares[0] | shares[1]) == 60


def test_fewer_fields(tmp_path, rows_of):
    lines = [l.split("\t") for l in _make_lines(8)]
    short = ["\t".join(f[:1 + 4] + f[14:14 + 3]) for f in lines]
    path = _write(tmp_path / "s.tsv", short)
    rows, _ = rows_of(criteo_dataset(path, 4, num_dense=4, num_sparse=3))
    assert sorted(rows[0][0]) == ["C1", "C2", "C3", "dense"]
    for (features, label), f in zip(rows, lines):
        assert label == float(f[0])
        np.testing.assert_allclose(features["dense"], [math.log1p(max(0, int(x))) if x else 0.0 for x in f[1:5]],
                                   rtol=1e-6)
        assert [features[f"C{j + 1}"] for j in range(3)] == [[_hash(x)] if x else [] for x in f[14:17]]
    no_dense, _ = rows_of(criteo_dataset(_write(tmp_path / "n.tsv", ["\t".join(f[:1] + f[14:]) for f in lines]),
                                         4, num_dense=0))
    assert "dense" not in no_dense[0][0]


@pytest.mark.parametrize("bad, match", [
    ("drop_field", r"expected 40 tab-separated fields.*bad_day.tsv line 6 has 39 fields: [01]\\t5\\t"),
    ("extra_field", r"expected 40 tab-separated fields.*bad_day.tsv line 6 has 41 fields: [01]\\t5\\t.*\\tabc\]"),
    ("empty_line", r"expected 40 tab-separated fields.*bad_day.tsv line 6 has 1 fields: \]"),
    ("label", r"label \(first field\) must be 0 or 1; file .*bad_day.tsv line 6 has label 2\]"),
    ("dense", r"StringToNumberOp|convert"),
])
def test_malformed_lines_raise(tmp_path, bad, match):
    lines = _make_lines(12)
    f = lines[5].split("\t")
    if bad == "drop_field":
        lines[5] = "\t".join(f[:-1])
    elif bad == "extra_field":
        lines[5] = "\t".join(f + ["abc"])
    elif bad == "empty_line":
        lines[5] = ""
    elif bad == "label":
        lines[5] = "\t".join(["2"] + f[1:])
    else:
        lines[5] = "\t".join(f[:3] + ["x12"] + f[4:])
    path = _write(tmp_path / "bad_day.tsv", lines)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match) as info:
        list(criteo_dataset(path, batch_size=4))
    if bad not in ("dense",):
        assert "bad_day.tsv" in str(info.value)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        criteo_dataset(str(tmp_path / "nope.tsv"), 4)
    ok = _write(tmp_path / "ok.tsv", _make_lines(4))
    with pytest.raises(FileNotFoundError, match="gone.tsv"):
        criteo_dataset([ok, str(tmp_path / "gone.tsv")], 4)
    with pytest.raises(FileNotFoundError, match="day_"):
        criteo_dataset(str(tmp_path / "day_*"), 4)
    with pytest.raises(IsADirectoryError):
        criteo_dataset(str(tmp_path), 4)
    with pytest.raises(ValueError, match="rank"):
        criteo_dataset(ok, 4, rank=2, num_ranks=2)
