"""A checkpoint of the baseline stack (TensorFlow 2.16.2, Keras 2) restores on this stack and trains on to the
result the baseline stack reached (issue 54's invariant; tests/train/lane_checkpoint.py).

The fixture, tests/train/lane_checkpoint_fixture/, was written in the baseline lane by

    TF_USE_LEGACY_KERAS=1 .venv/bin/python tests/train/lane_checkpoint.py write tests/train/lane_checkpoint_fixture

(its losses.json names the TensorFlow and Keras that wrote it; first_layout_start is its `start` as the code before
dense.npz's layout 2 wrote it, tf_fusedrec/train/checkpoint.py). On either stack the test restores its `start`
checkpoint, trains the same steps and compares the losses and its own checkpoint of the end with the fixture's
`after`: every array of dense.npz (dense weights, dense optimizer slots under tf_keras' slot names, iteration
counts) and of the shard (keys, rows, table slot rows). On the baseline stack they are equal bit for bit. On Keras 3
the dense Adam update is Keras 3's (a few float32 operations in another order than tf_keras' legacy fused kernel):
equal to RTOL. The embedding tables' updates are the op library's on both stacks.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.subprocess_runner import load_script

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "lane_checkpoint_fixture"
lc = load_script(HERE / "lane_checkpoint.py", "fusedrec_lane_checkpoint")
RTOL, ATOL = 1e-6, 1e-7


def newest(model_dir):
    return max(Path(model_dir).glob("ckpt-*"), key=lambda p: int(p.name.split("-")[1]))


def arrays(checkpoint_dir):
    """{file/key: array} of a checkpoint's npz files."""
    out = {}
    for path in sorted(Path(checkpoint_dir).glob("*.npz")):
        with np.load(path, allow_pickle=False) as z:
            out.update({f"{path.name}/{k}": z[k] for k in z.files})
    return out


def assert_same_checkpoint(got_dir, want_dir, exact):
    got, want = arrays(got_dir), arrays(want_dir)
    assert sorted(got) == sorted(want), f"arrays only in one: {sorted(set(got) ^ set(want))}"
    for name, value in want.items():
        if exact or value.dtype.kind not in "fc":
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], value, rtol=RTOL, atol=ATOL, err_msg=name)


def test_the_baseline_checkpoint_trains_on_as_on_the_baseline(tmp_path):
    written = json.loads((FIXTURE / "losses.json").read_text())
    losses = lc.continue_from(str(FIXTURE / "start"), str(tmp_path / "after"))
    exact = lc.fr._keras.legacy()  # noqa: SLF001  (the stack that wrote the fixture)
    if exact:
        assert losses == written["losses"]
    else:
        np.testing.assert_allclose(losses, written["losses"], rtol=RTOL, err_msg="losses")
    after = newest(tmp_path / "after")
    assert after.name == f"ckpt-{lc.START_STEPS + lc.CONTINUE_STEPS}"
    assert_same_checkpoint(after, newest(FIXTURE / "after"), exact)


def test_a_checkpoint_of_the_first_dense_layout_trains_on_alike(tmp_path):
    """first_layout_start: the same checkpoint written (by the baseline stack) before dense.npz left out the embedding
    layer's own variables (its statistics were var0): the dense variables find theirs by order, shape and dtype, on
    either Keras, and training goes on as from the new layout's."""
    with np.load(FIXTURE / "first_layout_start" / "ckpt-3" / "dense.npz") as z:
        assert "dense_layout" not in z.files and z["var0"].dtype == np.int64, "not a checkpoint of the first layout"
    written = json.loads((FIXTURE / "losses.json").read_text())
    losses = lc.continue_from(str(FIXTURE / "first_layout_start"), str(tmp_path / "after"))
    np.testing.assert_allclose(losses, written["losses"], rtol=RTOL, err_msg="losses")
    assert_same_checkpoint(newest(tmp_path / "after"), newest(FIXTURE / "after"), lc.fr._keras.legacy())  # noqa: SLF001


@pytest.mark.keras2
def test_the_fixture_is_what_the_baseline_stack_writes(tmp_path):
    """The committed fixture is what this code writes on the stack that wrote it: a change to the model, the data or
    the checkpoint format must rewrite it (the command in the module docstring)."""
    lc.write(str(tmp_path / "fresh"))
    for part in ("start", "after"):
        assert_same_checkpoint(newest(tmp_path / "fresh" / part), newest(FIXTURE / part), exact=True)
    fresh = json.loads((tmp_path / "fresh" / "losses.json").read_text())
    assert fresh == json.loads((FIXTURE / "losses.json").read_text())


def test_the_fixture_is_small():
    size = sum(os.path.getsize(p) for p in FIXTURE.rglob("*") if p.is_file())
    assert size < 100_000, f"{FIXTURE}: {size} bytes"
