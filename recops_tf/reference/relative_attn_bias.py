"""Composite references of stem relative_attn_bias, in stock TF (also the benchmark baseline:
a tf.gather of the bucketised deltas and a 2 x 2 repeat)."""
import numpy as np
import tensorflow as tf

DEFAULT_BUCKET_DIVISOR = 0.301


def time_buckets(timestamps, num_buckets, bucket_divisor=DEFAULT_BUCKET_DIVISOR):
    """[B, s, s] int32 buckets, in float64 from the float32-rounded divisor (as the op)."""
    if isinstance(timestamps, tf.RaggedTensor):
        timestamps = timestamps.to_tensor()
    t = tf.cast(timestamps, tf.int64)
    a = tf.cast(tf.abs(t[:, None, :] - t[:, :, None]), tf.float64)
    divisor = float(np.float32(bucket_divisor))
    b = tf.floor(tf.math.log(tf.maximum(a, 1.0)) / divisor)
    return tf.cast(tf.minimum(b, float(num_buckets - 1)), tf.int32)


def relative_attn_bias_time(timestamps, weights, bucket_divisor=DEFAULT_BUCKET_DIVISOR, *,
                            duplicate=True):
    weights = tf.convert_to_tensor(weights)
    buckets = time_buckets(timestamps, tf.compat.dimension_value(weights.shape[1]),
                           bucket_divisor)
    bias = tf.gather(weights, buckets, axis=1)  # [L, B, s, s]
    if duplicate:
        bias = tf.repeat(tf.repeat(bias, 2, axis=2), 2, axis=3)
    return bias, buckets


def relative_attn_bias_backward(grad, buckets, num_buckets, *, duplicate=True):
    if duplicate:
        buckets = tf.repeat(tf.repeat(buckets, 2, axis=1), 2, axis=2)
    layers = tf.shape(grad)[0]
    flat = tf.reshape(tf.transpose(tf.reshape(grad, [layers, -1])), [-1, layers])
    summed = tf.math.unsorted_segment_sum(flat, tf.reshape(buckets, [-1]), num_buckets)
    return tf.transpose(summed)


def relative_attn_bias_pos(rel_pos_bias, identity, past_valid_lens):
    n = tf.shape(rel_pos_bias)[0]
    lens = tf.cast(past_valid_lens, tf.int32)[:, None]
    i = tf.range(n)[None, :]
    rows = tf.where(i < lens, i, lens)
    gathered = tf.gather(rel_pos_bias, rows)  # [B, n, n]
    return (1 - identity)[None] * gathered + identity[None] * rel_pos_bias[0, 0]


def toeplitz_position_bias(pos_weights, candidate_len=0, *, duplicate=True):
    """Element by element (numpy) construction of the same matrices."""
    w = np.asarray(pos_weights)
    n = (len(w) + 1) // 2
    size = n + candidate_len // 2
    f = 2 if duplicate else 1
    p = np.zeros([f * size, f * size], w.dtype)
    ident = np.zeros_like(p)
    for r in range(f * size):
        for c in range(f * size):
            i, j = r // f, c // f
            if i < n and j < n:
                p[r, c] = w[n - 1 + j - i]
            ident[r, c] = 1 if i == j else 0
    return tf.constant(p), tf.constant(ident)
