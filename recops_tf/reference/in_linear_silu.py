"""Composite reference of stem in_linear_silu in stock TF (matmul, bias, SiLU, split; also the
benchmark baseline)."""
import tensorflow as tf


def in_linear_silu(x, weight, bias, split_sizes, *, weight_layout="nk"):
    if isinstance(x, tf.RaggedTensor):
        outs = in_linear_silu(x.flat_values, weight, bias, split_sizes,
                              weight_layout=weight_layout)
        return tuple(x.with_flat_values(o) for o in outs)
    z = tf.tensordot(x, weight, [[x.shape.rank - 1], [1 if weight_layout == "nk" else 0]])
    return tuple(tf.split(tf.nn.silu(z + bias), list(split_sizes), axis=-1))
