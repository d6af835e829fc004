"""Cases of token_mixing: LayerNorm of x + xᵀ over [B, S, S] blocks."""
import tensorflow as tf

import recops_tf
from recops_tf.reference import token_mixing as ref
from recops_tf.testing.cases._common import Case
from recops_tf.testing.inputs import random_values


def build(batch=3, s=16, dtype=tf.float32, seed=0):
    """LayerNorm of x + xᵀ over [B, S, S] blocks (x read, y written; backward: dy, x read,
    dx written)."""
    a = [random_values([batch, s, s], dtype, seed), random_values([s], dtype, seed + 1),
         random_values([s], dtype, seed + 2)]
    n = batch * s * s * a[0].dtype.size
    return Case(f"B={batch} S={s}", recops_tf.token_mixing, ref.token_mixing, a,
                [0, 1, 2], bytes_forward=2 * n, bytes_backward=3 * n)
