"""The few places where Keras 3 and Keras 2 (tf_keras) differ for tf_fusedrec, in one home.

tf_fusedrec uses whichever Keras `tf.keras` is in the process (tf_fusedrec/_frameworks.py: Keras 3 unless the user set
TF_USE_LEGACY_KERAS=1) and never switches it. The differences it meets:

* Variables: a Keras 3 layer tracks only `keras.Variable`s as its weights (a plain `tf.Variable` attribute is not in
  `layer.trainable_weights`, so `model.fit` would never train it); tf_keras tracks `tf.Variable`s. `variable()` makes
  the kind the running Keras tracks.
* Optimizers: Keras 3 has no legacy (OptimizerV2) classes and no `_decayed_lr`; its `learning_rate` property is the
  current rate (a schedule evaluated at `iterations`). tf_keras has both kinds.
"""

import tensorflow as tf

from tf_fusedrec import _frameworks

# Keras' class of each optimizer name of tf_fusedrec's OptimizerSpec (config.OPTIMIZER_NAMES).
OPTIMIZER_CLASSES = {"sgd": "SGD", "adagrad": "Adagrad", "adam": "Adam", "adamw": "AdamW", "ftrl": "Ftrl",
                     "rmsprop": "RMSprop"}


def legacy():
    """True when tf.keras is Keras 2 (tf_keras)."""
    return _frameworks.keras_is_legacy()


def variable(initial_value, name, trainable=True, dtype=None, constraint=None):
    """A variable the running Keras tracks as a layer weight when a layer holds it (module docstring). `constraint`:
    a function(variable) -> its new value, which every Keras optimizer runs right after applying a step."""
    if legacy():
        return tf.Variable(initial_value, trainable=trainable, name=name, dtype=dtype, constraint=constraint)
    import keras  # noqa: PLC0415  (Keras 3: what tf.keras is here)

    var = keras.Variable(initial_value, trainable=trainable, name=name, dtype=dtype)
    var.constraint = constraint
    return var


def read(var):
    """The current value of a tf.Variable or a keras.Variable, as a tensor (recorded by a GradientTape)."""
    if isinstance(var, tf.Variable):
        return var.read_value()
    return tf.convert_to_tensor(var)  # a keras.Variable (its value, cast where a mixed-precision policy casts it)


def assign(var, value):
    """var = value for a tf.Variable or a keras.Variable; -> the assign op in a graph (a tf.compat.v1 graph runs it only
    when something depends on it), None eagerly or for a keras.Variable (Keras 3: tf.functions only, where automatic
    control dependencies run it in program order)."""
    if isinstance(var, tf.Variable):
        return var.assign(value, read_value=False)
    var.assign(value)
    return None


def build_optimizer(name, config, for_tfra=False):
    """A fresh Keras optimizer of tf_fusedrec's optimizer `name` with hyperparameters `config` (a dict).

    Keras 2: the legacy (OptimizerV2) classes, which run in eager, tf.function and tf.compat.v1 graphs alike and are
    what TFRA's DynamicEmbeddingOptimizer wraps (AdamW has no legacy class: the new tf_keras one, refused for TFRA
    tables). Keras 3: its own classes.
    """
    if legacy():
        if name in OPTIMIZER_CLASSES and hasattr(tf.keras.optimizers.legacy, OPTIMIZER_CLASSES[name]):
            return getattr(tf.keras.optimizers.legacy, OPTIMIZER_CLASSES[name])(**config)
        if for_tfra:
            raise ValueError(f"optimizer {name!r} has no Keras 2 legacy class, which TFRA tables need; use "
                             f"table_backend='native' for it")
    return getattr(tf.keras.optimizers, OPTIMIZER_CLASSES[name])(**config)


def is_optimizer(obj):
    """Whether obj is a Keras optimizer instance (either Keras, either kind of tf_keras optimizer)."""
    kinds = [tf.keras.optimizers.Optimizer]
    if legacy():
        kinds.append(tf.keras.optimizers.legacy.Optimizer)
    return isinstance(obj, tuple(kinds))


def current_learning_rate(optimizer):
    """The learning rate `optimizer` applies at its next update, float32 (a schedule evaluated at its iterations)."""
    if hasattr(optimizer, "_decayed_lr"):  # tf_keras legacy
        return tf.cast(optimizer._decayed_lr(tf.float32), tf.float32)  # noqa: SLF001  (Keras' own schedule hook)
    rate = optimizer.learning_rate  # Keras 3 and tf_keras' new optimizers: the current rate
    return tf.cast(tf.convert_to_tensor(rate), tf.float32)


# The per-variable state lists of the optimizers of Keras 3 and of tf_keras' new (non-legacy) optimizers, by class,
# as (attribute, the slot name tf_keras' legacy optimizer of that class gives the same state): checkpoints key the
# dense slots by those names on either Keras, so a checkpoint written under Keras 2 restores under Keras 3 and back.
_SLOT_LISTS = {
    "Adam": (("_momentums", "m"), ("_velocities", "v"), ("_velocity_hats", "vhat")),
    "Adagrad": (("_accumulators", "accumulator"),),
    "SGD": (("momentums", "momentum"),),
    "RMSprop": (("_velocities", "rms"), ("_momentums", "momentum"), ("_average_gradients", "mg")),
    "Ftrl": (("_accumulators", "accumulator"), ("_linears", "linear")),
}


def _slot_lists(optimizer):
    """_SLOT_LISTS' entry of the optimizer's class or of its nearest base class (AdamW: Adam's), or None."""
    for cls in type(optimizer).__mro__:
        if cls.__name__ in _SLOT_LISTS:
            return _SLOT_LISTS[cls.__name__]
    return None


def _variable_index(optimizer, var):
    """The index of `var` in a Keras 3 (or tf_keras new) optimizer's per-variable lists."""
    if hasattr(optimizer, "_get_variable_index"):  # Keras 3
        return optimizer._get_variable_index(var)  # noqa: SLF001  (Keras' own lookup of its lists)
    return optimizer._index_dict[optimizer._var_key(var)]  # noqa: SLF001  (tf_keras' new optimizers)


def dense_slots(optimizer, variables):
    """[(key, slot variable)] of a dense optimizer's per-variable state, in a deterministic order, for checkpoints.

    'var{i}/{slot name}' for the i-th of `variables`, with tf_keras' legacy slot names (get_slot) on either Keras: for
    Keras 3's optimizers (and tf_keras' new ones) of the classes of _SLOT_LISTS, their per-variable lists under the
    legacy name of the same state, so a checkpoint moves between Keras 2 and Keras 3. Another optimizer class: its
    own variables other than its step count and learning rate, in their creation order, keyed 'slot{j}'
    (`positional_dense_slots`).
    """
    if hasattr(optimizer, "get_slot_names"):
        return [(f"var{i}/{name}", optimizer.get_slot(v, name))
                for i, v in enumerate(variables) for name in sorted(optimizer.get_slot_names())]
    lists = _slot_lists(optimizer)
    if lists is None:
        return positional_dense_slots(optimizer)
    slots = []
    for i, v in enumerate(variables):
        index = _variable_index(optimizer, v)
        named = [(name, getattr(optimizer, attr, None)) for attr, name in lists]
        slots.extend((f"var{i}/{name}", state[index]) for name, state in sorted(named, key=lambda n: n[0])
                     if state is not None and len(state) > index and state[index] is not None)
    return slots


def positional_dense_slots(optimizer):
    """[('slot{j}', variable)]: a Keras 3 optimizer's variables other than its step count and learning rate, in
    creation order (how tf_fusedrec keyed every Keras 3 optimizer's dense slots before they took the legacy names:
    Checkpointer.restore reads such checkpoints too)."""
    skip = {id(optimizer.iterations)}
    rate = getattr(optimizer, "_learning_rate", None)
    if rate is not None:
        skip.add(id(rate))
    return [(f"slot{j}", v) for j, v in enumerate(x for x in optimizer.variables if id(x) not in skip)]
