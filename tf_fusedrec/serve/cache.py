"""The ranker's adaptive embedding cache (FlexEMR §3.1.1), and a Backend that puts it in front of another backend.

AdaptiveCache holds float32 rows keyed by (group, table key) (the keys of tf_fusedrec/export/format.py). Its capacity
in bytes moves between min_fraction * budget and budget with the ranker's load: the ranker reports the size of every
request batch with observe(); a sliding window over the last `window` sizes gives the load (the window's mean). When a
full window of observations made since the last resize has a mean above high_load, the ranker counts as loaded and the
capacity halves (entries are evicted down to it and the slabs are compacted, so the memory is really given back to
the dense model's batches); below low_load it doubles, up to the budget. Between the two the capacity stays: the gap
is the hysteresis that keeps the cache from flapping. A grown cache fills again from misses (nothing is prefetched).

Bytes are counted as 8 (the int64 key) + 4 * dim (the float32 row) per entry. Python's own bookkeeping (the dicts that
map keys to slots and hold the eviction order, roughly 100-200 bytes an entry) is not counted: the budget is what the
rows would take in a device or pinned buffer.

Eviction follows a policy object: LRUPolicy (least recently used first) or LFUPolicy (least frequently used first,
ties by recency). Both are exact and O(1) per touched or evicted entry. A lookup costs one dict probe per key in
Python (about 0.1 µs); rows are gathered and scattered with NumPy, slot allocation and eviction are batched.

CachedBackend wraps another Backend: rows() and pooled() look the pairs' table keys up in the cache, ask the inner
backend only for the distinct keys that missed, and return what the inner backend alone would return.
"""

import collections
import itertools
import threading

import numpy as np

from tf_fusedrec.export import format as fmt
from tf_fusedrec.serve import backend as backend_lib

KEY_BYTES = 8
ROW_ITEM_BYTES = 4

# The doorkeeper of CachedBackend.pooled: one bool per slot (1 MiB a group), indexed by the top bits of a key's route.
_DOORKEEPER_BITS = 20
_DOORKEEPER_SLOTS = 1 << _DOORKEEPER_BITS


def _consume(iterator):
    """Runs an iterator to its end in C (the itertools recipe), for calls made for their effect on each item."""
    collections.deque(iterator, maxlen=0)


def entry_bytes(dim):
    """Bytes one cached row of width dim counts for: its int64 key and its float32 row."""
    return KEY_BYTES + ROW_ITEM_BYTES * int(dim)


# --- eviction policies -----------------------------------------------------------------------------------------------


class LRUPolicy:
    """Evicts the entry used least recently: an OrderedDict kept in use order (oldest first).

    Entries are hashable ids ((group, key) tuples in AdaptiveCache); the policy only orders them.
    """

    name = "lru"

    def __init__(self):
        self._order = collections.OrderedDict()

    def __len__(self):
        return len(self._order)

    def insert(self, entries):
        """New entries, in the order they arrived: each becomes the most recently used."""
        self._order.update(zip(entries, itertools.repeat(None)))

    def touch(self, entries):
        """Entries that were used, in the order of use."""
        _consume(map(self._order.move_to_end, entries))

    def pop_victim(self):
        """Removes and returns the entry to evict next."""
        return self._order.popitem(last=False)[0]

    def clear(self):
        self._order.clear()


class LFUPolicy:
    """Evicts the entry used least often, the least recently used of those first.

    The O(1) LFU scheme: a count per entry and, per count, an OrderedDict of the entries with that count in use order.
    An entry starts at count 1 when inserted; every touch adds 1. Counts are forgotten on eviction and do not decay, so
    an entry that was hot long ago keeps its place until the entries used more often fill the cache.
    """

    name = "lfu"

    def __init__(self):
        self._count = {}
        self._buckets = {}  # count -> OrderedDict of the entries with that count, least recently used first
        self._min = 0  # the smallest count held (0 when empty)

    def __len__(self):
        return len(self._count)

    def insert(self, entries):
        if not entries:
            return
        bucket = self._buckets.get(1)
        if bucket is None:
            bucket = self._buckets[1] = collections.OrderedDict()
        count = self._count
        for entry in entries:
            count[entry] = 1
            bucket[entry] = None
        self._min = 1

    def touch(self, entries):
        count, buckets = self._count, self._buckets
        for entry in entries:
            c = count[entry]
            bucket = buckets[c]
            del bucket[entry]
            if not bucket:
                del buckets[c]
                if self._min == c:
                    self._min = c + 1  # the entry just moved there, so that bucket is not empty
            count[entry] = c + 1
            above = buckets.get(c + 1)
            if above is None:
                above = buckets[c + 1] = collections.OrderedDict()
            above[entry] = None

    def pop_victim(self):
        bucket = self._buckets[self._min]
        entry = bucket.popitem(last=False)[0]
        del self._count[entry]
        if not bucket:
            del self._buckets[self._min]
            # A scan over the distinct counts, only when the lowest bucket empties.
            self._min = min(self._buckets) if self._buckets else 0
        return entry

    def clear(self):
        self._count.clear()
        self._buckets.clear()
        self._min = 0


POLICIES = {"lru": LRUPolicy, "lfu": LFUPolicy}


# --- storage ---------------------------------------------------------------------------------------------------------


class _GroupSlab:
    """One group's cached rows: a float32 slab [slots, dim], a dict key -> slot, and the free slots."""

    def __init__(self, dim):
        self.dim = dim
        self.entry_bytes = entry_bytes(dim)
        self.slot_of = {}
        self.rows = np.empty((0, dim), np.float32)
        self.free = []

    def __len__(self):
        return len(self.slot_of)

    def slots(self, keys_list):
        """int64 [n] slot of each key, -1 where absent."""
        return np.fromiter(map(self.slot_of.get, keys_list, itertools.repeat(-1)), np.int64, len(keys_list))

    def insert(self, keys_list, rows):
        """Stores rows [m, dim] of m keys that are absent."""
        m = len(keys_list)
        taken = min(m, len(self.free))
        slots = self.free[len(self.free) - taken:]
        del self.free[len(self.free) - taken:]
        if m > taken:
            # Doubling keeps the number of reallocations logarithmic in the number of entries.
            old = len(self.rows)
            grown = max(2 * old, old + m - taken, 16)
            rows_grown = np.empty((grown, self.dim), np.float32)
            rows_grown[:old] = self.rows
            self.rows = rows_grown
            slots.extend(range(old, old + m - taken))
            self.free.extend(range(grown - 1, old + m - taken - 1, -1))
        self.rows[slots] = rows
        self.slot_of.update(zip(keys_list, slots))

    def remove(self, key):
        self.free.append(self.slot_of.pop(key))

    def compact(self):
        """Moves the live rows to the front of a slab just big enough (after a shrink: the memory goes back)."""
        if len(self.rows) <= 2 * len(self.slot_of) + 16:
            return
        keys = list(self.slot_of)
        slots = np.fromiter(self.slot_of.values(), np.int64, len(keys))
        self.rows = self.rows[slots]  # fancy indexing copies, so the old slab is freed
        self.slot_of = dict(zip(keys, range(len(keys))))
        self.free = []


class AdaptiveCache:
    """A thread-safe cache of embedding rows whose capacity follows the ranker's load (see the module docstring).

    Args:
      budget_bytes: the most the cache may hold (key + row bytes, see the module docstring); also its starting
        capacity.
      min_fraction: the capacity never drops below min_fraction * budget_bytes; in (0, 1].
      window: how many recent request batch sizes the load is the mean of, and how many observations must follow a
        resize before the next one.
      high_load: a window mean above this (instances per request batch) shrinks the capacity (halves it).
      low_load: a window mean below this grows the capacity (doubles it, up to the budget); < high_load.
      policy: "lru" or "lfu" (POLICIES).
    """

    def __init__(self, budget_bytes, min_fraction=0.1, window=64, high_load=256.0, low_load=64.0, policy="lru"):
        if not isinstance(budget_bytes, (int, np.integer)) or budget_bytes < 1:
            raise ValueError(f"AdaptiveCache: budget_bytes must be an int >= 1, got {budget_bytes!r}")
        if not 0.0 < min_fraction <= 1.0:
            raise ValueError(f"AdaptiveCache: min_fraction must be in (0, 1], got {min_fraction!r}")
        if not isinstance(window, (int, np.integer)) or window < 1:
            raise ValueError(f"AdaptiveCache: window must be an int >= 1, got {window!r}")
        if not 0.0 <= low_load < high_load:
            raise ValueError(f"AdaptiveCache: need 0 <= low_load < high_load, got low_load={low_load!r}, "
                             f"high_load={high_load!r}")
        if policy not in POLICIES:
            raise ValueError(f"AdaptiveCache: unknown policy {policy!r} (one of {sorted(POLICIES)})")
        self._lock = threading.Lock()
        self.budget_bytes = int(budget_bytes)
        self.min_capacity_bytes = int(min_fraction * budget_bytes)
        self.high_load = float(high_load)
        self.low_load = float(low_load)
        self._capacity = self.budget_bytes
        self._window = collections.deque(maxlen=int(window))
        self._window_sum = 0  # ints, so the running sum does not drift
        self._since_resize = 0
        self._policy = POLICIES[policy]()
        self._slabs = {}  # group -> _GroupSlab
        self._bytes = 0
        self._hits = self._misses = self._resizes = self._evictions = 0

    # --- lookups ---

    def get_many(self, group, keys):
        """Looks keys up.

        Args:
          group: the group's name.
          keys: int64 [n] table keys (may repeat: each occurrence counts as a hit or a miss).

        Returns:
          (rows float32 [h, dim], the rows of the hits in the order of keys (a copy); hit bool [n]). rows is [0, 0]
          while the cache has never held a row of the group.
        """
        keys = _keys_1d(keys, "keys")
        with self._lock:
            slab = self._slabs.get(group)
            if slab is None or not len(slab):
                self._misses += len(keys)
                dim = slab.dim if slab is not None else 0
                return np.zeros((0, dim), np.float32), np.zeros(len(keys), bool)
            slots = slab.slots(keys.tolist())
            hit = slots >= 0
            rows = slab.rows[slots[hit]]
            self._policy.touch(zip(itertools.repeat(group), keys[hit].tolist()))
            n_hits = len(rows)
            self._hits += n_hits
            self._misses += len(keys) - n_hits
        return rows, hit

    def put_many(self, group, keys, rows):
        """Inserts rows, evicting by the policy to stay within the capacity; keys already held get the new row and
        count as used.

        When more new rows arrive than the capacity holds, only the last ones that fit are kept: inserting them one by
        one would have evicted the first ones anyway, under either policy.

        Args:
          group: the group's name.
          keys: int64 [n] table keys (a repeated key keeps its first row).
          rows: float32 [n, dim]; dim is fixed per group by the first put.
        """
        keys = _keys_1d(keys, "keys")
        rows = np.asarray(rows, np.float32)
        if rows.ndim != 2 or len(rows) != len(keys):
            raise ValueError(f"AdaptiveCache.put_many: group {group!r}: rows must be [{len(keys)}, dim], "
                             f"got {rows.shape}")
        if not len(keys):
            return
        _, first = np.unique(keys, return_index=True)
        if len(first) < len(keys):
            first.sort()  # first occurrences, in arrival order (the order LRU sees them)
            keys, rows = keys[first], rows[first]
        with self._lock:
            slab = self._slabs.get(group)
            if slab is None:
                slab = self._slabs[group] = _GroupSlab(rows.shape[1])
            elif slab.dim != rows.shape[1]:
                raise ValueError(f"AdaptiveCache.put_many: group {group!r} holds rows of dim {slab.dim}, "
                                 f"got rows of dim {rows.shape[1]}")
            slots = slab.slots(keys.tolist())
            held = slots >= 0
            if held.any():
                slab.rows[slots[held]] = rows[held]
                self._policy.touch(zip(itertools.repeat(group), keys[held].tolist()))
            new = ~held
            new_keys, new_rows = keys[new], rows[new]
            fit = self._capacity // slab.entry_bytes
            if len(new_keys) > fit:
                new_keys, new_rows = new_keys[len(new_keys) - fit:], new_rows[len(new_rows) - fit:]
            if not len(new_keys):
                return
            self._evict_to(self._capacity - len(new_keys) * slab.entry_bytes)
            new_list = new_keys.tolist()
            slab.insert(new_list, new_rows)
            self._policy.insert(list(zip(itertools.repeat(group), new_list)))
            self._bytes += len(new_list) * slab.entry_bytes

    def clear(self):
        """Drops every entry (e.g. when the model is replaced); the counters and the capacity stay."""
        with self._lock:
            self._slabs.clear()
            self._policy.clear()
            self._bytes = 0

    # --- load ---

    def observe(self, batch_size):
        """Records the size of one request batch and resizes the cache when the load calls for it.

        Args:
          batch_size: int >= 0, the number of instances of the request.

        Returns:
          The capacity in bytes after the observation.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 0:
            raise ValueError(f"AdaptiveCache.observe: batch_size must be an int >= 0, got {batch_size!r}")
        with self._lock:
            window = self._window
            if len(window) == window.maxlen:
                self._window_sum -= window[0]
            window.append(int(batch_size))
            self._window_sum += int(batch_size)
            self._since_resize += 1
            # Decide only on a window made entirely of observations since the last resize: the capacity then moves
            # one step per window of evidence, not once per request.
            if self._since_resize < window.maxlen:
                return self._capacity
            load = self._window_sum / len(window)
            if load > self.high_load and self._capacity > self.min_capacity_bytes:
                self._capacity = max(self.min_capacity_bytes, self._capacity // 2)
                self._evict_to(self._capacity)
                for slab in self._slabs.values():
                    slab.compact()
            elif load < self.low_load and self._capacity < self.budget_bytes:
                self._capacity = min(self.budget_bytes, self._capacity * 2)
            else:
                return self._capacity
            self._resizes += 1
            self._since_resize = 0
            return self._capacity

    # --- state ---

    def __len__(self):
        with self._lock:
            return len(self._policy)

    @property
    def capacity_bytes(self):
        with self._lock:
            return self._capacity

    def stats(self):
        """A dict: policy, hits, misses, hit_rate (None before any lookup), entries, bytes, capacity_bytes,
        min_capacity_bytes, budget_bytes, load (the window's mean, None before any observation), resizes, evictions."""
        with self._lock:
            looked_up = self._hits + self._misses
            return {
                "policy": self._policy.name,
                "hits": self._hits,
                "misses": self._misses,
                "hit_rate": self._hits / looked_up if looked_up else None,
                "entries": len(self._policy),
                "bytes": self._bytes,
                "capacity_bytes": self._capacity,
                "min_capacity_bytes": self.min_capacity_bytes,
                "budget_bytes": self.budget_bytes,
                "load": self._window_sum / len(self._window) if self._window else None,
                "resizes": self._resizes,
                "evictions": self._evictions,
            }

    def _evict_to(self, target_bytes):
        """Evicts by the policy until at most target_bytes are held (the caller holds the lock)."""
        while self._bytes > target_bytes and len(self._policy):
            group, key = self._policy.pop_victim()
            slab = self._slabs[group]
            slab.remove(key)
            self._bytes -= slab.entry_bytes
            self._evictions += 1


def _keys_1d(keys, what):
    keys = np.asarray(keys)
    if keys.ndim != 1:
        raise ValueError(f"AdaptiveCache: {what} must be 1-D, got shape {keys.shape}")
    if keys.size and not np.issubdtype(keys.dtype, np.integer):
        raise ValueError(f"AdaptiveCache: {what} must be integers (int64 table keys), got {keys.dtype}")
    return keys.astype(np.int64, copy=False)


# --- the backend -----------------------------------------------------------------------------------------------------


class CachedBackend(backend_lib.Backend):
    """A Backend that answers from an AdaptiveCache and asks `inner` only for what the cache does not hold.

    rows() returns exactly inner.rows(): the distinct keys that miss are fetched from inner (once each, by their first
    pair) and inserted. Rows of ids never trained are cached too: the initializer's row is a function of (id, feature)
    only. pooled() equals inner.pooled() up to float32 summation order (1e-6): cached pairs are pooled here, the
    others by inner (on embedding servers, where they are partially pooled), and the partial sums and counts added.

    Rows pooled by inner never come back one by one, so pooled() alone would never fill the cache. With
    admit_from_pooled, a missing key that already missed in an earlier pooled() call (a doorkeeper: one bit per hash
    slot, cleared when half full) is fetched as a row with inner.rows() and cached; keys seen once, the long tail,
    are still pooled by inner. Without it, pooled() only reads the cache, which rows() fills.

    The ranker calls cache.observe(batch size) once per request; this class does not, since one request makes one call
    per group.

    Versions (an inner backend that is `versioned`, backend.py): the cache holds the rows of one version, the newest
    asked for; a call asking for a newer one empties it first, and a call asking for an older one (a batch that began
    before a swap) reads inner only. Reads and writes check the version under this backend's lock, so rows of two
    versions never meet in the cache.

    Args:
      inner: a Backend with a `manifest` attribute (the export's manifest, as on LocalBackend), to form table keys.
      cache: an AdaptiveCache (may be shared by several CachedBackends of different exports only if cleared between).
      admit_from_pooled: bool, see above.
    """

    def __init__(self, inner, cache, admit_from_pooled=True):
        manifest = getattr(inner, "manifest", None)
        if manifest is None:
            raise ValueError(f"CachedBackend: the inner backend {type(inner).__name__} has no manifest "
                             "(inner.manifest): it is needed to form the table keys")
        if not isinstance(cache, AdaptiveCache):
            raise ValueError(f"CachedBackend: cache must be an AdaptiveCache, got {type(cache).__name__}")
        self.inner = inner
        self.cache = cache
        self.manifest = manifest
        self.admit_from_pooled = bool(admit_from_pooled)
        self._groups = {g["name"]: g for g in manifest["groups"]}
        self._version = None  # the version whose rows the cache holds (None: not told yet)
        self._lock = threading.Lock()
        self._doorkeepers = {}  # group -> (bool [_DOORKEEPER_SLOTS], [slots set since the last clear])
        self._rows_fetched = 0
        self._rows_admitted_from_pooled = 0
        self._pairs_pooled_here = 0
        self._pairs_pooled_by_inner = 0

    def _pairs(self, group, ids, categories):
        """(group dict, ids int64 [n], categories int64 [n], table keys int64 [n]) after checking the inputs."""
        if group not in self._groups:
            raise fmt.ExportError(f"the export has no group {group!r} (groups: {sorted(self._groups)})")
        spec = self._groups[group]
        ids = np.asarray(ids, np.int64)
        categories = np.asarray(categories, np.int64)
        if ids.ndim != 1 or categories.shape != ids.shape:
            raise ValueError(f"group {group}: ids and categories must be 1-D of one length, got {ids.shape} and "
                             f"{categories.shape}")
        num_categories = len(spec["features"])
        if len(categories) and (categories.min() < 0 or categories.max() >= num_categories):
            raise ValueError(f"group {group}: categories must lie in [0, {num_categories}), got "
                             f"[{categories.min()}, {categories.max()}]")
        keys = fmt.table_keys(ids, categories, num_categories, spec["encoding"])
        return spec, ids, categories, keys

    @property
    def versioned(self):
        return bool(getattr(self.inner, "versioned", False))

    def _holds(self, version):
        """Whether the cache holds `version`'s rows (None: unversioned calls always); a newer version empties the
        cache and becomes its version. Called with self._lock held."""
        if version is None:
            return True
        if self._version is None or version > self._version:
            if self._version is not None:
                self.cache.clear()
            self._version = version
        return version == self._version

    def _get(self, group, unique_keys, version):
        """(rows of the keys the cache holds, bool hit [n]) for `version`; no hit when the cache is on another."""
        if version is None:
            return self.cache.get_many(group, unique_keys)
        with self._lock:
            if self._holds(version):
                return self.cache.get_many(group, unique_keys)
        return np.zeros((0, self._groups[group]["dim"]), np.float32), np.zeros(len(unique_keys), bool)

    def _ask_rows(self, asks, group, ids, categories, first, fetch):
        """Appends to asks the inner rows lookup of the distinct keys selected by fetch (bool over the distinct keys,
        first: each one's first pair); -> its index in asks (None: nothing to fetch)."""
        if not fetch.any():
            return None
        position = first[fetch]
        asks.append(backend_lib.Lookup(group, ids[position], categories[position]))
        return len(asks) - 1

    def _insert(self, group, keys, rows, version):
        """Rows fetched from inner for `keys`, inserted into the cache if it is still on `version`; -> the rows."""
        rows = np.asarray(rows, np.float32)
        with self._lock:
            if self._holds(version):
                self.cache.put_many(group, keys, rows)
            self._rows_fetched += len(keys)
        return rows

    def rows(self, group, ids, categories, version=None):
        return self.lookup_many([backend_lib.Lookup(group, ids, categories)], version)[0]

    def pooled(self, group, ids, categories, segments, num_segments, version=None):
        return self.lookup_many([backend_lib.Lookup(group, ids, categories, segments, num_segments)], version)[0]

    def lookup_many(self, lookups, version=None):
        """rows() and pooled() of several Lookups: the cache is read for all of them first, then everything it misses
        is asked of inner in one inner.lookup_many call (a RemoteBackend: one round trip for the whole batch)."""
        asks = []
        finishers = [self._plan_rows(q, asks, version) if q.segments is None else self._plan_pooled(q, asks, version)
                     for q in lookups]
        more = {} if version is None else {"version": version}
        answers = self.inner.lookup_many(asks, **more) if asks else []
        return [finish(answers) for finish in finishers]

    def _plan_rows(self, q, asks, version):
        group = q.group
        spec, ids, categories, keys = self._pairs(group, q.ids, q.categories)
        unique_keys, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        cached, hit = self._get(group, unique_keys, version)
        rows = np.empty((len(unique_keys), spec["dim"]), np.float32)
        if len(cached):
            rows[hit] = cached
        miss = ~hit
        fetch = self._ask_rows(asks, group, ids, categories, first, miss)

        def finish(answers):
            if fetch is not None:
                rows[miss] = self._insert(group, unique_keys[miss], answers[fetch], version)
            return rows[inverse]
        return finish

    def _plan_pooled(self, q, asks, version):
        group, num_segments = q.group, q.num_segments
        spec, ids, categories, keys = self._pairs(group, q.ids, q.categories)
        segments = np.asarray(q.segments, np.int64)
        if segments.shape != ids.shape:
            raise ValueError(f"group {group}: segments must be [{len(ids)}] like ids, got {segments.shape}")
        if len(segments) and (segments.min() < 0 or segments.max() >= num_segments):
            raise ValueError(f"group {group}: segments must lie in [0, {num_segments}), got "
                             f"[{segments.min()}, {segments.max()}]")
        unique_keys, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        cached, hit = self._get(group, unique_keys, version)
        rows = np.zeros((len(unique_keys), spec["dim"]), np.float32)
        if len(cached):
            rows[hit] = cached
        admit = np.zeros(len(unique_keys), bool)
        if self.admit_from_pooled and not hit.all():
            admit[~hit] = self._seen_before(group, unique_keys[~hit])
        fetch = self._ask_rows(asks, group, ids, categories, first, admit)
        pair_here = (hit | admit)[inverse]
        elsewhere = ~pair_here
        by_inner = None
        if elsewhere.any():
            asks.append(backend_lib.Lookup(group, ids[elsewhere], categories[elsewhere], segments[elsewhere],
                                           num_segments))
            by_inner = len(asks) - 1

        def finish(answers):
            if fetch is not None:
                rows[admit] = self._insert(group, unique_keys[admit], answers[fetch], version)
            sums, counts = backend_lib.pool(rows[inverse[pair_here]], segments[pair_here], num_segments)
            if by_inner is not None:
                inner_sums, inner_counts = answers[by_inner]
                sums += inner_sums
                counts += inner_counts
            with self._lock:
                self._rows_admitted_from_pooled += int(admit.sum())
                self._pairs_pooled_here += int(pair_here.sum())
                self._pairs_pooled_by_inner += int(elsewhere.sum())
            return sums, counts
        return finish

    def _seen_before(self, group, keys):
        """bool [n]: whether each key's doorkeeper slot was set (by an earlier miss); sets them."""
        # The top bits of the route hash: uniform over slots whatever the encoding.
        slot = (fmt.route(keys) >> np.uint64(64 - _DOORKEEPER_BITS)).astype(np.int64)
        with self._lock:
            if group not in self._doorkeepers:
                self._doorkeepers[group] = [np.zeros(_DOORKEEPER_SLOTS, bool), 0]
            door = self._doorkeepers[group]
            seen = door[0][slot]
            door[0][slot] = True
            door[1] += int(np.count_nonzero(~seen))  # may count a slot twice within one call: it only clears earlier
            if door[1] > _DOORKEEPER_SLOTS // 2:
                # Half full: false "seen before" answers would grow, and keys that stopped coming would stay admitted.
                door[0][:] = False
                door[1] = 0
        return seen

    def stats(self):
        """The inner backend's stats, with the cache's (and this backend's counters) under "cache"."""
        with self._lock:
            mine = {"rows_fetched": self._rows_fetched, "rows_admitted_from_pooled": self._rows_admitted_from_pooled,
                    "pairs_pooled_here": self._pairs_pooled_here, "pairs_pooled_by_inner": self._pairs_pooled_by_inner}
        return {**self.inner.stats(), "cache": {**self.cache.stats(), **mine}}

    def close(self):
        self.inner.close()
