"""Cases of relative_attn_bias: the time-bucket bias and the Toeplitz position bias."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.reference import relative_attn_bias as ref
from recops_tf.testing.cases._common import Case, tensor_bytes
from recops_tf.testing.inputs import random_values


def build(fn="time", layers=2, batch=3, steps=5, num_buckets=129,
          dtype=tf.float32, index_dtype=tf.int64, seed=0):
    """fn "time": increasing timestamps (gaps up to ~a day in seconds) and [L, NB] weights,
    the 2 x 2 duplicated bias; fn "pos": a Toeplitz [2s, 2s] position bias with its identity
    and random cached lengths."""
    rng = np.random.default_rng(seed)
    if fn == "time":
        gaps = rng.integers(0, 86400, size=(batch, steps))
        ts = tf.constant(np.cumsum(gaps, axis=1), dtype=index_dtype)
        w = random_values([layers, num_buckets], dtype, seed + 1)
        s2 = 2 * steps
        out = layers * batch * s2 * s2 * w.dtype.size
        return Case(f"time L={layers} B={batch} s={steps}",
                    lambda ts, w: recops_tf.relative_attn_bias_time(ts, w)[0],
                    lambda ts, w: ref.relative_attn_bias_time(ts, w)[0],
                    [ts, w], [1],
                    bytes_forward=out + batch * steps * steps * 4 + tensor_bytes(ts, w),
                    bytes_backward=out + batch * steps * steps * 4 + tensor_bytes(w))
    pos_w = random_values([2 * steps - 1], dtype, seed + 1)
    p, ident = recops_tf.toeplitz_position_bias(pos_w)
    lens = tf.constant(rng.integers(0, 2 * steps + 1, size=batch), dtype=index_dtype)
    out = batch * 4 * steps * steps * p.dtype.size
    return Case(f"pos B={batch} S2={2 * steps}", recops_tf.relative_attn_bias_pos,
                ref.relative_attn_bias_pos, [p, ident, lens], [0, 1],
                bytes_forward=out + 2 * tensor_bytes(p),
                bytes_backward=2 * out + 2 * tensor_bytes(p))
