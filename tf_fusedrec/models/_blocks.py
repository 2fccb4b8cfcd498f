"""Pieces shared by the models."""

import tensorflow as tf


def mlp(units, name, last_activation="relu", seed=0):
    """Dense layers of the given widths; ReLU between them, `last_activation` after the last."""
    layers = []
    for i, u in enumerate(units):
        activation = "relu" if i < len(units) - 1 else last_activation
        layers.append(
            tf.keras.layers.Dense(
                u, activation=activation, name=f"{name}_{i}",
                kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + i),
            )
        )
    return tf.keras.Sequential(layers, name=name)


def compute_dtype(outputs, dtype):
    """The embedding layer's float32 outputs (dict of tensors or ragged tensors) in the model's compute dtype: float16
    or bfloat16 under a Keras mixed precision policy (tf.keras.mixed_precision), unchanged otherwise."""
    if tf.as_dtype(dtype) == tf.float32:
        return outputs
    return {k: tf.cast(v, dtype) for k, v in outputs.items()}


def logits(x):
    """Logits in float32, whatever the compute dtype (the loss and the AUC are computed in float32)."""
    return tf.cast(x, tf.float32)


def sparse_inputs(inputs):
    """The sparse part of a batch dict (everything but "dense")."""
    return {k: v for k, v in inputs.items() if k != "dense"}


def pooled(outputs, names):
    """[B, dim] per feature: multi-hot outputs without a combiner are summed over their ids."""
    result = []
    for n in names:
        x = outputs[n]
        if isinstance(x, tf.RaggedTensor):
            x = tf.reduce_sum(x, axis=1)
        elif x.shape.rank == 3:
            x = tf.reduce_sum(x, axis=1)
        result.append(x)
    return result
