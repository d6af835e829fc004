"""Composite reference of multislice_concat: strided slices and concats."""
import tensorflow as tf


def multislice_concat(x, concat_sizes, slice_begins, slice_lengths):
    outputs, s = [], 0
    for size in concat_sizes:
        parts = []
        for _ in range(size):
            begin, length = slice_begins[s], slice_lengths[s]
            parts.append(x[:, begin:] if length == -1 else x[:, begin:begin + length])
            s += 1
        outputs.append(tf.concat(parts, axis=1))
    return outputs
