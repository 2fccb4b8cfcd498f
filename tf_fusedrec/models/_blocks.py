"""Pieces shared by the models."""

import contextlib
import threading

import tensorflow as tf

from tf_fusedrec import ops

_TRACING = threading.local()  # .standard_ops: a standard_ops() block is open in this thread


@contextlib.contextmanager
def standard_ops():
    """While open (in this thread), the models trace TensorFlow's own ops only, no tf_fusedrec op: what fr.export's
    dense SavedModel holds, so that TensorFlow Serving or any TensorFlow loads it without the op library. The values
    are the same either way."""
    previous = getattr(_TRACING, "standard_ops", False)
    _TRACING.standard_ops = True
    try:
        yield
    finally:
        _TRACING.standard_ops = previous


def upper_pairs(x):
    """x [B, F, F] -> [B, F (F - 1) / 2]: the values above each diagonal, row by row (DLRM's pairwise interactions).
    ops.upper_triangle, or under standard_ops the boolean mask it equals value for value."""
    if not getattr(_TRACING, "standard_ops", False):
        return ops.upper_triangle(x)
    f = x.shape[1]
    upper = tf.constant([[i < j for j in range(f)] for i in range(f)])
    return tf.reshape(tf.boolean_mask(x, tf.broadcast_to(upper, tf.shape(x))), [-1, f * (f - 1) // 2])


def pairwise_dots(vectors):
    """F tensors [B, d] (or one stacked [B, F, d]) -> [B, F (F - 1) / 2]: the dot products of the pairs i < j, row
    by row (DLRM's interactions). For float32 ops.dot_interaction (one op each way, half the multiply-adds) on the
    vectors as they are: no stack before it, and their gradients come back as one feature-major tensor that
    TensorFlow's Unpack splits along axis 0 without copying (the example-major stack's unstack copied every row).
    The batch matmul and upper_pairs on the example-major stack otherwise and under standard_ops (what the exported
    SavedModel holds)."""
    listed = isinstance(vectors, (list, tuple))
    if not getattr(_TRACING, "standard_ops", False) and (vectors[0] if listed else vectors).dtype == tf.float32:
        return ops.dot_interaction(list(vectors) if listed else vectors)
    stacked = tf.stack(vectors, axis=1) if listed else vectors
    return upper_pairs(tf.matmul(stacked, stacked, transpose_b=True))


def mlp(units, name, last_activation="relu", seed=0):
    """Dense layers of the given widths; ReLU between them, `last_activation` after the last."""
    layers = []
    for i, u in enumerate(units):
        activation = "relu" if i < len(units) - 1 else last_activation
        layers.append(
            tf.keras.layers.Dense(
                u, activation=activation, name=f"{name}_{i}",
                kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + i),
            )
        )
    return tf.keras.Sequential(layers, name=name)


def compute_dtype(outputs, dtype):
    """The embedding layer's float32 outputs (dict of tensors or ragged tensors) in the model's compute dtype: float16
    or bfloat16 under a Keras mixed precision policy (tf.keras.mixed_precision), unchanged otherwise."""
    if tf.as_dtype(dtype) == tf.float32:
        return outputs
    return {k: tf.cast(v, dtype) for k, v in outputs.items()}


def logits(x):
    """Logits in float32, whatever the compute dtype (the loss and the AUC are computed in float32)."""
    return tf.cast(x, tf.float32)


def sparse_inputs(inputs):
    """The sparse part of a batch dict (everything but "dense")."""
    return {k: v for k, v in inputs.items() if k != "dense"}


def pooled(outputs, names):
    """[B, dim] per feature: multi-hot outputs without a combiner are summed over their ids."""
    result = []
    for n in names:
        x = outputs[n]
        if isinstance(x, tf.RaggedTensor):
            x = tf.reduce_sum(x, axis=1)
        elif x.shape.rank == 3:
            x = tf.reduce_sum(x, axis=1)
        result.append(x)
    return result
