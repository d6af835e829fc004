"""Cases of disentangle_attention: c2p|p2c disentangled attention."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.reference import disentangle_attention as ref
from recops_tf.testing.cases._common import Case
from recops_tf.testing.inputs import random_values


def build(batch=2, heads=2, s=16, d=8, dtype=tf.float32, seed=0):
    """c2p|p2c disentangled attention with relative positions i - j and no mask; "rate" counts
    the five s x s x d (or s x 2s x d) GEMMs of the forward and twice that backward."""
    rel = tf.constant(np.arange(s)[:, None] - np.arange(s)[None, :], tf.int64)
    a = ([random_values([batch, heads, s, d], dtype, seed + i) for i in range(3)]
         + [random_values([2 * s, heads, d], dtype, seed + 3 + i) for i in range(2)])
    flops = 2 * batch * heads * s * d * (s + 2 * s + 2 * s + s)
    return Case(f"b={batch} n={heads} s={s} d={d}",
                lambda q, k, v, pk, pq: recops_tf.disentangle_attention(q, k, v, pk, pq, rel),
                lambda q, k, v, pk, pq: ref.disentangle_attention(q, k, v, pk, pq,
                                                                  rel),
                a, [0, 1, 2, 3, 4], bytes_forward=0, bytes_backward=0, flops_forward=flops,
                flops_backward=2 * flops)
