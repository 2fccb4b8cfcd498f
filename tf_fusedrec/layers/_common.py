"""Argument handling shared by the embedding layers."""

import contextlib

import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec import initializers
from tf_fusedrec.layers import _inputs

DEFAULT_OPTIMIZER = "adagrad"


def default_initializer():
    """Hashed rows: reproducible, and independent of worker count and batch order (config.default_initializer)."""
    return cfg.default_initializer()


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


def group_features(features, optimizer, initializer, layer_name):
    """cfg.group_features, its errors (a `shares` that cannot be honoured) prefixed with the layer's name."""
    try:
        return cfg.group_features(features, optimizer, initializer)
    except ValueError as e:
        raise ValueError(f"{layer_name}: {e}") from None


def flatten_inputs(features, inputs, layer_name, local_checks=True):
    """Checks the input dict; returns ({name: FlatFeature}, assertion ops: local_value_checks). local_checks=False:
    no value checks (see shared_checks)."""
    _inputs.check_input_dict(features, inputs, layer_name)
    flats = _inputs.flatten_features(features, inputs)
    return flats, (local_value_checks(features, inputs) if local_checks else [])


def _first_broken(broken):
    """int32 scalar: the position of the first True in broken (bool [P], P >= 1); any position when none is."""
    size = tf.size(broken, out_type=tf.int32)
    return tf.argmax(tf.cast(broken, tf.int32) * tf.range(size, 0, -1), output_type=tf.int32)


def local_value_checks(features, inputs):
    """The value checks of this worker's batch as ONE assertion op (an op per feature and rule cost a graph of ~25
    ops each, and their conditionals ran every step), failing with the message of the first rule broken, in
    violation_messages' order."""
    flags, messages = violation_flags(features, inputs)
    broken = flags > 0
    text = tf.gather(tf.constant(messages), _first_broken(broken))
    return [tf.debugging.Assert(tf.logical_not(tf.reduce_any(broken)), [text])]


def violation_flags(features, inputs):
    """(int32 [P] flags, P messages): every value rule of every feature, 1 where this worker's batch breaks it."""
    return tf.cast(_inputs.id_violations(features, inputs), tf.int32), violation_messages(features)


def violation_messages(features):
    """The P messages of violation_flags, in its order (static: no tensors)."""
    return [m for f in features for m in _inputs.violation_messages(f)]


def violation_message(message, ranks):
    return f"{message} (in the batch of rank {', '.join(str(r) for r in ranks)})"


def shared_checks(features, inputs, comm, name):
    """The value checks of every worker's batch, shared by one small allgather (`name`), as ONE assertion op that
    fails on EVERY worker, naming the first rule broken (in violation_messages' order: the feature and the rule) and
    the rank(s) whose batch broke it, when any worker's batch is bad. Run it before the first all-to-all: a check
    failing on one worker alone would leave its peers waiting in a collective it never joins."""
    flags, messages = violation_flags(features, inputs)
    everyone = comm.allgather(flags[None, :], name=name) > 0  # [N, P]
    broken = tf.reduce_any(everyone, axis=0)
    first = _first_broken(broken)
    ranks = tf.boolean_mask(tf.range(comm.size), tf.gather(everyone, first, axis=1))
    # The same text as violation_message, with the rule and the ranks known only at run time.
    text = tf.strings.join([tf.gather(tf.constant(messages), first), " (in the batch of rank ",
                            tf.strings.reduce_join(tf.strings.as_string(ranks), separator=", "), ")"])
    return [tf.debugging.Assert(tf.logical_not(tf.reduce_any(broken)), [text])]


def checked_inputs(features, inputs, layer_name, comm, name, checked=False):
    """flatten_inputs with the value checks local (one worker) or shared (several; collective `name`); checked=True:
    the caller already checked the values on every worker."""
    if comm.size == 1 and not checked:
        return flatten_inputs(features, inputs, layer_name)
    flats, _ = flatten_inputs(features, inputs, layer_name, local_checks=False)
    return flats, ([] if checked else shared_checks(features, inputs, comm, name))


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


class Injection:
    """A layer's injected outputs (a plain object: Keras must not track the tensors): while a block is open, the
    layer's next call returns them after checking the call's input dict. How a pipeline runs a user's model on
    embeddings it computed ahead, and how fr.export saves the dense part without tracing any table."""

    outputs = None

    @contextlib.contextmanager
    def block(self, outputs, layer_name):
        if self.outputs is not None:
            raise RuntimeError(f"{layer_name}: injected() blocks cannot nest")
        self.outputs = outputs
        try:
            yield
        finally:
            self.outputs = None

    def take(self, features, inputs, layer_name):
        _inputs.check_input_dict(features, inputs, layer_name)
        outputs, self.outputs = self.outputs, None
        return outputs
