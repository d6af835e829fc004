"""Cases of embedding_by_address: by-address lookup and update of a growing table."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.ops._common import lib
from recops_tf.reference import embedding_by_address as ref
from recops_tf.testing.cases._common import Case


def build(fn="lookup", table_rows=100, num_lookup=64, dim=8, dtype=tf.float32,
          index_dtype=None, seed=0):
    """fn "lookup": by-address lookup of num_lookup uniform rows (some address 0) against
    tf.gather on a variable holding the same rows; fn "update": by-address add against a
    variable's scatter_add."""
    rng = np.random.default_rng(seed)
    table, rows = _mirrored_table(rng, table_rows, dim, 0)
    ids = rng.integers(0, table_rows, size=num_lookup)
    addresses = table.lookup_addresses(ids, training=False)
    ids = tf.constant(ids)
    var = tf.Variable(rows)
    label = f"{fn} V={table_rows} N={num_lookup} D={dim}"
    if fn == "lookup":
        return Case(label, lambda a, i: recops_tf.embedding_lookup_by_address(table, a),
                    lambda a, i: ref.embedding_lookup(var, i), [addresses, ids], [],
                    num_lookup * (8 + 2 * 4 * dim), 0, auxiliary=_table_auxiliary(table))
    values = tf.constant(rng.standard_normal((num_lookup, dim)), tf.float32)

    def reference(a, i, x):
        var.scatter_add(tf.IndexedSlices(x, i))
        return x

    return Case(label, lambda a, i, x: recops_tf.embedding_update_by_address(table, a, x),
                reference,
                [addresses, ids, values], [], num_lookup * (8 + 3 * 4 * dim), 0,
                state=lambda: ([table.export()[1]], [var]))


def _mirrored_table(rng, num_rows, dim, num_slots):
    """A table whose key k is row k (so row ids index a dense mirror), full rows random."""
    table = recops_tf.DynamicEmbeddingTable(dim, initializer="zeros", num_slots=num_slots)
    rows = rng.standard_normal((num_rows, table.width)).astype(np.float32)
    if num_slots >= 2:  # v >= 0
        rows[:, 2 * dim:3 * dim] = np.abs(rows[:, 2 * dim:3 * dim])
    table.assign(np.arange(num_rows), rows)
    return table, rows


def _table_auxiliary(table):
    """Uses the table ops not in the timed case: create, lookup/insert, size, export, import."""
    def auxiliary():
        fresh = table._create_resource()
        addresses = lib().recops_dynamic_embedding_lookup_addresses(
            fresh, tf.constant([5, 6, 5], tf.int64), True)
        keys, rows = table.export()
        table.assign(keys, rows)
        tf.debugging.assert_equal(table.size(), tf.size(keys, out_type=tf.int64))
        tf.debugging.assert_equal(addresses[0], addresses[2])
    return auxiliary
