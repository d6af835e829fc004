"""Cases of fused_sgd: one SGD step (weight decay) of Zipf rows of a variable or a table."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.reference import fused_sgd as ref
from recops_tf.testing.cases._common import Case, as_step, touched_bytes
from recops_tf.testing.inputs import zipf_ids


def build(target="variable", table_rows=100, touched=64, dim=8, weight_decay=0.01,
          dtype=tf.float32, index_dtype=tf.int64, seed=0):
    """One SGD step (weight decay) of `touched` Zipf rows of a variable (or a table by
    address) against the scatter_add composite on a copy."""
    rng = np.random.default_rng(seed)
    ids = zipf_ids(rng, touched, table_rows)
    gradient = tf.constant(rng.standard_normal((touched, dim)), tf.float32)
    init = rng.standard_normal((table_rows, dim)).astype(np.float32)
    ref_var = tf.Variable(init)
    lr = 0.1
    label = f"{target} V={table_rows} N={touched} D={dim} wd={weight_decay}"

    def reference(g, i):
        return ref.sgd_update(ref_var, g, i, lr, weight_decay)

    nbytes = touched_bytes(ids, dim, 1)
    if target == "table":
        table = recops_tf.DynamicEmbeddingTable(dim, initializer="zeros")
        table.assign(np.arange(table_rows), init)
        addresses = table.lookup_addresses(ids, training=False)
        return Case(label, as_step(lambda a, i: recops_tf.sgd_update(table, gradient, a, lr,
                                                                     weight_decay)),
                    as_step(lambda a, i: reference(gradient, i)), [addresses, tf.constant(ids)],
                    [], nbytes, 0, state=lambda: ([table.export()[1]], [ref_var]))
    fused_var = tf.Variable(init)
    return Case(label, as_step(lambda g, i: recops_tf.sgd_update(fused_var, g, i, lr,
                                                                 weight_decay)),
                as_step(reference), [gradient, tf.constant(ids, index_dtype)], [], nbytes, 0,
                state=lambda: ([fused_var], [ref_var]))
