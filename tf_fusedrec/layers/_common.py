"""Argument handling shared by the embedding layers."""

import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec import initializers
from tf_fusedrec.layers import _inputs

DEFAULT_OPTIMIZER = "adagrad"


def default_initializer():
    """Hashed rows: reproducible, and independent of worker count and batch order."""
    return initializers.Hashed(seed=0, stddev=0.05)


def parse_features(features, layer_name):
    """A tuple of Features from Features or their configs; ValueError naming a duplicate or a bad entry."""
    if isinstance(features, (cfg.Feature, dict)) or not features:
        raise ValueError(f"{layer_name}: features must be a non-empty list of fr.Feature, got {features!r}")
    parsed, seen = [], set()
    for f in features:
        if isinstance(f, dict):
            f = cfg.Feature.from_config(f)
        if not isinstance(f, cfg.Feature):
            raise ValueError(f"{layer_name}: features must be fr.Feature objects, got {f!r}")
        if f.name in seen:
            raise ValueError(f"{layer_name}: feature '{f.name}' is configured twice")
        seen.add(f.name)
        parsed.append(f)
    return tuple(parsed)


def flatten_inputs(features, inputs, layer_name, check_ids=True):
    """Checks the input dict; returns ({name: FlatFeature}, assertion ops on the ids, none if not check_ids)."""
    _inputs.check_input_dict(features, inputs, layer_name)
    flats, checks = {}, []
    for f in features:
        flat, c = _inputs.flatten_feature(f, inputs[f.name], check_ids)
        flats[f.name] = flat
        checks.extend(c)
    return flats, checks


def after(deps, tensor):
    """`tensor`, computed only once `deps` have run (ragged-aware)."""
    with tf.control_dependencies(deps):
        if isinstance(tensor, tf.RaggedTensor):
            return tensor.with_flat_values(tf.identity(tensor.flat_values))
        return tf.identity(tensor)


def layer_config(features, optimizer, initializer):
    return {
        "features": [f.get_config() for f in features],
        "optimizer": {"name": optimizer.name, **dict(optimizer.config)},
        "initializer": initializers.serialize(initializer),
    }
