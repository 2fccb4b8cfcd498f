"""Helpers for the data tests: turn a dataset of (features, label) batches into per-example Python rows."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf


def batch_rows(features, label):
    """One batch -> list of (dict name -> int | list[int] | tuple[float, ...], label) per example."""
    cols = {}
    for name, x in features.items():
        if isinstance(x, tf.RaggedTensor):
            cols[name] = [list(map(int, r)) for r in x.to_list()]
        elif name == "dense":
            cols[name] = [tuple(float(v) for v in r) for r in x.numpy()]
        else:
            cols[name] = [int(v) for v in x.numpy()]
    labels = [float(v) for v in label.numpy()]
    return [({k: cols[k][i] for k in cols}, labels[i]) for i in range(len(labels))]


def dataset_rows(ds):
    """All examples of a dataset, in order, and the number of batches."""
    rows, n = [], 0
    for features, label in ds:
        rows.extend(batch_rows(features, label))
        n += 1
    return rows, n


@pytest.fixture(name="rows_of")
def rows_of_fixture():
    return dataset_rows


def assert_batches_equal(a, b):
    """Two (features, label) batches are identical (keys, dtypes, shapes, values, ragged row splits)."""
    fa, la = a
    fb, lb = b
    assert sorted(fa) == sorted(fb)
    for k in fa:
        x, y = fa[k], fb[k]
        assert type(x) is type(y), k
        assert x.dtype == y.dtype, k
        if isinstance(x, tf.RaggedTensor):
            np.testing.assert_array_equal(x.row_splits.numpy(), y.row_splits.numpy(), err_msg=k)
            np.testing.assert_array_equal(x.flat_values.numpy(), y.flat_values.numpy(), err_msg=k)
        else:
            np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=k)
    np.testing.assert_array_equal(la.numpy(), lb.numpy())


@pytest.fixture(name="batches_equal")
def batches_equal_fixture():
    return assert_batches_equal
