"""Composite reference of concat_jagged_tensor / split_jagged_tensor from stock TF ops."""
import tensorflow as tf


def _a_row_mask(offsets_a, offsets_b, n_prefix):
    """Boolean [RA+RB]: True where a row of the concatenation comes from A."""
    offsets_a = tf.cast(offsets_a, tf.int64)
    offsets_b = tf.cast(offsets_b, tf.int64)
    splits = offsets_a + offsets_b
    len_a = offsets_a[1:] - offsets_a[:-1]
    len_b = offsets_b[1:] - offsets_b[:-1]
    q = tf.minimum(tf.cast(n_prefix, tf.int64), len_b)
    seg = tf.ragged.row_splits_to_segment_ids(splits)
    pos = tf.range(splits[-1]) - tf.gather(splits, seg)
    start = tf.gather(q, seg)
    return (pos >= start) & (pos < start + tf.gather(len_a, seg))


def concat_jagged_tensor(values_a, offsets_a, values_b, offsets_b, n_prefix_from_right=0):
    if n_prefix_from_right == 0:
        # The stock RaggedTensor concat along the ragged axis.
        rt_a = tf.RaggedTensor.from_row_splits(values_a, tf.cast(offsets_a, tf.int64))
        rt_b = tf.RaggedTensor.from_row_splits(values_b, tf.cast(offsets_b, tf.int64))
        return tf.concat([rt_a, rt_b], axis=1).values
    is_a = _a_row_mask(offsets_a, offsets_b, n_prefix_from_right)
    rows = tf.range(tf.shape(is_a)[0])  # dynamic_stitch takes int32 indices
    return tf.dynamic_stitch(
        [tf.boolean_mask(rows, is_a), tf.boolean_mask(rows, ~is_a)], [values_a, values_b])


def split_jagged_tensor(values, offsets_a, offsets_b, n_prefix_to_right=0):
    is_a = _a_row_mask(offsets_a, offsets_b, n_prefix_to_right)
    return tf.boolean_mask(values, is_a), tf.boolean_mask(values, ~is_a)
