"""Keras 3 layers built on the recops_tf ops."""
from recops_tf.layers.disentangled_self_attention import DisentangledSelfAttention
from recops_tf.layers.dynamic_embedding import DynamicEmbedding
from recops_tf.layers.fuxi_attention import FuxiAttention
from recops_tf.layers.hstu_attention import HSTUAttention
from recops_tf.layers.hstu_block import HSTUBlock
from recops_tf.layers.relative_attention_bias import RelativeAttentionBias
from recops_tf.layers.token_mixing import TokenMixing

__all__ = ["DisentangledSelfAttention", "DynamicEmbedding", "FuxiAttention", "HSTUAttention",
           "HSTUBlock", "RelativeAttentionBias", "TokenMixing"]
