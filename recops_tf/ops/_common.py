"""Helpers shared by the public op wrappers (argument conversion and ragged handling)."""
import tensorflow as tf

from recops_tf import _loader

INDEX_DTYPES = (tf.int32, tf.int64)


def lib():
    """The generated wrappers of the op library."""
    return _loader.load()


def index_tensor(x, name):
    """Converts `x` to an int32/int64 tensor (Python ints become int64)."""
    if not tf.is_tensor(x):
        x = tf.convert_to_tensor(x, dtype_hint=tf.int64, name=name)
    if x.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {x.dtype.name}")
    return x


def same_index_dtype(a, b):
    """Casts two index tensors to a common dtype (int64 if they differ)."""
    if a.dtype != b.dtype:
        a, b = tf.cast(a, tf.int64), tf.cast(b, tf.int64)
    return a, b


def ragged_parts(rt, name):
    """(values, row_splits) of a RaggedTensor with exactly one ragged dimension."""
    if rt.ragged_rank != 1:
        raise ValueError(f"{name} must have exactly one ragged dimension, got ragged_rank "
                         f"{rt.ragged_rank}")
    return rt.values, rt.row_splits


def zeros_if_none(grad, like):
    return tf.zeros_like(like) if grad is None else grad


def op_attrs(op, names):
    """Attributes of `op` by name, strings decoded (for gradient functions)."""
    attrs = {a: op.get_attr(a) for a in names}
    return {a: v.decode() if isinstance(v, bytes) else v for a, v in attrs.items()}
