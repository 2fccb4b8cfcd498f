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

The stamps (tf.timestamp) time the calls as they run once `comm.overlap_collectives()` has been called (the train
app and the benchmarks do); without it, TensorFlow runs every stamp and collective of a step in program order.
"""

import tensorflow as tf

from tf_fusedrec.distributed import comm as comm_lib

# Intervals kept per step to compute the time at least one all-to-all is in flight; a step issues far fewer.
MAX_INTERVALS = 4096
# Collective call sites whose latest [start, end] are kept for arrival_split.
MAX_SITES = 2048


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
        # Grouped allreduce calls and the bytes of their inputs (one worker's share before reduction).
        self.allreduce_calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="allreduce_calls")
        self.allreduce_bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="allreduce_bytes")
        # [start, end] of each collective call site's latest run, for arrival_split: sites are numbered as the
        # step functions are traced, which every worker does in the same order.
        self.site_stamps = tf.Variable(tf.zeros([MAX_SITES, 2], tf.float64), trainable=False, name="site_stamps")
        self._sites = {"alltoall": [], "allreduce": []}
        self._busy = self._exposed = 0.0

    def wrap(self, comm):
        """A comm that counts its all-to-alls and times its allreduces here; allgathers and broadcasts go straight to
        `comm`."""
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
        self._stamp_site("alltoall", start, end)
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
        self.allreduce_calls.assign_add(1)
        self.allreduce_bytes.assign_add(sum(tf.cast(tf.size(t), tf.int64) * t.dtype.size for t in tensors))
        self._stamp_site("allreduce", start, end)
        return reduced

    def _stamp_site(self, kind, start, end):
        """Keeps [start, end] of this call site's latest run (traced calls only; sites past MAX_SITES are not
        kept)."""
        used = sum(len(v) for v in self._sites.values())
        if tf.executing_eagerly() or used >= MAX_SITES:
            return
        self._sites[kind].append(used)
        self.site_stamps.scatter_nd_update([[used]], tf.stack([start, end])[None])

    def arrival_split(self, comm, since):
        """Splits the last step's time in flight, per collective kind, into waiting and transfer, over all workers.

        Call it on every worker after a step that began at `since` (time.time()). A call's wait on worker r is
        from its start there to the start of the last worker's same call (the peer it waits for); from then to its
        end it moves data (Horovod's negotiation included). Per worker, `wait` is the time some call of the kind
        was in flight but none had all workers in (intervals merged: concurrent calls count once) and `transfer`
        the time at least one had; both are averaged over workers. The workers' clocks must agree: one machine
        (loopback or the namespaced cluster), not separate hosts. Returns {kind: {"wait": s, "transfer": s,
        "calls": n}}; collective (an allgather), so every worker must call it."""
        import numpy as np  # noqa: PLC0415

        stamps = comm.allgather(self.site_stamps.read_value()[None], "meter/arrival_split").numpy()
        fresh = np.all(stamps[:, :, 0] >= since, axis=0)
        out = {}
        for kind, sites in self._sites.items():
            sites = [s for s in sites if fresh[s]]
            if not sites:
                continue
            per_site = stamps[:, sites]  # [workers, calls, 2]
            last = per_site[:, :, 0].max(axis=0)
            wait = transfer = 0.0
            for r in range(per_site.shape[0]):
                busy = merge_intervals(per_site[r])
                moving = merge_intervals(np.stack([last, per_site[r, :, 1]], axis=1))
                transfer += sum(e - s for s, e in moving)
                wait += sum(e - s for s, e in busy) - sum(e - s for s, e in moving)
            out[kind] = {"wait": wait / per_site.shape[0], "transfer": transfer / per_site.shape[0],
                         "calls": len(sites)}
        return out

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
        for v in (self.calls, self.bytes, self.num_intervals, self.num_compute_intervals, self.allreduce_calls,
                  self.allreduce_bytes):
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
            "allreduce_calls_per_step": int(self.allreduce_calls.numpy()) / steps,
            "allreduce_bytes_per_step": int(self.allreduce_bytes.numpy()) / steps,
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

    def broadcast(self, tensors, name, root_rank=0):
        return self.inner.broadcast(tensors, name, root_rank)

    def __repr__(self):
        return f"MeteredComm({self.inner!r})"
