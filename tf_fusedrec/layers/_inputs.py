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


def id_violations(features, inputs):
    """bool [P]: for every feature (in order) and its rules (violation_messages' order), whether its ids (after
    flatten_feature's static checks) break the rule: what a layer checks in one assertion, and what workers share so
    that one worker's bad batch stops all of them.

    One reduction per feature and rule (its smallest or largest id), then one comparison per rule over all features:
    a comparison and a reduction per feature and rule were 8 graph ops a feature, a third of the checks' step graph.
    """
    axes = {}  # rank -> the reduction axes (all), one constant shared by the features' reductions

    def extreme(reduce, ids):
        values = ids.flat_values if isinstance(ids, tf.RaggedTensor) else tf.convert_to_tensor(ids)
        if values.shape.rank is None:
            values = tf.reshape(values, [-1])
        rank = values.shape.rank
        if rank not in axes:
            axes[rank] = tf.constant(list(range(rank)), tf.int32)
        return tf.cast(reduce(input=values, axis=axes[rank]), tf.int64)  # empty: the dtype's max / min

    lows = tf.stack([extreme(tf.raw_ops.Min, inputs[f.name]) for f in features])
    negative = tf.unstack(lows < -1, num=len(features))
    bounded = [f for f in features if f.max_id_bits is not None]
    too_large = {}
    if bounded:
        highs = tf.stack([extreme(tf.raw_ops.Max, inputs[f.name]) for f in bounded])
        limits = tf.constant([1 << f.max_id_bits for f in bounded], tf.int64)
        too_large = dict(zip([f.name for f in bounded], tf.unstack(highs >= limits, num=len(bounded))))
    flags = []
    for f, flag in zip(features, negative):
        flags.append(flag)
        if f.name in too_large:
            flags.append(too_large[f.name])
    return tf.stack(flags)


def flatten_feature(feature, ids):
    """Checks one feature's ids statically (dtype, rank) and returns its valid ids flattened, plus what is needed to
    rebuild the output. The value checks (negative, too large) are the caller's, over all features at once
    (id_violations): one assertion for a layer, or one shared between workers.

    Returns:
      FlatFeature(ids int64 [n], layout).

    Raises:
      ValueError / TypeError naming the feature for a wrong dtype or rank (statically known).
    """
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
        values = ids.flat_values
        num_rows = ids.nrows()
        kind, shape = "ragged", None
    else:
        rank = ids.shape.rank
        if rank not in (1, 2):
            raise ValueError(f"{where}: ids must have shape [B] or [B, L] (or be ragged), got shape {ids.shape}")
        shape = tf.shape(ids, out_type=tf.int64)
        if rank == 1:  # (a size, not shape[0]: one op, not four; a layer has one per feature)
            kind, values, num_rows = "dense1", ids, tf.size(ids, out_type=tf.int64)
        else:
            kind, values, num_rows = "dense2", tf.reshape(ids, [-1]), shape[0]
    values = tf.cast(values, tf.int64)
    positions = tf.reshape(tf.where(values >= 0), [-1])
    # The row of each valid id, computed from its position only (not a row id per value, then gathered).
    if kind == "ragged":
        rows_of = ops.row_ids(ids.row_splits, positions)  # in the row splits' dtype, as value_rowids()
    elif kind == "dense1":
        rows_of = positions
    else:
        rows_of = positions // tf.maximum(shape[1], 1)
    layout = _Layout(kind, shape, positions, rows_of, ids if ragged else None, num_rows, ids.shape)
    return FlatFeature(tf.gather(values, positions), layout)


def output_segments(feature, layout):
    """Where each valid id's row lands in the feature's output before the combiner's scaling: -> (int64 [n] output
    row of each id, int64 scalar number of output rows). A combiner sums an example's ids into its row; without one
    each id has a row of its own (its position in the padded or ragged layout), and padding's rows stay zero."""
    if feature.combiner is not None:
        return layout.rows_of, layout.num_rows
    if layout.kind == "ragged":
        return layout.positions, tf.shape(layout.ragged.flat_values, out_type=tf.int64)[0]
    return layout.positions, tf.reduce_prod(layout.shape)


def finish_rows(feature, sums, layout):
    """The summed rows [num output rows, dim] of output_segments -> the feature's output (see module docstring)."""
    dim = feature.dim
    sums.set_shape([None, dim])
    if feature.combiner is None:
        if layout.kind == "ragged":
            return layout.ragged.with_flat_values(sums)
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

