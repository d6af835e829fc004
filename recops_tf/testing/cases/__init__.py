"""Case builders: for each stem, inputs of a given shape plus the fused and reference callables.

One module per stem of the ops table, named after it (``cases/<stem>.py``); its ``build`` takes
the keys of the stem's ``bench`` shapes in ``recops_tf/_ops_table.py`` as keyword arguments
(and ``dtype``, ``index_dtype`` and ``seed``). What the builders share is in ``_common``.

Used by the benchmark (``recops_tf.bench``), the smoke run, the concurrency and repo-level tests
and ``tools/peak_memory.py``.
"""
from recops_tf.testing.cases import (concat_jagged_tensor, disentangle_attention,
                                     embedding_by_address, fused_lazy_adam,
                                     fused_linear_cross_entropy, fused_sgd, gather_for_rank1,
                                     hstu_dense, hstu_dense_fuxi, in_linear_silu, ln_mul,
                                     multislice_concat, norm_multiply_dropout, pcie_through,
                                     relative_attn_bias, reverse_sequence, token_mixing)
from recops_tf.testing.cases._common import Case

__all__ = ["BUILDERS", "Case", "build"]

# In the order of the ops table.
BUILDERS = {
    "concat_jagged_tensor": concat_jagged_tensor.build,
    "gather_for_rank1": gather_for_rank1.build,
    "reverse_sequence": reverse_sequence.build,
    "multislice_concat": multislice_concat.build,
    "hstu_dense_fuxi": hstu_dense_fuxi.build,
    "relative_attn_bias": relative_attn_bias.build,
    "hstu_dense": hstu_dense.build,
    "ln_mul": ln_mul.build,
    "norm_multiply_dropout": norm_multiply_dropout.build,
    "token_mixing": token_mixing.build,
    "in_linear_silu": in_linear_silu.build,
    "disentangle_attention": disentangle_attention.build,
    "fused_linear_cross_entropy": fused_linear_cross_entropy.build,
    "embedding_by_address": embedding_by_address.build,
    "fused_lazy_adam": fused_lazy_adam.build,
    "fused_sgd": fused_sgd.build,
    "pcie_through": pcie_through.build,
}


def build(stem, shape, **kwargs):
    """The case of `stem` for one benchmark shape of the ops table."""
    return BUILDERS[stem](**dict(shape), **kwargs)
