"""Input conversion shared by the op wrappers."""

import tensorflow as tf

KEY_DTYPES = (tf.int32, tf.int64)


def convert_keys(keys):
    """keys as an int32 or int64 tensor; TypeError naming the dtype otherwise."""
    keys = tf.convert_to_tensor(keys)
    if keys.dtype not in KEY_DTYPES:
        raise TypeError(f"keys must be int32 or int64, got {keys.dtype.name}")
    return keys


def convert_segment_ids(segment_ids):
    """segment_ids as an int32 tensor; TypeError naming the dtype otherwise."""
    segment_ids = tf.convert_to_tensor(segment_ids, dtype_hint=tf.int32)
    if segment_ids.dtype != tf.int32:
        raise TypeError(f"segment_ids must be int32, got {segment_ids.dtype.name}")
    return segment_ids
