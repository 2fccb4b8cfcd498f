"""dot_interaction: DLRM's pairwise interactions of each example's F vectors, the dot products of the pairs i < j,
without the [F, F] product matrix; and its gradient.

It equals, up to the order of each dot product's additions, the batch matmul and upper triangle it replaces (kept
as its reference in the tests)::

    upper_triangle(tf.matmul(x, x, transpose_b=True))

whose three batch matmuls (forward, and two in the backward) did twice the multiply-adds on 27 x 16 matrices and
were, with the triangle, about a quarter of a one-worker criteo step (scripts/op_profile.py).
"""

import tensorflow as tf

from tf_fusedrec.ops._loader import load_ops


def dot_interaction(x, feature_major=False, name=None):
    """The dot products of every pair of vectors of each example.

    Args:
      x: float32 [B, F, D], or [F, B, D] with feature_major (x[i, b]: example b's vector i; what
        tf.stack(vectors, axis=0) builds, and whose gradient tf.unstack(axis=0) splits without copying).
      feature_major: the layout of x (and of its gradient). The values are bit for bit the same either way.
      name: optional op name.

    Returns:
      float32 [B, F * (F - 1) // 2]: dot(x[b, 0], x[b, 1]), dot(x[b, 0], x[b, 2]), ..., dot(x[b, 0], x[b, F - 1]),
      dot(x[b, 1], x[b, 2]), ..., dot(x[b, F - 2], x[b, F - 1]).

    Raises:
      TypeError: another dtype than float32 (the models keep matmul and upper_triangle for the others).
      ValueError / InvalidArgumentError: x not of rank 3.
    """
    with tf.name_scope(name or "dot_interaction"):
        x = tf.convert_to_tensor(x)
        if x.dtype != tf.float32:
            raise TypeError(f"x must be float32, got {x.dtype.name}")
        return load_ops().fused_rec_dot_interaction(x, feature_major=bool(feature_major))


@tf.RegisterGradient("FusedRec>DotInteraction")
def _dot_interaction_grad(op, grad):
    return load_ops().fused_rec_dot_interaction_grad(grad, op.inputs[0], feature_major=op.get_attr("feature_major"))


@tf.RegisterGradient("FusedRec>DotInteractionGrad")
def _dot_interaction_grad_grad(op, upstream):
    """x_grad = S(grad) x, S(grad) the symmetric [F, F] matrix of the pair gradients (zero diagonal): with respect
    to grad, pair (i, j) gets dot(u_i, x_j) + dot(u_j, x_i); with respect to x, S(grad) u."""
    from tf_fusedrec.ops.upper_triangle_ops import upper_triangle  # noqa: PLC0415

    grad, x = op.inputs
    feature_major = op.get_attr("feature_major")
    u, v = (tf.transpose(upstream, [1, 0, 2]), tf.transpose(x, [1, 0, 2])) if feature_major else (upstream, x)
    cross = tf.matmul(u, v, transpose_b=True)  # [B, F, F]: dot(u_i, x_j)
    return (upper_triangle(cross + tf.transpose(cross, [0, 2, 1])),
            load_ops().fused_rec_dot_interaction_grad(grad, upstream, feature_major=feature_major))
