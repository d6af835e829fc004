"""Composite references of embedding_by_address on a dense mirror of the table.

`params` is the table as a dense [V, width] matrix and `rows` the row index of each address
(-1 for address 0), which is what the addresses name."""
import tensorflow as tf


def embedding_lookup_by_address(params, rows, embedding_dim=None):
    embedding_dim = embedding_dim or params.shape[1]
    gathered = tf.gather(params, tf.maximum(rows, 0))[..., :embedding_dim]
    return tf.where((rows >= 0)[..., None], gathered, tf.zeros_like(gathered))


def embedding_update_by_address(params, rows, values, update_type="add"):
    """The updated params: add sums duplicates; assign keeps each row's last occurrence."""
    valid = rows >= 0
    rows, values = tf.boolean_mask(rows, valid), tf.boolean_mask(values, valid)
    width, d = params.shape[1], values.shape[1]
    values = tf.pad(values, [[0, 0], [0, width - values.shape[1]]])
    if update_type == "add":
        return tf.tensor_scatter_nd_add(params, rows[:, None], values)
    position = tf.range(tf.shape(rows)[0])
    last = tf.math.unsorted_segment_max(position, rows, tf.shape(params)[0])
    keep = tf.equal(tf.gather(last, rows), position)
    rows, values = tf.boolean_mask(rows, keep), tf.boolean_mask(values, keep)
    old = tf.gather(params, rows)
    mask = tf.cast(tf.range(width) < d, params.dtype)
    return tf.tensor_scatter_nd_update(params, rows[:, None], values * mask + old * (1 - mask))


def embedding_lookup(params, ids):
    return tf.gather(params, ids)
