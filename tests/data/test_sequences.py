"""GRM sequence data (tf_fusedrec/data/sequences.py): long-tailed lengths, determinism, disjoint worker shares, the
per-sample and the batched API agreeing, the cap, empty sequences, labels that depend on the items, spec errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tf_fusedrec  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec.data import SequenceSpec, SparseInput, grm_batch, grm_dataset, grm_hidden_logits, grm_samples
from tf_fusedrec.train.experiment import auc

from tests.subprocess_runner import ROOT

VOCAB = 5_000
SPEC = SequenceSpec(SparseInput("items", VOCAB, zipf=1.1),
                    (SparseInput("target", VOCAB, zipf=1.1), SparseInput("segment", 100), SparseInput("device", 8)),
                    target="target")


def take(spec, n, **kwargs):
    return list(itertools.islice(grm_samples(spec, **kwargs), n))


def lengths_of(samples):
    return np.array([s["tokens"] for s in samples])


def with_(spec=SPEC, **changes):
    fields = {f: getattr(spec, f) for f in spec.__dataclass_fields__}
    return SequenceSpec(**{**fields, **changes})


# ----------------------------------------------------------------------------------------------------------------
# Lengths
# ----------------------------------------------------------------------------------------------------------------

def test_lengths_are_long_tailed_as_documented():
    lengths = lengths_of(take(SPEC, 20_000))
    median = np.median(lengths)
    assert 30 <= median <= 34, median
    # the module docstring: 5th-95th percentile of max / median over 10^4 users is 33x-52x, bounded by 50 x 32
    assert 33 <= lengths.max() / median <= 53, (lengths.max(), median)
    assert lengths.max() <= SPEC.longest_length and lengths.min() >= 1
    assert 1.5 <= lengths.mean() / median <= 1.8, lengths.mean() / median  # exp(sigma^2 / 2) = 1.65
    # a long tail: 1% of the users hold far more than 1% of the tokens
    top = np.sort(lengths)[::-1][: len(lengths) // 100]
    assert top.sum() / lengths.sum() > 0.08, top.sum() / lengths.sum()


def test_sigma_is_the_tail_knob():
    narrow = lengths_of(take(with_(length_sigma=0.3), 5_000))
    assert narrow.max() / np.median(narrow) < 4, narrow.max() / np.median(narrow)
    flat = lengths_of(take(with_(length_sigma=0.0, median_length=20), 200))
    assert set(flat) == {20}


def test_empty_sequences_are_kept():
    spec = with_(empty_fraction=0.2)
    samples = take(spec, 2_000)
    assert [s["index"] for s in samples] == list(range(2_000)), "samples were dropped"
    empty = [s for s in samples if s["tokens"] == 0]
    assert 0.17 <= len(empty) / 2_000 <= 0.23, len(empty)
    assert all(s["items"].shape == (0,) for s in empty)
    features, labels = next(iter(grm_dataset(spec, 64)))
    assert (features["items"].row_lengths().numpy() == 0).any() and labels.shape == (64, 2)


# ----------------------------------------------------------------------------------------------------------------
# Determinism and workers
# ----------------------------------------------------------------------------------------------------------------

def assert_samples_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=f"sample {x['index']}, {k}")


def test_deterministic_and_resumable():
    first = take(SPEC, 600, seed=3)
    assert_samples_equal(first, take(SPEC, 600, seed=3))
    assert_samples_equal(first[437:], take(SPEC, 163, seed=3, start=437))
    assert_samples_equal(first[10:20], list(grm_samples(SPEC, seed=3, start=10, stop=20)))
    other = take(SPEC, 600, seed=4)
    assert not all(np.array_equal(a["items"], b["items"]) for a, b in zip(first, other))
    held_out = take(SPEC, 600, seed=3, held_out=True)
    assert not all(np.array_equal(a["items"], b["items"]) for a, b in zip(first, held_out))
    s = first[0]
    assert s["items"].dtype == np.int64 and s["labels"].dtype == np.float32 and s["labels"].shape == (2,)
    assert s["tokens"] == s["items"].size and np.ndim(s["target"]) == 0
    items = np.concatenate([x["items"] for x in first])
    assert items.min() >= 0 and items.max() < VOCAB


def test_workers_get_disjoint_shares_whose_union_is_the_stream():
    one = take(SPEC, 900)
    shares = [take(SPEC, 300, rank=r, num_ranks=3) for r in range(3)]
    indices = [{s["index"] for s in share} for share in shares]
    assert not (indices[0] & indices[1]) and not (indices[1] & indices[2]) and not (indices[0] & indices[2])
    assert set().union(*indices) == set(range(900))
    by_index = {s["index"]: s for s in one}
    for share in shares:  # a sample is the same whichever worker generates it
        assert_samples_equal(share, [by_index[s["index"]] for s in share])


def test_batched_dataset_equals_the_samples():
    spec = with_(empty_fraction=0.1)
    for rank in range(2):
        ds = grm_dataset(spec, 32, seed=1, rank=rank, num_ranks=2, start_step=2, steps=4)
        batches = list(ds)
        assert len(batches) == 2
        samples = take(spec, 64, seed=1, rank=rank, num_ranks=2, start=64)
        for (features, labels), chunk in zip(batches, (samples[:32], samples[32:])):
            want_features, want_labels = grm_batch(chunk, spec)
            assert sorted(features) == sorted(want_features) == ["device", "items", "segment", "target"]
            np.testing.assert_array_equal(features["items"].row_splits.numpy(),
                                          want_features["items"].row_splits.numpy())
            np.testing.assert_array_equal(features["items"].flat_values.numpy(),
                                          want_features["items"].flat_values.numpy())
            for c in ("device", "segment", "target"):
                assert features[c].shape == (32,)
                np.testing.assert_array_equal(features[c].numpy(), want_features[c].numpy())
            np.testing.assert_array_equal(labels.numpy(), want_labels.numpy())


def test_two_workers_see_what_one_worker_of_twice_the_batch_sees():
    def rows(ds):
        out = []
        for features, labels in ds:
            for items, target, label in zip(features["items"].to_list(), features["target"].numpy(),
                                            labels.numpy()):
                out.append((tuple(items), int(target), tuple(label)))
        return out

    one = rows(grm_dataset(SPEC, 64, steps=2))
    two = rows(grm_dataset(SPEC, 32, rank=0, num_ranks=2, steps=2)) + rows(
        grm_dataset(SPEC, 32, rank=1, num_ranks=2, steps=2))
    assert sorted(one) == sorted(two) and len(one) == 128


# ----------------------------------------------------------------------------------------------------------------
# The cap
# ----------------------------------------------------------------------------------------------------------------

def test_a_sequence_over_the_cap_is_an_error_naming_it():
    capped = with_(max_length=100)
    with pytest.raises(ValueError, match=r"sample \d+ has a sequence of \d+ items, more than the cap max_length=100"):
        take(capped, 1_000)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=r"max_length=100"):
        list(grm_dataset(capped, 256, steps=1))


def test_truncate_keeps_the_last_items_and_the_labels():
    full = take(SPEC, 1_000)
    cut = take(with_(max_length=100, truncate=True), 1_000)
    assert max(lengths_of(full)) > 100, "the sample must hold sequences over the cap"
    for a, b in zip(full, cut):
        assert b["tokens"] == min(a["tokens"], 100)
        np.testing.assert_array_equal(b["items"], a["items"][-100:])
        np.testing.assert_array_equal(b["labels"], a["labels"])
        assert b["target"] == a["target"]


# ----------------------------------------------------------------------------------------------------------------
# Labels
# ----------------------------------------------------------------------------------------------------------------

def test_labels_follow_the_hidden_model():
    samples = take(SPEC, 8_000)
    labels = np.stack([s["labels"] for s in samples])
    click, conversion = labels[:, 0], labels[:, 1]
    assert 0.4 <= click.mean() <= 0.6 and 0.18 <= conversion.mean() <= 0.32, labels.mean(axis=0)
    assert (conversion <= click).all(), "a conversion without a click"
    logits = grm_hidden_logits(SPEC, [s["index"] for s in samples])
    assert logits.shape == (8_000, 2)
    assert auc(click, logits[:, 0]) > 0.75
    clicked = click == 1
    assert auc(conversion[clicked], logits[clicked, 1]) > 0.75


def _item_score_auc(samples, labels):
    """AUC on the second half of a score learnt from the first half's items only: each sample scores the mean
    click rate (over the first half) of the samples holding each of its last 16 items."""
    half = len(samples) // 2
    clicks, seen = np.zeros(VOCAB), np.zeros(VOCAB)
    for s, y in zip(samples[:half], labels[:half]):
        ids = np.unique(s["items"][-16:])
        clicks[ids] += y
        seen[ids] += 1
    rate = np.where(seen > 0, (clicks + 1) / (seen + 2), 0.5)
    scores = [rate[s["items"][-16:]].mean() if s["tokens"] else 0.5 for s in samples[half:]]
    return auc(labels[half:], np.array(scores))


def test_clicks_depend_on_the_items():
    samples = take(SPEC, 8_000)
    click = np.array([s["labels"][0] for s in samples])
    learnt = _item_score_auc(samples, click)
    shuffled = _item_score_auc(samples, np.random.default_rng(0).permutation(click))
    assert learnt > 0.55, learnt
    assert abs(shuffled - 0.5) < 0.03, shuffled


# ----------------------------------------------------------------------------------------------------------------
# Spec and config
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, fragment", [
    (dict(items=SparseInput("items", VOCAB, hotness=3)), "feature 'items': hotness must be 1"),
    (dict(target="segment"), "target: feature 'segment' has vocab 100"),
    (dict(target="user"), "target: 'user' is not a context feature"),
    (dict(contexts=(SparseInput("labels", 10),), target=None), "feature 'labels': the name is reserved"),
    (dict(contexts=(SparseInput("items", 10),), target=None), "feature 'items' is given twice"),
    (dict(median_length=0), "median_length must be a number >= 1"),
    (dict(length_sigma=-1.0), "length_sigma must be a number >= 0"),
    (dict(longest_length=10), "longest_length must be an int >= median_length"),
    (dict(empty_fraction=1.0), "empty_fraction must be a number in [0, 1)"),
    (dict(max_length=0), "max_length must be an int >= 1"),
    (dict(truncate="yes"), "truncate must be true or false"),
])
def test_spec_errors_name_the_field(changes, fragment):
    with pytest.raises(ValueError) as e:
        with_(**changes)
    assert fragment in str(e.value), str(e.value)


def test_argument_errors():
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 1\]"):
        take(SPEC, 1, rank=2, num_ranks=2)
    with pytest.raises(ValueError, match=r"batch_size must be an int >= 1"):
        grm_dataset(SPEC, 0)
    with pytest.raises(ValueError, match=r"expected a SequenceSpec or an ExperimentConfig"):
        take({"items": 1}, 1)
    with pytest.raises(ValueError, match=r"grm_batch: needs at least one sample"):
        grm_batch([], SPEC)


def test_spec_from_the_yaml_config():
    config = cfg.load_config(ROOT / "configs" / "grm_synthetic.yaml")
    spec = SequenceSpec.from_config(config)
    assert spec.items == SparseInput("items", 100_000, 1.1)
    assert spec.feature_names == ("items", "target", "user_segment", "device") and spec.target == "target"
    assert (spec.median_length, spec.length_sigma, spec.longest_length) == (32, 1.0, 1600)
    samples = take(config, 50)  # a config works where a spec does, with its data.seed
    assert_samples_equal(samples, take(spec, 50, seed=config.data.seed))
    assert sorted(samples[0]) == ["device", "index", "items", "labels", "target", "tokens", "user_segment"]
