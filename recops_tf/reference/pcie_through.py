"""Composite reference of the host swap (the Rec SDK's non-fused path, `_get_swap_info`):
concat of the tables' gathered rows enqueued on a `tf.queue.FIFOQueue`, then, after it, one
item dequeued, split per table and written with `scatter_nd_update`."""
import tensorflow as tf


def rma_swap_multi_tables(swap_in_index, swap_out_index, tables, queue_in, queue_out):
    """`queue_in` / `queue_out`: `tf.queue.FIFOQueue`s of one float32 component."""
    swap_out_index = tf.cast(swap_out_index, tf.int64)
    swap_in_index = tf.cast(swap_in_index, tf.int64)
    out = tf.concat([tf.gather(t, swap_out_index) for t in tables], axis=1)
    with tf.control_dependencies([queue_out.enqueue(out)]):
        item = queue_in.dequeue()
    pieces = tf.split(item, len(tables), axis=1)
    writes = [t.scatter_nd_update(swap_in_index[:, None], p) for t, p in zip(tables, pieces)]
    with tf.control_dependencies(writes):
        return tf.constant(0, tf.int64)
