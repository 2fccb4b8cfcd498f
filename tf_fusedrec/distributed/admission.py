"""Tables that admit ids only once they are frequent, and forget rows that stopped training (DeepRec's counter filter,
Monolith's occurrence threshold and expiry).

    fr.FusedEmbedding(features, admission=fr.Admission(min_count=5), expiry=fr.Expiry(steps=1000, interval=100))

**Admission.** Each sharded table counts, on the worker that owns the keys, how often each (category, id) key it does
not hold yet was read by a training lookup (``training`` not False; a key read twice in one batch counts once: the
lookup reads unique keys). A key is admitted by the lookup whose count reaches ``min_count``: that lookup inserts its
row (its initializer's row, as without admission) and trains it, and its count is dropped. Until then the key reads
its initializer's row (Hashed: the function of (seed, feature, id) it will start from when admitted; another
initializer: what the table gives a key it does not hold), it is not inserted, and its gradient is dropped: no update,
no optimizer slot. The dropped keys are counted per lookup (``dropped``: unique keys a step read without a row, summed
over steps). Inference lookups count nothing. A key that leaves the table (evicted, expired) starts counting anew.
With ``min_count=1`` every key is admitted by its first lookup: the training is exactly the one without admission.

**Expiry.** Right after every ``interval``-th update (``optimizer.iterations`` a multiple of ``interval``), each
sharded table removes the rows, with their optimizer slots, that no training lookup has read in the last ``steps``
steps: the table's clock (its training lookups: one per step) minus the clock of the row's last training lookup is
``steps`` or more. A row read by a training lookup is updated by that step, so these are the rows not updated for
``steps`` steps. Expiry runs before eviction's capacity bound when both are set.

**Checkpoints.** fr.train.Checkpointer saves the counts of the keys not admitted yet beside each table's rows and
restores them onto any worker count (they are keyed like the rows). Expiry's clocks are saved like eviction's (each
row's last training lookup, the table's clock and the expired counters; tf_fusedrec/distributed/eviction.py), so a
resumed run expires exactly the rows the uninterrupted run would; a checkpoint without them (written before they were
saved) restores an empty status: the clock starts again at zero and a restored row counts as read at the restore.

**Scope.** Sharded tables only: replicated hot rows (replication=...) are chosen as frequent and always trained.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tf_fusedrec.ops import indexing


def _check_int(owner, name, value, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{owner}: {name} must be an integer >= {low}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Admission:
    """Which ids FusedEmbedding's tables give a trainable row.

    Args:
      min_count: training lookups of an id (per feature) before it is admitted (>= 1; 1: every id, at once).
    """

    min_count: int

    def __post_init__(self):
        _check_int("Admission", "min_count", self.min_count, 1)

    def get_config(self):
        return {"min_count": int(self.min_count)}


@dataclasses.dataclass(frozen=True)
class Expiry:
    """When FusedEmbedding's tables forget a row.

    Args:
      steps: a row not read by a training lookup (so not updated) for this many steps is removed (>= 1).
      interval: updates between expiry checks (>= 1): a row goes between `steps` and `steps + interval - 1` steps
        after its last update.
    """

    steps: int
    interval: int = 100

    def __post_init__(self):
        _check_int("Expiry", "steps", self.steps, 1)
        _check_int("Expiry", "interval", self.interval, 1)

    def get_config(self):
        return {"steps": int(self.steps), "interval": int(self.interval)}


def _parse(policy, cls, what, layer):
    if policy is None:
        return None
    if isinstance(policy, dict):
        policy = cls(**policy)
    if not isinstance(policy, cls):
        raise ValueError(f"{layer}: {what} must be None or fr.{cls.__name__}(...), got {policy!r}")
    return policy


def parse_admission(admission, layer):
    """None, an Admission or its config dict -> Admission or None."""
    return _parse(admission, Admission, "admission", layer)


def parse_expiry(expiry, layer):
    """None, an Expiry or its config dict -> Expiry or None."""
    return _parse(expiry, Expiry, "expiry", layer)


def expired(keys, lasts, clock, steps):
    """The keys (int64 [K]) whose last training lookup (lasts int64 [K]) is `steps` or more lookups before `clock`:
    int64 [E], in table order."""
    return indexing.masked(tf.reshape(clock - lasts, [-1]) >= steps, tf.reshape(keys, [-1]))


class AdmissionCounter:
    """The counts of the keys one table has not admitted yet (module docstring), and the gradients it dropped.

    What checkpoints use: export() and upsert(keys, counts).
    """

    def __init__(self, name, min_count):
        if not tf.executing_eagerly():
            raise ValueError(f"table {name}: admission needs TF2 (eager construction, tf.function steps)")
        self.name, self.min_count = name, int(min_count)
        prefix = name.replace("/", "_")
        self.counts = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0,
                                                              name=f"{prefix}_admission_counts")
        self.dropped = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{prefix}_dropped")

    def admit(self, keys, exists):
        """Counts a training lookup of the unique keys [U] (exists: bool [U], held by the table) -> bool [U], True
        where the key is held or admitted now; the others' counts are kept and their gradients counted as dropped."""
        keys, exists = tf.reshape(keys, [-1]), tf.reshape(exists, [-1])  # TFRA's exists has no static shape
        seen = tf.reshape(self.counts.lookup(keys), [-1]) + 1
        admitted = tf.logical_or(exists, seen >= self.min_count)
        waiting = tf.logical_not(admitted)
        updates = [
            self.counts.insert(*indexing.masked(waiting, keys, seen)),
            # Also a held key's stale count (its row came back by a restore or a hot-set move while it waited).
            self.counts.remove(indexing.masked(tf.logical_and(admitted, seen > 1), keys)),
            self.dropped.assign_add(tf.reduce_sum(tf.cast(waiting, tf.int64))),
        ]
        with tf.control_dependencies([u for u in updates if u is not None]):
            return tf.identity(admitted)

    def export(self):
        """(keys int64 [W], counts int64 [W]) of the keys not admitted yet."""
        return self.counts.export()

    def upsert(self, keys, counts):
        return self.counts.insert(tf.convert_to_tensor(keys, tf.int64), tf.convert_to_tensor(counts, tf.int64))

    def size(self):
        return self.counts.size()


def admitted_lookup(keys, categories, ids, admitted, trained, initial):
    """Rows of unique keys [U]: trained(keys, categories, ids) of the admitted ones (the trainable read, which inserts
    them), initial(...) of the others (their initializer's rows; no gradient flows there).

    categories: int32 [U] or None; ids: int64 [U]; admitted: bool [U]; -> float32 [U, dim]."""
    positions = [indexing.true_positions(mask) for mask in (admitted, tf.logical_not(admitted))]

    def part(at):
        return tuple(None if t is None else tf.gather(t, at) for t in (keys, categories, ids))

    return tf.dynamic_stitch([tf.cast(at, tf.int32) for at in positions],
                             [trained(*part(positions[0])), tf.stop_gradient(initial(*part(positions[1])))])
