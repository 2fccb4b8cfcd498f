"""Tables that evict (MTGRBoost §4.1): a capacity per sharded table and an eviction policy by access frequency
(LFU) or recency (LRU), run every `interval` updates.

    fr.FusedEmbedding(features, eviction=fr.Eviction(capacity=100_000, policy="lfu", interval=100))

**What is counted.** Each sharded table keeps, beside its rows, a status table (TFRA, int64 [count, last]) on the
worker that owns the keys: every training lookup (``training`` not False) adds 1 to the count of each distinct key
it reads on this worker and sets its ``last`` to the table's clock, which that lookup advanced by one. A key read
twice in one batch counts once (the lookup reads unique keys). Inference lookups count nothing.

**When and what is evicted.** fr.train's GroupedOptimizer runs the eviction right after every `interval`-th update
(``optimizer.iterations`` a multiple of `interval`), so it runs between steps on every worker. When a worker's table
holds more than ``capacity`` rows, it removes the excess: the keys with the lowest count (``lfu``; ties: the least
recently read, then the smaller key) or the least recently read (``lru``; ties: the lower count, then the smaller
key). The keys the last lookup read (this step's) are never evicted, even when they alone exceed the capacity (the
table then keeps them all and is over capacity until a later eviction). A key leaves with its row (float32 or
float16 storage), its optimizer slots and its status: nothing of it is kept, and when it is read again it starts
anew from its initializer's row (the Hashed row of (feature, id), or the Keras initializer's draw) with empty slots,
like an id never seen. A row the status has not counted (restored from a checkpoint without a status, or moved out
of the hot set) counts as read 0 times, never.

Expiry (fr.Expiry, tf_fusedrec/distributed/admission.py) removes rows by the same status: those whose ``last`` is
``steps`` or more lookups old.

**Scope.** Only sharded rows are evicted; replicated hot rows (replication=...) are not. ``capacity`` counts rows of
one group's table on one worker: with N workers a group holds at most about N x capacity rows.

**Checkpoints.** fr.train.Checkpointer saves the status with the rows, in every checkpoint (full or delta): each
row's count and last, the table's clock and each worker's evicted (and expired) counter. A restore puts each key's
status on the worker that owns its row (any worker count), sets the clock, and gives each worker its own counters (on
M workers after another count, old worker s's go to worker s mod M: the totals are kept), so a resumed run evicts
exactly the rows the uninterrupted run would. A checkpoint without a status (written before it was saved) restores
an empty one: counts and recency start again from zero, so the restored rows are the first to go until they are read
again.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tf_fusedrec.ops import indexing

POLICIES = ("lfu", "lru")


@dataclasses.dataclass(frozen=True)
class Eviction:
    """How FusedEmbedding bounds its tables.

    Args:
      capacity: rows each group's sharded table keeps on each worker: an int >= 1, or {feature name: int} naming
        one feature of each group to bound (groups not named are not bounded).
      policy: "lfu" (the least frequently read go first) or "lru" (the least recently read go first).
      interval: updates between evictions (>= 1).
    """

    capacity: object
    policy: str = "lfu"
    interval: int = 100

    def __post_init__(self):
        if isinstance(self.capacity, dict):
            for name, value in self.capacity.items():
                _check_int(f"capacity of feature '{name}'", value, 1)
        else:
            _check_int("capacity", self.capacity, 1)
        if self.policy not in POLICIES:
            raise ValueError(f"Eviction: policy must be one of {POLICIES}, got {self.policy!r}")
        _check_int("interval", self.interval, 1)

    def capacity_of(self, group, layer_name):
        """The capacity of a SpecGroup's table, or None (not bounded)."""
        if not isinstance(self.capacity, dict):
            return int(self.capacity)
        named = {self.capacity[n] for n in group.feature_names if n in self.capacity}
        if len(named) > 1:
            raise ValueError(f"{layer_name}: features {list(group.feature_names)} share one table (group "
                             f"{group.name}) but Eviction names different capacities for them: {sorted(named)}")
        return int(named.pop()) if named else None

    def get_config(self):
        return {"capacity": self.capacity, "policy": self.policy, "interval": self.interval}


def _check_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"Eviction: {name} must be an integer >= {low}, got {value!r}")


def parse_eviction(eviction, layer, features):
    """None, an Eviction or its config dict -> Eviction or None; capacities naming unknown features are refused."""
    if eviction is None:
        return None
    if isinstance(eviction, dict):
        eviction = Eviction(**eviction)
    if not isinstance(eviction, Eviction):
        raise ValueError(f"{layer}: eviction must be None or fr.Eviction(capacity, policy, interval), got "
                         f"{eviction!r}")
    if isinstance(eviction.capacity, dict):
        unknown = sorted(set(eviction.capacity) - {f.name for f in features})
        if unknown:
            raise ValueError(f"{layer}: Eviction capacity names features the layer does not have: {unknown}")
    return eviction


def victims(keys, counts, lasts, clock, capacity, policy):
    """The keys to evict from a table of len(keys) rows (TF ops).

    Args:
      keys: int64 [K], the table's keys; counts, lasts: int64 [K], their status; clock: the last lookup's clock
        (keys with last == clock are protected); capacity: int; policy: "lfu" or "lru".

    Returns:
      int64 [E]: min(K - capacity, unprotected keys) keys (none when K <= capacity), in eviction order.
    """
    keys, counts, lasts = (tf.reshape(x, [-1]) for x in (keys, counts, lasts))
    excess = tf.maximum(tf.size(keys, out_type=tf.int64) - capacity, 0)
    candidates = tf.not_equal(lasts, clock)
    keys, counts, lasts = indexing.masked(candidates, keys, counts, lasts)
    # A lexicographic order by stable sorts, least significant key first.
    primary, secondary = (counts, lasts) if policy == "lfu" else (lasts, counts)
    order = tf.argsort(keys, stable=True)
    for column in (secondary, primary):
        order = tf.gather(order, tf.argsort(tf.gather(column, order), stable=True))
    take = tf.minimum(excess, tf.size(keys, out_type=tf.int64))
    return tf.gather(keys, order[:take])
