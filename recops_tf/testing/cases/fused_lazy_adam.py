"""Cases of fused_lazy_adam: one LazyAdam step of Zipf rows of a variable or a table."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.reference import fused_lazy_adam as ref
from recops_tf.testing.cases._common import Case, as_step, touched_bytes
from recops_tf.testing.inputs import zipf_ids


def build(target="variable", table_rows=100, touched=64, dim=8, baseline="composite",
          dtype=tf.float32, index_dtype=tf.int64, seed=0):
    """One LazyAdam step of `touched` Zipf rows (duplicates) of a [table_rows, dim] variable
    (or, target "table", of a growing table by address) against the TF-Addons-style composite
    on copies; baseline "keras_adam" times Keras 3's stock Adam on the same IndexedSlices."""
    rng = np.random.default_rng(seed)
    ids = zipf_ids(rng, touched, table_rows)
    gradient = tf.constant(rng.standard_normal((touched, dim)), tf.float32)
    init = [rng.standard_normal((table_rows, dim)).astype(np.float32),
            rng.standard_normal((table_rows, dim)).astype(np.float32) * 0.1,
            rng.random((table_rows, dim)).astype(np.float32)]
    ref_vars = [tf.Variable(x) for x in init]
    lr = 0.01
    label = f"{target} V={table_rows} N={touched} D={dim}"

    def reference(g, i):
        return ref.lazy_adam_update(*ref_vars, g, i, lr)

    nbytes = touched_bytes(ids, dim, 3)
    if target == "table":
        table = recops_tf.DynamicEmbeddingTable(dim, initializer="zeros", num_slots=2)
        table.assign(np.arange(table_rows), np.concatenate(init, axis=1))
        addresses = table.lookup_addresses(ids, training=False)

        def table_state():
            rows = table.export()[1]
            return [rows[:, :dim], rows[:, dim:2 * dim], rows[:, 2 * dim:]], ref_vars

        return Case(label, as_step(lambda a, i: recops_tf.lazy_adam_update(table, None, None,
                                                                           gradient, a, lr)),
                    as_step(lambda a, i: reference(gradient, i)), [addresses, tf.constant(ids)],
                    [], nbytes, 0, state=table_state)
    fused_vars = [tf.Variable(x) for x in init]
    case = Case(label, as_step(lambda g, i: recops_tf.lazy_adam_update(*fused_vars, g, i, lr)),
                as_step(reference), [gradient, tf.constant(ids, index_dtype)], [], nbytes, 0,
                state=lambda: (fused_vars, ref_vars))
    if baseline == "keras_adam":
        import keras

        keras_var = tf.Variable(init[0])
        adam = keras.optimizers.Adam(lr)
        adam.build([keras_var])
        case.label += " vs Keras Adam"
        shape = tf.constant([table_rows, dim], tf.int64)
        case.baseline = as_step(lambda g, i: adam.apply([tf.IndexedSlices(g, i, shape)],
                                                        [keras_var]))
    return case
