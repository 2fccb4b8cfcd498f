"""Counts what the all-to-alls of a training step move: calls, bytes and time, for the train summary and bench.

`AlltoallMeter.install()` wraps `horovod.tensorflow.alltoall`, which both FusedEmbedding's comm and TFRA's
HvdAllToAllEmbedding call, so both layers are measured the same way. It sees the forward all-to-alls; the backward
pass sends one gradient all-to-all per forward embeddings all-to-all, of the same size, which `per_step()` adds.
Time is wall time from the call's inputs being ready to its output being ready, waiting for peers included.
"""

import tensorflow as tf


class AlltoallMeter:
    def __init__(self):
        self.calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="alltoall_calls")
        self.bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="alltoall_bytes")
        self.float_bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="alltoall_float_bytes")
        self.float_calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="alltoall_float_calls")
        self.seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="alltoall_seconds")
        self._original = None

    def install(self):
        import horovod.tensorflow as hvd  # noqa: PLC0415

        if self._original is not None:
            return self
        original = hvd.alltoall
        meter = self

        def metered_alltoall(tensor, splits=None, *args, **kwargs):
            tensor = tf.convert_to_tensor(tensor)
            with tf.control_dependencies([tensor]):
                start = tf.timestamp()
            with tf.control_dependencies([start]):
                received, received_splits = original(tf.identity(tensor), splits, *args, **kwargs)
            with tf.control_dependencies([received]):
                elapsed = tf.timestamp() - start
            nbytes = tf.cast(tf.size(tensor), tf.int64) * tensor.dtype.size
            updates = [meter.calls.assign_add(1), meter.bytes.assign_add(nbytes), meter.seconds.assign_add(elapsed)]
            if tensor.dtype.is_floating:
                updates += [meter.float_calls.assign_add(1), meter.float_bytes.assign_add(nbytes)]
            with tf.control_dependencies(updates):
                return tf.identity(received), received_splits

        self._original = original
        hvd.alltoall = metered_alltoall
        return self

    def reset(self):
        for v in (self.calls, self.bytes, self.float_bytes, self.float_calls):
            v.assign(0)
        self.seconds.assign(0.0)

    def per_step(self, steps):
        """Totals over `steps` steps -> per-step figures, backward gradient all-to-alls included."""
        steps = max(int(steps), 1)
        calls = int(self.calls.numpy()) + int(self.float_calls.numpy())
        nbytes = int(self.bytes.numpy()) + int(self.float_bytes.numpy())
        return {
            "alltoall_calls_per_step": calls / steps,
            "alltoall_bytes_per_step": nbytes / steps,
            "alltoall_mean_message_bytes": nbytes / max(calls, 1),
            "forward_alltoall_seconds_per_step": float(self.seconds.numpy()) / steps,
        }
