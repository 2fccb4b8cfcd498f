"""gather_segment_sum: a group's recover gather and every feature's combiner sum as one op, and its gradient.

For the ids of a fused group (feature f's ids at index[o_f : o_f + n_f]) it equals, bit for bit, the chain it
replaces in the layer's output, which stays as its reference (tf_fusedrec.layers._inputs.unflatten_rows)::

    fused = gather(params, index)                                          # recover the fused layout
    parts = split(fused, [n_0, n_1, ...])                                  # per feature
    outputs[f] = unsorted_segment_sum(parts[f], segment_ids[f], num_segments[f])   # combiner sum / scatter

and its gradient equals the chain's (gathers per feature -> concat -> unsorted_segment_sum over index): every output
row, forward and backward, is summed in id order from zero, as TensorFlow's CPU segment sum does.
"""

import tensorflow as tf

from tf_fusedrec.ops._loader import load_ops

FLOAT_DTYPES = (tf.float16, tf.float32, tf.float64)


def gather_segment_sum(params, index, segment_ids, num_segments, name=None):
    """Per feature, the sums of its ids' rows of params, each into the output row its segment id names.

    Args:
      params: float16, float32 or float64 [S, dim], the rows the ids point at.
      index: int32 [n], each id's row in params, features one after another (n = sum of the features' id counts).
      segment_ids: list of M int64 [n_f], each feature's output row for each of its ids.
      num_segments: list of M int64 scalars (Python ints or tensors), each feature's output rows.
      name: optional op name.

    Returns:
      list of M tensors [num_segments[f], dim] of params' dtype; a row no id lands in is zero.

    Raises:
      TypeError: params not a float tensor, or an index / segment dtype other than int32 / int64.
      ValueError: segment_ids and num_segments of different lengths, or empty.
      InvalidArgumentError: an index outside [0, S), a segment id outside [0, num_segments[f]) (naming f, the value
        and its position), or an index length other than the sum of the segment ids' lengths.
    """
    segment_ids, num_segments = list(segment_ids), list(num_segments)
    if not segment_ids or len(segment_ids) != len(num_segments):
        raise ValueError(f"segment_ids and num_segments must be non-empty lists of one length, got "
                         f"{len(segment_ids)} and {len(num_segments)}")
    with tf.name_scope(name or "gather_segment_sum"):
        params = tf.convert_to_tensor(params)
        if params.dtype not in FLOAT_DTYPES:
            raise TypeError(f"params must be float16, float32 or float64, got {params.dtype.name}")
        index = _int_tensor(index, tf.int32, "index")
        segment_ids = [_int_tensor(s, tf.int64, f"segment_ids[{f}]") for f, s in enumerate(segment_ids)]
        num_segments = [_int_tensor(s, tf.int64, f"num_segments[{f}]") for f, s in enumerate(num_segments)]
        return load_ops().fused_rec_gather_segment_sum(params, index, segment_ids, num_segments)


def _int_tensor(value, dtype, what):
    value = tf.convert_to_tensor(value, dtype_hint=dtype)
    if value.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"{what} must be int32 or int64, got {value.dtype.name}")
    return tf.cast(value, dtype)


def _split_inputs(op):
    n = op.get_attr("N")
    return op.inputs[0], op.inputs[1], list(op.inputs[2:2 + n]), list(op.inputs[2 + n:2 + 2 * n])


@tf.RegisterGradient("FusedRec>GatherSegmentSum")
def _gather_segment_sum_grad(op, *grads):
    params, index, segment_ids, num_segments = _split_inputs(op)
    grads = [tf.zeros_like(out) if g is None else g for g, out in zip(grads, op.outputs)]
    params_grad = load_ops().fused_rec_gather_segment_sum_grad(
        grads, index, segment_ids, num_segments, tf.shape(params, out_type=tf.int32)[0])
    return [params_grad, None] + [None] * (2 * len(segment_ids))


@tf.RegisterGradient("FusedRec>GatherSegmentSumGrad")
def _gather_segment_sum_grad_grad(op, params_grad_grad):
    n = op.get_attr("N")
    index, segment_ids, num_segments = op.inputs[n], list(op.inputs[n + 1:2 * n + 1]), list(op.inputs[2 * n + 1:3 * n + 1])
    grads = load_ops().fused_rec_gather_segment_sum(params_grad_grad, index, segment_ids, num_segments)
    return list(grads) + [None] * (2 * n + 2)
