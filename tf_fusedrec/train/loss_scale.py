"""Dynamic loss scaling for float16 dense layers (Keras ``mixed_float16``) under the grouped optimizer.

    scale = fr.train.DynamicLossScale(comm)
    pipe = fr.train.TrainPipeline(model, optimizer, loss_fn, dataset, loss_scale=scale)

float16 gradients underflow below 6e-8, so the step differentiates ``loss x scale`` and divides every gradient
(dense, and the rows' IndexedSlices) by ``scale`` before the update, in float32. When any gradient on any worker is
not finite (the scaled backward overflowed), every worker skips the update (one allreduce of the count of non-finite
gradients decides it for all, so the collectives of the update stay matched) and halves the scale; after
``growth_interval`` finite steps in a row it doubles. Keras's LossScaleOptimizer does the same for one optimizer;
this one wraps the whole step so that it also covers the tables and agrees across workers.

The skipped steps' loss is still returned; ``skipped`` counts them. The scale and the counters are plain variables of
this object (not checkpointed: a resumed run starts from ``initial`` again).
"""

import tensorflow as tf


class DynamicLossScale:
    """Args:
      comm: the run's comm (its allreduce decides a skip for every worker).
      initial: the first scale (2**15, as Keras).
      growth_interval: finite steps in a row before the scale doubles.
    """

    def __init__(self, comm, initial=2.0 ** 15, growth_interval=2000):
        if not initial > 0 or isinstance(growth_interval, bool) or not isinstance(growth_interval, int) \
                or growth_interval < 1:
            raise ValueError(f"DynamicLossScale: initial must be > 0 and growth_interval an int >= 1, got "
                             f"{initial!r}, {growth_interval!r}")
        self.comm, self.growth_interval = comm, growth_interval
        self.scale = tf.Variable(float(initial), trainable=False, name="loss_scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="loss_scale_good_steps")
        self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="loss_scale_skipped")

    def scaled(self, loss):
        return loss * tf.cast(self.scale, loss.dtype)

    def unscale(self, grads):
        inverse = 1.0 / self.scale
        out = []
        for g in grads:
            if g is None:
                out.append(None)
            elif isinstance(g, tf.IndexedSlices):
                out.append(tf.IndexedSlices(tf.cast(g.values, tf.float32) * inverse, g.indices, g.dense_shape))
            else:
                out.append(tf.cast(g, tf.float32) * inverse)
        return out

    def all_finite(self, grads):
        """True on every worker when every gradient of every worker is finite (one allreduce with several)."""
        bad = tf.add_n([tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(
            g.values if isinstance(g, tf.IndexedSlices) else g)), tf.int32)) for g in grads if g is not None]
            + [tf.constant(0, tf.int32)])
        if self.comm.size > 1:
            bad = self.comm.allreduce([tf.cast(bad, tf.float32)], name="FusedRec/loss_scale/nonfinite", op="sum")[0]
        return tf.equal(bad, 0)

    def apply(self, grads, apply_fn):
        """Runs apply_fn() (the update) when `grads` are finite everywhere, else skips it; adjusts the scale; -> op."""
        finite = self.all_finite(grads)

        def good():
            with tf.control_dependencies([apply_fn()]):
                grow = tf.greater_equal(self.good_steps + 1, self.growth_interval)
                return tf.group(self.scale.assign(tf.where(grow, self.scale * 2.0, self.scale)),
                                self.good_steps.assign(tf.where(grow, tf.constant(0, tf.int64), self.good_steps + 1)))

        def bad():
            return tf.group(self.scale.assign(tf.maximum(self.scale / 2.0, 1.0)), self.good_steps.assign(0),
                            self.skipped.assign_add(1))

        return tf.cond(finite, good, bad)
