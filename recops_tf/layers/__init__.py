"""Keras 3 layers built on the recops_tf ops."""
from recops_tf.layers.hstu_attention import HSTUAttention

__all__ = ["HSTUAttention"]
