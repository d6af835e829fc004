"""Cases of multislice_concat: random (possibly overlapping) column slices, concatenated."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.reference import multislice_concat as ref
from recops_tf.testing.cases._common import Case, tensor_bytes
from recops_tf.testing.inputs import random_values


def multislice_slices(cols, outputs, slices_per_output, seed=0):
    """Random (possibly overlapping) slices: begins, lengths (some -1) and concat sizes."""
    rng = np.random.default_rng(seed)
    width = max(1, cols // (outputs * slices_per_output))
    begins, lengths = [], []
    for _ in range(outputs * slices_per_output):
        b = int(rng.integers(0, cols))
        if b + width >= cols:
            begins.append(b)
            lengths.append(-1 if rng.integers(0, 2) else cols - b)
        else:
            begins.append(b)
            lengths.append(width)
    return [slices_per_output] * outputs, begins, lengths


def build(rows=5, cols=12, outputs=3, slices_per_output=2, dtype=tf.float32,
          index_dtype=None, seed=0):
    sizes, begins, lengths = multislice_slices(cols, outputs, slices_per_output, seed)
    x = random_values([rows, cols], dtype, seed + 1)
    out_cols = sum(cols - b if n == -1 else n for b, n in zip(begins, lengths))
    out_bytes = rows * out_cols * x.dtype.size
    return Case(f"R={rows} D={cols} C={outputs}x{slices_per_output}",
                lambda x: recops_tf.multislice_concat(x, sizes, begins, lengths),
                lambda x: ref.multislice_concat(x, sizes, begins, lengths),
                [x], [0], 2 * out_bytes, out_bytes + tensor_bytes(x))
