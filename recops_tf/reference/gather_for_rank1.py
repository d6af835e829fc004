"""Composite reference of gather_for_rank1 / index_select_for_rank1_backward."""
import tensorflow as tf


def gather_for_rank1(x, index):
    return tf.gather(x, index)


def index_select_for_rank1_backward(grad_y, x, index):
    return tf.math.unsorted_segment_sum(grad_y, index, tf.shape(x)[0])
