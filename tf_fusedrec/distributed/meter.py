"""Counts what the all-to-alls of a training step move: calls, bytes and time, for the train summary and bench.

`AlltoallMeter.wrap(comm)` returns a comm whose all-to-alls are counted; every layer built with it (FusedEmbedding,
and PerFeatureEmbedding's TFRA layers, which are handed the same comm) is measured the same way, and nothing else in
the process is touched. The backward of a float all-to-all (the gradient all-to-all, same size, reverse splits) goes
through the metered comm too, named `{name}/grad`, so it is counted like the forward ones.

Time: `seconds` is the sum over calls of the wall time from a call's inputs being ready to its output being ready,
waiting for peers included. Each call's [start, end] is also kept, and so are the dense-compute intervals a
TrainPipeline stamps (each micro-batch's forward, from its embeddings being ready to its predictions, and backward,
from the gradient reaching its predictions to it reaching its embeddings). After each step, `collect_step()` folds
them into:

* `busy_seconds`: the time at least one all-to-all was in flight (overlapping calls counted once);
* `exposed_seconds`: the part of it during which no dense compute ran: what the step waited on all-to-alls that
  compute did not hide. With no compute stamps (a plain train step), every in-flight second counts as exposed.
"""

import tensorflow as tf

from tf_fusedrec.distributed import comm as comm_lib

# Reading the clock has no effect on other ops: stamps must not be chained in program order with everything else.
comm_lib.order_insensitive(("Timestamp",))

# Intervals kept per step to compute the time at least one all-to-all is in flight; a step issues far fewer.
MAX_INTERVALS = 4096


class AlltoallMeter:
    def __init__(self):
        self.calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="alltoall_calls")
        self.bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="alltoall_bytes")
        self.seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="alltoall_seconds")
        self.intervals = tf.Variable(tf.zeros([MAX_INTERVALS, 2], tf.float64), trainable=False,
                                     name="alltoall_intervals")
        self.num_intervals = tf.Variable(0, dtype=tf.int64, trainable=False, name="alltoall_num_intervals")
        self.compute_intervals = tf.Variable(tf.zeros([MAX_INTERVALS, 2], tf.float64), trainable=False,
                                             name="compute_intervals")
        self.num_compute_intervals = tf.Variable(0, dtype=tf.int64, trainable=False, name="num_compute_intervals")
        # Seconds in allreduces (the dense gradients' above all), from the inputs being ready to the result: the
        # transfer plus the wait for the slowest worker to arrive.
        self.allreduce_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="allreduce_seconds")
        self._busy = self._exposed = 0.0

    def wrap(self, comm):
        """A comm that counts its all-to-alls and times its allreduces here; allgathers go straight to `comm`."""
        return MeteredComm(comm_lib.get_comm(comm), self)

    def record(self, tensor, call, forward=True):
        """Runs call(tensor) -> (received, received_splits) and counts it (its time in `seconds` if forward). The
        counting is a side effect that runs before the step's function returns; nothing waits for it, so it adds no
        order between collectives."""
        tensor = tf.convert_to_tensor(tensor)
        with tf.control_dependencies([tensor]):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            received, received_splits = call(tf.identity(tensor))
        with tf.control_dependencies([received]):
            end = tf.timestamp()
        nbytes = tf.cast(tf.size(tensor), tf.int64) * tensor.dtype.size
        self.calls.assign_add(1)
        self.bytes.assign_add(nbytes)
        if forward:
            self.seconds.assign_add(end - start)
        _append(self.intervals, self.num_intervals, start, end)
        return received, received_splits

    def record_allreduce(self, tensors, call):
        """Runs call(tensors) -> list and adds its time, inputs ready to results out, to `allreduce_seconds`."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        with tf.control_dependencies(tensors):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            reduced = call([tf.identity(t) for t in tensors])
        with tf.control_dependencies(reduced):
            end = tf.timestamp()
        self.allreduce_seconds.assign_add(end - start)
        return reduced

    def record_compute(self, start, end):
        """An op recording [start, end] (float64 seconds, tf.timestamp) as dense compute of the current step."""
        return _append(self.compute_intervals, self.num_compute_intervals, start, end)

    def collect_step(self):
        """Folds the intervals recorded since the last call into busy and exposed seconds (once after each step)."""
        alltoalls = _recorded(self.intervals, self.num_intervals)
        compute = _recorded(self.compute_intervals, self.num_compute_intervals)
        busy = merge_intervals(alltoalls)
        self._busy += sum(e - s for s, e in busy)
        self._exposed += sum(e - s for s, e in busy) - overlap_length(busy, merge_intervals(compute))

    @property
    def busy_seconds(self):
        return self._busy

    @property
    def exposed_seconds(self):
        return self._exposed

    def reset(self):
        for v in (self.calls, self.bytes, self.num_intervals, self.num_compute_intervals):
            v.assign(0)
        self.seconds.assign(0.0)
        self.allreduce_seconds.assign(0.0)
        self._busy = self._exposed = 0.0

    def per_step(self, steps):
        """Totals over `steps` steps -> per-step figures, backward gradient all-to-alls included."""
        steps = max(int(steps), 1)
        calls, nbytes = int(self.calls.numpy()), int(self.bytes.numpy())
        return {
            "alltoall_calls_per_step": calls / steps,
            "alltoall_bytes_per_step": nbytes / steps,
            "alltoall_mean_message_bytes": nbytes / max(calls, 1),
            "forward_alltoall_seconds_per_step": float(self.seconds.numpy()) / steps,
            "alltoall_busy_seconds_per_step": self._busy / steps,
            "exposed_alltoall_seconds_per_step": self._exposed / steps,
            "allreduce_seconds_per_step": float(self.allreduce_seconds.numpy()) / steps,
        }


def _append(buffer, count, start, end):
    slot = count.assign_add(1) - 1
    return buffer.scatter_nd_update(tf.minimum(slot, MAX_INTERVALS - 1)[None, None], tf.stack([start, end])[None])


def _recorded(buffer, count):
    n = min(int(count.numpy()), MAX_INTERVALS)
    rows = buffer[:n].numpy() if n else []
    count.assign(0)
    return rows


def merge_intervals(intervals):
    """[start, end] rows -> sorted disjoint intervals covering the same time."""
    merged = []
    # A stamp op can run a little after the event it marks, so an interval can come out reversed: skip those.
    for start, end in sorted(tuple(r) for r in intervals if r[1] > r[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def overlap_length(a, b):
    """Total length of the intersection of two lists of sorted disjoint intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


class MeteredComm(comm_lib.Comm):
    """`comm` with its all-to-alls counted and its allreduces timed by `meter`."""

    def __init__(self, comm, meter):
        self.inner, self.meter = comm, meter

    @property
    def rank(self):
        return self.inner.rank

    @property
    def size(self):
        return self.inner.size

    def alltoall(self, tensor, splits, name):
        tensor = tf.convert_to_tensor(tensor)
        if not tensor.dtype.is_floating:
            return self.meter.record(tensor, lambda t: self.inner.alltoall(t, splits, name))

        held = {}

        @tf.custom_gradient
        def metered(t):
            received, received_splits = self.meter.record(t, lambda x: self.inner.alltoall(x, splits, name))
            held["splits"] = received_splits

            def grad(upstream):
                back, _ = self.meter.record(
                    upstream, lambda g: self.inner.alltoall(g, received_splits, f"{name}/grad"), forward=False)
                return back

            return received, grad

        received = metered(tensor)
        return received, held["splits"]

    def allreduce(self, tensors, name, op="average"):
        return self.meter.record_allreduce(tensors, lambda ts: self.inner.allreduce(ts, name, op))

    def allgather(self, tensor, name):
        return self.inner.allgather(tensor, name)

    def __repr__(self):
        return f"MeteredComm({self.inner!r})"
