"""Cases of fused_linear_cross_entropy: softmax cross-entropy of each position's target over a
whole item matrix."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.reference import fused_linear_cross_entropy as ref
from recops_tf.testing.cases._common import Case
from recops_tf.testing.inputs import random_values


def build(p=70, n=300, d=16, dtype=tf.float32, index_dtype=tf.int64, seed=0):
    """The loss of p positions' states [p, d] against n items [n, d] (targets uniform over the
    items, no bias, extra logits, smoothing or weights), differentiated w.r.t. states and
    items; the reference is the composite with the [p, n] logits (in float32 for float32 and
    bfloat16 inputs).

    "rate" counts the useful GEMM FLOPs, those the composite does too: 2·p·n·d forward (the
    logits), 4·p·n·d backward (dstates = G·items and ditems = Gᵀ·states). The fused backward
    also recomputes the logits tile by tile (another 2·p·n·d) instead of reading a stored
    [p, n] matrix; that recompute is the price of its O((p + n) d) memory and is not counted,
    so its rate is comparable with the composite's."""
    label = f"P={p} N={n} d={d}"
    if tf.as_dtype(dtype) not in (tf.float32, tf.bfloat16, tf.float64):
        # No float16 kernel: the float32 case, so that `bench --dtype float16` still runs.
        dtype, label = tf.float32, label + " (float32: no float16 kernel)"
    rng = np.random.default_rng(seed)
    targets = tf.constant(rng.integers(0, n, size=p), index_dtype)
    a = [random_values([p, d], dtype, seed + 1), random_values([n, d], dtype, seed + 2)]
    flops = 2 * p * n * d

    def one_pass():
        """The one-pass form (gradients_in_forward: FusedLinearCrossEntropyWithGrad and
        FusedLinearCrossEntropyApplyGrad) of a mean loss: its value and gradients."""
        with tf.GradientTape() as tape:
            tape.watch(a)
            loss = tf.reduce_mean(recops_tf.fused_linear_cross_entropy(
                a[0], a[1], targets, gradients_in_forward=True))
        return [loss] + tape.gradient(loss, a)

    return Case(label,
                lambda s, e: recops_tf.fused_linear_cross_entropy(s, e, targets),
                lambda s, e: ref.fused_linear_cross_entropy(s, e, targets)[0],
                a, [0, 1], bytes_forward=0, bytes_backward=0, flops_forward=flops,
                flops_backward=2 * flops, upstream_dtype=tf.float64 if dtype == tf.float64
                else tf.float32, auxiliary=one_pass)
