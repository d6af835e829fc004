"""Composite reference of stem norm_multiply_dropout in stock TF (also the benchmark
baseline). The dropout mask is the kernel's counter hash, rebuilt with TF's uint64 ops, so
the reference drops exactly the same elements."""
import numpy as np
import tensorflow as tf

from recops_tf.reference.ln_mul import layer_norm

_GOLDEN = 0x9E3779B97F4A7C15


def _u64(x):
    return tf.constant(x, tf.uint64)


def _mix(z):
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(30))) * _u64(0xBF58476D1CE4E5B9)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(27))) * _u64(0x94D049BB133111EB)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(31)))


def _hash32(x):
    def step(x, shift):
        return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(shift, tf.uint32)))
    x = step(x, 16) * tf.constant(0x7FEB352D, tf.uint32)
    x = step(x, 15) * tf.constant(0x846CA68B, tf.uint32)
    return step(x, 16)


def dropout_factors(shape, dropout_rate, seed, dtype):
    """keep / (1 - p) (or 0) per element of a tensor of `shape` ([..., C]: rows of C), as the
    kernel computes it."""
    rate = float(np.float32(dropout_rate))
    seed = tf.bitcast(tf.cast(tf.convert_to_tensor(seed), tf.int64), tf.uint64)
    key = _mix(tf.bitwise.bitwise_xor(seed[0], _mix(seed[1] + _u64(_GOLDEN))))
    shape = tf.cast(shape, tf.int64)
    cols = shape[-1]
    rows = tf.reduce_prod(shape) // tf.maximum(cols, 1)
    row = tf.bitcast(tf.range(rows), tf.uint64)
    row_key = tf.cast(tf.bitwise.bitwise_and(_mix(key + row * _u64(_GOLDEN)),
                                             _u64(0xFFFFFFFF)), tf.uint32)
    col = tf.cast(tf.range(cols), tf.uint32)
    h = _hash32(tf.bitwise.bitwise_xor(row_key[:, None], col[None, :]))
    keep = tf.cast(h, tf.uint64) >= _u64(int(round(rate * 2.0**32)))
    factor = tf.where(keep, tf.constant(1.0 / (1.0 - rate), dtype), tf.zeros([], dtype))
    return tf.reshape(factor, shape)


def norm_multiply_dropout(x, u, weight, bias, epsilon=1e-5, dropout_rate=0.0, training=True,
                          seed=None):
    if isinstance(x, tf.RaggedTensor):
        return x.with_flat_values(norm_multiply_dropout(
            x.flat_values, u.flat_values, weight, bias, epsilon, dropout_rate, training, seed))
    y = layer_norm(x, weight, bias, epsilon) * u
    if training and dropout_rate > 0.0:
        if seed is None:
            raise ValueError("the reference needs the seed to rebuild the mask")
        y = y * dropout_factors(tf.shape(x), dropout_rate, seed, x.dtype)
    return y
