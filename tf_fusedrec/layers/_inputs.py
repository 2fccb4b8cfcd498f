"""Per-feature input checks, flattening to valid ids, and the inverse: rows back to the feature's output layout.

Shared by FusedEmbedding and PerFeatureEmbedding so both accept exactly the same inputs and combine identically.
Accepted inputs per feature: ids [B] -> [B, dim]; ids [B, L] (padding -1) or a tf.RaggedTensor [B, None] -> with
combiner None [B, L, dim] (ragged stays ragged), with sum | mean | sqrtn [B, dim]. Padding (-1) and empty rows
contribute nothing; an empty row gives zeros.
"""

import collections

import tensorflow as tf

from tf_fusedrec import ops

FlatFeature = collections.namedtuple("FlatFeature", ["ids", "layout"])
_Layout = collections.namedtuple(
    "_Layout", ["kind", "shape", "positions", "rows_of", "ragged", "num_rows", "static_shape"]
)


def check_input_dict(features, inputs, layer_name):
    """ValueError naming the feature when a configured feature is missing or an unknown one is given."""
    if not isinstance(inputs, dict):
        raise ValueError(f"{layer_name}: inputs must be a dict feature name -> ids, got {type(inputs).__name__}")
    names = {f.name for f in features}
    missing = sorted(names - set(inputs))
    unknown = sorted(set(inputs) - names)
    if missing:
        raise ValueError(f"{layer_name}: feature '{missing[0]}' is missing from the inputs (missing: {missing})")
    if unknown:
        raise ValueError(f"{layer_name}: unknown feature '{unknown[0]}' in the inputs (configured: {sorted(names)})")


def _messages(feature):
    where = f"feature '{feature.name}'"
    negative = f"{where}: ids must be >= 0 (-1 marks padding); found a negative id"
    too_large = None if feature.max_id_bits is None else (
        f"{where}: id does not fit in max_id_bits={feature.max_id_bits} (ids must be < 2**{feature.max_id_bits})")
    return negative, too_large


def violation_messages(feature):
    """The messages of id_violations, in its order: negative ids, then ids too large (with max_id_bits)."""
    return [m for m in _messages(feature) if m is not None]


def _id_values(ids):
    """A feature's ids as int64 values of any shape (a ragged tensor's flat values)."""
    values = ids.flat_values if isinstance(ids, tf.RaggedTensor) else tf.convert_to_tensor(ids)
    return tf.cast(values, tf.int64)


def id_violations(features, inputs):
    """bool [P]: for every feature (in order) and its rules (violation_messages' order), whether its ids (after
    flatten_feature's static checks) break the rule: what a layer checks in one assertion, and what workers share so
    that one worker's bad batch stops all of them.

    Every feature's smallest and largest id from one op (ops.id_extremes), then one comparison per rule over all
    features: a Min and a Max per feature and their stacks were about 60 of a 26-feature step's graph nodes.
    """
    lows, highs = ops.id_extremes([_id_values(inputs[f.name]) for f in features])
    negative = lows < -1
    bounded = [i for i, f in enumerate(features) if f.max_id_bits is not None]
    if not bounded:
        return negative
    limits = tf.constant([1 << features[i].max_id_bits for i in bounded], tf.int64)
    too_large = tf.gather(highs, bounded) >= limits
    # violation_messages' order: each feature's negative flag, then its too-large flag where it has one.
    order, slot = [], {i: len(features) + k for k, i in enumerate(bounded)}
    for i in range(len(features)):
        order.append(i)
        if i in slot:
            order.append(slot[i])
    return tf.gather(tf.concat([negative, too_large], axis=0), order)


def _checked_ids(feature, ids):
    """One feature's ids checked statically (dtype, rank) -> (ids as a tensor or tf.RaggedTensor, layout kind)."""
    where = f"feature '{feature.name}'"
    ragged = isinstance(ids, tf.RaggedTensor)
    if not ragged:
        ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
        raise TypeError(f"{where}: ids must be {feature.key_dtype.name}, got {ids.dtype.name}")
    if ids.dtype != feature.key_dtype:
        raise TypeError(
            f"{where}: ids must be {feature.key_dtype.name} (the feature's key_dtype), got {ids.dtype.name}"
        )
    if ragged:
        if ids.ragged_rank != 1 or ids.shape.rank != 2:
            raise ValueError(f"{where}: ragged ids must have shape [B, None], got {ids.shape}")
        return ids, "ragged"
    if ids.shape.rank not in (1, 2):
        raise ValueError(f"{where}: ids must have shape [B] or [B, L] (or be ragged), got shape {ids.shape}")
    return ids, "dense1" if ids.shape.rank == 1 else "dense2"


def _layout(ids, kind, positions):
    """The _Layout of one feature's ids (from _checked_ids) whose valid ids sit at flat `positions`."""
    if kind == "ragged":
        # The row of each valid id, from its position only (not a row id per value, then gathered).
        rows_of = ops.row_ids(ids.row_splits, positions)  # in the row splits' dtype, as value_rowids()
        return _Layout(kind, None, positions, rows_of, ids, ids.nrows(), ids.shape)
    if kind == "dense1":
        # (the static batch size where known, else a size: one op, not a shape and a slice)
        known = ids.shape[0] is not None
        num_rows = tf.constant(ids.shape[0], tf.int64) if known else tf.size(ids, out_type=tf.int64)
        return _Layout(kind, None, positions, positions, None, num_rows, ids.shape)
    shape = tf.shape(ids, out_type=tf.int64)
    width = max(ids.shape[1], 1) if ids.shape[1] is not None else tf.maximum(shape[1], 1)
    return _Layout(kind, shape, positions, positions // width, None, shape[0], ids.shape)


def flatten_features(features, inputs):
    """Checks each feature's ids statically (dtype, rank) and returns its valid ids flattened, plus what is needed to
    rebuild its output; the valid ids of all features come from one op (ops.valid_ids). The value checks (negative,
    too large) are the caller's, over all features at once (id_violations): one assertion for a layer, or one shared
    between workers.

    Returns:
      {name: FlatFeature(ids int64 [n], layout)}.

    Raises:
      ValueError / TypeError naming the feature for a wrong dtype or rank (statically known).
    """
    checked = [_checked_ids(f, inputs[f.name]) for f in features]
    if not checked:
        return {}
    valid, positions = ops.valid_ids([_id_values(ids) for ids, _ in checked])
    return {f.name: FlatFeature(v, _layout(ids, kind, p))
            for f, (ids, kind), v, p in zip(features, checked, valid, positions)}


def flatten_feature(feature, ids):
    """flatten_features of one feature: -> FlatFeature(ids int64 [n], layout)."""
    return flatten_features([feature], {feature.name: ids})[feature.name]


def output_segments(feature, layout):
    """Where each valid id's row lands in the feature's output before the combiner's scaling: -> (int64 [n] output
    row of each id, int64 scalar number of output rows). A combiner sums an example's ids into its row; without one
    each id has a row of its own (its position in the padded or ragged layout), and padding's rows stay zero."""
    if feature.combiner is not None:
        return layout.rows_of, layout.num_rows
    if layout.kind == "ragged":
        return layout.positions, tf.shape(layout.ragged.flat_values, out_type=tf.int64)[0]
    if layout.kind == "dense1":
        return layout.positions, layout.num_rows
    return layout.positions, tf.reduce_prod(layout.shape)


def finish_rows(feature, sums, layout):
    """The summed rows [num output rows, dim] of output_segments -> the feature's output (see module docstring)."""
    dim = feature.dim
    sums.set_shape([None, dim])
    if feature.combiner is None:
        if layout.kind == "ragged":
            return layout.ragged.with_flat_values(sums)
        if layout.kind == "dense1":  # [B, dim] already: a row per id
            sums.set_shape(layout.static_shape.concatenate([dim]))
            return sums
        if layout.static_shape[1] is not None:
            out = tf.reshape(sums, [-1, layout.static_shape[1], dim])
        else:
            out = tf.reshape(sums, tf.concat([layout.shape, [dim]], axis=0))
        out.set_shape(layout.static_shape.concatenate([dim]))
        return out
    sums.set_shape([layout.static_shape[0], dim])
    if feature.combiner == "sum":
        return sums
    counts = tf.math.unsorted_segment_sum(tf.ones_like(layout.rows_of, sums.dtype), layout.rows_of, layout.num_rows)
    counts = tf.maximum(counts, 1.0)[:, None]
    if feature.combiner == "mean":
        return sums / counts
    return sums / tf.sqrt(counts)


def unflatten_rows(feature, rows, layout):
    """Rows of the valid ids [n, dim] -> the feature's output (see module docstring), with static shapes set: a
    scatter (no combiner) or a segment sum, then finish_rows. The per-feature layers' way; FusedEmbedding sums a
    whole group's rows with one op (GroupLookup.output_sums) before finish_rows."""
    rows = tf.ensure_shape(rows, [None, feature.dim])
    segments, total = output_segments(feature, layout)
    if feature.combiner is None:
        sums = tf.scatter_nd(segments[:, None], rows, tf.stack([total, feature.dim]))
    else:
        sums = tf.math.unsorted_segment_sum(rows, segments, total)
    return finish_rows(feature, sums, layout)

