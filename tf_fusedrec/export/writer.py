"""Writing an export (format: tf_fusedrec/export/format.py) from a model held in one process.

`tf.saved_model.save(model)` cannot save a model holding TFRA tables (their shadow variables capture per-step
tensors), and serving wants the tables apart from the dense part anyway: the dense part is saved as a SavedModel whose
signature takes the embeddings (the model runs on them through the layer's `injected` seam, so the tables are never
traced), and the tables are written as sorted (key, row) parts split by routing range.
"""

import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from tf_fusedrec import initializers
from tf_fusedrec.export import format as fmt
from tf_fusedrec.layers.fused_embedding import FusedEmbedding
from tf_fusedrec.layers.per_feature_embedding import PerFeatureEmbedding
from tf_fusedrec.models import _blocks
from tf_fusedrec.train.optimizer import embedding_layers

LAYOUTS = ("one", "bag", "sequence")
SIGNATURE = "serving_default"
# A second signature of the same function: every float32 [B, d] input (the one-id and bag features' rows, float dense
# inputs of rank 2) side by side in one float32 [B, sum d] input "packed", the others as in SIGNATURE. One tensor to
# build and bind instead of ~30 (the ranker's dense call: benchmarks/serving/serve_packed_call.py, benchmarks/results/serve/packed_call.json).
PACKED_SIGNATURE = "serving_packed"
PACKED_INPUT = "packed"


def _layouts(layer, example):
    """{feature: layout}: "one" (one id per instance -> [B, dim]), "bag" (several ids, a combiner -> [B, dim]) or
    "sequence" (several ids, no combiner -> a ragged [B, None, dim] reaching the dense part)."""
    layouts = {}
    for f in layer.features:
        if f.combiner is not None:
            layouts[f.name] = "bag"
            continue
        if example is None:
            layouts[f.name] = "one"
            continue
        value = example[f.name]
        ragged = isinstance(value, tf.RaggedTensor)
        layouts[f.name] = "one" if not ragged and len(np.shape(value)) == 1 else "sequence"
    return layouts


def _dense_specs(model, layer, example):
    """{input name: TensorSpec} of the model's inputs that are not sparse features."""
    names = {f.name for f in layer.features}
    if example is not None:
        specs = {}
        for key, value in example.items():
            if key in names:
                continue
            value = tf.convert_to_tensor(value)
            specs[key] = tf.TensorSpec([None] + value.shape[1:].as_list(), value.dtype, name=key)
        return specs
    num_dense = getattr(model, "num_dense", None)
    if num_dense is None:
        raise ValueError(f"export_model: cannot tell the dense inputs of {type(model).__name__}; pass example=, a batch "
                         f"dict as the model takes it")
    return {"dense": tf.TensorSpec([None, num_dense], tf.float32, name="dense")} if num_dense else {}


def _group_tables(layer):
    """[(group dict without rows/parts, keys int64 [K], rows float32 [K, dim])] of the layer's tables in this
    process; replicated hot rows take the place of the sharded table's copy of their keys."""
    out = []
    for group, keys, rows, hot_keys, hot_rows in group_parts(layer):
        if len(hot_keys):
            cold = ~np.isin(keys, hot_keys)
            keys, rows = np.concatenate([keys[cold], hot_keys]), np.concatenate([rows[cold], hot_rows])
        out.append((group, keys, rows))
    return out


def group_parts(layer):
    """[(group dict without rows/parts, keys int64 [K], rows float32 [K, dim], hot keys int64 [H], hot rows float32
    [H, dim])] of the layer's tables in this process: the sharded table's rows (this worker's shard) and the
    replicated hot rows (every worker's, equal; none without hot replication), whose keys win over the sharded copy."""
    out = []
    if isinstance(layer, FusedEmbedding):
        if layer.fusion != "deferred":
            raise ValueError(f"{layer.name}: export needs fusion='deferred' (fusion={layer.fusion!r} hashes the "
                             f"category in on the sender, so the initial rows of ids never trained cannot be formed "
                             f"from (feature, id))")
        hot = layer.hot_tables or [None] * len(layer.tables)
        for group, table, hot_table in zip(layer.groups, layer.tables, hot):
            keys, rows = (x.numpy() for x in table.export())
            hot_keys, hot_rows = hot_rows_of(hot_table, group.spec.dim)
            initializer = layer._initializers[group.feature_names[0]]  # noqa: SLF001  (resolved per group)
            out.append((_group_dict(group.name, group.spec.dim, group.encoding, group.categories, initializer),
                        keys, rows, hot_keys, hot_rows))
        return out
    if isinstance(layer, PerFeatureEmbedding):
        for group, table in zip(layer.groups, layer.sharded_tables()):
            (name,) = group.categories
            feature = next(f for f in layer.features if f.name == name)
            initializer = feature.initializer if feature.initializer is not None else layer.default_initializer
            keys, rows = (x.numpy() for x in table.params.export())
            out.append((_group_dict(f"feature_{name}", feature.dim, "identity", (name,), initializer), keys, rows,
                        np.zeros(0, np.int64), np.zeros((0, feature.dim), np.float32)))
        return out
    raise ValueError(f"export_model: unsupported embedding layer {type(layer).__name__}")


def hot_rows_of(hot_table, dim):
    """(keys int64 [H], rows float32 [H, dim]) of a group's replicated hot rows (every worker's, equal); none without
    hot replication (hot_table None)."""
    if hot_table is None:
        return np.zeros(0, np.int64), np.zeros((0, dim), np.float32)
    keys, rows = hot_table.export()
    return keys.numpy(), rows.numpy()


def dense_variables(model, layer):
    """The model's variables outside the embedding layer, in the order the export's SavedModel holds them
    (its `dense_variables`): what a published version's dense weights are."""
    embedding_ids = {id(v) for v in layer.variables}
    return [v for v in model.variables if id(v) not in embedding_ids]


def _group_dict(name, dim, encoding, categories, initializer):
    """"features": the group's categories (the features that own rows), each with its salt; a feature that shares
    another's rows is not one of them (the manifest's feature entry names the group and category it reads)."""
    seed = initializer.seed if initializers.is_hashed(initializer) else 0
    return {"name": name, "dim": int(dim), "encoding": encoding, "features": list(categories),
            "salts": [initializers.feature_salt(seed, n) for n in categories],
            "initializer": initializers.serialize(initializer)}


def _input_names(layer, layouts):
    """{feature: {"rows": signature input} or {"values": ..., "row_lengths": ...}}: names the signature accepts
    whatever the feature is called."""
    names = {}
    for i, f in enumerate(sorted(layer.features, key=lambda f: f.name)):
        if layouts[f.name] == "sequence":
            names[f.name] = {"values": f"emb_{i}_values", "row_lengths": f"emb_{i}_row_lengths"}
        else:
            names[f.name] = {"rows": f"emb_{i}"}
    return names


class _DenseModule(tf.Module):
    """What the SavedModel holds: the model's dense variables (tracked) and the serving function."""

    def __init__(self, variables):
        super().__init__(name="fused_rec_dense")
        self.dense_variables = list(variables)


def _save_dense(model, layer, dense_specs, layouts, input_names, path):
    variables = dense_variables(model, layer)
    features = sorted(layer.features, key=lambda f: f.name)
    specs = dict(dense_specs)
    for f in features:
        if layouts[f.name] == "sequence":
            names = input_names[f.name]
            specs[names["values"]] = tf.TensorSpec([None, f.dim], tf.float32, name=names["values"])
            specs[names["row_lengths"]] = tf.TensorSpec([None], tf.int64, name=names["row_lengths"])
        else:
            name = input_names[f.name]["rows"]
            specs[name] = tf.TensorSpec([None, f.dim], tf.float32, name=name)

    def serve(inputs):
        batch = None
        outputs = {}
        for f in features:
            names = input_names[f.name]
            if layouts[f.name] == "sequence":
                outputs[f.name] = tf.RaggedTensor.from_row_lengths(inputs[names["values"]], inputs[names["row_lengths"]])
                size = tf.shape(inputs[names["row_lengths"]])[0]
            else:
                outputs[f.name] = inputs[names["rows"]]
                size = tf.shape(inputs[names["rows"]])[0]
            batch = size if batch is None else batch
        model_inputs = {k: inputs[k] for k in dense_specs}
        for f in features:  # the layer checks the names only: its rows are injected
            model_inputs[f.name] = tf.zeros([batch], f.key_dtype)
        # TensorFlow's own ops only: the SavedModel loads without the op library (TF Serving, the ranker).
        with layer.injected(outputs), _blocks.standard_ops():
            scores = model(model_inputs, training=False)
        return {"scores": tf.reshape(scores, [-1])}

    # A sequence's values are float32 [tokens, d]: not [B, d], so not packed.
    sequence_values = {input_names[f.name]["values"] for f in features if layouts[f.name] == "sequence"}
    members = _packed_members({name: spec for name, spec in specs.items() if name not in sequence_values})
    rest = {name: spec for name, spec in specs.items() if name not in dict(members)}
    packed_name = PACKED_INPUT
    while packed_name in specs:  # a dense input of that name (not a float32 [B, d] one) keeps its name
        packed_name += "_"
    packed_spec = tf.TensorSpec([None, sum(width for _, width in members)], tf.float32, name=packed_name)

    def serve_packed(packed, others):
        parts = tf.split(packed, [width for _, width in members], axis=1) if members else []
        return serve({**others, **{name: part for (name, _), part in zip(members, parts)}})

    module = _DenseModule(variables)
    # No AutoGraph: serve() and the model hold no tensor-dependent Python control flow (layers/protocol.py).
    module.serve = tf.function(serve, input_signature=[specs], autograph=False)
    module.serve_packed = tf.function(serve_packed, input_signature=[packed_spec, rest], autograph=False)
    tf.saved_model.save(module, path, signatures={SIGNATURE: module.serve.get_concrete_function(),
                                                  PACKED_SIGNATURE: module.serve_packed.get_concrete_function()})
    return {"signature": PACKED_SIGNATURE, "input": packed_name, "members": [[name, width] for name, width in members]}


def _packed_members(specs):
    """[(input name, width)] of the float32 rank-2 inputs of known width in `specs` (inputs whose first dimension is
    the batch), in their order: the packed input's columns."""
    return [(name, int(spec.shape[1])) for name, spec in specs.items()
            if spec.dtype == tf.float32 and spec.shape.rank == 2 and spec.shape[1] is not None]


def export_model(model, out, example=None, parts=4, overwrite=False, source=None):
    """Writes an export of `model` (built, trained, in this process) to directory `out`.

    Args:
      model: a Keras model holding one FusedEmbedding or PerFeatureEmbedding over a single-process comm (restore a
        checkpoint of any worker count into one process first: `python -m tf_fusedrec.export` does).
      out: the export directory; must not exist unless overwrite.
      example: a batch dict as the model takes it: tells the dense inputs and whether a feature without combiner
        takes one id per instance or a sequence. None: "dense" [B, model.num_dense] and one id per instance.
      parts: files per group (ranges of the routing hash space of equal width).
      overwrite: replace an existing `out`.
      source: a dict recorded in the manifest (checkpoint, step, workers...).

    Returns:
      The manifest dict.
    """
    layers = embedding_layers(model)
    if len(layers) != 1:
        raise ValueError(f"export_model: the model must hold exactly one embedding layer, found {len(layers)}")
    (layer,) = layers
    if layer.comm.size != 1:
        raise ValueError(f"{layer.name}: export_model runs in one process (this layer spans {layer.comm.size} workers); "
                         f"use `python -m tf_fusedrec.export --model-dir ...`, which restores a checkpoint of any worker "
                         f"count into one process")
    if not isinstance(parts, int) or parts < 1:
        raise ValueError(f"export_model: parts must be a positive int, got {parts!r}")
    if os.path.exists(out):
        if not overwrite:
            raise ValueError(f"export_model: {out} exists (pass overwrite=True to replace it)")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        layouts = _layouts(layer, example)
        dense_specs = _dense_specs(model, layer, example)
        input_names = _input_names(layer, layouts)
        packed = _save_dense(model, layer, dense_specs, layouts, input_names, os.path.join(staging, "dense"))
        groups = [fmt.write_group(staging, g, keys, rows, parts) for g, keys, rows in _group_tables(layer)]
        # A feature that shares another's rows reads that feature's group and category.
        category = {n: (g["name"], c) for g in groups for c, n in enumerate(g["features"])}
        features = [{"name": f.name, "dim": f.dim, "combiner": f.combiner, "key_dtype": f.key_dtype.name,
                     "max_id_bits": f.max_id_bits, "layout": layouts[f.name],
                     "group": category[f.shares or f.name][0], "category": category[f.shares or f.name][1],
                     "shares": f.shares, "inputs": input_names[f.name]}
                    for f in sorted(layer.features, key=lambda f: f.name)]
        dense_files = []
        for root, _, files in os.walk(os.path.join(staging, "dense")):
            for name in sorted(files):
                path = os.path.join(root, name)
                dense_files.append({"path": os.path.relpath(path, staging), "bytes": os.path.getsize(path),
                                    "sha256": fmt.sha256_of(path)})
        manifest = fmt.write_manifest(staging, {
            "model": {"class": type(model).__name__, "name": model.name},
            "layer": {"class": type(layer).__name__, "name": layer.name},
            "features": features,
            "groups": groups,
            "dense": {"path": "dense", "signature": SIGNATURE, "output": "scores",
                      "inputs": {k: {"shape": s.shape.as_list(), "dtype": s.dtype.name} for k, s in dense_specs.items()},
                      "packed": packed, "files": dense_files},
            "source": source or {},
        })
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest
