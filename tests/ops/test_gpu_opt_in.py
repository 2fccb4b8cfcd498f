"""The ops run on the CPU unless TF_FUSEDREC_GPU=1 (tf_fusedrec/ops/_loader.py): their CUDA kernels, registered
when the library is built against a CUDA build of TensorFlow, are verified on a GPU only through the standalone harness
(tests/cuda, benchmarks/results/cuda): the TensorFlow GPU ops around them have not run on a GPU yet.

* by default every op of the family is created on /device:CPU:0, whatever TensorFlow would choose;
* with TF_FUSEDREC_GPU=1 the placement is TensorFlow's (no device is pinned);
* the results equal the NumPy oracle either way; the "gpu" parameter runs the CUDA kernels and skips without a GPU.
"""

import numpy as np
import pytest
import tensorflow as tf

KEYS = np.array([7, 3, 7, 3, 9, 7], np.int64)
SEGMENTS = np.array([0, 0, 1, 0, 1, 1], np.int32)


def op_devices(fro):
    """The requested device of each op's output, built in a graph."""
    with tf.Graph().as_default():
        keys, segments = tf.constant(KEYS), tf.constant(SEGMENTS)
        outputs = [fro.segment_unique(keys, segments).unique_keys, fro.owner_of(keys, 2),
                   fro.partition_by_owner(keys, 2, segments).keys,
                   fro.category_unique(keys, segments, 2, encoding="hashed").unified_keys]
        return {t.op.type: t.op.device for t in outputs}


def test_ops_are_placed_on_the_cpu_by_default(fro, monkeypatch):
    monkeypatch.delenv("TF_FUSEDREC_GPU", raising=False)
    devices = op_devices(fro)
    assert len(devices) == 4 and all(d.endswith("device:CPU:0") for d in devices.values()), devices


def test_opt_in_leaves_the_placement_to_tensorflow(fro, monkeypatch):
    monkeypatch.setenv("TF_FUSEDREC_GPU", "1")
    devices = op_devices(fro)
    assert len(devices) == 4 and set(devices.values()) == {""}, devices


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_results_equal_the_oracle(fro, ref, monkeypatch, device):
    if device == "gpu":
        if not tf.config.list_physical_devices("GPU"):
            pytest.skip("no GPU visible to TensorFlow")
        monkeypatch.setenv("TF_FUSEDREC_GPU", "1")
    else:
        monkeypatch.delenv("TF_FUSEDREC_GPU", raising=False)
    with tf.device(f"/{device.upper()}:0"):
        got = fro.segment_unique(tf.constant(KEYS), tf.constant(SEGMENTS))
        unified = fro.category_unique(tf.constant(KEYS), tf.constant(SEGMENTS), 2, encoding="hashed")
    want = ref.segment_unique(KEYS, SEGMENTS)
    for name in want._fields:
        np.testing.assert_array_equal(getattr(got, name).numpy(), getattr(want, name), err_msg=name)
    np.testing.assert_array_equal(unified.unified_keys.numpy(),
                                  ref.category_unique(KEYS, SEGMENTS, 2, encoding="hashed").unified_keys)
