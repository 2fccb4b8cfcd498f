"""ragged_causal_attention: HSTU's pointwise causal attention over a ragged batch's flat tokens, in one op each way.

Equal (to float32 rounding) to the pair-list form the GRM ran before, kept as its reference in the tests::

    pairs = causal_pairs(row_splits, buckets, attention_norm)      # (query i, key j <= i) of every sequence
    scores = sum(gather(q, pairs.query) * gather(k, pairs.key), -1) + gather(bias, pairs.bucket)
    out = unsorted_segment_sum(silu(scores) / pairs.normalizer * gather(v, pairs.key), pairs.query, T)

which materialised [P, heads, head_dim] tensors for P = sum L (L + 1) / 2 pairs, forward and backward.
"""

import tensorflow as tf

from tf_fusedrec.ops._loader import load_ops


def _fixed_norm(attention_norm):
    if attention_norm == "causal":
        return 0
    if isinstance(attention_norm, bool) or not isinstance(attention_norm, int) or attention_norm <= 0:
        raise ValueError(f"attention_norm must be 'causal' or a positive int, got {attention_norm!r}")
    return attention_norm


def ragged_causal_attention(q, k, v, row_splits, bias=None, attention_norm="causal", name=None):
    """``out[i, h] = sum_{j <= i} SiLU(<q[i, h], k[j, h]> + bias[bucket(i - j), h]) / n_i * v[j, h]`` per sequence.

    Args:
      q, k, v: float32 [T, heads, head_dim], the flat tokens of B sequences.
      row_splits: int64 (or int32) [B + 1], the sequences' offsets into the T tokens (0 first, T last).
      bias: float32 [buckets, heads], the relative-position bias; ``bucket(d) = min(floor(log2(d + 1)), buckets -
        1)``. None (or zero buckets): no bias.
      attention_norm: "causal" (``n_i = i + 1``, i the position in its sequence) or a positive int N (``n_i = N``).
      name: optional name scope.

    Returns:
      float32 [T, heads, head_dim]. Differentiable in q, k, v and bias.

    Raises:
      ValueError: attention_norm neither "causal" nor a positive int. InvalidArgumentError (at run time): shapes
      that differ, row_splits not from 0 to T or decreasing, bias not [buckets, heads].
    """
    with tf.name_scope(name or "ragged_causal_attention"):
        fixed = _fixed_norm(attention_norm)
        q = tf.convert_to_tensor(q, tf.float32)
        if bias is None:
            bias = tf.zeros([0, q.shape[1] if q.shape.rank == 3 and q.shape[1] is not None else 0], tf.float32)
        return load_ops().fused_rec_ragged_causal_attention(q, k, v, tf.cast(row_splits, tf.int64),
                                                            tf.convert_to_tensor(bias, tf.float32),
                                                            fixed_norm=fixed)


@tf.RegisterGradient("FusedRec>RaggedCausalAttention")
def _ragged_causal_attention_grad(op, dout):
    dq, dk, dv, dbias = load_ops().fused_rec_ragged_causal_attention_grad(
        dout, *op.inputs, fixed_norm=op.get_attr("fixed_norm"))
    return dq, dk, dv, None, dbias


tf.no_gradient("FusedRec>RaggedCausalAttentionGrad")
