"""Key-centric sample clustering (NestPipe §V-C): reorder a batch so that samples sharing ids land in the same
micro-batch, so that fewer (feature, id) pairs are sent by more than one micro-batch.

Only pairs that can be saved matter: a pair seen once in the batch is sent once whatever the order, and a pair seen
in more samples than a micro-batch holds is sent by several micro-batches anyway. Each sample is represented by its
most shared pair among the others (seen in 2 .. B/k samples of the batch); samples are ordered by their
representative, most shared first (ties by the pair), so samples with the same representative sit together, and the
ordered batch is cut into k equal contiguous micro-batches. Samples with no such pair keep their order, at the end.
Only the order changes: every sample is trained on once, and the step's gradient is the same sum (Proposition 2).
It runs in the tf.data pipeline (NumPy, off the training step).
"""

import numpy as np
import tensorflow as tf


def sample_pairs(features, names):
    """-> (sample index int64 [P], pair code int64 [P]) over the valid ids (padding -1 dropped) of the features, each
    [B] or [B, L] NumPy ids; codes number the distinct (feature, id) pairs of the batch 0, 1, ..."""
    samples, codes, offset = [], [], 0
    for values in features[:len(names)]:
        values = np.asarray(values)
        rows = np.arange(values.shape[0]) if values.ndim == 1 else np.repeat(np.arange(values.shape[0]),
                                                                             values.shape[1])
        values = values.reshape(-1)
        keep = values >= 0
        distinct, inverse = np.unique(values[keep], return_inverse=True)
        samples.append(rows[keep])
        codes.append(inverse.reshape(-1) + offset)
        offset += len(distinct)
    if not samples:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(samples).astype(np.int64), np.concatenate(codes).astype(np.int64)


def cluster_order_numpy(num_samples, samples, codes, micro_batches):
    """The permutation of [num_samples] described in the module docstring (int64)."""
    if num_samples == 0 or len(codes) == 0:
        return np.arange(num_samples, dtype=np.int64)
    capacity = max(2, -(-num_samples // micro_batches))
    num_codes = int(codes.max()) + 1
    # Distinct samples per pair: a pair repeated inside one sample is still sent once for it.
    samples_per_pair = np.bincount(np.unique(samples * num_codes + codes) % num_codes, minlength=num_codes)
    weight = samples_per_pair[codes]
    weight = np.where((weight >= 2) & (weight <= capacity), weight, 0)
    # Per sample, its best pair: highest weight, then smallest code.
    order = np.lexsort((codes, -weight, samples))
    first = np.ones(len(order), bool)
    first[1:] = samples[order][1:] != samples[order][:-1]
    best = order[first]
    rep_weight = np.zeros(num_samples, np.int64)
    rep_code = np.full(num_samples, np.iinfo(np.int64).max)
    rep_weight[samples[best]] = weight[best]
    rep_code[samples[best]] = np.where(weight[best] > 0, codes[best], np.iinfo(np.int64).max)
    return np.lexsort((np.arange(num_samples), rep_code, -rep_weight)).astype(np.int64)


def cluster_order(features, names, micro_batches):
    """In a tf.data map: the clustered order of a batch's samples, int64 [B].

    Args:
      features: the batch's feature dict; `names` picks the sparse features ([B], [B, L] with -1 padding, or ragged).
    """
    columns, batch = [], None
    for n in names:
        v = features[n]
        if isinstance(v, tf.RaggedTensor):
            v = v.to_tensor(default_value=-1)  # NumPy reads ragged rows as [B, L] ids padded with -1
        columns.append(v)
        batch = tf.shape(v, out_type=tf.int64)[0]

    def order(num_samples, *values):
        samples, codes = sample_pairs(values, names)
        return cluster_order_numpy(int(num_samples), samples, codes, micro_batches)

    result = tf.numpy_function(order, [batch] + columns, tf.int64, stateful=False)
    result.set_shape([None])
    return result


def unique_pairs_per_batch(num_samples, samples, codes, micro_batches, order=None):
    """Unique (feature, id) pairs summed over the k contiguous micro-batches of a batch taken in `order` (None: as
    it is): what one worker sends per batch with fwp's per-micro-batch dedup. k = 1: the whole batch's unique pairs.

    Args:
      samples, codes: from sample_pairs.
    """
    if not len(codes):
        return 0
    position = np.empty(num_samples, np.int64)
    position[np.arange(num_samples) if order is None else np.asarray(order)] = np.arange(num_samples)
    # The split of TrainPipeline: micro-batch i holds positions [n * i // k, n * (i + 1) // k).
    starts = [(num_samples * i) // micro_batches for i in range(1, micro_batches)]
    micro_batch = np.searchsorted(starts, position[samples], side="right")
    return len(np.unique(micro_batch * (int(codes.max()) + 1) + codes))
