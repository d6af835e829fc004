"""Composite reference of the fused LazyAdam step: TF-Addons LazyAdam's sparse update from
stock ops (negative indices dropped, duplicates summed by unique + segment_sum, then gather,
math and scatter_update of m, v and var)."""
import tensorflow as tf


def lazy_adam_update(var, m, v, gradient, indices, lr, beta1=0.9, beta2=0.999, epsilon=1e-7):
    indices = tf.reshape(indices, [-1])
    keep = indices >= 0
    indices, gradient = tf.boolean_mask(indices, keep), tf.boolean_mask(gradient, keep)
    unique, position = tf.unique(indices)
    g = tf.math.unsorted_segment_sum(gradient, position, tf.shape(unique)[0])
    m_rows = beta1 * tf.gather(m, unique) + (1 - beta1) * g
    v_rows = beta2 * tf.gather(v, unique) + (1 - beta2) * tf.square(g)
    var_rows = tf.gather(var, unique) - lr * m_rows / (tf.sqrt(v_rows) + epsilon)
    m.scatter_update(tf.IndexedSlices(m_rows, unique))
    v.scatter_update(tf.IndexedSlices(v_rows, unique))
    return var.scatter_update(tf.IndexedSlices(var_rows, unique))
