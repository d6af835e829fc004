"""Cases of reverse_sequence: [B, T, D] rows reversed up to random lengths."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.reference import reverse_sequence as ref
from recops_tf.testing.cases._common import Case, tensor_bytes
from recops_tf.testing.inputs import random_values


def build(batch=3, steps=7, dim=4, dtype=tf.float32, index_dtype=tf.int64, seed=0):
    rng = np.random.default_rng(seed)
    x = random_values([batch, steps, dim], dtype, seed + 1)
    lens = tf.constant(rng.integers(0, steps + 1, size=batch), dtype=index_dtype)
    return Case(f"B={batch} T={steps} D={dim}", recops_tf.reverse_sequence,
                ref.reverse_sequence, [x, lens], [0], 2 * tensor_bytes(x), 2 * tensor_bytes(x))
