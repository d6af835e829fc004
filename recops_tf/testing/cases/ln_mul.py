"""Cases of ln_mul: LayerNorm · u."""
import tensorflow as tf

import recops_tf
from recops_tf.reference import ln_mul as ref
from recops_tf.testing.cases._common import Case, norm_mul_args


def build(rows=64, cols=32, dtype=tf.float32, seed=0):
    """LayerNorm · u over [rows, cols]: memory-bound (x, u read, y written; backward: dy, x,
    u read, dx, du written)."""
    a = norm_mul_args(rows, cols, dtype, seed)
    n = rows * cols * a[0].dtype.size
    return Case(f"R={rows} C={cols}", recops_tf.ln_mul, ref.ln_mul, a, [0, 1, 2, 3],
                bytes_forward=3 * n, bytes_backward=5 * n)
