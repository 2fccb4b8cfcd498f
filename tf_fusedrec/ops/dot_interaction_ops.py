"""dot_interaction: DLRM's pairwise interactions of each example's F vectors, the dot products of the pairs i < j,
without the [F, F] product matrix; and its gradient.

It equals, up to the order of each dot product's additions, the batch matmul and upper triangle it replaces (kept
as its reference in the tests)::

    upper_triangle(tf.matmul(x, x, transpose_b=True))

whose three batch matmuls (forward, and two in the backward) did twice the multiply-adds on 27 x 16 matrices and
were, with the triangle, about a quarter of a one-worker criteo step (benchmarks/profiling/op_profile.py).
"""

import tensorflow as tf

from tf_fusedrec.ops._loader import load_ops


def dot_interaction(x, feature_major=False, name=None):
    """The dot products of every pair of vectors of each example.

    Args:
      x: float32 [B, F, D]; or [F, B, D] with feature_major (x[i, b]: example b's vector i; what
        tf.stack(vectors, axis=0) builds, and whose gradient tf.unstack(axis=0) splits without copying); or a list
        of F float32 tensors [B, D] of one shape (example b's vectors x[0][b], ..., x[F - 1][b]: DLRM's embeddings as
        they come, with no stack before the op, their gradients unstacked from one feature-major tensor without a
        copy).
      feature_major: the layout of a stacked x (and of its gradient). The values are bit for bit the same in every
        form.
      name: optional op name.

    Returns:
      float32 [B, F * (F - 1) // 2]: dot(x[b, 0], x[b, 1]), dot(x[b, 0], x[b, 2]), ..., dot(x[b, 0], x[b, F - 1]),
      dot(x[b, 1], x[b, 2]), ..., dot(x[b, F - 2], x[b, F - 1]).

    Raises:
      TypeError: another dtype than float32 (the models keep matmul and upper_triangle for the others).
      ValueError / InvalidArgumentError: x not of rank 3; a list that is empty or of tensors not all [B, D] of one
        shape.
    """
    with tf.name_scope(name or "dot_interaction"):
        if isinstance(x, (list, tuple)):
            if not x:
                raise ValueError("x must hold at least one tensor, got an empty list")
            xs = [tf.convert_to_tensor(t) for t in x]
            for i, t in enumerate(xs):
                if t.dtype != tf.float32:
                    raise TypeError(f"x[{i}] must be float32, got {t.dtype.name}")
            return load_ops().fused_rec_dot_interaction_n(xs)
        x = tf.convert_to_tensor(x)
        if x.dtype != tf.float32:
            raise TypeError(f"x must be float32, got {x.dtype.name}")
        return load_ops().fused_rec_dot_interaction(x, feature_major=bool(feature_major))


@tf.RegisterGradient("FusedRec>DotInteraction")
def _dot_interaction_grad(op, grad):
    return load_ops().fused_rec_dot_interaction_grad(grad, op.inputs[0], feature_major=op.get_attr("feature_major"))


def _pair_grads(u, x):
    """[B, P]: the gradient of sum(u * x_grad) with respect to the pair gradients, pair (i, j) getting
    dot(u_i, x_j) + dot(u_j, x_i) (u and x example-major [B, F, D])."""
    from tf_fusedrec.ops.upper_triangle_ops import upper_triangle  # noqa: PLC0415

    cross = tf.matmul(u, x, transpose_b=True)  # [B, F, F]: dot(u_i, x_j)
    return upper_triangle(cross + tf.transpose(cross, [0, 2, 1]))


@tf.RegisterGradient("FusedRec>DotInteractionGrad")
def _dot_interaction_grad_grad(op, upstream):
    """x_grad = S(grad) x, S(grad) the symmetric [F, F] matrix of the pair gradients (zero diagonal): with respect
    to grad, pair (i, j) gets dot(u_i, x_j) + dot(u_j, x_i); with respect to x, S(grad) u."""
    grad, x = op.inputs
    feature_major = op.get_attr("feature_major")
    u, v = (tf.transpose(upstream, [1, 0, 2]), tf.transpose(x, [1, 0, 2])) if feature_major else (upstream, x)
    return (_pair_grads(u, v), load_ops().fused_rec_dot_interaction_grad(grad, upstream, feature_major=feature_major))


@tf.RegisterGradient("FusedRec>DotInteractionN")
def _dot_interaction_n_grad(op, grad):
    xs = list(op.inputs)
    return tf.unstack(load_ops().fused_rec_dot_interaction_n_grad(grad, xs), num=len(xs), axis=0)


@tf.RegisterGradient("FusedRec>DotInteractionNGrad")
def _dot_interaction_n_grad_grad(op, upstream):
    """As _dot_interaction_grad_grad, with x = stack(xs, axis=0) and upstream [F, B, D]."""
    grad, xs = op.inputs[0], list(op.inputs[1:])
    xs_grad = load_ops().fused_rec_dot_interaction_grad(grad, upstream, feature_major=True)
    return [_pair_grads(tf.transpose(upstream, [1, 0, 2]), tf.stack(xs, axis=1))] + tf.unstack(
        xs_grad, num=len(xs), axis=0)
