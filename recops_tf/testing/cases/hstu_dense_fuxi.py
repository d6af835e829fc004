"""Cases of hstu_dense_fuxi: causal jagged Fuxi attention with both biases."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.reference import hstu_dense_fuxi as ref
from recops_tf.testing.cases._common import Case, row_offsets
from recops_tf.testing.inputs import random_values


def build(batch=3, max_len=70, heads=2, dim=8, dtype=tf.float32,
          index_dtype=tf.int64, seed=0):
    """Causal jagged Fuxi attention with both biases, lengths uniform in [1, max_len]."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=batch)
    offsets = row_offsets(lengths, index_dtype)
    rows = int(lengths.sum())
    q, k, v = (random_values([rows, heads, dim], dtype, seed + i) for i in range(3))
    ts = random_values([batch, max_len, max_len], dtype, seed + 4)
    pos = random_values([1, max_len, max_len], dtype, seed + 5)
    fused = lambda q, k, v, ts, pos: recops_tf.hstu_attention_fuxi(  # noqa: E731
        q, k, v, seq_offsets=offsets, max_seq_len=max_len, timestamp_bias=ts,
        position_bias=pos)
    reference = lambda q, k, v, ts, pos: ref.hstu_attention_fuxi(  # noqa: E731
        q, k, v, offsets, max_len, ts, pos)
    # Useful causal FLOPs per visible pair and head: forward Q.K and three P.V products;
    # backward dO_s.V, dS.K, dS^T.Q, three dV products and two bias-gradient products.
    pairs = float(np.sum(lengths * (lengths + 1) / 2))
    return Case(f"B={batch} L<={max_len} H={heads} D={dim}", fused, reference,
                [q, k, v, ts, pos], [0, 1, 2, 3, 4], bytes_forward=0, bytes_backward=0,
                flops_forward=int(2 * heads * 4 * dim * pairs),
                flops_backward=int(2 * heads * 8 * dim * pairs))
