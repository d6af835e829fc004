"""Cases of pcie_through: one host swap of table rows through a channel."""
import numpy as np
import tensorflow as tf

import recops_tf
from recops_tf.ops._common import lib
from recops_tf.reference import pcie_through as ref
from recops_tf.testing.cases._common import Case


def build(tables=2, table_rows=100, swapped=16, dim=8, dtype=tf.float32, seed=0):
    """One host swap of `swapped` rows out and `swapped` rows in (some rows both: all reads
    come first) on `tables` [table_rows, dim] variables, through one channel that carries the
    swap-out item back in (push, then pop), against the FIFOQueue composite on copies."""
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal((table_rows, dim)).astype(np.float32) for _ in range(tables)]
    fused_tables = [tf.Variable(x) for x in init]
    ref_tables = [tf.Variable(x) for x in init]
    swap_out = tf.constant(rng.choice(table_rows, swapped, replace=False), tf.int64)
    swap_in = tf.constant(rng.choice(table_rows, swapped, replace=False), tf.int64)
    channel = recops_tf.HostChannel(capacity=2)
    queue = tf.queue.FIFOQueue(2, [tf.float32])

    def auxiliary():
        # The channel ops the step does not use: create, push, size, pop, close.
        fresh = lib().recops_host_channel(capacity=2)
        lib().recops_host_channel_push(fresh, tf.constant([1.0, 2.0]))
        tf.debugging.assert_equal(lib().recops_host_channel_size(fresh), tf.constant(1, tf.int64))
        tf.debugging.assert_equal(lib().recops_host_channel_pop(fresh, dtype=tf.float32),
                                  tf.constant([1.0, 2.0]))
        lib().recops_host_channel_close(fresh)

    return Case(f"T={tables} V={table_rows} N={swapped} D={dim}",
                lambda i, o: recops_tf.rma_swap_multi_tables(i, o, fused_tables, channel,
                                                             channel),
                lambda i, o: ref.rma_swap_multi_tables(i, o, ref_tables, queue, queue),
                [swap_in, swap_out], [], 2 * 2 * swapped * tables * dim * 4, 0,
                state=lambda: (fused_tables, ref_tables), auxiliary=auxiliary)
