"""Composite reference of stem hstu_dense_fuxi (padded dense, stock TF; the benchmark
baseline)."""
import numpy as np
import tensorflow as tf

from recops_tf.reference.hstu_dense import _lengths, visibility


def hstu_attention_fuxi(q, k, v, seq_offsets, max_seq_len, timestamp_bias=None,
                        position_bias=None, mask_type="causal", mask=None, silu_scale=0.0):
    """Jagged q, k, v [T, N, D] -> [T, 3 N D] (both biases) or [T, N D]."""
    dtype = q.dtype
    splits = tf.cast(seq_offsets, tf.int64)
    batch = tf.shape(splits, out_type=tf.int64)[0] - 1
    to_dense = lambda x: tf.RaggedTensor.from_row_splits(x, splits).to_tensor(  # noqa: E731
        shape=[batch, max_seq_len, x.shape[1], x.shape[2]])
    qd, kd, vd = to_dense(q), to_dense(k), to_dense(v)
    s = tf.einsum("bihd,bjhd->bhij", qd, kd)
    scale = silu_scale if silu_scale != 0.0 else float(np.float32(1.0) / np.float32(max_seq_len))
    m = tf.cast(visibility(seq_offsets, seq_offsets, max_seq_len, max_seq_len, mask_type), dtype)
    if mask_type == "custom":
        m = m * mask
    channels = [s * tf.sigmoid(s) * tf.cast(scale, dtype) * m]
    if timestamp_bias is not None:
        channels.append(timestamp_bias[:, None] * m)
        channels.append(position_bias[:, None] * m)
    lengths = _lengths(splits)
    outs = []
    for weights in channels:
        weights = tf.broadcast_to(weights, tf.shape(s))  # the bias channels: every head
        o = tf.einsum("bhij,bjhd->bihd", weights, vd)
        o = tf.RaggedTensor.from_tensor(o, lengths=lengths).values
        outs.append(tf.reshape(o, [-1, o.shape[1] * o.shape[2]]))
    return tf.concat(outs, axis=1)
