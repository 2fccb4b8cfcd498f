"""Checkpoints that survive crashes and restore onto any worker count (MTGRBoost §5.2), full or delta.

Layout of a model directory::

    DIR/ckpt-{step}/manifest.json        written last; its presence is what makes the checkpoint exist
    DIR/ckpt-{step}/shard-{r}-of-{N}.npz  rank r's rows: every table's (keys, ids, rows) it owns + optimizer slot rows
                                          (+ with admission, the counts of the keys it has not admitted yet;
                                          with eviction or expiry, the access status of its rows)
    DIR/ckpt-{step}/shard-{r}-of-{N}.part-{k}.npz  (native tables larger than part_bytes) rank r's rows of those
                                          tables (a delta's: the changed ones) in pieces of about part_bytes, each
                                          with its slot rows, ids and access status; the shard lists each part's
                                          sha256 and size (and holds a delta's removed keys)
    DIR/ckpt-{step}/dense.npz             dense weights, optimizer iterations and dense slots, replicated hot rows
                                          with their slots and hot sets (equal on every rank;
                                          rank 0 writes them)

Full and delta checkpoints (``full_every``): a full checkpoint's shards hold every row a rank owns; a delta's hold
only the rows whose value or optimizer slots changed since the previous checkpoint (new keys included) and, per table,
the keys removed since then (``t{t}.removed``: evicted, or moved into the hot set); its dense.npz is whole (small).
The manifest names the kind and, for a delta, the parent step it applies on: a delta restores as its chain, the full
checkpoint it descends from and every delta after it, in order. Change detection is exact (but for tables in part
files, below) and works the same on every table backend: the Checkpointer keeps, per table, the sorted keys, rows and
slot rows of this rank at the previous checkpoint (the one it saved or restored) and diffs the current export against
them bit for bit. Memory: with full_every > 0, each rank holds a host copy of its shard as of the last checkpoint (8
bytes per key, 4 per row and slot value, 1 per slot-exists flag: about the size of its full shard file; float16 rows
are kept as the float32 the tables export), and twice that while a save runs; with full_every = 0 nothing is kept. A
table written in part files (a native one over part_bytes, tiered tables larger than memory among them) is never held
whole: the Checkpointer keeps its DigestState (each key and a 64-bit digest of its row's and slots' bits, 16 bytes a
key), and a delta reads the table chunk by chunk, writing the rows whose digest changed or that are new (with every
key's access status) to part files; a change in one word of a row always changes its digest, changes in several could
keep it with a probability of about 2^-64 (the digest's one inexactness). A slot row that disappears while its key's
row stays is not carried by a delta (nothing in tf_fusedrec removes a slot row alone).

Saving: each rank writes its shard into DIR/.tmp-ckpt-{step}/ (file, fsync, rename), the ranks allgather the shards'
sha256 and sizes, and rank 0 writes the manifest there and renames the directory to ckpt-{step}: a checkpoint is
either complete or absent, whatever dies when. A kill between two ranks' saves leaves only a .tmp directory, which
the next run removes. Retention (``keep``) keeps the newest `keep` checkpoints and every checkpoint their chains need.

Admission counts (FusedEmbedding(admission=...)): every checkpoint, full or delta, holds each rank's whole count table
(``t{t}.counts.keys``, ``.values``, ``.ids``), restored from the newest checkpoint of a chain with the rows' owner
filter; a checkpoint without them (older, or written without admission) restores empty counts.

Access status (FusedEmbedding(eviction=..., expiry=...); tf_fusedrec/distributed/eviction.py): every checkpoint, full
or delta, holds each rank's whole status too, since a training read changes a key's status whether or not it changes
its row: every row's (count, last) (``t{t}.status.counts``, ``.lasts``: aligned with the rows in a full checkpoint;
with their own ``.keys`` and ``.ids`` in a delta, whose rows are the changed ones only: up to 32 bytes per row held),
the table's clock (``t{t}.status.clock``: its training lookups, equal on every worker) and the rank's evicted and
expired counters (``t{t}.evicted``, ``t{t}.expired``). They are restored from the newest checkpoint of a chain, after
the rows: each key's status goes with its row (the rows' owner filter), every rank takes the clock, and old rank s's
counters are added up on new rank s mod M, so the same worker count gives each rank its own and another keeps the
totals. So a resumed run evicts and expires exactly the rows the uninterrupted run would. Rows never read keep no
status, and a TFRA status without a row (a key moved into the hot set) is not saved. A checkpoint without a status
(older, or written without eviction and expiry) restores an empty one: counts and recency start again from zero.

Data positions: batches are a function of the step, except a sequence run's (token-balanced batches hold different
sample counts): save(stream_position=...) records each rank's position in its sample stream in the manifest
(``stream_positions``, one list of ints per rank, gathered with the shards' digests: no extra collective), and
restore() returns them; the train app refuses to continue them on another worker count.

Restoring (`restore`): the ranks allgather the steps they see published and take the newest one all of them see; each
rank then follows its chain back to the full checkpoint, checks the sha256 of every file it is going to read, and
the ranks agree (allgather) before reading anything, so a missing link or a corrupt or missing file stops every rank
with the same error naming it. A checkpoint written by N workers restores onto M: table and slot rows are kept where
owner_of(id, M) == rank; new rank r reads only the shards that can hold its ids (old shard r mod N when N divides M,
old shards s with s mod M == r when M divides N, every shard otherwise), each link of a chain by the worker count
that wrote it. Files are .npz without pickles.
"""

import collections
import functools
import hashlib
import io
import json
import os
import shutil
import time

import numpy as np
import tensorflow as tf

from tf_fusedrec import _frameworks
from tf_fusedrec import _keras
from tf_fusedrec.train.optimizer import embedding_layers

de = _frameworks.de  # TFRA's dynamic_embedding, imported on first use (_frameworks.tfra: an error saying how to get it)

# 2: manifests name their kind and parent; 3: a shard may list part files (tables larger than PART_BYTES); a
# checkpoint without parts is written as format 2, which the releases before parts read too. Formats 1 (every
# checkpoint full) and 2 restore.
FORMAT = 3
PART_BYTES = 256 << 20  # a native table whose shard exceeds this goes to part files of about this size each
HASH_PIECE = 64 << 20  # bytes read at a time while hashing a part file
MANIFEST = "manifest.json"
DENSE = "dense.npz"
FULL, DELTA = "full", "delta"
MAX_VISIBLE = 64  # published steps a rank reports in the agreement (the newest ones)
MAX_MESSAGE = 2048  # bytes of a rank's error message in the restore agreement


class CheckpointError(ValueError):
    """A checkpoint cannot be restored (corrupt or missing file, or a layout this run cannot read)."""


def step_dir(model_dir, step):
    return os.path.join(model_dir, f"ckpt-{step}")


def shard_name(rank, size):
    return f"shard-{rank}-of-{size}.npz"


def published_steps(model_dir):
    """Steps whose manifest exists, ascending."""
    if not os.path.isdir(model_dir):
        return []
    steps = []
    for name in os.listdir(model_dir):
        if name.startswith("ckpt-") and name[5:].isdigit() and os.path.exists(os.path.join(model_dir, name, MANIFEST)):
            steps.append(int(name[5:]))
    return sorted(steps)


def read_manifest(model_dir, step):
    with open(os.path.join(step_dir(model_dir, step), MANIFEST)) as f:
        return json.load(f)


def parent_of(manifest):
    """The step a delta checkpoint applies on; None for a full one."""
    return manifest.get("parent") if manifest.get("kind", FULL) == DELTA else None


def needed_steps(model_dir, keep):
    """The published steps to keep: the newest `keep` and every checkpoint their chains go through."""
    steps = published_steps(model_dir)
    needed = set()
    for step in steps[-keep:]:
        while step is not None and step not in needed:
            needed.add(step)
            try:
                step = parent_of(read_manifest(model_dir, step))
            except (OSError, ValueError):
                step = None
    return needed


def shards_to_read(rank, new_size, old_size):
    """The old shards new rank `rank` of `new_size` reads: only those that can hold ids it owns."""
    if new_size % old_size == 0:
        return [rank % old_size]
    if old_size % new_size == 0:
        return [s for s in range(old_size) if s % new_size == rank]
    return list(range(old_size))


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def _write_atomic(path, data):
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def part_name(rank, size, k):
    """The k-th part file of rank's shard (a table larger than PART_BYTES, written in pieces)."""
    return f"shard-{rank}-of-{size}.part-{k}.npz"


def _file_digest(path):
    """(sha256 hex, bytes) of a file, read HASH_PIECE bytes at a time (a part file is not held whole)."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while piece := f.read(HASH_PIECE):
            h.update(piece)
            n += len(piece)
    return h.hexdigest(), n


def _npz_bytes(arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


# dense.npz's layout: 2 (from 2026-11-28) counts var{i} over the model's variables outside its embedding layers;
# before (no such key) they counted every variable Keras tracked in them but their tables (_align_first_layout).
DENSE_LAYOUT = "dense_layout"


def _align_first_layout(state, count, z):
    """`state` ([(key, variable)], its first `count` the dense variables 'var{i}') keyed for a dense.npz of the first
    layout, whose var{j} also counted the embedding layers' variables Keras 2 tracks (their statistics, counters):
    each dense variable takes, in order, the next var{j} of its shape and dtype (those are int64 and float64, the
    model's float32 or float16), so the checkpoint restores on either Keras. A variable left without one keeps its
    key, which the restore then names as missing."""
    old = sorted((k for k in z.files if k.startswith("var") and k[3:].isdigit()), key=lambda k: int(k[3:]))
    renamed, j = [], 0
    for key, v in state[:count]:
        want = (tuple(v.shape), np.dtype(tf.as_dtype(v.dtype).as_numpy_dtype))
        while j < len(old) and (z[old[j]].shape, z[old[j]].dtype) != want:
            j += 1
        renamed.append((old[j], v) if j < len(old) else (key, v))
        j += 1
    return renamed + state[count:]


TableState = collections.namedtuple("TableState", ["keys", "rows", "slots"])
TableState.__doc__ = """One rank's rows of a table: keys int64 [K] ascending, rows [K, dim], and per optimizer slot
(in slot_tables order) (values [K, dim], exists bool [K])."""


DigestState = collections.namedtuple("DigestState", ["keys", "digests"])
DigestState.__doc__ = """One rank's rows of a table written in part files, as a delta diffs against them: keys int64 [K]
ascending and each key's 64-bit digest of its row's and slot rows' bits (_row_digests), 16 bytes a key instead of the
rows."""

DIGEST_BLOCK = 1 << 16  # rows hashed at a time (their words as uint64: bounded memory)


@functools.lru_cache(maxsize=None)
def _digest_constants(width):
    """The fixed odd 64-bit constants of _row_digests for `width` words an entry (made once per width, not per
    chunk)."""
    rng = np.random.default_rng(0x5EED_D16E57)
    return rng.integers(0, 1 << 63, width, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def _chunk_digests(rows, slot_rows, slots):
    """_row_digests of an export_chunks chunk: its rows and slot rows ([k, S, dim], `slots` the table's
    (name, slot) in slot_tables order)."""
    return _row_digests(rows, [slot_rows[:, slot.part - 1] for _, slot in slots])


def _sorted_digest_state(seen):
    """The DigestState of a table's chunks' [(keys, digests)], in key order."""
    keys = np.concatenate([k for k, _ in seen]) if seen else np.zeros(0, np.int64)
    digests = np.concatenate([d for _, d in seen]) if seen else np.zeros(0, np.uint64)
    order = np.argsort(keys, kind="stable")
    return DigestState(keys[order], digests[order])


def _row_digests(rows, slot_values):
    """uint64 [K]: per key, sum over its row's and slot rows' float32 words w_i of w_i * c_i mod 2^64, with fixed odd
    64-bit constants c_i. Two entries that differ in one word always differ here (c_i is odd and |w_i - w'_i| <
    2^32); entries that differ in several collide with a probability of about 2^-64 (a delta would then miss that row's
    change: the digest's one inexactness, docs say so)."""
    parts = [np.asarray(rows, np.float32).reshape(len(rows), -1)]
    parts += [np.asarray(v, np.float32).reshape(len(rows), -1) for v in slot_values]
    constants = _digest_constants(sum(part.shape[1] for part in parts))
    out = np.empty(len(rows), np.uint64)
    for start in range(0, len(rows), DIGEST_BLOCK):
        block = slice(start, start + DIGEST_BLOCK)
        words = np.concatenate([np.ascontiguousarray(part[block]).view(np.uint32) for part in parts], axis=1)
        with np.errstate(over="ignore"):
            out[block] = (words.astype(np.uint64) * constants).sum(axis=1, dtype=np.uint64)
    return out


def _digest_state(state):
    """The DigestState of a TableState (a table that outgrew part_bytes since the delta's parent)."""
    return DigestState(state.keys, _row_digests(state.rows, [values for values, _ in state.slots]))


def _digest_changes(previous, keys, digests, held):
    """bool [k] over keys (any order): new, or a digest other than previous's; marks previous's keys found in
    `held` (bool over previous.keys)."""
    if len(previous.keys) == 0:
        return np.ones(len(keys), bool)
    at = np.minimum(np.searchsorted(previous.keys, keys), len(previous.keys) - 1)
    found = previous.keys[at] == keys
    held[at[found]] = True
    changed = ~found
    changed[found] = previous.digests[at[found]] != digests[found]
    return changed


def _same_bits(a, b):
    """bool [K]: row k of a equals row k of b bit for bit (NaN equals the same NaN, -0.0 differs from 0.0), as one
    byte comparison per row (a void view of each row's bytes: about 10x faster than comparing values and reducing
    over the row)."""
    width = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
    as_bytes = np.dtype((np.void, width))
    return np.ascontiguousarray(a).view(as_bytes).ravel() == np.ascontiguousarray(b).view(as_bytes).ravel()


def changes(previous, current):
    """What a delta carries from TableState `previous` to `current`: (bool [K] over current's keys, True where the
    key is new or its row or a slot (value or existence) changed; int64 keys of previous that current lacks).
    previous's keys must be ascending (TableState's are); current's may come in any order (ascending: the lookups
    run in order, the fastest). Also what finds a publish's delta (train/publishing.py: row_changes)."""
    old, new = previous.keys, current.keys
    if len(old) == 0:
        return np.ones(len(new), bool), old
    at = np.minimum(np.searchsorted(old, new), len(old) - 1)
    found = old[at] == new
    mine, theirs = np.flatnonzero(found), at[found]
    same = _same_bits(np.take(current.rows, mine, axis=0), np.take(previous.rows, theirs, axis=0))
    for (values, exists), (old_values, old_exists) in zip(current.slots, previous.slots):
        both = exists[mine] & old_exists[theirs]
        same &= exists[mine] == old_exists[theirs]
        same &= ~both | _same_bits(np.take(values, mine, axis=0), np.take(old_values, theirs, axis=0))
    changed = np.ones(len(new), bool)
    changed[mine] = ~same
    held = np.zeros(len(old), bool)  # the keys of previous that current holds (a marker: no second search)
    held[theirs] = True
    return changed, old[~held]


Link = collections.namedtuple("Link", ["step", "directory", "manifest", "names"])
Link.__doc__ = """One checkpoint of a restore's chain: its step, directory, manifest and the files this rank reads."""


def _check_count(what, value, low):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"Checkpointer: {what} must be an int >= {low}, got {value!r}")
    return value


class Checkpointer:
    """Saves and restores a model, its GroupedOptimizer and a step counter in `model_dir`.

    Args:
      model_dir: the directory (shared by the workers).
      model: a Keras model holding FusedEmbedding / PerFeatureEmbedding layers.
      optimizer: what fr.train.make_optimizer returned for it.
      step: an int64 tf.Variable (the training step; also the data position, batches being a function of it).
      comm: the comm object of the run.
      keep: published checkpoints kept (older ones are removed by rank 0 after each save, except those a kept
        delta checkpoint needs).
      config_name: recorded in the manifest.
      full_every: 0 (every checkpoint full), or steps: checkpoints are deltas on the previous one, and full at steps
        that are multiples of full_every, at the first save of a run that restored nothing, and whenever the full
        checkpoint the chain starts at is full_every steps old or more (so a restore reads at most full_every steps
        of deltas). Needs host memory for the previous checkpoint's rows (module docstring).
      part_bytes: with full_every = 0, a native table whose rows, slots and status on this rank exceed it is read
        from the table and written in part files of about this size, and restored part by part, so that a table
        larger than memory (tiered) checkpoints without being held whole (module docstring).
    """

    def __init__(self, model_dir, model, optimizer, step, comm, keep=2, config_name="", full_every=0,
                 part_bytes=PART_BYTES):
        self.model_dir, self.model, self.optimizer, self.step = model_dir, model, optimizer, step
        self.comm, self.config_name = comm, config_name
        self.keep = _check_count("keep", keep, 1)
        self.full_every = _check_count("full_every", full_every, 0)
        self.part_bytes = _check_count("part_bytes", part_bytes, 1)
        layers = embedding_layers(model)
        self.tables = [t for layer in layers for t in layer.sharded_tables()]
        # Per table, what counts its accesses (eviction, expiry) or None: its status is saved beside the rows.
        self.access = [a for layer in layers for a in layer.access_tables()]
        # Replicated hot rows (FusedEmbedding(replication=...)): equal on every rank, saved once in dense.npz.
        self.replicated = [t for layer in layers for t in layer.replicated_tables()]
        sparse_ids = {id(v) for layer in layers for _, variables in layer.optimizer_groups() for v in variables}
        # The model's variables outside its embedding layers. The layers' own (tables' anchors, per-call statistics,
        # TFRA's trainable wrappers and the per-step ids/exists buffers of its shadow variables) are saved apart
        # (tables, access status, replicated rows) or are no training state, and Keras 2 tracks them where Keras 3
        # does not (plain tf.Variables): without them the list, and the checkpoint, are the same on either Keras.
        embedding_ids = sparse_ids | {id(v) for layer in layers for v in layer.variables}
        self.dense_vars = [v for v in model.variables if id(v) not in embedding_ids
                           and not (_frameworks.tfra_loaded()
                                    and isinstance(v, (de.TrainableWrapper, de.shadow_ops.DEResourceVariable)))]
        self._trainable_dense = [v for v in model.trainable_variables if id(v) not in sparse_ids]
        self._slots_built = False
        # The checkpoint this process saved or restored last (a delta's parent), the full one its chain starts at,
        # and (full_every > 0) this rank's [TableState] at it.
        self._parent, self._base, self._previous = None, None, None
        self.written = []  # {"step", "kind", "bytes" (every rank's files)} per save of this process
        self.seconds = []  # this rank's seconds per save, beside `written`

    # --- optimizer state ------------------------------------------------------------------------------------------

    def _build_slots(self):
        """Creates every optimizer slot now (they are created lazily by the first update otherwise), so a restore
        has somewhere to write them."""
        if self._slots_built:
            return
        self.optimizer.create_slots([t.trainable for t in self.tables + self.replicated if t.trainable is not None]
                                    + self._trainable_dense)
        self._slots_built = True

    def _table_slots(self, table):
        """[(slot name, slot TFRA variable)] of a table's optimizer."""
        return [] if table.trainable is None else self.optimizer.slot_tables(table.trainable)

    def _dense_state(self, positional=False):
        """[(key, variable)] of everything equal on every rank, in a deterministic order. positional: the dense
        optimizer's slots keyed as checkpoints of Keras 3 optimizers were before they took tf_keras' slot names
        (_keras.positional_dense_slots), to restore one of those."""
        state = [(f"var{i}", v) for i, v in enumerate(self.dense_vars)]
        opts = [("dense", self.optimizer.dense)] + [(f"sparse{i}", o) for i, o in enumerate(self.optimizer.sparse)]
        state.append(("grouped/iterations", self.optimizer.iterations))
        for label, opt in opts:
            state.append((f"{label}/iterations", opt.iterations))
        slots = (_keras.positional_dense_slots(self.optimizer.dense) if positional
                 else _keras.dense_slots(self.optimizer.dense, self._trainable_dense))
        state.extend((f"dense/{key}", slot) for key, slot in slots)
        state.append(("step", self.step))
        return state

    def _replicated_state(self):
        """{key: array} of the replicated tables: hot set, rows and slot rows (rank 0's copy; all are equal)."""
        arrays = {}
        for r, table in enumerate(self.replicated):
            for what, value in zip(("keys", "ids", "segments"), table.hot_set.numpy()):
                arrays[f"hot{r}.set.{what}"] = value
            keys, rows = (x.numpy() for x in table.params.export())
            arrays[f"hot{r}.keys"], arrays[f"hot{r}.rows"] = keys, rows
            for name, slot in self._table_slots(table):
                values, exists = slot.lookup(tf.constant(keys, tf.int64), return_exists=True)
                arrays[f"hot{r}.slot.{name}.rows"] = values.numpy()
                arrays[f"hot{r}.slot.{name}.exists"] = exists.numpy()
        return arrays

    def _restore_replicated(self, z):
        for r, table in enumerate(self.replicated):
            table.hot_set.assign(*(z[f"hot{r}.set.{what}"] for what in ("keys", "ids", "segments")))
            keys = tf.constant(z[f"hot{r}.keys"], tf.int64)
            table.params.upsert(keys, tf.constant(z[f"hot{r}.rows"]))
            for slot_name, slot in self._table_slots(table):
                exists = z[f"hot{r}.slot.{slot_name}.exists"]
                slot.upsert(tf.boolean_mask(keys, exists), tf.constant(z[f"hot{r}.slot.{slot_name}.rows"][exists]))

    def table_state(self, table):
        """This rank's TableState of a sharded table, now."""
        keys, rows = (x.numpy() for x in table.params.export())
        order = np.argsort(keys, kind="stable")
        keys, rows = keys[order], rows[order]
        slots = []
        for _, slot in self._table_slots(table):
            values, exists = slot.lookup(tf.constant(keys, tf.int64), return_exists=True)
            slots.append((values.numpy(), exists.numpy()))
        return TableState(keys, rows, tuple(slots))

    def _add_rows(self, t, table, kind, arrays):
        """Adds table t's rows and slot rows (a delta's: the changed ones, and the keys removed) to the shard's
        arrays; -> its TableState now."""
        state = self.table_state(table)
        take = slice(None)
        if kind == DELTA and isinstance(self._previous[t], DigestState):  # it was in part files then
            previous = self._previous[t]
            held = np.zeros(len(previous.keys), bool)
            take = _digest_changes(previous, state.keys, _digest_state(state).digests, held)
            arrays[f"t{t}.removed"] = previous.keys[~held]
        elif kind == DELTA:
            take, arrays[f"t{t}.removed"] = changes(self._previous[t], state)
        keys = state.keys[take]
        arrays[f"t{t}.keys"], arrays[f"t{t}.rows"] = keys, state.rows[take]
        ids = table.ids_of_keys(keys)
        if ids is not None:
            arrays[f"t{t}.ids"] = ids
        for (name, _), (values, exists) in zip(self._table_slots(table), state.slots):
            arrays[f"t{t}.slot.{name}.rows"] = values[take]
            arrays[f"t{t}.slot.{name}.exists"] = exists[take]
        return state

    def _in_parts(self, table):
        """Whether a table's rows go to part files: a native table whose rows, slots and status on this rank exceed
        part_bytes."""
        rows = table.params
        return hasattr(rows, "export_chunks") and int(rows.size()) * rows.entry_bytes() > self.part_bytes

    def _write_parts(self, t, table, kind, staging, parts, arrays):
        """Writes table t's rows, slot rows, ids and (with eviction or expiry) access status in part files of at
        most part_bytes, read from the table chunk by chunk (never whole), appending each file's (sha256, bytes) to
        `parts`; a delta's parts hold the rows changed since the previous checkpoint (digests: DigestState) and the
        whole status, its removed keys go into the shard's `arrays`. -> the table's DigestState now (full_every > 0)
        or None."""
        slots = self._table_slots(table)
        tracked = self.access[t]
        previous = self._previous[t] if kind == DELTA else None
        if isinstance(previous, TableState):  # the table outgrew part_bytes since the parent
            previous = _digest_state(previous)
        held = None if previous is None else np.zeros(len(previous.keys), bool)
        seen = []  # (keys, digests) of each chunk, for the next delta
        clock = 0
        for keys, rows, slot_rows, counts, lasts, clock in table.params.export_chunks(self._rows_per_part(table)):
            digests = None
            if self.full_every:
                digests = _chunk_digests(rows, slot_rows, slots)
                seen.append((keys, digests))
            take = slice(None) if previous is None else _digest_changes(previous, keys, digests, held)
            out = {f"t{t}.keys": keys[take], f"t{t}.rows": rows[take]}
            ids = table.ids_of_keys(out[f"t{t}.keys"])
            if ids is not None:
                out[f"t{t}.ids"] = ids
            for name, slot in slots:  # a native table's slots live with its rows: every key has them
                out[f"t{t}.slot.{name}.rows"] = slot_rows[take, slot.part - 1]
                out[f"t{t}.slot.{name}.exists"] = np.ones(len(out[f"t{t}.keys"]), bool)
            if tracked is not None:  # a full part's aligned with its rows; a delta's of every key, with the keys
                out[f"t{t}.status.counts"], out[f"t{t}.status.lasts"] = counts, lasts
                if previous is not None:
                    out[f"t{t}.status.keys"] = keys
                    status_ids = table.ids_of_keys(keys)
                    if status_ids is not None:
                        out[f"t{t}.status.ids"] = status_ids
            elif previous is not None and not len(out[f"t{t}.keys"]):
                continue  # a delta's chunk without a change: no file
            data = _npz_bytes(out)
            del out
            _write_atomic(os.path.join(staging, part_name(self.comm.rank, self.comm.size, len(parts))), data)
            parts.append((_sha256(data), len(data)))
        if previous is not None:
            arrays[f"t{t}.removed"] = previous.keys[~held]
        if tracked is not None:  # its status went with the rows, into the parts
            arrays.update(_access_counters(t, tracked, clock))
        return _sorted_digest_state(seen) if self.full_every else None

    def _rows_per_part(self, table):
        return max(1, self.part_bytes // table.params.entry_bytes())

    def _state_for_deltas(self, table):
        """This rank's state of a table as the next delta diffs against it: its DigestState when it goes to part
        files (read chunk by chunk), else its TableState."""
        if not self._in_parts(table):
            return self.table_state(table)
        slots = self._table_slots(table)
        return _sorted_digest_state([(keys, _chunk_digests(rows, slot_rows, slots)) for keys, rows, slot_rows, *_ in
                                     table.params.export_chunks(self._rows_per_part(table))])

    # --- saving -------------------------------------------------------------------------------------------------

    def kind_of(self, step):
        """FULL or DELTA: what save() writes at `step` (the same on every rank)."""
        if not self.full_every or self._parent is None or step <= self._parent:
            return FULL
        if step % self.full_every == 0 or step - self._base >= self.full_every:
            return FULL
        return DELTA

    def save(self, stream_position=None):
        """Writes and publishes the checkpoint of the current step (every rank calls it); -> its directory.

        stream_position: None, or this rank's position in its training data, ints (as many on every rank; the train
          app's sequence runs give their batching.StreamPosition, whose batches are not a function of the step):
          the manifest lists every rank's as "stream_positions", which restore() returns.
        """
        began = time.perf_counter()
        self._build_slots()
        rank, size = self.comm.rank, self.comm.size
        step = int(self.step.numpy())
        kind = self.kind_of(step)
        staging = os.path.join(self.model_dir, f".tmp-ckpt-{step}")
        os.makedirs(staging, exist_ok=True)
        arrays, states, parts = {}, [], []  # parts: (sha256, bytes) of this rank's part files, in order
        for t, table in enumerate(self.tables):
            in_parts = self._in_parts(table)
            if in_parts:  # its DigestState (deltas) or None: nothing held whole
                states.append(self._write_parts(t, table, kind, staging, parts, arrays))
            else:
                states.append(self._add_rows(t, table, kind, arrays))
            if table.counts is not None:
                keys, counts = (x.numpy() for x in table.counts.export())
                arrays[f"t{t}.counts.keys"], arrays[f"t{t}.counts.values"] = keys, counts
                ids = table.ids_of_keys(keys)
                if ids is not None:
                    arrays[f"t{t}.counts.ids"] = ids
            if self.access[t] is not None and not in_parts:
                arrays.update(_access_arrays(t, table, self.access[t], states[t].keys, kind))
        if parts:
            arrays["parts.sha256"] = np.array([list(bytes.fromhex(digest)) for digest, _ in parts], np.uint8)
            arrays["parts.bytes"] = np.array([nbytes for _, nbytes in parts], np.int64)
        shard = _npz_bytes(arrays)
        del arrays
        _write_atomic(os.path.join(staging, shard_name(rank, size)), shard)
        files = {shard_name(rank, size): (_sha256(shard), len(shard))}
        dense_bytes = 0
        if rank == 0:
            dense = _npz_bytes({**{key: v.numpy() for key, v in self._dense_state()}, **self._replicated_state(),
                                DENSE_LAYOUT: np.array(2)})
            _write_atomic(os.path.join(staging, DENSE), dense)
            files[DENSE] = (_sha256(dense), len(dense))
            dense_bytes = len(dense)
        # Every rank's shard digest reaches every rank; the collective is also the barrier before publishing.
        digest = np.frombuffer(bytes.fromhex(files[shard_name(rank, size)][0]), np.uint8).astype(np.int64)
        position = [] if stream_position is None else [int(x) for x in stream_position]
        sizes = [len(shard), dense_bytes, sum(nbytes for _, nbytes in parts), len(parts)]
        row = np.concatenate([digest, np.array(sizes + position, np.int64)])[None, :]
        gathered = self.comm.allgather(tf.constant(row), name=f"FusedRec/checkpoint/save/{step}").numpy()
        final = step_dir(self.model_dir, step)
        if rank == 0:
            for r in range(size):
                files[shard_name(r, size)] = (bytes(gathered[r, :32].astype(np.uint8)).hex(), int(gathered[r, 32]))
            manifest = {
                "format": FORMAT if gathered[:, 35].any() else 2,  # 3 only where a rank wrote part files
                "step": step, "kind": kind, "parent": self._parent if kind == DELTA else None,
                "workers": size, "config": self.config_name,
                "tables": [t.name for t in self.tables], "replicated": [t.name for t in self.replicated],
                "files": {name: {"sha256": digest, "bytes": nbytes} for name, (digest, nbytes) in sorted(files.items())},
            }
            if stream_position is not None:
                manifest["stream_positions"] = gathered[:, digest.size + len(sizes):].tolist()
            _write_atomic(os.path.join(staging, MANIFEST), json.dumps(manifest, indent=1).encode())
            if os.path.exists(final):
                shutil.rmtree(final)
            os.rename(staging, final)  # the publication: atomic
            needed = needed_steps(self.model_dir, self.keep)
            for old in published_steps(self.model_dir):
                if old not in needed:
                    shutil.rmtree(step_dir(self.model_dir, old), ignore_errors=True)
        # Nobody starts the next step's collectives believing a checkpoint exists that rank 0 has not published.
        self.comm.allreduce([tf.zeros([1])], name=f"FusedRec/checkpoint/published/{step}", op="sum")
        self._remember(step, step if kind == FULL else self._base, lambda: states)
        self.written.append({"step": step, "kind": kind, "bytes": int(gathered[:, 32:35].sum())})
        self.seconds.append(time.perf_counter() - began)  # this rank's (`written` is every rank's, equal)
        return final

    def _remember(self, step, base, states):
        """`step` (whose chain starts at the full checkpoint `base`) is now the parent of the next delta; `states`
        (this rank's tables at it: a function, called only with full_every > 0) what that delta diffs against."""
        self._parent, self._base = step, base
        self._previous = states() if self.full_every else None

    def written_summary(self):
        """{"full_every", "full": {"count", "mean_bytes", "mean_seconds"}, "delta": {...}}: the checkpoints this process
        wrote (bytes: every rank's files, manifest aside; seconds: this rank's, from reading the tables to the
        publication, which every rank waits for)."""
        summary = {"full_every": self.full_every}
        for kind in (FULL, DELTA):
            sizes = [w["bytes"] for w in self.written if w["kind"] == kind]
            seconds = [s for w, s in zip(self.written, self.seconds) if w["kind"] == kind]
            summary[kind] = {"count": len(sizes), "mean_bytes": int(np.mean(sizes)) if sizes else 0,
                             "mean_seconds": round(float(np.mean(seconds)), 4) if seconds else 0.0}
        return summary

    # --- restoring ----------------------------------------------------------------------------------------------

    def agreed_step(self):
        """The newest step every rank sees published (None: none); removes stale staging directories (rank 0)."""
        visible = published_steps(self.model_dir)[-MAX_VISIBLE:]
        row = np.full([1, MAX_VISIBLE], -1, np.int64)
        row[0, :len(visible)] = visible
        gathered = self.comm.allgather(tf.constant(row), name="FusedRec/checkpoint/visible_steps").numpy()
        common = set(gathered[0].tolist())
        for r in range(1, gathered.shape[0]):
            common &= set(gathered[r].tolist())
        common.discard(-1)
        if self.comm.rank == 0 and os.path.isdir(self.model_dir):
            for name in os.listdir(self.model_dir):
                if name.startswith(".tmp-ckpt-"):
                    shutil.rmtree(os.path.join(self.model_dir, name), ignore_errors=True)
        return max(common) if common else None

    def _names_for(self, manifest, newest):
        """The files of a checkpoint this rank reads: the shards that can hold its ids, and dense.npz of the newest
        checkpoint of the chain (every checkpoint's is whole)."""
        shards = [shard_name(s, manifest["workers"])
                  for s in shards_to_read(self.comm.rank, self.comm.size, manifest["workers"])]
        return ([DENSE] if newest else []) + shards

    def _read_chain(self, step):
        """-> ([Link] from the full checkpoint to `step`, {(step, name): bytes} checked against the manifests,
        {(step, name): [(path, sha256, bytes)]} the part files a shard lists, each checked against its listing (read,
        hashed and let go: they are read again when applied), this rank's first problem as an error message naming
        the file, or "")."""
        links, at = [], step  # newest first while following the parents
        while True:
            path = os.path.join(step_dir(self.model_dir, at), MANIFEST)
            try:
                manifest = read_manifest(self.model_dir, at)
            except (OSError, ValueError) as e:
                what = f"cannot be read ({getattr(e, 'strerror', None) or e})"
                if links:
                    what += f"; it is the parent of the delta checkpoint {links[-1].directory}"
                return links, {}, {}, self._problem(step, f"{path} {what}", [at] + [link.step for link in links])
            links.append(Link(at, step_dir(self.model_dir, at), manifest, None))
            if manifest.get("format", 1) > FORMAT:
                return links, {}, {}, self._problem(step, f"{path} has format {manifest['format']}; this tf_fusedrec "
                                                      f"reads formats up to {FORMAT}", [link.step for link in links])
            if manifest.get("kind", FULL) == FULL:
                break
            parent = parent_of(manifest)
            if isinstance(parent, bool) or not isinstance(parent, int) or parent >= at:
                return links, {}, {}, self._problem(step, f"{path} is a delta checkpoint whose parent {parent!r} is not "
                                                      f"an earlier step", [link.step for link in links])
            at = parent
        links = [link._replace(names=self._names_for(link.manifest, i == 0)) for i, link in enumerate(links)][::-1]
        contents, parts = {}, {}
        for i, link in enumerate(links):
            for name in link.names:
                entry = link.manifest["files"].get(name)
                path = os.path.join(link.directory, name)
                if entry is None or not os.path.exists(path):
                    return links, {}, {}, self._problem(step, f"{path} is missing", [x.step for x in links[i:]])
                with open(path, "rb") as f:
                    data = f.read()
                if len(data) != entry["bytes"] or _sha256(data) != entry["sha256"]:
                    return links, {}, {}, self._problem(step, f"{path} does not match its sha256 and size in "
                                                          f"manifest.json", [x.step for x in links[i:]])
                contents[link.step, name] = data
                if name == DENSE:
                    continue
                parts[link.step, name] = _listed_parts(data, link, name)
                for part, digest, nbytes in parts[link.step, name]:
                    if not os.path.exists(part):
                        return links, {}, {}, self._problem(step, f"{part} (a part of {path}) is missing",
                                                            [x.step for x in links[i:]])
                    if _file_digest(part) != (digest, nbytes):
                        return links, {}, {}, self._problem(step, f"{part} does not match the sha256 and size {path} "
                                                                  f"lists for it", [x.step for x in links[i:]])
        return links, contents, parts, ""

    def _problem(self, step, what, unusable):
        """The error message of a chain that cannot be read: `what` (naming the file) and the checkpoints that depend
        on it (`unusable`: steps), which are to be removed to resume from an older one."""
        dirs = [step_dir(self.model_dir, s) for s in sorted(set(unusable), reverse=True)]
        return (f"checkpoint {step_dir(self.model_dir, step)}: {what} (read by rank {self.comm.rank}); remove the "
                f"director{'ies' if len(dirs) > 1 else 'y'} {', '.join(dirs)} to resume from an older checkpoint")

    def _agree(self, problem):
        """Every rank learns every rank's problem (one allgather): CheckpointError with the lowest rank's, on all."""
        encoded = np.zeros([1, MAX_MESSAGE], np.int32)
        data = np.frombuffer(problem.encode()[:MAX_MESSAGE], np.uint8)
        encoded[0, :len(data)] = data
        gathered = self.comm.allgather(tf.constant(encoded), name="FusedRec/checkpoint/verified").numpy()
        for row in gathered:
            message = bytes(row[row != 0].astype(np.uint8)).decode(errors="replace")
            if message:
                raise CheckpointError(message)

    def restore(self):
        """Restores the newest checkpoint every rank sees, with its chain (all ranks call it, before any training
        collective, onto empty tables).

        Returns:
          None when there is none, else {"step", "directory", "workers" (who wrote it), "files" (its files this rank
          read), "chain" ([{"step", "kind", "workers", "files"}] from the full checkpoint on: what was applied, in
          order), "bytes_read" (the whole chain's), "stream_positions" (every old rank's save(stream_position=...),
          a list of int lists, or None)}.

        Raises:
          CheckpointError: on every rank, naming the file, when a file to read or a link of the chain is missing or
            corrupt, or the checkpoint's tables are not this model's.
        """
        step = self.agreed_step()
        if step is None:
            return None
        self._build_slots()
        links, contents, parts, problem = self._read_chain(step)
        self._agree(problem)
        for link in links:
            self._check_tables(link)
        newest, rank, size = links[-1], self.comm.rank, self.comm.size
        with np.load(io.BytesIO(contents[newest.step, DENSE]), allow_pickle=False) as z:
            state = self._dense_state(positional=any(k.startswith("dense/slot") for k in z.files))
            if DENSE_LAYOUT not in z.files:
                state = _align_first_layout(state, len(self.dense_vars), z)
            for key, v in state:
                if key not in z.files or tuple(z[key].shape) != tuple(v.shape):
                    raise CheckpointError(f"checkpoint {newest.directory}: {DENSE} has no value of shape {v.shape} "
                                          f"for {key} ({v.name}): a different model or optimizer")
                v.assign(z[key])
            self._restore_replicated(z)
        for link in links:
            for name in link.names:
                if name == DENSE:
                    continue
                with np.load(io.BytesIO(contents[link.step, name]), allow_pickle=False) as z:
                    for t, table in enumerate(self.tables):
                        self._restore_table(t, table, z, rank, size, link.manifest["workers"], link.directory)
                        if link is newest:
                            self._restore_counts(t, table, z, rank, size, link.manifest["workers"], link.directory)
                    clocks = self._status_clocks(z) if link is newest else {}
                for part in parts[link.step, name]:  # the rows of tables written in pieces, one piece at a time
                    with np.load(io.BytesIO(_read_part(*part)), allow_pickle=False) as z:
                        for t, table in enumerate(self.tables):
                            self._restore_table(t, table, z, rank, size, link.manifest["workers"], link.directory)
                            # The rows' access status is in the same part: set from this one read, now that its
                            # keys are held (the newest link's only: every checkpoint holds the whole status).
                            if t in clocks and f"t{t}.status.counts" in z.files:
                                self._apply_status(z, t, clocks[t], link)
        self._restore_access(newest, contents)
        self._remember(step, links[0].step, lambda: [self._state_for_deltas(table) for table in self.tables])
        return {"step": step, "directory": newest.directory, "workers": newest.manifest["workers"],
                "files": newest.names,
                "chain": [{"step": link.step, "kind": link.manifest.get("kind", FULL),
                           "workers": link.manifest["workers"], "files": link.names} for link in links],
                "bytes_read": (sum(len(c) for c in contents.values())
                               + sum(nbytes for listed in parts.values() for _, _, nbytes in listed)),
                "stream_positions": newest.manifest.get("stream_positions")}

    def _check_tables(self, link):
        manifest, directory = link.manifest, link.directory
        if manifest["tables"] != [t.name for t in self.tables]:
            raise CheckpointError(f"checkpoint {directory} holds the tables {manifest['tables']}, this model has "
                                  f"{[t.name for t in self.tables]}: a different model or config")
        if manifest.get("replicated", []) != [t.name for t in self.replicated]:
            raise CheckpointError(f"checkpoint {directory} holds the replicated tables {manifest.get('replicated', [])}"
                                  f", this model has {[t.name for t in self.replicated]}: hot-row replication was "
                                  f"switched on or off since it was written (rows would be lost or held twice)")

    def _restore_counts(self, t, table, z, rank, size, old_size, directory):
        """Inserts the admission counts of table t of one shard that this rank owns (none in the shard: none)."""
        if table.counts is None or f"t{t}.counts.keys" not in z.files:
            return
        keys = z[f"t{t}.counts.keys"]
        mine = _owned(z, f"t{t}.counts", len(keys), table, rank, size, old_size, directory)
        table.counts.upsert(tf.constant(keys[mine], tf.int64), tf.constant(z[f"t{t}.counts.values"][mine], tf.int64))

    def _status_clocks(self, z):
        """{t: clock} of the tracking tables whose access status one shard holds (in it or in its parts)."""
        return {t: z[f"t{t}.status.clock"] for t, tracked in enumerate(self.access)
                if tracked is not None and f"t{t}.status.clock" in z.files}

    def _apply_status(self, z, t, clock, link):
        """Sets table t's access status from one shard or part file of the newest link: each key's (count, last) on
        the rank that now owns its row (held by then: the native table sets the status of held keys only)."""
        rank, size, old_size = self.comm.rank, self.comm.size, link.manifest["workers"]
        # A delta's status names its keys; a full checkpoint's (or part's) is aligned with its rows.
        prefix = f"t{t}.status" if f"t{t}.status.keys" in z.files else f"t{t}"
        keys, counts, lasts = z[f"{prefix}.keys"], z[f"t{t}.status.counts"], z[f"t{t}.status.lasts"]
        # A row never read ((0, 0)) reads as never read without a status entry.
        mine = _owned(z, prefix, len(keys), self.tables[t], rank, size, old_size, link.directory)
        mine &= (counts != 0) | (lasts != 0)
        self.access[t].set_access_status(keys[mine], counts[mine], lasts[mine], clock)

    def _restore_access(self, link, contents):
        """Sets the access status the newest checkpoint's shards hold (after every row is restored: the native table
        sets the status of held keys only; a status in part files was set with its part's rows), and the evicted and
        expired counters of old rank s added up on new rank s mod size (module docstring). A table whose checkpoint
        holds no status keeps an empty one."""
        if not any(tracked is not None for tracked in self.access):
            return
        rank, size, old_size = self.comm.rank, self.comm.size, link.manifest["workers"]
        counters = {}  # t -> int64 [evicted, expired]
        for s in shards_to_read(rank, size, old_size):
            with np.load(io.BytesIO(contents[link.step, shard_name(s, old_size)]), allow_pickle=False) as z:
                for t, clock in self._status_clocks(z).items():
                    if f"t{t}.status.counts" in z.files:  # else in the parts, set with the rows
                        self._apply_status(z, t, clock, link)
                    total = counters.setdefault(t, np.zeros(2, np.int64))
                    if s % size == rank:
                        total += [z[f"t{t}.evicted"], z[f"t{t}.expired"]]
        for t, (evicted, expired) in counters.items():
            self.access[t].evicted.assign(evicted)
            self.access[t].expired.assign(expired)

    def _restore_table(self, t, table, z, rank, size, old_size, directory):
        """Applies table t of one shard or part file: removes its removed keys (a delta's), then upserts the rows
        and slot rows this rank owns (none in the file: nothing; a table written in parts has none in its shard)."""
        removed = z[f"t{t}.removed"] if f"t{t}.removed" in z.files else ()
        if len(removed):  # a key removed on its old owner is absent from every other rank: no filter needed
            table.params.remove(tf.constant(removed, tf.int64))
            for _, slot in self._table_slots(table):
                slot.remove(tf.constant(removed, tf.int64))
        if f"t{t}.keys" not in z.files:  # a delta's shard whose rows went to part files holds the removed keys only
            return
        keys, rows = z[f"t{t}.keys"], z[f"t{t}.rows"]
        mine = _owned(z, f"t{t}", len(keys), table, rank, size, old_size, directory)
        keep_keys = tf.constant(keys[mine], tf.int64)
        table.params.upsert(keep_keys, tf.constant(rows[mine]))
        for slot_name, slot in self._table_slots(table):
            exists = z[f"t{t}.slot.{slot_name}.exists"][mine]
            slot.upsert(tf.boolean_mask(keep_keys, exists),
                        tf.constant(z[f"t{t}.slot.{slot_name}.rows"][mine][exists]))


def access_status_of(tracked, keys):
    """The access status of the sorted keys int64 [K] of a table that counts accesses: (counts int64 [K], lasts int64
    [K], (0, 0) for a key never counted, clock int64)."""
    status_keys, counts, lasts, clock = (np.asarray(x) for x in tracked.access_status())
    out_counts, out_lasts = np.zeros(len(keys), np.int64), np.zeros(len(keys), np.int64)
    if len(status_keys) and len(keys):
        at = np.minimum(np.searchsorted(keys, status_keys), len(keys) - 1)
        found = keys[at] == status_keys  # a status without a row (TFRA: a key moved into the hot set) is not kept
        out_counts[at[found]], out_lasts[at[found]] = counts[found], lasts[found]
    return out_counts, out_lasts, np.int64(clock)


def _access_arrays(t, table, tracked, keys, kind):
    """The arrays of table t's access status in a shard: every row's (count, last), aligned with the rows (keys:
    this rank's sorted keys) in a full checkpoint, with its keys (and ids) in a delta (whose rows are the changed
    ones only), the clock, and this rank's evicted and expired counters."""
    counts, lasts, clock = access_status_of(tracked, keys)
    arrays = {f"t{t}.status.counts": counts, f"t{t}.status.lasts": lasts, f"t{t}.status.clock": clock,
              f"t{t}.evicted": np.int64(tracked.evicted.numpy()), f"t{t}.expired": np.int64(tracked.expired.numpy())}
    if kind == DELTA:
        arrays[f"t{t}.status.keys"] = keys
        ids = table.ids_of_keys(keys)
        if ids is not None:
            arrays[f"t{t}.status.ids"] = ids
    return arrays


def _listed_parts(shard, link, name):
    """[(path, sha256, bytes)] of the part files a shard's bytes list (none: [])."""
    with np.load(io.BytesIO(shard), allow_pickle=False) as z:
        if "parts.bytes" not in z.files:
            return []
        digests, sizes = z["parts.sha256"], z["parts.bytes"]
    rank, size = (int(x) for x in name[len("shard-"):-len(".npz")].split("-of-"))
    return [(os.path.join(link.directory, part_name(rank, size, k)), bytes(digests[k]).hex(), int(sizes[k]))
            for k in range(len(sizes))]


def _read_part(path, digest, nbytes):
    """A part file's bytes, checked again against its shard's listing (it was checked before the ranks agreed to
    restore; a file changed since then is a CheckpointError on this rank)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != nbytes or _sha256(data) != digest:
        raise CheckpointError(f"{path} changed while the checkpoint was being restored: it no longer matches the "
                              f"sha256 and size its shard lists")
    return data


def _access_counters(t, tracked, clock):
    """The main shard's arrays of table t's access status when its rows and their status went to part files: the
    clock, and this rank's evicted and expired counters."""
    return {f"t{t}.status.clock": np.int64(clock), f"t{t}.evicted": np.int64(tracked.evicted.numpy()),
            f"t{t}.expired": np.int64(tracked.expired.numpy())}


def _owned(z, prefix, count, table, rank, size, old_size, directory):
    """bool [count]: which of a shard's `count` entries under `prefix` (a table's rows, its counts or its status) this
    rank owns, from their ids (`{prefix}.ids`) where the shard holds ids of several new ranks."""
    from tf_fusedrec import ops  # noqa: PLC0415

    if size % old_size == 0 and size > old_size or (size % old_size and old_size % size):
        # The shard holds ids of several new ranks: keep ours.
        if f"{prefix}.ids" not in z.files:
            raise CheckpointError(
                f"checkpoint {directory} ({old_size} workers): table {table.name} uses hashed unified keys, "
                f"whose ids cannot be recovered, so it restores onto {old_size} workers or a divisor of it only; "
                f"declare max_id_bits for its features (packed keys) to change the worker count freely")
        return ops.owner_of(tf.constant(z[f"{prefix}.ids"]), size).numpy() == rank
    return np.ones(count, bool)  # every entry of the shards we read is ours
