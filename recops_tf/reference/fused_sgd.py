"""Composite reference of the fused SGD step (the Rec SDK's non-fused path):
scatter_add(var, idx, -lr * (g + wd * gather(var, idx))), the gather taken before the scatter
and negative indices dropped."""
import tensorflow as tf


def sgd_update(var, gradient, indices, lr, weight_decay=0.0):
    indices = tf.reshape(indices, [-1])
    keep = indices >= 0
    indices, gradient = tf.boolean_mask(indices, keep), tf.boolean_mask(gradient, keep)
    step = gradient + weight_decay * tf.gather(var, indices) if weight_decay else gradient
    return var.scatter_add(tf.IndexedSlices(-lr * step, indices))
