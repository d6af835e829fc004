"""Composite reference of reverse_sequence."""
import tensorflow as tf


def reverse_sequence(x, seq_lengths):
    return tf.reverse_sequence(x, seq_lengths, seq_axis=1, batch_axis=0)
