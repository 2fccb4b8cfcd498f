"""upper_triangle: the strict upper triangle of each example's [F, F] matrix, packed row by row (DLRM's pairwise
interactions), and its gradient.

It equals, value for value and in order, the boolean mask it replaces (kept as its reference in the tests)::

    tf.reshape(tf.boolean_mask(x, tf.broadcast_to(i < j, tf.shape(x))), [-1, F * (F - 1) // 2])

whose Where, per-value gather and segment-sum gradient over B F^2 values cost about a tenth of a criteo step.
"""

import tensorflow as tf

from tf_fusedrec.ops._loader import load_ops

DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def upper_triangle(x, name=None):
    """The values above the diagonal of each square matrix of x.

    Args:
      x: float16, bfloat16, float32 or float64 [B, F, F].
      name: optional op name.

    Returns:
      [B, F * (F - 1) // 2] of x's dtype: x[b, 0, 1:], then x[b, 1, 2:], ..., then x[b, F - 2, F - 1].

    Raises:
      TypeError: another dtype.
      ValueError / InvalidArgumentError: x not of shape [B, F, F].
    """
    with tf.name_scope(name or "upper_triangle"):
        x = tf.convert_to_tensor(x)
        if x.dtype not in DTYPES:
            raise TypeError(f"x must be float16, bfloat16, float32 or float64, got {x.dtype.name}")
        return load_ops().fused_rec_upper_triangle(x)


@tf.RegisterGradient("FusedRec>UpperTriangle")
def _upper_triangle_grad(op, grad):
    return load_ops().fused_rec_upper_triangle_grad(grad, tf.shape(op.inputs[0], out_type=tf.int32)[1])


@tf.RegisterGradient("FusedRec>UpperTriangleGrad")
def _upper_triangle_grad_grad(op, grad):  # noqa: ARG001
    return load_ops().fused_rec_upper_triangle(grad), None
