"""Synthetic data: format, determinism, N workers == 1 worker, resume, skew, hotness, learnable labels."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tf_fusedrec  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from tf_fusedrec.data import SparseInput, calibrate_zipf, hidden_logits, synthetic_dataset, top_share
from tf_fusedrec.data import synthetic as syn

INPUTS = [
    SparseInput("user", 5_000, zipf=1.1),
    SparseInput("item", 300, zipf=0.8),
    SparseInput("tags", 1_000, hotness=(0, 4)),
    SparseInput("pair", 50, zipf=2.0, hotness=2),
]


def _take(ds, n):
    return list(ds.take(n))


def _concat_batches(batches):
    """Concatenate (features, label) batches along the batch dimension."""
    feats = {}
    for k in batches[0][0]:
        xs = [b[0][k] for b in batches]
        feats[k] = tf.concat(xs, axis=0)
    return feats, tf.concat([b[1] for b in batches], axis=0)


# ------------------------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(vocab_size=0), "vocab_size"),
    (dict(vocab_size=2 ** 63), "vocab_size"),
    (dict(vocab_size=10.0), "vocab_size"),
    (dict(vocab_size=10, zipf=0.0), "zipf"),
    (dict(vocab_size=10, zipf=-1.0), "zipf"),
    (dict(vocab_size=10, zipf=float("nan")), "zipf"),
    (dict(vocab_size=10, hotness=0), "hotness"),
    (dict(vocab_size=10, hotness=(3, 2)), "hotness"),
    (dict(vocab_size=10, hotness=(-1, 2)), "hotness"),
    (dict(vocab_size=10, hotness=(0, 0)), "hotness"),
    (dict(vocab_size=10, hotness="2"), "hotness"),
])
def test_sparse_input_validation_names_field_and_feature(kwargs, field):
    with pytest.raises(ValueError) as info:
        SparseInput("my_feature", **kwargs)
    assert field in str(info.value) and "my_feature" in str(info.value)


def test_sparse_input_normalizes_and_reserved_name():
    assert SparseInput("a", 10, hotness=[1, 3]).hotness == (1, 3)
    assert SparseInput("a", 10, zipf=2).zipf == 2.0
    assert not SparseInput("a", 10).multi_hot and SparseInput("a", 10, hotness=(1, 1)).multi_hot
    with pytest.raises(ValueError, match="dense"):
        SparseInput("dense", 10)


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=0), "batch_size"),
    (dict(rank=2, num_ranks=2), "rank"),
    (dict(num_ranks=0), "num_ranks"),
    (dict(seed=-1), "seed"),
    (dict(steps=-1), "steps"),
    (dict(start_step=-1), "start_step"),
    (dict(num_dense=-1), "num_dense"),
])
def test_dataset_argument_validation(kwargs, match):
    args = dict(inputs=INPUTS, num_dense=3, batch_size=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        synthetic_dataset(**args)


def test_duplicate_names_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        synthetic_dataset([SparseInput("a", 10), SparseInput("a", 20)], 0, 8)


# ------------------------------------------------------------------------------------------------------------------
# Format
# ------------------------------------------------------------------------------------------------------------------

def test_output_format():
    ds = synthetic_dataset(INPUTS, num_dense=5, batch_size=64, steps=3)
    batches = _take(ds, 10)
    assert len(batches) == 3
    spec_f, spec_l = ds.element_spec
    assert isinstance(spec_f["tags"], tf.RaggedTensorSpec) and isinstance(spec_f["pair"], tf.RaggedTensorSpec)
    assert spec_f["user"].shape == [64] and spec_f["dense"].shape == [64, 5] and spec_l.shape == [64]
    for features, label in batches:
        assert sorted(features) == ["dense", "item", "pair", "tags", "user"]
        assert features["user"].dtype == tf.int64 and features["user"].shape == [64]
        assert isinstance(features["tags"], tf.RaggedTensor) and features["tags"].dtype == tf.int64
        assert features["tags"].shape[0] == 64
        assert features["dense"].dtype == tf.float32 and features["dense"].shape == [64, 5]
        assert label.dtype == tf.float32 and label.shape == [64]
        assert set(np.unique(label.numpy())) <= {0.0, 1.0}
        for inp in INPUTS:
            x = features[inp.name]
            ids = x.flat_values.numpy() if isinstance(x, tf.RaggedTensor) else x.numpy()
            assert ids.min() >= 0 and ids.max() < inp.vocab_size, inp.name


def test_no_dense_key_without_dense_features():
    features, label = _take(synthetic_dataset(INPUTS[:1], num_dense=0, batch_size=16), 1)[0]
    assert sorted(features) == ["user"]
    dense_only, _ = _take(synthetic_dataset([], num_dense=4, batch_size=16), 1)[0]
    assert sorted(dense_only) == ["dense"]


def test_steps_none_is_endless():
    ds = synthetic_dataset(INPUTS[:1], 0, 4)
    assert len(_take(ds, 25)) == 25


# ------------------------------------------------------------------------------------------------------------------
# Determinism, workers, resume
# ------------------------------------------------------------------------------------------------------------------

def test_same_seed_same_batches_different_seed_differs(batches_equal):
    a = _take(synthetic_dataset(INPUTS, 3, 32, seed=7, steps=4), 4)
    b = _take(synthetic_dataset(INPUTS, 3, 32, seed=7, steps=4), 4)
    for x, y in zip(a, b):
        batches_equal(x, y)
    c = _take(synthetic_dataset(INPUTS, 3, 32, seed=8, steps=4), 4)
    for x, y in zip(a, c):
        assert not np.array_equal(x[0]["user"].numpy(), y[0]["user"].numpy())
        assert not np.array_equal(x[0]["dense"].numpy(), y[0]["dense"].numpy())
    # Steps differ from each other, and the held-out stream differs from the training stream.
    assert not np.array_equal(a[0][0]["user"].numpy(), a[1][0]["user"].numpy())
    h = _take(synthetic_dataset(INPUTS, 3, 32, seed=7, steps=4, held_out=True), 4)
    for x, y in zip(a, h):
        assert not np.array_equal(x[0]["user"].numpy(), y[0]["user"].numpy())


def test_reiterating_restarts_the_stream(batches_equal):
    ds = synthetic_dataset(INPUTS, 2, 16, steps=3)
    for x, y in zip(_take(ds, 3), _take(ds, 3)):
        batches_equal(x, y)


@pytest.mark.parametrize("num_ranks, batch_size", [(2, 48), (4, 20), (3, 300)])
def test_n_workers_equal_one_worker(batches_equal, num_ranks, batch_size):
    steps = 3
    one = _take(synthetic_dataset(INPUTS, 4, batch_size * num_ranks, seed=3, steps=steps), steps)
    per_rank = [_take(synthetic_dataset(INPUTS, 4, batch_size, seed=3, rank=r, num_ranks=num_ranks, steps=steps),
                      steps) for r in range(num_ranks)]
    for s in range(steps):
        batches_equal(_concat_batches([per_rank[r][s] for r in range(num_ranks)]), one[s])
    # The workers' batches are different data.
    assert not np.array_equal(per_rank[0][0][0]["dense"].numpy(), per_rank[1][0][0]["dense"].numpy())


def test_start_step_resumes_the_same_stream(batches_equal):
    full = _take(synthetic_dataset(INPUTS, 2, 24, seed=5, rank=1, num_ranks=2, steps=7), 10)
    assert len(full) == 7
    resumed = _take(synthetic_dataset(INPUTS, 2, 24, seed=5, rank=1, num_ranks=2, steps=7, start_step=4), 10)
    assert len(resumed) == 3
    for x, y in zip(full[4:], resumed):
        batches_equal(x, y)
    endless = _take(synthetic_dataset(INPUTS, 2, 24, seed=5, rank=1, num_ranks=2, start_step=6), 1)
    batches_equal(endless[0], full[6])
    assert _take(synthetic_dataset(INPUTS, 2, 24, steps=3, start_step=5), 5) == []


def test_batch_depends_only_on_seed_step_and_rows():
    """The batch of step s is a function of (seed, held_out, s) and the rows, not of the stream position."""
    g = syn._generator(tuple(INPUTS), 2, 9)
    a = g.rows(11, False, 100, 700)
    b = g.rows(11, False, 0, 1024)
    for (va, sa), (vb, sb) in zip(a[0], b[0]):
        np.testing.assert_array_equal(va, vb[sb[100]:sb[700]])
        np.testing.assert_array_equal(sa, sb[100:701] - sb[100])
    np.testing.assert_array_equal(a[1], b[1][100:700])
    np.testing.assert_array_equal(a[2], b[2][100:700])


# ------------------------------------------------------------------------------------------------------------------
# Skew
# ------------------------------------------------------------------------------------------------------------------

def test_truncated_zipf_sampler_is_the_exact_inverse_cdf():
    rng = np.random.default_rng(0)
    for n, s in [(1, 1.0), (7, 0.5), (1000, 1.0), (50_000, 1.3), ((1 << 20) + 1000, 1.05)]:
        law = syn._TruncatedZipf(n, s)
        u = rng.random(100_000)
        r = law.sample(u)
        assert r.min() >= 0 and r.max() < n
        head = u < law._cdf[-1]
        want = np.searchsorted(law._cdf, u[head], side="right")
        np.testing.assert_array_equal(r[head], want)
        k = np.arange(min(n, 50))
        pmf = (k + 1.0) ** -s / np.sum(np.arange(1, n + 1, dtype=np.float64) ** -s)
        if n <= 50_000:
            counts = np.bincount(r, minlength=n)[:k.size] / u.size
            np.testing.assert_allclose(counts[:5], pmf[:5], atol=0.005)
        np.testing.assert_allclose(law.cdf(k.size), pmf.sum(), rtol=1e-9)


def test_tail_beyond_the_exact_table():
    n = 4 << 20
    law = syn._TruncatedZipf(n, 0.9)
    exact_total = np.sum(np.arange(1, n + 1, dtype=np.float64) ** -0.9)
    assert law.total == pytest.approx(exact_total, rel=1e-10)
    assert law.cdf(3 << 20) == pytest.approx(np.sum(np.arange(1, (3 << 20) + 1, dtype=np.float64) ** -0.9)
                                             / exact_total, rel=1e-10)
    r = law.sample(np.random.default_rng(1).random(200_000))
    assert r.max() < n and (r >= (1 << 20)).mean() == pytest.approx(1 - law.cdf(1 << 20), abs=0.01)


@pytest.mark.parametrize("vocab", [10_000, 100_000, 1_000_000])
def test_calibrate_zipf_hits_the_target(vocab):
    s = calibrate_zipf(vocab)
    assert 1.0 < s < 1.5
    assert top_share(SparseInput("x", vocab, zipf=s)) == pytest.approx(0.90, abs=1e-5)
    assert top_share(SparseInput("x", vocab, zipf=s), top_fraction=0.5) > 0.9


def test_calibrate_zipf_trends_and_errors():
    assert calibrate_zipf(10_000) > calibrate_zipf(100_000) > calibrate_zipf(1_000_000)
    assert calibrate_zipf(10_000, target_share=0.5) < calibrate_zipf(10_000, target_share=0.9)
    with pytest.raises(ValueError, match="target_share"):
        calibrate_zipf(1000, top_fraction=0.5, target_share=0.4)    # below the uniform share
    with pytest.raises(ValueError, match="target_share"):
        calibrate_zipf(1000, target_share=1.0)
    with pytest.raises(ValueError, match="top_fraction"):
        calibrate_zipf(1000, top_fraction=0.0)


def test_top_share_of_several_inputs():
    a = SparseInput("a", 10_000, zipf=1.2)
    assert top_share([a, SparseInput("b", 10_000, zipf=1.2)]) == pytest.approx(top_share(a), abs=1e-6)
    # A uniform-ish feature next to a skewed one: the 400 top ids of the 20,000 are all the skewed feature's
    # (its rank-400 id has probability 0.5 * 1.7e-4 > 0.5 * 1e-4 of any id of the other).
    mixed = top_share([a, SparseInput("c", 10_000, zipf=1e-6)])
    assert mixed == pytest.approx(top_share(a, top_fraction=0.04) / 2, abs=1e-6)
    # The sampled estimate agrees with the exact one when there are many samples per top id.
    assert top_share(a, samples=400_000, seed=1) == pytest.approx(top_share(a), abs=0.01)


def test_measured_skew_matches_the_calibrated_target():
    vocab = 10_000
    s = calibrate_zipf(vocab, top_fraction=0.02, target_share=0.90)
    inp = SparseInput("x", vocab, zipf=s)
    ids = np.concatenate([f["x"].numpy() for f, _ in synthetic_dataset([inp], 0, 20_000, seed=2, steps=10)])
    assert ids.size == 200_000 and ids.min() >= 0 and ids.max() < vocab
    counts = np.bincount(ids, minlength=vocab)
    top = np.sort(counts)[::-1][:200]
    assert top.sum() / ids.size == pytest.approx(0.90, abs=0.02)
    # The hot ids are spread over the id space, not 0, 1, 2, ...
    hottest = np.argsort(counts)[::-1][:200]
    assert hottest[0] != 0
    assert np.median(hottest) > vocab / 10
    assert len(set(hottest.tolist()) & set(range(200))) < 50


def test_features_are_independent_streams():
    a, b = SparseInput("a", 1000, zipf=1.1), SparseInput("b", 1000, zipf=1.1)
    features, _ = _take(synthetic_dataset([a, b], 0, 4096), 1)[0]
    # Same law but different id bijections and different random numbers.
    assert np.mean(features["a"].numpy() == features["b"].numpy()) < 0.05
    ga = syn._generator((a, b), 0, 0).features
    ranks_a = (features["a"].numpy() - ga[0].offset) * pow(ga[0].mult, -1, 1000) % 1000
    ranks_b = (features["b"].numpy() - ga[1].offset) * pow(ga[1].mult, -1, 1000) % 1000
    assert ranks_a.max() < 1000 and np.mean(ranks_a == ranks_b) < 0.3
    assert abs(np.corrcoef(np.log1p(ranks_a), np.log1p(ranks_b))[0, 1]) < 0.1


# ------------------------------------------------------------------------------------------------------------------
# Hotness
# ------------------------------------------------------------------------------------------------------------------

def test_variable_and_fixed_hotness():
    inputs = [SparseInput("var", 500, hotness=(0, 3)), SparseInput("fixed", 500, hotness=3),
              SparseInput("range1", 500, hotness=(2, 2)), SparseInput("maybe", 500, hotness=(0, 1))]
    features, _ = _take(synthetic_dataset(inputs, 0, 2000, steps=1), 1)[0]
    lengths = features["var"].row_lengths().numpy()
    assert lengths.min() == 0 and lengths.max() == 3
    assert set(np.unique(lengths)) == {0, 1, 2, 3}
    assert np.abs(np.bincount(lengths) / lengths.size - 0.25).max() < 0.05
    assert (features["fixed"].row_lengths().numpy() == 3).all()
    assert (features["range1"].row_lengths().numpy() == 2).all()
    assert set(np.unique(features["maybe"].row_lengths().numpy())) == {0, 1}
    # Empty rows survive the worker split and the resume path.
    one = features["var"]
    two = [f["var"] for f, _ in (_take(synthetic_dataset(inputs, 0, 1000, rank=r, num_ranks=2, steps=1), 1)[0]
                                 for r in range(2))]
    assert tf.concat(two, axis=0).to_list() == one.to_list()


# ------------------------------------------------------------------------------------------------------------------
# Labels
# ------------------------------------------------------------------------------------------------------------------

def _auc(score, label):
    order = np.argsort(score)
    ranks = np.empty(score.size)
    ranks[order] = np.arange(1, score.size + 1)
    pos = label.sum()
    neg = label.size - pos
    return (ranks[label == 1].sum() - pos * (pos + 1) / 2) / (pos * neg)


@pytest.mark.parametrize("inputs, num_dense", [
    ([SparseInput(f"C{i}", 10 ** (3 + i % 3), zipf=1.1) for i in range(26)], 13),
    ([SparseInput("a", 1000, hotness=(0, 5)), SparseInput("b", 50, zipf=2.0, hotness=3)], 0),
])
def test_labels_follow_the_hidden_model(inputs, num_dense):
    logits, labels = [], []
    for features, label in synthetic_dataset(inputs, num_dense, 4096, seed=4, steps=3):
        logits.append(hidden_logits(inputs, features, seed=4))
        labels.append(label.numpy())
    logit, label = np.concatenate(logits), np.concatenate(labels)
    assert 0.35 < label.mean() < 0.65
    assert np.corrcoef(logit, label)[0, 1] > 0.3
    assert _auc(logit, label) > 0.8
    # Calibrated: the mean predicted probability matches the label rate in each logit bin.
    p = 1 / (1 + np.exp(-logit))
    for lo, hi in [(0.0, 0.3), (0.3, 0.7), (0.7, 1.0)]:
        sel = (p >= lo) & (p < hi)
        assert abs(label[sel].mean() - p[sel].mean()) < 0.03


def test_labels_learnable_from_ids_alone():
    """A per-id average of the training labels (what an embedding learns) ranks held-out examples well."""
    inp = SparseInput("x", 200, zipf=0.5)
    train = next(iter(synthetic_dataset([inp], 0, 50_000, seed=1, steps=1)))
    test = next(iter(synthetic_dataset([inp], 0, 20_000, seed=1, steps=1, held_out=True)))
    ids, y = train[0]["x"].numpy(), train[1].numpy()
    rate = np.bincount(ids, weights=y, minlength=200) / np.maximum(np.bincount(ids, minlength=200), 1)
    assert _auc(rate[test[0]["x"].numpy()], test[1].numpy()) > 0.8
    # Different ids really have different click rates (the per-id weights are not all alike).
    assert rate.std() > 0.2


def test_hidden_model_is_a_hash_not_a_table():
    a = syn._Feature(SparseInput("a", 2 ** 40), seed=0)
    ids = np.array([0, 1, 2 ** 39, 2 ** 40 - 1], np.int64)
    w = a.weights(ids)
    assert w.min() >= -1 and w.max() < 1 and len(set(w.tolist())) == 4
    np.testing.assert_array_equal(w, syn._Feature(SparseInput("a", 2 ** 40), seed=0).weights(ids))
    assert not np.array_equal(w, syn._Feature(SparseInput("b", 2 ** 40), seed=0).weights(ids))
    # Huge vocabularies: ids stay in range and the bijection stays a bijection (gcd 1).
    assert math.gcd(a.mult, 2 ** 40) == 1
    out = a.ids(np.random.default_rng(0).random(10_000))
    assert out.min() >= 0 and out.max() < 2 ** 40


# ------------------------------------------------------------------------------------------------------------------
# Drift
# ------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("drift", [0.5, 3.0, 250.0])
def test_drift_moves_every_drawn_rank_by_floor_drift_times_step(drift):
    """With drift d, a draw of rank k at step s gives the id of rank k - floor(d s) (mod vocab): the ranks of the
    drifted ids, read through the inverse of the feature's bijection, are the undrifted ranks plus the shift, feature
    by feature (new ids arrive at the top); the labels follow the hidden weights of the new ids; drift 0 is the default
    stream."""
    still = _take(synthetic_dataset(INPUTS, 3, 64, seed=5, steps=6), 6)
    moved = _take(synthetic_dataset(INPUTS, 3, 64, seed=5, steps=6, drift=drift), 6)
    default = _take(synthetic_dataset(INPUTS, 3, 64, seed=5, steps=6, drift=0), 6)

    def flat(x):
        return (x.flat_values if isinstance(x, tf.RaggedTensor) else x).numpy()

    for step, ((f0, _), (f1, label1), (fd, _)) in enumerate(zip(still, moved, default)):
        shift = math.floor(drift * step)
        for inp in INPUTS:
            feature = syn._Feature(inp, 5)  # noqa: SLF001  (the bijection rank -> id)
            v = inp.vocab_size
            inverse = pow(feature.mult, -1, v) if v > 1 else 1

            def rank_of(ids):
                return (ids - feature.offset) % v * inverse % v  # noqa: B023

            np.testing.assert_array_equal((rank_of(flat(f0[inp.name])) - shift) % v, rank_of(flat(f1[inp.name])),
                                          err_msg=inp.name)
            np.testing.assert_array_equal(flat(fd[inp.name]), flat(f0[inp.name]))
            if isinstance(f0[inp.name], tf.RaggedTensor):
                np.testing.assert_array_equal(f0[inp.name].row_splits.numpy(), f1[inp.name].row_splits.numpy())
        np.testing.assert_array_equal(f0["dense"].numpy(), f1["dense"].numpy())
        if shift:
            logits = hidden_logits(INPUTS, f1, seed=5)
            assert np.corrcoef(logits, label1.numpy())[0, 1] > 0.3  # labels from the drifted ids' weights


@pytest.mark.parametrize("drift", [-1, float("nan"), True, "2"])
def test_bad_drift_is_refused(drift):
    with pytest.raises(ValueError, match="drift must be a finite number >= 0"):
        synthetic_dataset(INPUTS, 3, 64, drift=drift)
