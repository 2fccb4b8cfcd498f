"""Hot-row replication (HypeReca, shared/seeds/003_*.txt §2.4, §4.2, §5): which pairs to replicate, and moving rows.

A group's hot set is a list of (category, id) pairs whose rows every worker holds (data parallel: read locally,
gradients averaged over workers with the dense ones); every other pair stays sharded by owner_of. The group lookup's
HotReplica (group_lookup.py) serves them; this module decides which pairs, and moves rows when the set changes.

Choosing R, the number of replicated pairs (§5.2): count the (category, id) pairs of the first `sample_batches`
batches of every worker, merge the counts (one allgather), sort by count: rho(R) is the share of accesses the top R
pairs cover (Algorithm 1). Then minimise

    L(R) = R * C_ar + n * (1 - rho(R)) * C_a2a

with n the ids a worker looks up per step in the group, C_ar the seconds an allreduce spends per replicated row
(its gradient, dim float32, and its touched flag) and C_a2a the seconds the all-to-alls spend per sharded access
(the key out, the row back, its gradient in the backward pass). That is the paper's formula, for a lookup that
sends every access. FusedRec deduplicates on the sender (dedup="segment"), so what the all-to-alls carry is the
unique pairs of a batch, not its accesses; there the second term is u(R) * C_a2a with u(R) the unique pairs per
worker batch that are not among the R hottest (measured on the same batches: each pair's count of batches it
appears in). The paper's term overstates what replicating a pair saves by the pair's repeats within a batch, which
for Zipf data is most of its accesses. Both are measured on the running workers by a short
micro-benchmark of the comm (least-squares slope of time against bytes, averaged over workers so every worker
decides the same R), or given. The search is a ternary search over [0, R_max] followed by an enumeration around its
result (L is not always unimodal); R_max is bounded by the candidates and by `max_bytes` (rows and optimizer slots).

Re-peek (`move_hot_set`): between steps, a new hot set replaces the old one. Rows (and optimizer slot rows) of pairs
that leave go to their owner's sharded table; rows of pairs that enter leave their owner's table and are copied to
every worker (one allgather). Nothing is lost or duplicated: a key is either in every worker's hot table or in its
owner's sharded table.
"""

import dataclasses
import time

import numpy as np
import tensorflow as tf

from tf_fusedrec import initializers
from tf_fusedrec import ops

REPLICABLE_OPTIMIZERS = ("sgd", "adagrad", "adam")  # whose replicated update is tested equal to the sharded one
SLOTS_PER_ROW = {"sgd": 0, "adagrad": 1, "adam": 2}
DEFAULT_MAX_BYTES = 256 << 20
MAX_CANDIDATES = 1 << 20  # per worker and group: the most counted pairs a worker contributes to the merge


@dataclasses.dataclass(frozen=True)
class HotReplication:
    """How FusedEmbedding replicates hot rows.

    Args:
      rows: R, the number of (category, id) pairs replicated per group; None chooses it per group by the model L(R)
        (see the module docstring); 0 replicates nothing.
      sample_batches: batches counted (on every worker) to find the hot pairs.
      max_bytes: cap on the replicated rows' bytes per group and worker, optimizer slots included (default 256 MiB).
      costs: (C_ar, C_a2a) seconds per replicated row and per sharded access, instead of measuring them.
    """

    rows: int = None
    sample_batches: int = 100
    max_bytes: int = DEFAULT_MAX_BYTES
    costs: tuple = None

    def __post_init__(self):
        for name, value, low in (("rows", self.rows, 0), ("sample_batches", self.sample_batches, 1),
                                 ("max_bytes", self.max_bytes, 0)):
            if value is None and name == "rows":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"HotReplication: {name} must be an integer >= {low}, got {value!r}")
        if self.costs is not None and (len(self.costs) != 2 or min(self.costs) < 0):
            raise ValueError(f"HotReplication: costs must be (C_ar, C_a2a) >= 0 seconds, got {self.costs!r}")

    @property
    def auto(self):
        return self.rows is None

    def get_config(self):
        return {"rows": self.rows, "sample_batches": self.sample_batches, "max_bytes": self.max_bytes,
                "costs": None if self.costs is None else list(self.costs)}


def parse_replication(replication, layer_name):
    """None, "auto", an int R or a HotReplication -> HotReplication or None (nothing replicated: R = 0 or None)."""
    if replication is None:
        return None
    if isinstance(replication, str):
        if replication != "auto":
            raise ValueError(f"{layer_name}: replication must be None, 'auto', a number of rows or "
                             f"fr.HotReplication(...), got {replication!r}")
        return HotReplication()
    if isinstance(replication, (int, np.integer)) and not isinstance(replication, bool):
        if replication < 0:
            raise ValueError(f"{layer_name}: replication (rows) must be >= 0, got {replication}")
        return HotReplication(rows=int(replication)) if replication > 0 else None
    if isinstance(replication, dict):  # get_config's
        try:
            replication = HotReplication(**{k: tuple(v) if k == "costs" and v is not None else v
                                            for k, v in replication.items()})
        except TypeError as e:
            raise ValueError(f"{layer_name}: replication: {e}") from None
    if isinstance(replication, HotReplication):
        return replication if replication.rows != 0 else None
    raise ValueError(f"{layer_name}: replication must be None, 'auto', a number of rows or fr.HotReplication(...), "
                     f"got {replication!r}")


def bytes_per_row(group):
    """Bytes a replicated row costs each worker: the row, its optimizer slots, and its key, id and category."""
    return 4 * group.spec.dim * (1 + SLOTS_PER_ROW.get(group.spec.optimizer.name, 2)) + 20


def check_group(replication, group, initializer, layer_name):
    """Refuses, naming the group, what cannot be replicated."""
    where = f"{layer_name}: group {group.name} ({', '.join(group.feature_names)})"
    if group.spec.optimizer.name not in REPLICABLE_OPTIMIZERS:
        raise ValueError(f"{where}: hot-row replication supports the optimizers {REPLICABLE_OPTIMIZERS}, not "
                         f"{group.spec.optimizer.name!r} (its replicated update is not verified equal to the sharded "
                         f"one); use replication=None for this layer or another optimizer")
    if not initializers.is_hashed(initializer):
        raise ValueError(f"{where}: hot-row replication needs the Hashed initializer (every replica must start from "
                         f"the same row); got {initializer!r}")
    if replication.rows is not None and replication.rows * bytes_per_row(group) > replication.max_bytes:
        raise ValueError(f"{where}: replication rows={replication.rows} needs {replication.rows * bytes_per_row(group)}"
                         f" bytes per worker ({bytes_per_row(group)} a row with its optimizer slots), over "
                         f"max_bytes={replication.max_bytes}")


class HotSet:
    """The hot pairs of one group, equal on every worker: sorted unified keys [R] and their ids and categories.

    Variables of unknown length, so a new set (re-peek) does not retrace the step functions."""

    def __init__(self, name):
        self.name = name
        self.keys = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False,
                                name=f"{name}/hot_keys")
        self.ids = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False,
                               name=f"{name}/hot_ids")
        self.segments = tf.Variable(tf.zeros([0], tf.int32), shape=tf.TensorShape([None]), trainable=False,
                                    name=f"{name}/hot_segments")

    def assign(self, keys, ids, segments):
        keys, ids, segments = (np.asarray(x) for x in (keys, ids, segments))
        order = np.argsort(keys, kind="stable")
        if len(keys) and np.any(np.diff(keys[order]) == 0):
            raise ValueError(f"{self.name}: the hot set holds a key twice")
        self.keys.assign(keys[order].astype(np.int64))
        self.ids.assign(ids[order].astype(np.int64))
        self.segments.assign(segments[order].astype(np.int32))

    def numpy(self):
        return self.keys.numpy(), self.ids.numpy(), self.segments.numpy()

    def __len__(self):
        return int(tf.size(self.keys).numpy())


# --- counting and choosing ----------------------------------------------------------------------------------------

def count_pairs(layer, batches):
    """Counts each group's (category, id) pairs over this worker's batches.

    Args:
      layer: a FusedEmbedding.
      batches: iterable of input dicts (feature name -> ids).

    Returns:
      per group: dict(keys, ids, segments, counts (numpy, one entry per distinct pair), presence (batches each pair
      appears in), accesses (ids counted), batches).
    """
    from tf_fusedrec.distributed.group_lookup import fuse, unified_keys  # noqa: PLC0415  (import cycle)

    parts = [[] for _ in layer.groups]
    accesses = np.zeros(len(layer.groups), np.int64)
    num = 0
    for inputs in batches:
        num += 1
        flats, _ = layer.flatten(inputs)
        for g, group in enumerate(layer.groups):
            keys, segments, _ = fuse([flats[n].ids for n in group.feature_names], group.feature_categories)
            unified = unified_keys(keys, segments, group.num_categories, group.encoding)
            unified = unified.numpy()
            parts[g].append((unified, keys.numpy(), segments.numpy(), np.unique(unified)))
            accesses[g] += int(tf.size(keys))
    out = []
    for g in range(len(layer.groups)):
        if parts[g]:
            unified, ids, segments, present = (np.concatenate([p[i] for p in parts[g]]) for i in range(4))
        else:
            unified, ids, present = np.zeros([0], np.int64), np.zeros([0], np.int64), np.zeros([0], np.int64)
            segments = np.zeros([0], np.int32)
        keys, first, counts = np.unique(unified, return_index=True, return_counts=True)
        _, presence = np.unique(present, return_counts=True)  # the same keys: each is present in some batch
        out.append({"keys": keys, "ids": ids[first], "segments": segments[first], "counts": counts.astype(np.int64),
                    "presence": presence.astype(np.int64), "accesses": int(accesses[g]), "batches": num})
    return out


def merge_counts(counted, comm, name, cap=MAX_CANDIDATES):
    """Sums one group's counts over workers (each contributes its `cap` most counted pairs) -> the same dict on every
    worker, pairs sorted by count (descending), ties by key; accesses, batches and unique pairs (over all of a
    worker's pairs, not only its `cap`) summed."""
    order = np.lexsort((counted["keys"], -counted["counts"]))[:cap]
    table = np.stack([counted["keys"][order], counted["ids"][order], counted["segments"][order].astype(np.int64),
                      counted["counts"][order], counted["presence"][order]], axis=1).reshape([-1, 5])
    totals = np.array([[counted["accesses"], counted["batches"], counted["presence"].sum()]], np.int64)
    if comm.size > 1:
        table = comm.allgather(tf.constant(table, tf.int64), name=f"{name}/candidates").numpy()
        totals = comm.allgather(tf.constant(totals), name=f"{name}/totals").numpy()
    keys, first, inverse = np.unique(table[:, 0], return_index=True, return_inverse=True)
    counts = np.bincount(inverse, weights=table[:, 3], minlength=len(keys)).astype(np.int64)
    presence = np.bincount(inverse, weights=table[:, 4], minlength=len(keys)).astype(np.int64)
    order = np.lexsort((keys, -counts))
    return {"keys": keys[order], "ids": table[first, 1][order], "segments": table[first, 2][order].astype(np.int32),
            "counts": counts[order], "presence": presence[order], "accesses": int(totals[:, 0].sum()),
            "batches": int(totals[:, 1].sum()), "unique": int(totals[:, 2].sum())}


def coverage(counts, accesses):
    """rho[R] for R = 0..len(counts): the share of the accesses that the R most counted pairs cover."""
    return np.concatenate([[0.0], np.cumsum(counts) / max(accesses, 1)])


def sent_curve(merged, dedup=True):
    """Sharded accesses each worker sends per step for R = 0..len(pairs): n * (1 - rho(R)) (the paper), or with
    sender dedup u(R), the unique pairs per worker batch outside the R hottest."""
    batches = max(merged["batches"], 1)
    if not dedup:
        return merged["accesses"] / batches * (1.0 - coverage(merged["counts"], merged["accesses"]))
    return (merged["unique"] - np.concatenate([[0], np.cumsum(merged["presence"])])) / batches


def cost_curve(sent, c_ar, c_a2a):
    """L(R) = R * C_ar + sent(R) * C_a2a for R = 0..len(sent) - 1."""
    rows = np.arange(len(sent), dtype=np.float64)
    return rows * c_ar + np.asarray(sent, np.float64) * c_a2a


def choose_rows(loss, r_max, window=64):
    """argmin of loss[0..r_max] by ternary search, then enumeration of `window` either side of its result.

    -> (R, evaluations)."""
    lo, hi = 0, int(r_max)
    evaluations = 0
    while hi - lo > 2:
        m1, m2 = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        evaluations += 2
        if loss[m1] <= loss[m2]:
            hi = m2 - 1 if loss[m1] < loss[m2] else m2
        else:
            lo = m1 + 1
    around = np.arange(max(0, lo - window), min(int(r_max), hi + window) + 1)
    evaluations += len(around)
    best = int(around[np.argmin(loss[around])])
    return best, evaluations


def _timed(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure_slopes(comm, sizes=(1 << 15, 1 << 19, 1 << 22), repeats=5, name="FusedRec/replication/probe"):
    """(allreduce, all-to-all) seconds per byte: least-squares slopes of time against bytes (`sizes`: bytes per
    worker, float32 rows of 16), averaged over workers (equal on every worker). One worker: (0, 0), nothing is sent."""
    if comm.size == 1:
        return 0.0, 0.0
    width = 16
    slopes = []
    for kind in ("allreduce", "alltoall"):
        xs, ts = [], []
        for size in sizes:
            rows = max(1, size // (4 * width * comm.size))
            data = tf.ones([rows * comm.size, width], tf.float32)
            splits = tf.fill([comm.size], tf.constant(rows, tf.int32))
            if kind == "allreduce":
                fn = lambda: comm.allreduce([data], name=f"{name}/allreduce/{rows}", op="sum")[0].numpy()  # noqa: E731
            else:
                fn = lambda: comm.alltoall(data, splits, name=f"{name}/alltoall/{rows}")[0].numpy()  # noqa: E731
            xs.append(rows * comm.size * width * 4)
            ts.append(_timed(fn, repeats))
        slopes.append(max(np.polyfit(xs, ts, 1)[0], 0.0))
    slopes = comm.allreduce([tf.constant(slopes, tf.float64)], name=f"{name}/slopes", op="average")[0].numpy()
    return float(slopes[0]), float(slopes[1])


def group_costs(slopes, group):
    """(C_ar seconds per replicated row: its gradient and touched flag in an allreduce, C_a2a seconds per sharded
    access: the key out, the row back, its gradient back in the backward pass) of a group, from measure_slopes."""
    dim, wire_bytes = group.spec.dim, 8 if group.encoding == "packed" else 16
    return slopes[0] * (4 * dim + 4), slopes[1] * (wire_bytes + 2 * 4 * dim)


def plan_hot_sets(layer, batches, comm=None):
    """Counts `batches` (this worker's first sample_batches), merges over workers and chooses each group's hot set,
    without setting it.

    Returns:
      per group (report, (keys, ids, segments) of the chosen pairs). The report: {"group", "rows", "rho" (share of
      accesses the hot pairs cover), "sent_per_step" and "sent_per_step_without" (sharded pairs a worker sends per
      step, by the counts), "predicted_seconds" and "seconds_without" (L(R) and L(0); None when R is given),
      "c_ar", "c_a2a", "ids_per_step", "candidates", "sample_batches" (batches counted, all workers), "model"
      ("unique" or "accesses"), "chosen_by"}.
    """
    replication = getattr(layer, "replication", None)
    if replication is None:
        raise ValueError(f"{layer.name}: choose_hot_set needs a FusedEmbedding built with replication=...")
    comm = comm or layer.comm
    counted = count_pairs(layer, batches)
    slopes = None
    if replication.costs is None and replication.rows is None:  # measured once, for every group
        slopes = measure_slopes(comm, name=f"FusedRec/{layer.name}/replication/probe")
    plans = []
    for g, group in enumerate(layer.groups):
        name = f"FusedRec/{layer.name}/{group.name}/replication"
        cap = min(MAX_CANDIDATES, replication.max_bytes // bytes_per_row(group))
        merged = merge_counts(counted[g], comm, name, cap)
        rho = coverage(merged["counts"], merged["accesses"])
        dedup = layer.dedup == "segment"
        sent = sent_curve(merged, dedup)
        r_max = min(len(merged["counts"]), cap)
        ids_per_step = merged["accesses"] / max(merged["batches"], 1)
        if replication.costs is not None:
            c_ar, c_a2a = replication.costs
        elif slopes is not None:
            c_ar, c_a2a = group_costs(slopes, group)
        else:
            c_ar, c_a2a = None, None  # R is given: nothing to decide, nothing measured
        loss = None if c_ar is None else cost_curve(sent, c_ar, c_a2a)
        if replication.rows is not None:
            rows, chosen_by = min(replication.rows, len(merged["counts"])), "rows"
        elif comm.size == 1 and replication.costs is None:
            rows, chosen_by = 0, "one worker: nothing to save"
        else:
            rows, _ = choose_rows(loss, r_max)
            chosen_by = "model"
        report = {"group": group.name, "rows": rows, "rho": float(rho[rows]),
                  "sent_per_step": float(sent[rows]), "sent_per_step_without": float(sent[0]),
                  "model": "unique" if dedup else "accesses",
                  "predicted_seconds": None if loss is None else float(loss[rows]),
                  "seconds_without": None if loss is None else float(loss[0]),
                  "c_ar": c_ar, "c_a2a": c_a2a, "ids_per_step": ids_per_step,
                  "candidates": len(merged["counts"]), "sample_batches": merged["batches"],
                  "chosen_by": chosen_by}
        plans.append((report, (merged["keys"][:rows], merged["ids"][:rows], merged["segments"][:rows])))
    return plans


def choose_hot_set(layer, batches, comm=None):
    """plan_hot_sets, then sets every group's hot set (before training: no rows to move) -> the reports."""
    plans = plan_hot_sets(layer, batches, comm)
    for hot_set, (_, chosen) in zip(layer.hot_sets, plans):
        hot_set.assign(*chosen)
    return [report for report, _ in plans]


# --- moving rows between the replicated and the sharded table -----------------------------------------------------

def _slots(optimizer, trainable):
    """[slot TFRA variable] of a table's trainable handle under the GroupedOptimizer (sorted by slot name)."""
    if optimizer is None or trainable is None:
        return []
    optimizer.create_slots([trainable])  # slots are created lazily otherwise
    return [slot for _, slot in optimizer.slot_tables(trainable)]


def _take(params, keys):
    """(rows, exists) of keys in a TFRA variable, as numpy."""
    if len(keys) == 0:
        return np.zeros([0, params.dim], np.float32), np.zeros([0], bool)
    rows, exists = params.lookup(tf.constant(keys, tf.int64), return_exists=True)
    return rows.numpy(), exists.numpy()


def _put(params, keys, rows, exists):
    if exists.any():
        params.upsert(tf.constant(keys[exists], tf.int64), tf.constant(rows[exists]))


def _drop(params, keys):
    if len(keys):
        params.remove(tf.constant(keys, tf.int64))


def move_hot_set(layer, g, keys, ids, segments, optimizer=None, name=None):
    """Replaces group g's hot set by (keys, ids, segments), moving rows and optimizer slot rows (all workers call it,
    between steps, with the same arguments).

    Returns:
      {"left": pairs moved to their owners' sharded tables, "entered": pairs copied to every worker}.
    """
    comm = layer.comm
    name = name or f"FusedRec/{layer.name}/{layer.groups[g].name}/repeek"
    hot_set, lookup = layer.hot_sets[g], layer.group_lookups[g]
    cold, hot = lookup.table, lookup.hot.table
    cold_slots, hot_slots = _slots(optimizer, cold.trainable), _slots(optimizer, hot.trainable)
    old_keys, old_ids, _ = hot_set.numpy()
    keys, ids, segments = np.asarray(keys, np.int64), np.asarray(ids, np.int64), np.asarray(segments, np.int32)
    leaving = ~np.isin(old_keys, keys)
    entering = ~np.isin(keys, old_keys)
    # Leaving pairs: every worker holds their rows; the owner keeps them in its sharded table.
    lk, li = old_keys[leaving], old_ids[leaving]
    mine = ops.owner_of(tf.constant(li, tf.int64), comm.size).numpy() == comm.rank if len(li) else np.zeros(0, bool)
    # Every part (rows, then each slot) is taken before any is dropped: a native table drops a key's slots with its
    # row; rows are put first, so a slot put never creates a key.
    taken = [_take(src, lk) for src in [hot.rows] + hot_slots]
    for dst, (rows, exists) in zip([cold.rows] + cold_slots, taken):
        _put(dst, lk[mine], rows[mine], exists[mine])
    for src in [hot.rows] + hot_slots:
        _drop(src, lk)
    # Entering pairs: their owner holds them (if they were ever touched); every worker gets a copy.
    ek, ei = keys[entering], ids[entering]
    mine = ops.owner_of(tf.constant(ei, tf.int64), comm.size).numpy() == comm.rank if len(ei) else np.zeros(0, bool)
    taken = [_take(src, ek[mine]) for src in [cold.rows] + cold_slots]
    for t, (dst, (rows, exists)) in enumerate(zip([hot.rows] + hot_slots, taken)):
        flat = np.concatenate([rows, exists[:, None].astype(np.float32)], axis=1)
        order = ek[mine]
        if comm.size > 1:
            flat = comm.allgather(tf.constant(flat), name=f"{name}/rows{t}").numpy()
            order = comm.allgather(tf.constant(order, tf.int64), name=f"{name}/keys{t}").numpy()
        _put(dst, order, flat[:, :-1], flat[:, -1] > 0)
    for src in [cold.rows] + cold_slots:
        _drop(src, ek[mine])
    hot_set.assign(keys, ids, segments)
    return {"left": int(leaving.sum()), "entered": int(entering.sum())}


def repeek(layer, batches, optimizer=None):
    """Chooses the hot sets anew from `batches` and moves the rows (every worker, between steps) -> the reports."""
    reports = []
    for g, (report, chosen) in enumerate(plan_hot_sets(layer, batches)):
        report.update(move_hot_set(layer, g, *chosen, optimizer=optimizer))
        reports.append(report)
    return reports
