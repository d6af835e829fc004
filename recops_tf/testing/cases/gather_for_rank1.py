"""Cases of gather_for_rank1: a gather of uniform indices from a rank-1 table."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.reference import gather_for_rank1 as ref
from recops_tf.testing.cases._common import Case
from recops_tf.testing.inputs import random_values


def build(table=50, num_index=64, dtype=tf.float32, index_dtype=tf.int64, seed=0):
    rng = np.random.default_rng(seed)
    x = random_values([table], dtype, seed + 1)
    index = tf.constant(rng.integers(0, table, size=num_index), dtype=index_dtype)
    k = num_index
    return Case(f"E={table} K={num_index}", recops_tf.gather_for_rank1, ref.gather_for_rank1,
                [x, index], [0],
                bytes_forward=k * (index.dtype.size + x.dtype.size) + table * x.dtype.size,
                bytes_backward=k * (index.dtype.size + x.dtype.size) + table * x.dtype.size)
