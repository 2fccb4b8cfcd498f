"""Token-balanced batching (MTGRBoost Algorithm 1), the global-count loss weighting and the summary metrics of
tf_fusedrec/train/balance.py, in one process: the batcher against a brute-force reference, no sample lost or
duplicated over random streams, batch token counts within half the longest sequence of the target, edge cases, and
the weighting's gradient against one worker's on the union of the batches."""

import itertools

import numpy as np
import pytest

import tf_fusedrec as fr  # (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)
import tensorflow as tf
from tf_fusedrec.distributed.comm import SingleProcessComm
from tf_fusedrec.train import balance

# --- references --------------------------------------------------------------------------------------------------


def brute_force_cut(tokens, target):
    """The largest k in [1, n] minimising |tokens[0] + ... + tokens[k-1] - target| (linear scan)."""
    best_k, best_distance = None, None
    for k in range(1, len(tokens) + 1):
        distance = abs(sum(tokens[:k]) - target)
        if best_distance is None or distance <= best_distance:
            best_k, best_distance = k, distance
    return best_k


def reference_batches(token_counts, target, buffer_size):
    """Algorithm 1 written plainly: fill chunks of buffer_size while the buffer holds fewer than target tokens, cut
    at brute_force_cut, emit the rest at the end. Works on sample indices."""
    position, buffer, batches = 0, [], []
    while True:
        while sum(token_counts[i] for i in buffer) < target and position < len(token_counts):
            buffer += list(range(position, min(position + buffer_size, len(token_counts))))
            position = min(position + buffer_size, len(token_counts))
        if sum(token_counts[i] for i in buffer) < target:
            if buffer:
                batches.append(buffer)
            return batches
        k = brute_force_cut([token_counts[i] for i in buffer], target)
        batches.append(buffer[:k])
        buffer = buffer[k:]


def long_tailed_lengths(rng, n, cap, zero_fraction=0.05):
    """Pareto lengths (many short, a few up to `cap`), some empty."""
    lengths = np.minimum(np.floor(rng.pareto(1.2, n) * 4).astype(int) + 1, cap)
    lengths[rng.random(n) < zero_fraction] = 0
    return lengths


def batch_indices(token_counts, target, **kwargs):
    """A TokenBatcher's batches of the stream of sample indices 0, 1, ... whose token counts are token_counts."""
    batcher = balance.TokenBatcher(target, tokens_of=lambda i: int(token_counts[i]), **kwargs)
    return list(batcher(range(len(token_counts))))


# --- closest_cut -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_closest_cut_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        tokens = rng.integers(0, 6, n)
        tokens[rng.random(n) < 0.3] = 0  # plateaus: ties between cuts
        target = int(rng.integers(1, max(2, 2 * int(tokens.sum()) + 3)))
        assert balance.closest_cut(np.cumsum(tokens), target) == brute_force_cut(list(tokens), target), \
            (list(tokens), target)


def test_closest_cut_ties_go_to_the_larger_cut():
    # S = 2, 6: 4 - 2 == 6 - 4, the larger cut wins.
    assert balance.closest_cut(np.cumsum([2, 4, 5]), 4) == 2
    # Empty sequences right after an exact cut join the batch.
    assert balance.closest_cut(np.cumsum([3, 0, 0, 2]), 3) == 3
    # Strictly closer below the target: the smaller cut.
    assert balance.closest_cut(np.cumsum([3, 4]), 4) == 1


def test_closest_cut_never_returns_zero():
    # 0 tokens would be closest to 4 for a first sample of 9: it is a batch of its own, with its trailing empties.
    assert balance.closest_cut(np.cumsum([9, 0, 1]), 4) == 2
    assert balance.closest_cut(np.cumsum([9, 1]), 4) == 1


# --- TokenBatcher ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_batcher_matches_the_reference(seed):
    rng = np.random.default_rng(seed)
    token_counts = long_tailed_lengths(rng, int(rng.integers(0, 400)), cap=int(rng.integers(1, 80)))
    target = int(rng.integers(1, 120))
    buffer_size = int(rng.integers(1, 40))
    got = batch_indices(token_counts, target, buffer_size=buffer_size)
    assert got == reference_batches(list(token_counts), target, buffer_size)


@pytest.mark.parametrize("seed", range(12))
def test_no_sample_is_lost_or_duplicated(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(0, 2000))
    samples = [{"id": i, "seq": [0] * int(t)} for i, t in enumerate(long_tailed_lengths(rng, n, cap=300))]
    batcher = balance.TokenBatcher(int(rng.integers(1, 500)), buffer_size=int(rng.integers(1, 300)), tokens_of="seq")
    batches = list(batcher(iter(samples)))  # a one-pass iterator, as a reader gives
    assert all(batches), "an empty batch was emitted"
    emitted = [s for b in batches for s in b]
    assert len(emitted) == n
    assert [s["id"] for s in emitted] == list(range(n)), "samples must come out once each, in stream order"
    assert all(a is b for a, b in zip(emitted, samples)), "the batcher must hand back the samples themselves"


@pytest.mark.parametrize("seed", range(6))
def test_long_tailed_batches_are_within_half_the_longest_sequence_of_the_target(seed):
    # The cut is the closer of the two cumulative sums around the target, one sample apart: |tokens - N| <= L / 2
    # for every batch but the last, when no sequence is longer than the target.
    rng = np.random.default_rng(200 + seed)
    longest_allowed = 400
    token_counts = long_tailed_lengths(rng, 5000, cap=longest_allowed)
    longest = int(token_counts.max())
    target = 2000
    batches = batch_indices(token_counts, target, buffer_size=64, max_sequence_tokens=longest_allowed)
    sums = np.array([token_counts[b].sum() for b in batches])
    assert np.all(np.abs(sums[:-1] - target) <= longest / 2), (sums[:-1].min(), sums[:-1].max(), longest)
    assert sums[-1] <= target + longest / 2
    # Fixed sample counts of the same mean size spread far wider (the point of balancing).
    mean_size = len(token_counts) // len(batches)
    fixed = np.array([token_counts[b].sum() for b in balance.fixed_batches(range(len(token_counts)), mean_size)])
    assert np.std(sums[:-1]) < 0.5 * np.std(fixed[:-1])


def test_short_buffers_merge_into_the_next_fill():
    # buffer_size 1: one sample per fill, the buffer grows until it holds the target.
    token_counts = np.array([1, 1, 1, 1, 1, 1, 1])
    assert batch_indices(token_counts, 3, buffer_size=1) == [[0, 1, 2], [3, 4, 5], [6]]


def test_empty_sequences_are_kept():
    token_counts = np.array([0, 2, 0, 0, 2, 0, 3, 0])
    batches = batch_indices(token_counts, 2, buffer_size=3)
    assert sorted(i for b in batches for i in b) == list(range(8))
    assert [int(token_counts[b].sum()) for b in batches] == [2, 2, 3]


def test_only_empty_sequences_make_one_last_batch():
    assert batch_indices(np.zeros(7, int), 5, buffer_size=2) == [list(range(7))]


def test_empty_stream_gives_no_batches():
    assert list(balance.TokenBatcher(10)([])) == []


def test_a_sample_longer_than_the_target_is_a_batch_of_one():
    token_counts = np.array([3, 50, 2, 2, 0, 100, 3])
    batches = batch_indices(token_counts, 5, buffer_size=2)
    assert [i for b in batches for i in b] == list(range(7))
    assert [1] in batches
    assert [5] in batches  # 100 > 2 x 5: a batch of its own (the 0 before it went with the 2s)


def test_max_sequence_tokens_makes_a_longer_sequence_an_error():
    batcher = balance.TokenBatcher(10, max_sequence_tokens=8)
    with pytest.raises(ValueError, match=r"sample 2 of the stream holds 9 tokens, more than max_sequence_tokens=8"):
        list(batcher([[1], [1, 2], list(range(9))]))


def test_target_below_the_cap_is_an_error():
    with pytest.raises(ValueError, match=r"target_tokens \(100\) is smaller than max_sequence_tokens \(500\)"):
        balance.TokenBatcher(100, max_sequence_tokens=500)


@pytest.mark.parametrize("kwargs,message", [
    ({"target_tokens": 0}, "target_tokens must be a positive int"),
    ({"target_tokens": 2.5}, "target_tokens must be a positive int"),
    ({"target_tokens": 4, "buffer_size": 0}, "buffer_size must be a positive int"),
    ({"target_tokens": 4, "tokens_of": 3}, "tokens_of must be a callable"),
    ({"target_tokens": 4, "max_sequence_tokens": -1}, "max_sequence_tokens must be a positive int"),
])
def test_bad_arguments_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        balance.TokenBatcher(**kwargs)


def test_dict_samples_need_the_sequence_feature_named():
    samples = [{"history": [1, 2, 3], "user": 1}, {"history": [4], "user": 2}]
    with pytest.raises(ValueError, match=r"the samples are dicts \(features \['history', 'user'\]\): pass tokens_of"):
        list(balance.TokenBatcher(4)(samples))
    assert list(balance.TokenBatcher(3, tokens_of="history")(samples)) == [samples[:1], samples[1:]]
    with pytest.raises(ValueError, match=r"tokens_of='items': a sample has no sequence feature 'items'"):
        list(balance.TokenBatcher(3, tokens_of="items")(samples))


def test_bad_token_count_names_the_sample():
    with pytest.raises(ValueError, match=r"tokens_of\(sample 1 of the stream\) must be an int >= 0, got -2"):
        list(balance.TokenBatcher(4, tokens_of=lambda s: s)([1, -2, 3]))


# --- fixed_batches -----------------------------------------------------------------------------------------------


def test_fixed_batches_keep_the_remainder():
    assert list(balance.fixed_batches(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(balance.fixed_batches(iter(range(6)), 3)) == [[0, 1, 2], [3, 4, 5]]
    assert list(balance.fixed_batches([], 3)) == []
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        list(balance.fixed_batches(range(3), 0))


# --- to_dataset --------------------------------------------------------------------------------------------------


def test_to_dataset_gives_ragged_batches_of_varying_size():
    rng = np.random.default_rng(3)
    samples = [{"history": rng.integers(0, 50, int(n)).tolist(), "user": i, "label": float(i) / 10}
               for i, n in enumerate(long_tailed_lengths(rng, 60, cap=12, zero_fraction=0.2))]
    batcher = balance.TokenBatcher(15, buffer_size=7, tokens_of="history")
    signature = balance.batch_signature(sequences={"history": tf.int64}, scalars={"user": tf.int64,
                                                                                  "label": tf.float32})
    dataset = balance.to_dataset(lambda: batcher(samples), signature, label_key="label")
    expected = list(batcher(samples))
    for _ in range(2):  # the dataset can be iterated again
        got = list(dataset)
        assert len(got) == len(expected)
        for (features, labels), batch in zip(got, expected):
            assert isinstance(features["history"], tf.RaggedTensor)
            assert features["history"].to_list() == [s["history"] for s in batch]
            np.testing.assert_array_equal(features["user"].numpy(), [s["user"] for s in batch])
            np.testing.assert_allclose(labels.numpy(), [s["label"] for s in batch])
            assert features["history"].dtype == tf.int64 and labels.dtype == tf.float32
    assert len({int(f["user"].shape[0]) for f, _ in got}) > 1, "balanced batches should differ in size"


def test_collate_names_a_missing_feature():
    signature = balance.batch_signature(sequences={"history": tf.int64})
    with pytest.raises(ValueError, match=r"sample 1 of the batch has no feature 'history'"):
        balance.collate([{"history": [1]}, {"other": [2]}], signature)


def test_collate_wants_one_dimensional_sequences():
    signature = balance.batch_signature(sequences={"history": tf.int64})
    with pytest.raises(ValueError, match=r"feature 'history' of sample 1 must be a 1-D sequence, got shape \[2, 2\]"):
        balance.collate([{"history": [1]}, {"history": [[1, 2], [3, 4]]}], signature)


def test_dataset_arguments_are_checked():
    signature = balance.batch_signature(scalars={"x": tf.float32})
    with pytest.raises(ValueError, match="batches must be a callable"):
        balance.to_dataset([[{"x": 1.0}]], signature)
    with pytest.raises(ValueError, match=r"label_key 'y' is not in the signature"):
        balance.to_dataset(lambda: [], signature, label_key="y")
    with pytest.raises(ValueError, match=r"feature 'x' is both a sequence and a scalar"):
        balance.batch_signature(sequences={"x": tf.int64}, scalars={"x": tf.int64})
    with pytest.raises(ValueError, match=r"feature 'x' must be a tf.RaggedTensorSpec"):
        balance.collate([], {"x": tf.TensorSpec([], tf.float32)})


# --- metrics -----------------------------------------------------------------------------------------------------


def test_token_imbalance_on_known_inputs():
    assert balance.token_imbalance([[100, 100], [100, 100]]) == 1.0
    # Steps: 120/100 = 1.2 and 300/100 = 3.0 (three workers) -> 2.1.
    assert balance.token_imbalance([[100, 120, 110], [300, 100, 200]]) == pytest.approx(2.1)
    assert balance.token_imbalance([[5, 0]]) == float("inf")
    with pytest.raises(ValueError, match=r"\[steps, workers\] array"):
        balance.token_imbalance([])
    with pytest.raises(ValueError, match=r"negative count -1.0 at step 0, worker 1"):
        balance.token_imbalance([[3, -1]])


def test_samples_per_worker():
    summary = balance.samples_per_worker([[3, 5], [4, 1], [2, 3]])
    assert summary == {"total": [9, 9], "mean_per_step": [3.0, 3.0]}
    with pytest.raises(ValueError, match="samples_per_worker_per_step"):
        balance.samples_per_worker([1, 2])


# --- global-count weighting ----------------------------------------------------------------------------------------


class SimulatedComm:
    """Worker `rank` of `size` simulated workers whose local counts are known: the count allreduce sums them."""

    def __init__(self, rank, size, counts):
        self.rank, self.size, self.counts = rank, size, counts

    def allreduce(self, tensors, name, op="average"):
        (local,) = tensors
        assert op == "sum" and name == "FusedRec/balance/count"
        assert int(local) == self.counts[self.rank], "the allreduce must carry this worker's count"
        return [tf.constant(sum(self.counts), tf.int64)]

    def alltoall(self, tensor, splits, name):
        raise AssertionError(f"the loss weighting must not issue an all-to-all ({name})")


def per_token_losses(w, batch):
    """A linear model over token features: per-token squared errors, ragged [B, None]."""
    features, targets = batch
    return tf.square(tf.ragged.map_flat_values(lambda x: tf.linalg.matvec(x, w), features) - targets)


def random_batch(rng, lengths):
    values = rng.normal(size=(int(sum(lengths)), 3)).astype(np.float32)
    targets = rng.normal(size=int(sum(lengths))).astype(np.float32)
    return (tf.RaggedTensor.from_row_lengths(values, lengths), tf.RaggedTensor.from_row_lengths(targets, lengths))


def concat_batches(batches):
    return tuple(tf.concat([b[i] for b in batches], axis=0) for i in range(2))


@pytest.mark.parametrize("by", ["samples", "tokens"])
def test_averaged_weighted_gradients_equal_one_worker_on_the_union(by):
    rng = np.random.default_rng(7)
    w = tf.Variable(rng.normal(size=3).astype(np.float32))
    worker_lengths = [[3, 0, 5], [1], [2, 2, 7, 1, 0]]  # different local batch sizes, as the batcher gives
    batches = [random_batch(rng, lengths) for lengths in worker_lengths]
    weighting = balance.get_weighting(by)
    counts = [int(weighting.local_count(tf.constant(lengths))) for lengths in worker_lengths]
    assert counts == ([3, 1, 5] if by == "samples" else [8, 1, 12])

    def gradient(loss_fn):
        with tf.GradientTape() as tape:
            loss = loss_fn()
        return tape.gradient(loss, w).numpy()

    # Each worker's gradient of its weighted loss, then GroupedOptimizer's average over workers (sum x 1/N).
    averaged = np.mean([gradient(lambda r=r: balance.GlobalMeanLoss(SimulatedComm(r, 3, counts), by=by)(
        per_token_losses(w, batches[r]), tf.constant(worker_lengths[r])).loss) for r in range(3)], axis=0)
    # One worker on the union, with the global-mean loss.
    union, union_lengths = concat_batches(batches), sum(worker_lengths, [])
    single = gradient(lambda: balance.GlobalMeanLoss(SingleProcessComm(), by=by)(
        per_token_losses(w, union), tf.constant(union_lengths)).loss)
    np.testing.assert_allclose(averaged, single, rtol=1e-5, atol=1e-7)
    # The naive loss (each worker's local mean) is a different, biased, update with unequal batches.
    local_mean = np.mean([gradient(lambda r=r: tf.reduce_sum(per_token_losses(w, batches[r])) / counts[r])
                          for r in range(3)], axis=0)
    assert not np.allclose(local_mean, single, rtol=1e-3)


def test_global_mean_loss_formula():
    result = balance.GlobalMeanLoss(SimulatedComm(1, 2, [4, 6]), by="samples")(
        tf.constant([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), tf.constant([1, 1, 1, 1, 1, 1]))
    # sum 21 x N 2 / G 10.
    assert float(result.loss) == pytest.approx(4.2)
    assert (int(result.local_count), int(result.global_count)) == (6, 10)
    assert float(balance.global_mean_loss(tf.constant(21.0), 10, 2)) == pytest.approx(4.2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the global count is 0"):
        balance.global_mean_loss(tf.constant(1.0), 0, 2)


def test_global_count_with_one_worker_is_the_local_count():
    np.testing.assert_array_equal(balance.global_count([3, 17], SingleProcessComm(), "FusedRec/balance/count").numpy(),
                                  [3, 17])
    counts = balance.worker_counts([3, 17], SingleProcessComm(), "FusedRec/balance/worker_counts").numpy()
    np.testing.assert_array_equal(counts, [[3, 17]])


def test_unknown_weighting_is_an_error():
    with pytest.raises(ValueError, match=r"weighting 'by' must be one of \['samples', 'tokens'\], got 'rows'"):
        balance.get_weighting("rows")


def test_weighting_counts():
    lengths = tf.constant([0, 4, 2])
    assert int(balance.get_weighting("samples").local_count(lengths)) == 3
    assert int(balance.get_weighting("tokens").local_count(lengths)) == 6


def test_batcher_works_on_an_infinite_stream():
    batches = balance.TokenBatcher(10, buffer_size=4)(itertools.repeat([1, 2, 3]))
    assert [len(b) for b in itertools.islice(batches, 3)] == [3, 3, 3]  # 9 is closer to 10 than 12 is


# --- Accumulator (one process; the distributed equality is in tests/distributed/test_balance.py) ------------------


def accumulation_model(name, optimizer="sgd", table_backend="tfra"):
    features = [fr.Feature("user_id", dim=3, max_id_bits=20), fr.Feature("history", dim=3, max_id_bits=20)]
    layer = fr.FusedEmbedding(features, optimizer={"name": optimizer, "learning_rate": 0.2}, name=name,
                              table_backend=table_backend)
    head = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1))
    head.build([None, 6])
    return layer, head, fr.train.make_optimizer([layer], default={"name": "sgd", "learning_rate": 0.2})


def sample_losses(layer, head, batch):
    out = layer({"user_id": batch["user_id"], "history": batch["history"]}, training=True)
    history = tf.reduce_sum(out["history"], axis=1)  # [B, 3]
    scores = head(tf.concat([out["user_id"], history], axis=1))[:, 0]
    return tf.square(scores - batch["label"])


def accumulation_batches():
    rng = np.random.default_rng(5)
    batches = []
    for size in (3, 1, 4):
        lengths = rng.integers(0, 4, size)
        batches.append({"user_id": tf.constant(rng.integers(0, 6, size), tf.int64),
                        "history": tf.RaggedTensor.from_row_lengths(rng.integers(0, 6, int(lengths.sum())), lengths),
                        "label": tf.constant(rng.normal(size=size), tf.float32)})
    return batches


@pytest.mark.tfra
@pytest.mark.parametrize("optimizer,table_backend", [("sgd", "tfra"), ("adagrad", "tfra"), ("adagrad", "native")])
def test_accumulator_eagerly_equals_one_step_on_the_union(optimizer, table_backend):
    """The union's reference step always runs on TFRA tables: the native accumulation is checked against them."""
    batches = accumulation_batches()
    layer, head, opt = accumulation_model(f"acc_eager_{optimizer}_{table_backend}", optimizer, table_backend)
    accumulator = balance.Accumulator([layer, head], opt, name="eager")
    for batch in batches:
        with tf.GradientTape() as tape:
            loss_sum = tf.reduce_sum(sample_losses(layer, head, batch))
        variables = layer.trainable_variables + head.trainable_variables
        accumulator.accumulate(zip(tape.gradient(loss_sum, variables), variables), count=batch["label"].shape[0])
    assert int(accumulator.micro_batches) == 3
    accumulator.apply()
    assert int(accumulator.micro_batches) == 0

    union = {k: tf.concat([b[k] for b in batches], axis=0) for k in batches[0]}
    ref_layer, ref_head, ref_opt = accumulation_model(f"union_eager_{optimizer}", optimizer)
    with tf.GradientTape() as tape:
        loss = balance.GlobalMeanLoss(SingleProcessComm())(sample_losses(ref_layer, ref_head, union),
                                                           union["history"].row_lengths()).loss
    variables = ref_layer.trainable_variables + ref_head.trainable_variables
    ref_opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    np.testing.assert_allclose(head.kernel.numpy(), ref_head.kernel.numpy(), rtol=1e-6, atol=1e-7)
    for got_table, want_table in zip(layer.tables, ref_layer.tables):
        keys, rows = got_table.export()
        want_rows, exists = want_table.params.lookup(keys, return_exists=True)
        assert bool(tf.reduce_all(exists)) and int(got_table.size()) == int(want_table.size())
        np.testing.assert_allclose(rows.numpy(), want_rows.numpy(), rtol=1e-6, atol=1e-7)
        initial = want_table.initial_rows(keys, None)  # the rows moved: something was applied
        assert not np.allclose(rows.numpy(), initial.numpy())


@pytest.mark.tfra
def test_accumulator_errors_name_the_problem():
    layer, head, opt = accumulation_model("acc_errors")
    accumulator = balance.Accumulator([layer, head], opt, name="errors")
    with pytest.raises(ValueError, match=r"count \(the micro-batch's samples or tokens\) is required"):
        accumulator.accumulate([])
    stray = tf.Variable([1.0], name="stray")
    with pytest.raises(ValueError, match=r"variable 'stray:0' was not among the model's trainable variables"):
        accumulator.accumulate([(tf.constant([1.0]), stray)], count=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the global count is 0"):
        accumulator.apply()
    with pytest.raises(ValueError, match=r"an embedding table named '.*acc_errors.*/errors' already exists"):
        balance.Accumulator([layer, head], opt, name="errors")
    hot = fr.FusedEmbedding([fr.Feature("user_id", dim=3)], optimizer="sgd", replication=4, name="acc_hot")
    with pytest.raises(ValueError, match=r"layer 'acc_hot' replicates hot rows"):
        balance.Accumulator([hot], fr.train.make_optimizer([hot], default="sgd"))
