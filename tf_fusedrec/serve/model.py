"""A model rebuilt from an export: embeddings from a backend, combined as training combines them, then the dense
SavedModel. What fr.export.load_model returns (with every row in this process) and what the ranker runs (with the rows
on embedding servers).

Versions: over a versioned backend (embedding servers a trainer publishes to), the model is at one version at a time,
rows and dense weights together: a batch reads every row from the version its dense weights are at. The export is
version 0; install_version(v, step, weights) puts a published version's dense weights into a second copy of the
SavedModel (once no batch still runs on it) and makes it current between two batches (tf_fusedrec/serve/publish.py)."""

import collections
import os
import threading

import numpy as np

from tf_fusedrec.export import format as fmt
from tf_fusedrec.serve.backend import LocalBackend, Lookup, pool

FlatIds = collections.namedtuple("FlatIds", ["ids", "rows_of", "positions", "num_rows", "lengths"])
FlatIds.__doc__ = """One feature's ids of a batch: ids int64 [n] (valid ids), rows_of int64 [n] (the instance of each),
positions int64 [n] (index of each among all P positions, padding included), num_rows (B), lengths int64 [B]
(positions per instance)."""

RaggedIds = collections.namedtuple("RaggedIds", ["values", "lengths"])
RaggedIds.__doc__ = """One feature's ids of a batch already in arrays (the ranker's parser makes them): values int64
[n], the ids of every instance in order, and lengths int64 [B], how many each instance holds."""


class InputError(ValueError):
    """A request the model cannot take; the message names the feature or input and what is wrong."""


def _check_ints(where, values):
    """InputError naming the feature and the first value of a list that is not an integer (bools are not)."""
    if set(map(type, values)) <= {int}:  # the common case, without a Python-level loop
        return
    for x in values:
        if not isinstance(x, (int, np.integer)) or isinstance(x, bool):
            raise InputError(f"{where}: ids must be integers, got {x!r}")


def flatten_ids(feature, value, allow_padding=True):
    """A feature's ids -> FlatIds, checked.

    Args:
      feature: the manifest's feature dict.
      value: ids [B] or [B, L] (NumPy, TensorFlow, nested lists; padding -1 in a rectangular [B, L]), a
        tf.RaggedTensor [B, None], a RaggedIds, or a list of lists (one list per instance).
      allow_padding: False rejects -1 too (requests over HTTP have no use for padding).
    """
    name, layout = feature["name"], feature["layout"]
    where = f"feature '{name}'"
    one_each = False  # known to hold one id per instance (a 1-D array)
    if isinstance(value, RaggedIds):
        values, lengths = value
    elif hasattr(value, "row_lengths") and hasattr(value, "flat_values"):  # tf.RaggedTensor
        lengths = np.asarray(value.row_lengths(), np.int64)
        values = np.asarray(value.flat_values)
        if values.ndim != 1:
            raise InputError(f"{where}: ragged ids must be [B, None], got {value.shape}")
    elif isinstance(value, (list, tuple)) and value and any(isinstance(v, (list, tuple)) for v in value):
        rows = [v if isinstance(v, (list, tuple)) else [v] for v in value]
        for r in rows:
            _check_ints(where, r)
        lengths = np.array([len(r) for r in rows], np.int64)
        values = np.array([x for r in rows for x in r], np.int64)
    else:
        if isinstance(value, (list, tuple)):
            _check_ints(where, value)
        array = np.asarray(value)
        if array.dtype.kind not in "iu" and not (array.size == 0 and isinstance(value, (list, tuple))):
            raise InputError(f"{where}: ids must be integers ({feature['key_dtype']}), got {array.dtype}")
        if array.ndim == 1:
            lengths = np.ones(len(array), np.int64)
            one_each = True
        elif array.ndim == 2:
            lengths = np.full(array.shape[0], array.shape[1], np.int64)
        else:
            raise InputError(f"{where}: ids must be [B], [B, L] or one list per instance, got shape {array.shape}")
        values = array.reshape(-1)
    if values.dtype.kind == "u" and values.size and values.max() >= 1 << 63:
        raise InputError(f"{where}: id {int(values.max())} does not fit in int64")
    values = values.astype(np.int64)
    lowest = -1 if allow_padding else 0
    if values.size and values.min() < lowest:
        raise InputError(f"{where}: ids must be >= 0{' (-1 marks padding)' if allow_padding else ''}; found "
                         f"{int(values.min())}")
    bits = feature.get("max_id_bits")
    limit = (1 << bits) if bits is not None else (1 << 31 if feature["key_dtype"] == "int32" else None)
    if limit is not None and values.size and values.max() >= limit:
        raise InputError(f"{where}: id {int(values.max())} is too large (ids must be < {limit}"
                         f"{f', max_id_bits={bits}' if bits is not None else ', key_dtype int32'})")
    if layout == "one" and not one_each and np.any(lengths != 1):
        raise InputError(f"{where}: takes one id per instance (exported with layout 'one'), got an instance with "
                         f"{int(lengths[lengths != 1][0])}")
    if not allow_padding:  # every id was checked >= 0 above: every position holds one
        positions = np.arange(len(values), dtype=np.int64)
        rows_of = positions if one_each else np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        return FlatIds(values, rows_of, positions, len(lengths), lengths)
    rows_of = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    positions = np.flatnonzero(values >= 0)
    return FlatIds(values[positions], rows_of[positions], positions, len(lengths), lengths)


def combine(combiner, sums, counts):
    """A combiner applied to per-instance sums [B, dim] and id counts [B], as training applies it (float32)."""
    if combiner == "sum":
        return sums
    counts = np.maximum(counts, 1).astype(np.float32)[:, None]
    if combiner == "mean":
        return sums / counts
    return sums / np.sqrt(counts)


class ServingModel:
    """An export's model over a backend of rows.

    Args:
      export_dir: the export.
      backend: a serve.backend.Backend; None reads every row into this process (LocalBackend).
      pooling: multi-hot features with a combiner are pooled by the backend (on the embedding servers, FlexEMR's
        hierarchical pooling) rather than fetched row by row.
      packed: call the export's packed signature (one float32 input for every [B, d] input; exports that predate it
        have none and are called input by input, as packed=False does). The scores are the same either way.
    """

    def __init__(self, export_dir, backend=None, pooling=True, packed=True):
        from tf_fusedrec import _frameworks  # noqa: PLC0415

        tf = _frameworks.import_tensorflow()  # quietly: no CUDA plugin ERROR lines in the ranker's log

        self.export_dir = export_dir
        self.manifest = fmt.read_manifest(export_dir)
        for entry in self.manifest["dense"]["files"]:
            fmt.check_file(export_dir, entry)
        self.backend = backend if backend is not None else LocalBackend(export_dir, self.manifest)
        self.pooling = pooling
        self.features = {f["name"]: f for f in self.manifest["features"]}
        self.groups = {g["name"]: g for g in self.manifest["groups"]}
        self.dense_inputs = self.manifest["dense"]["inputs"]
        self._tf = tf
        self._dense_path = os.path.join(export_dir, self.manifest["dense"]["path"])
        self._loaded = [tf.saved_model.load(self._dense_path)]  # the second copy is loaded by the first publish
        # The packed signature where the export has one (exports before it: the per-input one), unless packed=False.
        self._packed = self.manifest["dense"].get("packed") if packed else None
        self._signature_key = self._packed["signature"] if self._packed else self.manifest["dense"]["signature"]
        signature = self._loaded[0].signatures[self._signature_key]
        self._signatures = [signature]
        # The signature's inputs (name, dtype) in the order its flat call takes them.
        self._flat_inputs = [(name, spec.dtype) for name, spec in
                             ((p.name, p.type_constraint) for p in signature.function_type.parameters.values())]
        self._lock = threading.Lock()
        source_step = self.manifest.get("source", {}).get("step")
        self.version, self.step = 0, source_step if isinstance(source_step, int) else -1
        self._current = 0  # the copy of the dense SavedModel at self.version
        self._in_use = [0, 0]  # batches running on each copy
        self._swap = threading.Condition()
        self._install_lock = threading.Lock()

    @property
    def versioned(self):
        """Whether the rows come in versions (a publisher may install new ones)."""
        return bool(getattr(self.backend, "versioned", False))

    def dense_variables(self):
        """[(name, shape, dtype name)] of the dense weights a published version carries, in order."""
        return [(v.name, v.shape.as_list(), v.dtype.name) for v in self._loaded[0].dense_variables]

    def install_version(self, version, step, weights):
        """Makes `version` (committed on every embedding server) current with the dense `weights` (arrays in the
        order of dense_variables()): put into the copy of the SavedModel no batch uses, which then becomes current
        between two batches. ValueError naming the weight when one does not fit; nothing changes then."""
        if not self.versioned:
            raise ValueError("this model's rows are not versioned (every row in this process, or a backend without "
                             "versions): only a model over embedding servers takes published versions")
        expected = self.dense_variables()
        if len(weights) != len(expected):
            raise ValueError(f"version {version}: {len(weights)} dense weights, the model has {len(expected)}")
        arrays = []
        for i, ((name, shape, dtype), value) in enumerate(zip(expected, weights)):
            value = np.asarray(value)
            if list(value.shape) != shape or value.dtype.name != dtype:
                raise ValueError(f"version {version}: dense weight {i} ({name}) is {value.dtype.name} "
                                 f"{list(value.shape)}, the model's is {dtype} {shape}")
            if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
                raise ValueError(f"version {version}: dense weight {i} ({name}) holds values that are not finite")
            arrays.append(value)
        with self._install_lock:  # one install at a time
            if version <= self.version:
                raise ValueError(f"version {version} is not above the current version {self.version}")
            if len(self._loaded) == 1:
                self._loaded.append(self._tf.saved_model.load(self._dense_path))
                self._signatures.append(self._loaded[1].signatures[self._signature_key])
            with self._swap:
                standby = 1 - self._current
                # A batch that began before the last swap may still run on the standby copy.
                self._swap.wait_for(lambda: self._in_use[standby] == 0)
            for variable, value in zip(self._loaded[standby].dense_variables, arrays):
                variable.assign(value)
            with self._swap:
                self._current, self.version, self.step = standby, int(version), int(step)

    def check_names(self, inputs):
        """InputError naming a missing or unknown input."""
        if not isinstance(inputs, dict):
            raise InputError(f"inputs must be a dict of input name -> values, got {type(inputs).__name__}")
        expected = set(self.features) | set(self.dense_inputs)
        missing = sorted(expected - set(inputs))
        unknown = sorted(set(inputs) - expected)
        if unknown:
            raise InputError(f"unknown feature '{unknown[0]}' (the model takes {sorted(expected)})")
        if missing:
            raise InputError(f"feature '{missing[0]}' is missing (the model takes {sorted(expected)})")

    def _dense_value(self, name, value, batch):
        spec = self.dense_inputs[name]
        expected = [batch] + spec["shape"][1:]
        try:
            array = np.asarray(value, dtype=spec["dtype"])
        except (TypeError, ValueError):
            raise InputError(f"input '{name}': values must be {spec['dtype']} of shape {expected} (got values that "
                             f"are not numbers, or instances of different lengths)") from None
        if list(array.shape) != expected:
            raise InputError(f"input '{name}': shape {list(array.shape)}, expected {expected}")
        if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
            raise InputError(f"input '{name}': values must be finite")
        return array

    def flatten(self, inputs, allow_padding=True):
        """{feature: FlatIds} and the batch size; InputError naming the feature when instances disagree."""
        self.check_names(inputs)
        flats = {name: flatten_ids(f, inputs[name], allow_padding) for name, f in self.features.items()}
        sizes = {name: flat.num_rows for name, flat in flats.items()}
        batch = next(iter(sizes.values())) if sizes else None
        for name, size in sizes.items():
            if size != batch:
                raise InputError(f"feature '{name}' has {size} instances, feature '{next(iter(sizes))}' has {batch}")
        return flats, batch

    def embed(self, flats, batch, version=None):
        """{signature input: float32/int64 array} of every feature's embeddings: each group's rows and (pooling) its
        pooled bags, all asked of the backend in one lookup_many call (a remote backend: one round trip), the rows of
        `version` (None: the backend's newest)."""
        at = {} if version is None else {"version": version}
        lookups, assemble = [], []
        for group_name in self.groups:
            # Every feature reading the group's rows, a feature that shares another's rows (manifest "shares") too.
            members = [f for _, f in sorted(self.features.items()) if f["group"] == group_name]
            pooled = [f for f in members if f["layout"] == "bag" and self.pooling]
            direct = [f for f in members if f not in pooled]
            if direct:
                lookups.append(Lookup(group_name, *self._ids_and_categories(flats, direct)))
                assemble.append(("rows", direct))
            if pooled:
                segments = np.concatenate([flats[f["name"]].rows_of + i * batch for i, f in enumerate(pooled)])
                lookups.append(Lookup(group_name, *self._ids_and_categories(flats, pooled), segments,
                                      batch * len(pooled)))
                assemble.append(("pooled", pooled))
        inputs = {}
        for (kind, features), answer in zip(assemble, self.backend.lookup_many(lookups, **at)):
            if kind == "rows":
                offset = 0
                for f in features:
                    flat = flats[f["name"]]
                    inputs.update(self._place(f, flat, answer[offset:offset + len(flat.ids)], batch))
                    offset += len(flat.ids)
            else:
                sums, counts = answer
                for i, f in enumerate(features):
                    part = slice(i * batch, (i + 1) * batch)
                    inputs[f["inputs"]["rows"]] = combine(f["combiner"], sums[part], counts[part])
        return inputs

    @staticmethod
    def _ids_and_categories(flats, features):
        """The features' ids one after another, and the category of each (its feature's)."""
        ids = np.concatenate([flats[f["name"]].ids for f in features])
        categories = np.concatenate([np.full(len(flats[f["name"]].ids), f["category"], np.int32) for f in features])
        return ids, categories

    @staticmethod
    def _place(feature, flat, rows, batch):
        dim = feature["dim"]
        if feature["layout"] == "sequence":
            values = np.zeros((int(flat.lengths.sum()), dim), np.float32)
            values[flat.positions] = rows
            return {feature["inputs"]["values"]: values, feature["inputs"]["row_lengths"]: flat.lengths}
        if feature["layout"] == "one":
            out = np.zeros((batch, dim), np.float32)
            out[flat.rows_of] = rows
            return {feature["inputs"]["rows"]: out}
        sums, counts = pool(rows, flat.rows_of, batch)  # a bag with pooling off: combined here
        return {feature["inputs"]["rows"]: combine(feature["combiner"], sums, counts)}

    def predict(self, inputs, allow_padding=True):
        """Scores float32 [B] of a batch dict (feature -> ids as in training; dense inputs by name)."""
        flats, batch = self.flatten(inputs, allow_padding)
        dense = {name: self._dense_value(name, inputs[name], batch) for name in self.dense_inputs}
        return self.predict_flat(flats, dense, batch)

    def predict_flat(self, flats, dense, batch):
        return self.predict_versioned(flats, dense, batch)[0]

    def predict_versioned(self, flats, dense, batch):
        """(scores float32 [B], the version they are of): rows and dense weights of one version."""
        tf = self._tf
        with self._swap:
            copy, version = self._current, self.version
            self._in_use[copy] += 1
        try:
            values = {**self.embed(flats, batch, version if self.versioned else None), **dense}
            if self._packed:
                values[self._packed["input"]] = self._pack(values, batch)
            # The flat call of the signature (TensorFlow is pinned, see requirements.txt): the keyword call binds and
            # type-checks each of its ~30 inputs in Python, about 0.6 ms of its 1.8 ms for 64 instances (measured),
            # for inputs that embed() and _dense_value() build in the signature's dtypes and shapes.
            flat = [tf.constant(values[name], dtype) for name, dtype in self._flat_inputs]
            signature = self._signatures[copy]
            with self._lock:  # one signature call at a time: the ranker batches requests instead
                out = signature._call_flat(flat, signature.captured_inputs)  # noqa: SLF001
        finally:
            with self._swap:
                self._in_use[copy] -= 1
                self._swap.notify_all()
        return out[self.manifest["dense"]["output"]].numpy(), version

    __call__ = predict

    def _pack(self, values, batch):
        """The packed signature's input: its members' [B, d] arrays side by side, in the manifest's order."""
        members = self._packed["members"]
        packed = np.empty((batch, sum(width for _, width in members)), np.float32)
        column = 0
        for name, width in members:
            packed[:, column:column + width] = values[name]
            column += width
        return packed

    def stats(self):
        return self.backend.stats()

    def close(self):
        self.backend.close()


def load_model(export_dir, backend=None, pooling=True, packed=True):
    """A single-process model rebuilt from an export (every row in this process unless a backend is given): its
    predict(batch) equals the training model's call with training=False on the same batch."""
    return ServingModel(export_dir, backend=backend, pooling=pooling, packed=packed)
