"""Cases of in_linear_silu: the UVQK projection with four equal splits."""
import tensorflow as tf

import recops_tf
from recops_tf.reference import in_linear_silu as ref
from recops_tf.testing.cases._common import Case
from recops_tf.testing.inputs import random_values


def build(m=64, k=16, split=8, dtype=tf.float32, seed=0):
    """The UVQK projection with four equal splits (Nw = 4 * split): "rate" counts the GEMM
    FLOPs (2·M·K·Nw forward, twice that backward)."""
    sizes = [split] * 4
    nw = 4 * split
    a = [random_values([m, k], dtype, seed), random_values([nw, k], dtype, seed + 1),
         random_values([nw], dtype, seed + 2)]
    flops = 2 * m * k * nw
    return Case(f"M={m} K={k} Nw={nw}",
                lambda x, w, b: recops_tf.in_linear_silu(x, w, b, sizes),
                lambda x, w, b: ref.in_linear_silu(x, w, b, sizes), a, [0, 1, 2],
                bytes_forward=0, bytes_backward=0, flops_forward=flops,
                flops_backward=2 * flops)
