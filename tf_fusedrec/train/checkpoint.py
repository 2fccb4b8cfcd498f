"""Checkpoints that survive crashes and restore onto any worker count (MTGRBoost §5.2).

Layout of a model directory::

    DIR/ckpt-{step}/manifest.json        written last; its presence is what makes the checkpoint exist
    DIR/ckpt-{step}/shard-{r}-of-{N}.npz  rank r's rows: every table's (keys, ids, rows) it owns + optimizer slot rows
    DIR/ckpt-{step}/dense.npz             dense weights, optimizer iterations and dense slots, replicated hot rows
                                          with their slots and hot sets (equal on every rank;
                                          rank 0 writes them)

Saving: each rank writes its shard into DIR/.tmp-ckpt-{step}/ (file, fsync, rename), the ranks allgather the shards'
sha256 and sizes, and rank 0 writes the manifest there and renames the directory to ckpt-{step}: a checkpoint is
either complete or absent, whatever dies when. A kill between two ranks' saves leaves only a .tmp directory, which
the next run removes.

Restoring (`restore`): the ranks allgather the steps they see published and take the newest one all of them see; each
rank then checks the sha256 of every file it is going to read, and the ranks agree (allgather) before reading
anything, so a corrupt or missing file stops every rank with the same error naming it. A checkpoint written by N
workers restores onto M: table and slot rows are kept where owner_of(id, M) == rank; new rank r reads only the
shards that can hold its ids (old shard r mod N when N divides M, old shards s with s mod M == r when M divides N,
every shard otherwise). Files are .npz without pickles.
"""

import hashlib
import io
import json
import os
import shutil

import numpy as np
import tensorflow as tf
from tensorflow_recommenders_addons import dynamic_embedding as de

from tf_fusedrec.train.optimizer import embedding_layers

FORMAT = 1
MANIFEST = "manifest.json"
DENSE = "dense.npz"
MAX_VISIBLE = 64  # published steps a rank reports in the agreement (the newest ones)


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


def _npz_bytes(arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


class Checkpointer:
    """Saves and restores a model, its GroupedOptimizer and a step counter in `model_dir`.

    Args:
      model_dir: the directory (shared by the workers).
      model: a Keras model holding FusedEmbedding / PerFeatureEmbedding layers.
      optimizer: what fr.train.make_optimizer returned for it.
      step: an int64 tf.Variable (the training step; also the data position, batches being a function of it).
      comm: the comm object of the run.
      keep: published checkpoints kept (older ones are removed by rank 0 after each save).
      config_name: recorded in the manifest.
    """

    def __init__(self, model_dir, model, optimizer, step, comm, keep=2, config_name=""):
        self.model_dir, self.model, self.optimizer, self.step = model_dir, model, optimizer, step
        self.comm, self.keep, self.config_name = comm, keep, config_name
        layers = embedding_layers(model)
        self.tables = [t for layer in layers for t in layer.sharded_tables()]
        # Replicated hot rows (FusedEmbedding(replication=...)): equal on every rank, saved once in dense.npz.
        self.replicated = [t for layer in layers if hasattr(layer, "replicated_tables")
                           for t in layer.replicated_tables()]
        sparse_ids = {id(v) for layer in layers for _, variables in layer.optimizer_groups() for v in variables}
        # Not dense: TFRA's trainable wrappers, and the per-step ids/exists buffers of its shadow variables (TFRA's
        # Keras layers track them as layer variables; their shape changes every step).
        self.dense_vars = [v for v in model.variables if id(v) not in sparse_ids
                           and not isinstance(v, (de.TrainableWrapper, de.shadow_ops.DEResourceVariable))]
        self._trainable_dense = [v for v in model.trainable_variables if id(v) not in sparse_ids]
        self._slots_built = False

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

    def _dense_state(self):
        """[(key, variable)] of everything equal on every rank, in a deterministic order."""
        state = [(f"var{i}", v) for i, v in enumerate(self.dense_vars)]
        opts = [("dense", self.optimizer.dense)] + [(f"sparse{i}", o) for i, o in enumerate(self.optimizer.sparse)]
        state.append(("grouped/iterations", self.optimizer.iterations))
        for label, opt in opts:
            state.append((f"{label}/iterations", opt.iterations))
        for i, v in enumerate(self._trainable_dense):
            for name in sorted(self.optimizer.dense.get_slot_names()):
                state.append((f"dense/var{i}/{name}", self.optimizer.dense.get_slot(v, name)))
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

    # --- saving -------------------------------------------------------------------------------------------------

    def save(self):
        """Writes and publishes the checkpoint of the current step (every rank calls it); -> its directory."""
        self._build_slots()
        rank, size = self.comm.rank, self.comm.size
        step = int(self.step.numpy())
        staging = os.path.join(self.model_dir, f".tmp-ckpt-{step}")
        os.makedirs(staging, exist_ok=True)
        arrays = {}
        for t, table in enumerate(self.tables):
            keys, rows = (x.numpy() for x in table.params.export())
            arrays[f"t{t}.keys"], arrays[f"t{t}.rows"] = keys, rows
            ids = table.ids_of_keys(keys)
            if ids is not None:
                arrays[f"t{t}.ids"] = ids
            for name, slot in self._table_slots(table):
                values, exists = slot.lookup(tf.constant(keys, tf.int64), return_exists=True)
                arrays[f"t{t}.slot.{name}.rows"] = values.numpy()
                arrays[f"t{t}.slot.{name}.exists"] = exists.numpy()
        shard = _npz_bytes(arrays)
        _write_atomic(os.path.join(staging, shard_name(rank, size)), shard)
        files = {shard_name(rank, size): (_sha256(shard), len(shard))}
        if rank == 0:
            dense = _npz_bytes({**{key: v.numpy() for key, v in self._dense_state()}, **self._replicated_state()})
            _write_atomic(os.path.join(staging, DENSE), dense)
            files[DENSE] = (_sha256(dense), len(dense))
        # Every rank's shard digest reaches rank 0; the collective is also the barrier before publishing.
        digest = np.frombuffer(bytes.fromhex(files[shard_name(rank, size)][0]), np.uint8).astype(np.int64)
        row = np.concatenate([digest, [len(shard)]])[None, :]
        gathered = self.comm.allgather(tf.constant(row), name=f"FusedRec/checkpoint/save/{step}").numpy()
        final = step_dir(self.model_dir, step)
        if rank == 0:
            for r in range(size):
                files[shard_name(r, size)] = (bytes(gathered[r, :32].astype(np.uint8)).hex(), int(gathered[r, 32]))
            manifest = {
                "format": FORMAT, "step": step, "workers": size, "config": self.config_name,
                "tables": [t.name for t in self.tables], "replicated": [t.name for t in self.replicated],
                "files": {name: {"sha256": digest, "bytes": nbytes} for name, (digest, nbytes) in sorted(files.items())},
            }
            _write_atomic(os.path.join(staging, MANIFEST), json.dumps(manifest, indent=1).encode())
            if os.path.exists(final):
                shutil.rmtree(final)
            os.rename(staging, final)  # the publication: atomic
            for old in published_steps(self.model_dir)[:-self.keep]:
                shutil.rmtree(step_dir(self.model_dir, old), ignore_errors=True)
        # Nobody starts the next step's collectives believing a checkpoint exists that rank 0 has not published.
        self.comm.allreduce([tf.zeros([1])], name=f"FusedRec/checkpoint/published/{step}", op="sum")
        return final

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

    def _read_checked(self, directory, manifest, names):
        """{name: bytes} of the files, each checked against the manifest; the ranks agree before anyone reads on:
        CheckpointError naming the first bad file of the lowest rank that has one, on every rank."""
        contents, problem = {}, (-1, 0)
        for index, name in enumerate(names):
            entry = manifest["files"].get(name)
            path = os.path.join(directory, name)
            if entry is None or not os.path.exists(path):
                problem = (index, 1)
                break
            with open(path, "rb") as f:
                data = f.read()
            if len(data) != entry["bytes"] or _sha256(data) != entry["sha256"]:
                problem = (index, 2)
                break
            contents[name] = data
        code = np.array([problem], np.int64)
        gathered = self.comm.allgather(tf.constant(code), name="FusedRec/checkpoint/verified").numpy()
        for r, (index, kind) in enumerate(gathered.tolist()):
            if kind:
                bad = self._names_for(r, manifest)[index]
                what = "is missing" if kind == 1 else "does not match its sha256 and size in manifest.json"
                raise CheckpointError(f"checkpoint {directory}: {os.path.join(directory, bad)} {what} (read by rank "
                                      f"{r}); remove the directory {directory} to resume from an older checkpoint")
        return contents

    def _names_for(self, rank, manifest):
        return [DENSE] + [shard_name(s, manifest["workers"])
                          for s in shards_to_read(rank, self.comm.size, manifest["workers"])]

    def restore(self):
        """Restores the newest checkpoint every rank sees (all ranks call it, before any training collective).

        Returns:
          None when there is none, else {"step", "directory", "workers" (who wrote it), "files", "bytes_read"}.

        Raises:
          CheckpointError: on every rank, naming the file, when a file to read is missing or corrupt, or the
            checkpoint's tables are not this model's.
        """
        step = self.agreed_step()
        if step is None:
            return None
        self._build_slots()
        directory = step_dir(self.model_dir, step)
        with open(os.path.join(directory, MANIFEST)) as f:
            manifest = json.load(f)
        names = self._names_for(self.comm.rank, manifest)
        contents = self._read_checked(directory, manifest, names)
        if manifest["tables"] != [t.name for t in self.tables]:
            raise CheckpointError(f"checkpoint {directory} holds the tables {manifest['tables']}, this model has "
                                  f"{[t.name for t in self.tables]}: a different model or config")
        if manifest.get("replicated", []) != [t.name for t in self.replicated]:
            raise CheckpointError(f"checkpoint {directory} holds the replicated tables {manifest.get('replicated', [])}"
                                  f", this model has {[t.name for t in self.replicated]}: hot-row replication was "
                                  f"switched on or off since it was written (rows would be lost or held twice)")
        old_size, rank, size = manifest["workers"], self.comm.rank, self.comm.size
        with np.load(io.BytesIO(contents[DENSE]), allow_pickle=False) as z:
            for key, v in self._dense_state():
                if key not in z.files or tuple(z[key].shape) != tuple(v.shape):
                    raise CheckpointError(f"checkpoint {directory}: {DENSE} has no value of shape {v.shape} for "
                                          f"{key} ({v.name}): a different model or optimizer")
                v.assign(z[key])
            self._restore_replicated(z)
        for name in names[1:]:
            with np.load(io.BytesIO(contents[name]), allow_pickle=False) as z:
                for t, table in enumerate(self.tables):
                    self._restore_table(t, table, z, rank, size, old_size, directory, name)
        return {"step": step, "directory": directory, "workers": old_size, "files": names,
                "bytes_read": sum(len(c) for c in contents.values())}

    def _restore_table(self, t, table, z, rank, size, old_size, directory, shard):
        from tf_fusedrec import ops  # noqa: PLC0415

        keys, rows = z[f"t{t}.keys"], z[f"t{t}.rows"]
        if size % old_size == 0 and size > old_size or (size % old_size and old_size % size):
            # The shard holds ids of several new ranks: keep ours.
            if f"t{t}.ids" not in z.files:
                raise CheckpointError(
                    f"checkpoint {directory} ({old_size} workers): table {table.name} uses hashed unified keys, "
                    f"whose ids cannot be recovered, so it restores onto {old_size} workers or a divisor of it only; "
                    f"declare max_id_bits for its features (packed keys) to change the worker count freely")
            mine = ops.owner_of(tf.constant(z[f"t{t}.ids"]), size).numpy() == rank
        else:
            mine = np.ones(len(keys), bool)  # every row of the shards we read is ours
        keep_keys = tf.constant(keys[mine], tf.int64)
        table.params.upsert(keep_keys, tf.constant(rows[mine]))
        for slot_name, slot in self._table_slots(table):
            exists = z[f"t{t}.slot.{slot_name}.exists"][mine]
            slot.upsert(tf.boolean_mask(keep_keys, exists),
                        tf.constant(z[f"t{t}.slot.{slot_name}.rows"][mine][exists]))
