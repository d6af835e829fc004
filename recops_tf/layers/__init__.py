"""Keras 3 layers built on the recops_tf ops."""
from recops_tf.layers.fuxi_attention import FuxiAttention
from recops_tf.layers.hstu_attention import HSTUAttention
from recops_tf.layers.hstu_block import HSTUBlock
from recops_tf.layers.relative_attention_bias import RelativeAttentionBias

__all__ = ["FuxiAttention", "HSTUAttention", "HSTUBlock", "RelativeAttentionBias"]
