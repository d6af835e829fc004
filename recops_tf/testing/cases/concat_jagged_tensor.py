"""Cases of concat_jagged_tensor: ragged concat and split of two jagged tensors."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.reference import concat_jagged_tensor as ref
from recops_tf.testing.cases._common import Case, row_offsets, tensor_bytes
from recops_tf.testing.inputs import random_values


def build(fn="concat", batch=4, len_a=6, len_b=3, dim=8, prefix=0,
          dtype=tf.float32, index_dtype=tf.int64, seed=0):
    """Lengths uniform in [0, 2*len) so rows are ragged; fn is "concat" or "split"."""
    rng = np.random.default_rng(seed)
    la = rng.integers(0, 2 * len_a + 1, size=batch)
    lb = rng.integers(0, 2 * len_b + 1, size=batch)
    oa, ob = row_offsets(la, index_dtype), row_offsets(lb, index_dtype)
    a = random_values([int(la.sum()), dim], dtype, seed + 1)
    b = random_values([int(lb.sum()), dim], dtype, seed + 2)
    label = f"{fn} B={batch} La~{len_a} Lb~{len_b} D={dim} p={prefix}"
    total = tensor_bytes(a, b)
    if fn == "concat":
        return Case(label,
                    lambda a, oa, b, ob: recops_tf.concat_jagged_tensor(
                        a, oa, b, ob, n_prefix_from_right=prefix),
                    lambda a, oa, b, ob: ref.concat_jagged_tensor(
                        a, oa, b, ob, n_prefix_from_right=prefix),
                    [a, oa, b, ob], [0, 2], 2 * total, 2 * total)
    values = ref.concat_jagged_tensor(a, oa, b, ob, n_prefix_from_right=prefix)
    return Case(label,
                lambda v, oa, ob: recops_tf.split_jagged_tensor(
                    v, oa, ob, n_prefix_to_right=prefix),
                lambda v, oa, ob: ref.split_jagged_tensor(v, oa, ob, n_prefix_to_right=prefix),
                [values, oa, ob], [0], 2 * total, 2 * total)
