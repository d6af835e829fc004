"""The ops table: one row per op stem, the single list every harness reads.

Tests check that every op in the library has a row, a public wrapper, a reference, a test file
and a docstring; ``recops_tf.bench`` times each row's benchmark shapes; ``tools/regen.py``
generates ``docs/ops.md`` from the rows and the wrappers' docstrings.
"""
import dataclasses
from typing import Mapping, Tuple

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
INDEX_DTYPES = ("int32", "int64")


@dataclasses.dataclass(frozen=True)
class OpStem:
    stem: str
    seed_ops: Tuple[str, ...]  # operator names in the Rec SDK
    tf_ops: Tuple[str, ...]  # registered op names (without the "Recops>" prefix)
    public: Tuple[str, ...]  # functions of recops_tf
    gradient: str  # how the forward is differentiated
    reference: Tuple[str, ...]  # functions of recops_tf.reference.<stem>, one per public fn
    dtypes: Tuple[str, ...]  # value dtypes (forward)
    index_dtypes: Tuple[str, ...]  # offsets / index / length dtypes
    bound: str  # "memory" or "compute": which machine ceiling the benchmark compares with
    # Benchmark shapes by size ("tiny" runs in the test suite, "full" is the real benchmark);
    # the keys are the arguments of the stem's case builder, recops_tf/testing/cases/<stem>.py.
    bench: Mapping[str, Tuple[Mapping[str, object], ...]]
    # Stateful stems (a table resource, in-place optimizer steps): their cases compare state
    # after one step, and they have no forward+backward benchmark.
    stateful: bool = False


OPS = (
    OpStem(
        stem="concat_jagged_tensor",
        seed_ops=("concat_jagged_tensor", "concat_jagged_tensor_grad"),
        tf_ops=("ConcatJaggedTensor", "ConcatJaggedTensorGrad"),
        public=("concat_jagged_tensor", "split_jagged_tensor"),
        gradient="each is the other's gradient (split <-> concat, same offsets and prefix)",
        reference=("concat_jagged_tensor", "split_jagged_tensor"),
        dtypes=FLOAT_DTYPES + ("int32", "int64"),
        index_dtypes=INDEX_DTYPES,
        bound="memory",
        bench={
            "tiny": ({"fn": "concat", "batch": 4, "len_a": 6, "len_b": 3, "dim": 8, "prefix": 0},
                     {"fn": "split", "batch": 4, "len_a": 6, "len_b": 3, "dim": 8, "prefix": 2}),
            "full": ({"fn": "concat", "batch": 1024, "len_a": 256, "len_b": 32, "dim": 64,
                      "prefix": 0},
                     {"fn": "concat", "batch": 1024, "len_a": 256, "len_b": 32, "dim": 64,
                      "prefix": 8},
                     {"fn": "split", "batch": 1024, "len_a": 256, "len_b": 32, "dim": 64,
                      "prefix": 0}),
        },
    ),
    OpStem(
        stem="gather_for_rank1",
        seed_ops=("gather_for_rank1", "index_select_for_rank1_backward"),
        tf_ops=("GatherForRank1", "IndexSelectForRank1Backward"),
        public=("gather_for_rank1", "index_select_for_rank1_backward"),
        gradient="IndexSelectForRank1Backward (deterministic scatter-add); it is linear, its "
                 "gradient is GatherForRank1",
        reference=("gather_for_rank1", "index_select_for_rank1_backward"),
        dtypes=FLOAT_DTYPES,
        index_dtypes=INDEX_DTYPES,
        bound="memory",
        bench={
            "tiny": ({"table": 50, "num_index": 64},),
            "full": ({"table": 20480, "num_index": 8 * 1024 * 1024},),
        },
    ),
    OpStem(
        stem="reverse_sequence",
        seed_ops=("reverse_sequence",),
        tf_ops=("ReverseSequence",),
        public=("reverse_sequence",),
        gradient="itself (reverse_sequence of the upstream gradient)",
        reference=("reverse_sequence",),
        dtypes=FLOAT_DTYPES + ("int64",),
        index_dtypes=INDEX_DTYPES,
        bound="memory",
        bench={
            "tiny": ({"batch": 3, "steps": 7, "dim": 4},),
            "full": ({"batch": 256, "steps": 512, "dim": 128},),
        },
    ),
    OpStem(
        stem="multislice_concat",
        seed_ops=("multislice_concat",),
        tf_ops=("MultisliceConcat", "MultisliceConcatGrad"),
        public=("multislice_concat",),
        gradient="MultisliceConcatGrad (scatter-add adjoint, overlaps accumulate); its "
                 "gradient is MultisliceConcat",
        reference=("multislice_concat",),
        dtypes=FLOAT_DTYPES,
        index_dtypes=(),
        bound="memory",
        bench={
            "tiny": ({"rows": 5, "cols": 12, "outputs": 3, "slices_per_output": 2},),
            "full": ({"rows": 65536, "cols": 512, "outputs": 8, "slices_per_output": 4},),
        },
    ),
    OpStem(
        stem="hstu_dense_fuxi",
        seed_ops=("hstu_dense_forward_fuxi", "hstu_dense_backward_fuxi"),
        tf_ops=("HstuFuxiForward", "HstuFuxiBackward"),
        public=("hstu_attention_fuxi",),
        gradient="HstuFuxiBackward (dq, dk, dv, d_timestamp_bias, d_position_bias; scores "
                 "recomputed per tile, upstream in the forward's layout); second order raises",
        reference=("hstu_attention_fuxi",),
        dtypes=FLOAT_DTYPES,
        index_dtypes=INDEX_DTYPES,
        bound="compute",
        bench={
            "tiny": ({"batch": 3, "max_len": 70, "heads": 2, "dim": 8},),
            "full": ({"batch": 32, "max_len": 1024, "heads": 4, "dim": 64},),
        },
    ),
    OpStem(
        stem="relative_attn_bias",
        seed_ops=("relative_attn_bias_time", "relative_attn_bias_pos",
                  "relative_attn_bias_backward"),
        tf_ops=("RelativeAttnBiasTime", "RelativeAttnBiasBackward", "RelativeAttnBiasPos",
                "RelativeAttnBiasPosBackward"),
        public=("relative_attn_bias_time", "relative_attn_bias_backward",
                "relative_attn_bias_pos", "toeplitz_position_bias"),
        gradient="time bias: RelativeAttnBiasBackward w.r.t. the weights (deterministic "
                 "scatter-add), whose own gradient is a gather (TF composite); position "
                 "bias: RelativeAttnBiasPosBackward (one pass, deterministic), second order "
                 "raises; toeplitz_position_bias is a composite",
        reference=("relative_attn_bias_time", "relative_attn_bias_backward",
                   "relative_attn_bias_pos", "toeplitz_position_bias"),
        dtypes=FLOAT_DTYPES,
        index_dtypes=INDEX_DTYPES,
        bound="memory",
        bench={
            "tiny": ({"fn": "time", "layers": 2, "batch": 3, "steps": 5},
                     {"fn": "pos", "batch": 3, "steps": 6}),
            # The time bias is output-write bound: L x B x 2s x 2s values (537 MB here).
            "full": ({"fn": "time", "layers": 8, "batch": 64, "steps": 256},
                     {"fn": "pos", "batch": 64, "steps": 512}),
        },
    ),
    OpStem(
        stem="hstu_dense",
        seed_ops=("hstu_dense_forward", "hstu_dense_backward", "hstu_backward_v2"),
        tf_ops=("HstuDenseForward", "HstuDenseBackward", "HstuPagedForward",
                "HstuCachedForward"),
        public=("hstu_attention", "hstu_attention_paged", "hstu_attention_cached"),
        gradient="HstuDenseBackward (dq, dk, dv, d_attn_bias = dS, the relative-bias weights; "
                 "scores recomputed per "
                 "tile); second order not implemented (raises); the paged and the cached "
                 "forwards are inference only (raise)",
        reference=("hstu_attention", "hstu_attention_paged", "hstu_attention_cached"),
        dtypes=FLOAT_DTYPES,
        index_dtypes=INDEX_DTYPES,
        bound="compute",
        bench={
            "tiny": ({"batch": 3, "max_len": 70, "heads": 2, "dim": 8},
                     {"batch": 3, "max_len": 40, "heads": 2, "dim": 8, "paged": True},
                     {"batch": 2, "max_len": 40, "heads": 2, "dim": 8, "cached": 2},
                     {"batch": 3, "max_len": 70, "heads": 2, "dim": 8, "rel_bias": True},
                     {"batch": 3, "max_len": 70, "heads": 2, "dim": 8, "gr_window": 8}),
            # Lengths uniform in [1, L], causal, float32. At L = 4096 the padded composite's
            # [B, H, L, L] scores need ~1 GB per tensor per 4 sequences: B = 4 keeps it in memory.
            "full": ({"batch": 32, "max_len": 256, "heads": 4, "dim": 64},
                     {"batch": 32, "max_len": 1024, "heads": 4, "dim": 64},
                     {"batch": 4, "max_len": 4096, "heads": 4, "dim": 64},
                     {"batch": 256, "max_len": 2048, "heads": 4, "dim": 64, "paged": True,
                      "page_size": 128},
                     # One new event of each of 8 users over a 1,000-event cache (serving).
                     {"batch": 8, "max_len": 1001, "heads": 1, "dim": 50, "cached": 1},
                     # The fused relative bias against the dense bias built by the separate
                     # ops ([B, H, L, L], 512 MB here) fed to the same attention.
                     {"batch": 32, "max_len": 1024, "heads": 4, "dim": 64, "rel_bias": True},
                     # GR's mask rules (window + context + targets) against the Rec SDK
                     # rules' nearest equivalent on the same shape (the baseline).
                     {"batch": 32, "max_len": 1024, "heads": 4, "dim": 64, "gr_window": 256}),
        },
    ),

    OpStem(
        stem="ln_mul",
        seed_ops=("ln_mul",),
        tf_ops=("LnMul", "LnMulGrad"),
        public=("ln_mul",),
        gradient="LnMulGrad (dx, du, dgamma, dbeta; statistics recomputed; deterministic "
                 "column sums; the seed has no backward); second order not implemented",
        reference=("ln_mul",),
        dtypes=FLOAT_DTYPES,
        index_dtypes=(),
        bound="memory",
        bench={
            "tiny": ({"rows": 64, "cols": 32},),
            "full": ({"rows": 65536, "cols": 512},),
        },
    ),
    OpStem(
        stem="norm_multiply_dropout",
        seed_ops=("norm_multiply_dropout", "norm_multiply_dropout_backward"),
        tf_ops=("NormMultiplyDropout", "NormMultiplyDropoutBackward"),
        public=("norm_multiply_dropout",),
        gradient="NormMultiplyDropoutBackward (dx, du, dweight, dbias; the mask recomputed "
                 "from the seed); second order not implemented",
        reference=("norm_multiply_dropout",),
        dtypes=FLOAT_DTYPES,
        index_dtypes=INDEX_DTYPES,
        bound="memory",
        bench={
            "tiny": ({"rows": 64, "cols": 32, "dropout_rate": 0.1},),
            "full": ({"rows": 65536, "cols": 512, "dropout_rate": 0.0},
                     {"rows": 65536, "cols": 512, "dropout_rate": 0.1}),
        },
    ),

    OpStem(
        stem="token_mixing",
        seed_ops=("token_mixing",),
        tf_ops=("TokenMixing", "TokenMixingGrad"),
        public=("token_mixing",),
        gradient="TokenMixingGrad (dx = dt + dtᵀ, dgamma, dbeta; deterministic; the seed has "
                 "no backward); second order not implemented",
        reference=("token_mixing",),
        dtypes=FLOAT_DTYPES,
        index_dtypes=(),
        bound="memory",
        bench={
            "tiny": ({"batch": 3, "s": 16},),
            "full": ({"batch": 1024, "s": 256},),
        },
    ),

    OpStem(
        stem="in_linear_silu",
        seed_ops=("in_linear_silu", "in_linear_silu_backward"),
        tf_ops=("InLinearSilu", "InLinearSiluBackward"),
        public=("in_linear_silu",),
        gradient="InLinearSiluBackward (dz = dA·silu'(z) and db, one pass) then TF's matmul "
                 "gradient (dx, dW); second order not implemented",
        reference=("in_linear_silu",),
        dtypes=FLOAT_DTYPES,
        index_dtypes=(),
        bound="compute",
        bench={
            "tiny": ({"m": 64, "k": 16, "split": 8},),
            # The seed's tiling example: M = 16384 tokens, K = 512, Nw = 4 x 512.
            "full": ({"m": 16384, "k": 512, "split": 512},),
        },
    ),

    OpStem(
        stem="disentangle_attention",
        seed_ops=("disentangle_attention",),
        tf_ops=("DisentangleAttention", "DisentangleAttentionGrad"),
        public=("disentangle_attention",),
        gradient="DisentangleAttentionGrad (query, key, value, pos_key, pos_query; through all "
                 "three outputs; the seed has no backward); second order not implemented",
        reference=("disentangle_attention",),
        dtypes=FLOAT_DTYPES,
        index_dtypes=("int64",),
        bound="compute",
        bench={
            "tiny": ({"batch": 2, "heads": 2, "s": 16, "d": 8},),
            "full": ({"batch": 8, "heads": 8, "s": 256, "d": 64},),
        },
    ),
    OpStem(
        stem="fused_linear_cross_entropy",
        # Not an operator of the Rec SDK: no seed operator (docs/ops.md shows "-").
        seed_ops=(),
        tf_ops=("FusedLinearCrossEntropy", "FusedLinearCrossEntropyGrad",
                "FusedLinearCrossEntropyWithGrad", "FusedLinearCrossEntropyApplyGrad"),
        public=("fused_linear_cross_entropy",),
        gradient="FusedLinearCrossEntropyGrad (dstates, ditems, dbias, dextra_values from "
                 "dloss and dlse; the logits recomputed tile by tile from the forward's lse, "
                 "never the [P, N] matrix); with gradients_in_forward, "
                 "FusedLinearCrossEntropyWithGrad makes them for a unit upstream in the "
                 "forward's one pass and FusedLinearCrossEntropyApplyGrad scales them (or runs "
                 "the backward where the upstream is not uniform); targets, weights and the "
                 "extra logits' indices get "
                 "none; second order not implemented (raises)",
        reference=("fused_linear_cross_entropy",),
        # Kernels: float32 and bfloat16 (float32 loss), float64; no float16.
        dtypes=("float32", "bfloat16", "float64"),
        index_dtypes=INDEX_DTYPES,
        bound="compute",
        bench={
            "tiny": ({"p": 70, "n": 300, "d": 16},),
            # 4096 positions (a batch of 32 sequences of 128) over a 12,000-item and a
            # 100,000-item catalogue: the composite's [P, N] float32 logits are 197 MB and
            # 1.6 GB per tensor.
            "full": ({"p": 4096, "n": 12000, "d": 64},
                     {"p": 4096, "n": 100000, "d": 64}),
        },
    ),
    OpStem(
        stem="embedding_by_address",
        seed_ops=("cust_op_by_addr",),
        tf_ops=("DynamicEmbeddingTable", "DynamicEmbeddingLookupAddresses",
                "DynamicEmbeddingTableSize", "DynamicEmbeddingTableExport",
                "DynamicEmbeddingTableImport", "EmbeddingLookupByAddress",
                "EmbeddingUpdateByAddress"),
        public=("embedding_lookup_by_address", "embedding_update_by_address", "embedding_lookup"),
        gradient="lookup: an IndexedSlices of the upstream rows keyed by address, w.r.t. the "
                 "table; the table ops and the update: none",
        reference=("embedding_lookup_by_address", "embedding_update_by_address",
                   "embedding_lookup"),
        dtypes=("float32",),
        index_dtypes=("int64",),
        bound="memory",
        bench={
            "tiny": ({"fn": "lookup", "table_rows": 100, "num_lookup": 64, "dim": 8},
                     {"fn": "update", "table_rows": 100, "num_lookup": 64, "dim": 8}),
            "full": ({"fn": "lookup", "table_rows": 1_000_000, "num_lookup": 65536, "dim": 64},
                     {"fn": "update", "table_rows": 1_000_000, "num_lookup": 65536, "dim": 64}),
        },
        stateful=True,
    ),
    OpStem(
        stem="fused_lazy_adam",
        seed_ops=("fused_lazy_adam",),
        tf_ops=("LazyAdam", "LazyAdamByAddress"),
        public=("lazy_adam_update",),
        gradient="none (an optimizer step)",
        reference=("lazy_adam_update",),
        dtypes=("float32",),
        index_dtypes=INDEX_DTYPES,
        bound="memory",
        bench={
            "tiny": ({"target": "variable", "table_rows": 100, "touched": 64, "dim": 8},
                     {"target": "variable", "table_rows": 100, "touched": 64, "dim": 8,
                      "baseline": "keras_adam"},
                     {"target": "table", "table_rows": 100, "touched": 64, "dim": 8}),
            "full": ({"target": "variable", "table_rows": 1_000_000, "touched": 16384,
                      "dim": 64},
                     {"target": "variable", "table_rows": 1_000_000, "touched": 16384,
                      "dim": 64, "baseline": "keras_adam"},
                     {"target": "table", "table_rows": 1_000_000, "touched": 16384, "dim": 64}),
        },
        stateful=True,
    ),
    OpStem(
        stem="fused_sgd",
        seed_ops=("fused_sgd",),
        tf_ops=("Sgd", "SgdByAddress"),
        public=("sgd_update",),
        gradient="none (an optimizer step)",
        reference=("sgd_update",),
        dtypes=("float32",),
        index_dtypes=INDEX_DTYPES,
        bound="memory",
        bench={
            "tiny": ({"target": "variable", "table_rows": 100, "touched": 64, "dim": 8},
                     {"target": "table", "table_rows": 100, "touched": 64, "dim": 8}),
            "full": ({"target": "variable", "table_rows": 1_000_000, "touched": 16384,
                      "dim": 64},
                     {"target": "table", "table_rows": 1_000_000, "touched": 16384, "dim": 64}),
        },
        stateful=True,
    ),
    OpStem(
        stem="pcie_through",
        seed_ops=("pcie_through",),
        tf_ops=("RmaSwapMultiTables", "HostChannel", "HostChannelPush", "HostChannelPop",
                "HostChannelSize", "HostChannelClose"),
        public=("rma_swap_multi_tables",),
        gradient="none (moves rows between tables and the host)",
        reference=("rma_swap_multi_tables",),
        dtypes=("float32",),
        index_dtypes=INDEX_DTYPES,
        bound="memory",
        bench={
            "tiny": ({"tables": 2, "table_rows": 100, "swapped": 16, "dim": 8},),
            "full": ({"tables": 3, "table_rows": 200_000, "swapped": 16384, "dim": 64},),
        },
        stateful=True,
    ),
)

BY_STEM = {row.stem: row for row in OPS}


def row_for_op(tf_op_name):
    """The row owning a registered op ("Recops>X" or "X")."""
    name = tf_op_name.split(">", 1)[-1]
    for row in OPS:
        if name in row.tf_ops:
            return row
    raise KeyError(tf_op_name)
