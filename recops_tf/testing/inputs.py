"""Random inputs, reproducible from a seed: values already rounded to a dtype, upstream
gradients for a function's outputs and Zipf-popular row ids.

Shared by the assertion helpers (``recops_tf.testing``), the case builders
(``recops_tf.testing.cases``) and the tests; it asserts nothing.
"""
import numpy as np
import tensorflow as tf


def random_values(shape, dtype, seed=0, low=-1.0, high=1.0):
    """Random values already rounded to `dtype` (ints: in [low*100, high*100))."""
    rng = np.random.default_rng(seed)
    dtype = tf.as_dtype(dtype)
    if dtype.is_integer:
        return tf.constant(rng.integers(int(low * 100), int(high * 100), size=shape),
                           dtype=dtype)
    return tf.cast(tf.constant(rng.uniform(low, high, size=shape)), dtype)


def upstream_like(outputs, dtype, seed=1):
    """Random upstream gradients (rounded to `dtype`), one per output."""
    ups = []
    for i, out in enumerate(tf.nest.flatten(outputs)):
        if isinstance(out, tf.RaggedTensor):
            out = out.flat_values
        ups.append(random_values(out.shape, dtype, seed=seed + i))
    return ups


def zipf_ids(rng, count, num_rows, a=1.2):
    """Row ids with a Zipf(a) popularity (many duplicates), spread over [0, num_rows)."""
    ranks = rng.zipf(a, size=count) - 1
    return (ranks * 2654435761 % num_rows).astype(np.int64)
