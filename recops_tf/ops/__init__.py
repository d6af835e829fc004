"""Public op wrappers; importing this package registers every gradient (once)."""
from recops_tf.ops.concat_jagged_tensor import concat_jagged_tensor, split_jagged_tensor
from recops_tf.ops.hstu_dense import (hstu_attention, hstu_attention_cached,
                                      hstu_attention_paged)
from recops_tf.ops.hstu_dense_fuxi import hstu_attention_fuxi
from recops_tf.ops.disentangle_attention import disentangle_attention
from recops_tf.ops.embedding_by_address import (DynamicEmbeddingTable, embedding_lookup,
                                                embedding_lookup_by_address,
                                                embedding_update_by_address)
from recops_tf.ops.fused_lazy_adam import lazy_adam_update
from recops_tf.ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from recops_tf.ops.fused_sgd import sgd_update
from recops_tf.ops.gather_for_rank1 import gather_for_rank1, index_select_for_rank1_backward
from recops_tf.ops.in_linear_silu import in_linear_silu
from recops_tf.ops.ln_mul import ln_mul
from recops_tf.ops.multislice_concat import multislice_concat
from recops_tf.ops.norm_multiply_dropout import norm_multiply_dropout
from recops_tf.ops.pcie_through import HostChannel, rma_swap_multi_tables
from recops_tf.ops.relative_attn_bias import (relative_attn_bias_backward,
                                              relative_attn_bias_pos, relative_attn_bias_time,
                                              toeplitz_position_bias)
from recops_tf.ops.reverse_sequence import reverse_sequence
from recops_tf.ops.token_mixing import token_mixing

__all__ = [
    "concat_jagged_tensor",
    "split_jagged_tensor",
    "gather_for_rank1",
    "index_select_for_rank1_backward",
    "hstu_attention",
    "hstu_attention_paged",
    "hstu_attention_cached",
    "hstu_attention_fuxi",
    "multislice_concat",
    "disentangle_attention",
    "in_linear_silu",
    "ln_mul",
    "norm_multiply_dropout",
    "relative_attn_bias_time",
    "relative_attn_bias_backward",
    "relative_attn_bias_pos",
    "toeplitz_position_bias",
    "reverse_sequence",
    "token_mixing",
    "DynamicEmbeddingTable",
    "embedding_lookup",
    "embedding_lookup_by_address",
    "embedding_update_by_address",
    "lazy_adam_update",
    "fused_linear_cross_entropy",
    "sgd_update",
    "HostChannel",
    "rma_swap_multi_tables",
]
