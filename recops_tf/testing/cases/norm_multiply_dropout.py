"""Cases of norm_multiply_dropout: ln_mul with dropout, timed against the stock composite."""
import tensorflow as tf

import recops_tf
from recops_tf.reference import ln_mul as ref_ln_mul
from recops_tf.reference import norm_multiply_dropout as ref
from recops_tf.testing.cases._common import Case, norm_mul_args


def build(rows=64, cols=32, dropout_rate=0.1, dtype=tf.float32, seed=0):
    """As ln_mul, with dropout. The reference rebuilds the kernel's mask (with uint64 ops, slow);
    the benchmark's baseline is the natural composite: LayerNorm, multiply and
    tf.nn.experimental.stateless_dropout (its own mask)."""
    a = norm_mul_args(rows, cols, dtype, seed)
    n = rows * cols * a[0].dtype.size
    seed_pair = tf.constant([seed, 1], tf.int64)

    def fused(x, u, w, b):
        return recops_tf.norm_multiply_dropout(x, u, w, b, dropout_rate=dropout_rate,
                                               seed=seed_pair)

    def reference(x, u, w, b):
        return ref.norm_multiply_dropout(x, u, w, b, dropout_rate=dropout_rate,
                                         seed=seed_pair)

    def composite(x, u, w, b):
        y = ref_ln_mul.ln_mul(x, u, w, b)
        if dropout_rate > 0.0:
            y = tf.nn.experimental.stateless_dropout(y, dropout_rate, seed=seed_pair)
        return y

    return Case(f"R={rows} C={cols} p={dropout_rate}", fused, reference, a, [0, 1, 2, 3],
                bytes_forward=3 * n, bytes_backward=5 * n, baseline=composite)
