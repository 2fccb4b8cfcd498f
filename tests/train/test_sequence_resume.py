"""Resuming a sequence run's data where it stopped, in one process (the train app's end-to-end resume under horovodrun
is in tests/apps/test_train_grm.py):

* TokenBatcher resumed at any batch of a stream (its StreamPosition: the samples consumed, the samples it had buffered
  past them) cuts exactly the batches the uninterrupted batcher cuts next, also where a cut ends on a fill boundary
  with empty sequences behind it (a fresh batcher started at the same sample cuts differently there);
* SequenceBatches (the train app's batches of grm_synthetic, --balance tokens and none) read through tf.data with
  prefetching: the position after the k batches consumed (not those tf.data made ahead), restored, yields batches k,
  k + 1, ... of the uninterrupted stream, tensor for tensor, and the same positions after them;
* a checkpoint of another worker count, or without positions, is a ValueError naming what to do;
* movielens_seq_samples(start=s) is the stream from its s-th sample on, across epochs.
"""

import itertools
import time

import numpy as np
import pytest

import tf_fusedrec as fr  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)
import tensorflow as tf
from tf_fusedrec import config as cfg
from tf_fusedrec.data.movielens_seq import movielens_seq_samples
from tf_fusedrec.train import batching, experiment

from tests.data.test_movielens_seq import SPEC, _write_dir, plain
from tests.subprocess_runner import ROOT

# --- TokenBatcher ------------------------------------------------------------------------------------------------


def cuts(token_counts, target, buffer_size, start=None):
    """[(batch of sample indices, buffered)] of a TokenBatcher over the stream 0, 1, ... (from StreamPosition
    `start`)."""
    start = start or batching.StreamPosition(0, 0)
    batcher = batching.TokenBatcher(target, buffer_size=buffer_size, tokens_of=lambda i: int(token_counts[i]))
    return list(batcher.cuts(range(start.samples, len(token_counts)), buffered=start.buffered))


def test_a_resumed_batcher_cuts_the_uninterrupted_batches():
    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(1, 120))
        tokens = np.minimum(rng.geometric(0.2, n), 40)
        tokens[rng.random(n) < 0.3] = 0  # many empty sequences: cuts on plateaus that reach the end of a fill
        target, buffer_size = int(rng.integers(1, 60)), int(rng.integers(1, 12))
        straight = cuts(tokens, target, buffer_size)
        assert [i for batch, _ in straight for i in batch] == list(range(n))
        consumed = 0
        for k, (batch, buffered) in enumerate(straight):
            consumed += len(batch)
            resumed = cuts(tokens, target, buffer_size, batching.StreamPosition(consumed, buffered))
            assert resumed == straight[k + 1:], (k, target, buffer_size, tokens.tolist())


def test_the_buffered_samples_matter():
    # Fills of 4: [10, 5, 6, 0] cuts [10], then [5, 6, 0] (the next empty sequence is not buffered yet); a batcher
    # started fresh at sample 1 fills [5, 6, 0, 0] and takes both empty sequences.
    tokens = [10, 5, 6, 0, 0, 3, 9]
    straight = cuts(tokens, 10, 4)
    assert straight[:2] == [([0], 3), ([1, 2, 3], 0)]
    assert cuts(tokens, 10, 4, batching.StreamPosition(1, 3)) == straight[1:]
    assert cuts(tokens, 10, 4, batching.StreamPosition(1, 0))[0][0] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="buffered must be >= 0"):
        cuts(tokens, 10, 4, batching.StreamPosition(1, -1))


# --- SequenceBatches ---------------------------------------------------------------------------------------------

BATCH = 32  # ~32 samples a batch: the batcher's buffer of 1024 samples refills about every 30 batches
RANK, SIZE = 1, 2


@pytest.fixture(scope="module")
def config():
    return cfg.load_config(str(ROOT / "configs" / "grm_synthetic.yaml"))


def as_arrays(element):
    features, labels = element
    out = {"labels": labels.numpy()}
    for name, value in features.items():
        if isinstance(value, tf.RaggedTensor):
            out[name + ".values"], out[name + ".splits"] = value.values.numpy(), value.row_splits.numpy()
        else:
            out[name] = value.numpy()
    return out


def assert_same_batches(got, want, what):
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        assert sorted(a) == sorted(b), (what, i)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{what}: batch {i}, {key}")


@pytest.mark.parametrize("balance", ["tokens", "none"])
def test_sequence_batches_resume_where_training_stopped(config, balance):
    straight = experiment.SequenceBatches(config, BATCH, RANK, SIZE, balance)
    total = 40
    iterator = iter(straight.dataset().prefetch(8))
    batches = [as_arrays(next(iterator)) for _ in range(total)]
    positions = [straight.position_after(k) for k in range(total + 1)]
    assert positions[0] == (0, 0)
    assert [p.samples for p in positions[1:]] == list(np.cumsum([c[0] for c in straight.counts[:total]]))
    if balance == "none":
        assert positions[-1] == (total * BATCH, 0)
    else:  # a refill of the batcher's buffer among the batches (the buffered count grows) and a resume on either side
        refill = next(k for k in range(1, total) if positions[k + 1].buffered > positions[k].buffered)
    trained = 5
    deadline = time.monotonic() + 30
    while len(straight.counts) <= total + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(straight.counts) > total + 1, "tf.data made no batch ahead of the ones consumed"
    for k in sorted({0, trained} | ({refill - 1, refill} if balance == "tokens" else set())):
        resumed = experiment.SequenceBatches(config, BATCH, RANK, SIZE, balance, position=positions[k])
        assert resumed.target_tokens == straight.target_tokens
        take = 3
        got = [as_arrays(e) for e in resumed.dataset().prefetch(8).take(take)]
        assert_same_batches(got, batches[k:k + take], f"{balance}: resumed after {k} batches")
        assert [resumed.position_after(j) for j in range(take + 1)] == positions[k:k + take + 1]


def test_a_checkpoint_of_another_worker_count_is_refused():
    restored = {"directory": "D/ckpt-4", "workers": 2, "stream_positions": [[64, 10], [70, 3]]}
    assert experiment.position_of_checkpoint(restored, 1, 2) == batching.StreamPosition(70, 3)
    with pytest.raises(ValueError, match=r"written by 2 worker\(s\), this run has 3.*start 2 worker"):
        experiment.position_of_checkpoint(restored, 0, 3)
    with pytest.raises(ValueError, match="D/ckpt-4 holds no sample-stream positions"):
        experiment.position_of_checkpoint({**restored, "stream_positions": None}, 0, 2)


# --- movielens_seq_samples(start=...) ----------------------------------------------------------------------------


def test_movielens_seq_samples_start_skips_across_epochs(tmp_path):
    path = _write_dir(tmp_path)
    rank, num_ranks = 1, 3
    per_epoch = len([plain(s) for s in movielens_seq_samples(path, SPEC, rank=rank, num_ranks=num_ranks)])
    assert per_epoch > 2
    kwargs = {"rank": rank, "num_ranks": num_ranks, "shuffle": True, "seed": 5}
    endless = [plain(s) for s in itertools.islice(movielens_seq_samples(path, SPEC, epochs=None, **kwargs),
                                                  4 * per_epoch)]
    for start in (1, per_epoch - 1, per_epoch, 2 * per_epoch + 2):
        resumed = movielens_seq_samples(path, SPEC, epochs=None, start=start, **kwargs)
        assert [plain(s) for s in itertools.islice(resumed, per_epoch)] == endless[start:start + per_epoch], start
    two = [plain(s) for s in movielens_seq_samples(path, SPEC, epochs=2, start=per_epoch + 1, **kwargs)]
    assert two == endless[per_epoch + 1:2 * per_epoch]
    assert list(movielens_seq_samples(path, SPEC, epochs=1, start=per_epoch, **kwargs)) == []
    with pytest.raises(ValueError, match="start must be an int >= 0"):
        movielens_seq_samples(path, SPEC, start=-1)
