// Stem hstu_dense: HSTU attention forward and backward (jagged layout; the Python wrapper maps
// the dense and ragged layouts onto it).
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// The inputs shared by the forward and the backward (which takes grad first).
#define RECOPS_HSTU_INPUTS           \
  Input("q: T")                      \
      .Input("k: T")                 \
      .Input("v: T")                 \
      .Input("seq_offsets_q: Tidx")  \
      .Input("seq_offsets_k: Tidx")  \
      .Input("num_context: Tidx")    \
      .Input("num_target: Tidx")     \
      .Input("mask: T")              \
      .Input("attn_bias: T")         \
      .Input("timestamps: Tidx")     \
      .Input("time_bias_weights: T") \
      .Input("position_bias_weights: T")

#define RECOPS_HSTU_ATTRS                                         \
  Attr("T: {float, half, bfloat16, double}")                      \
      .Attr("Tidx: {int32, int64} = DT_INT64")                    \
      .Attr("max_seq_len: int >= 1")                              \
      .Attr("max_seq_len_k: int >= 1")                            \
      .Attr("alpha: float = 1.0")                                 \
      .Attr("silu_scale: float = 0.0")                            \
      .Attr("mask_type: {'causal', 'none', 'custom'} = 'causal'") \
      .Attr("target_group_size: int >= 0 = 0")                    \
      .Attr("window_left: int >= -1 = -1")                        \
      .Attr("window_right: int >= -1 = -1")                       \
      .Attr("has_bias: bool = false")                             \
      .Attr("has_time_bias: bool = false")                        \
      .Attr("has_position_bias: bool = false")                    \
      .Attr("bucket_divisor: float = 0.301")                      \
      .Attr("mask_rules: {'rec_sdk', 'gr'} = 'rec_sdk'")          \
      .Attr("max_attn_len: int >= 0 = 0")                         \
      .Attr("contextual_seq_len: int >= 0 = 0")                   \
      .Attr("min_full_attn_seq_len: int >= 0 = 0")

REGISTER_OP("Recops>HstuDenseForward")
    .RECOPS_HSTU_INPUTS.Output("output: T")
    .RECOPS_HSTU_ATTRS
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle q, k, v;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &q));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &k));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 3, &v));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(q, 2), c->Dim(k, 2), &unused));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(k, 0), c->Dim(v, 0), &unused));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(k, 1), c->Dim(v, 1), &unused));
      for (int i : {3, 4, 5, 6, 9, 10, 11}) TF_RETURN_IF_ERROR(RequireVector(c, i));
      c->set_output(0, c->MakeShape({c->Dim(q, 0), c->Dim(q, 1), c->Dim(v, 2)}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
HSTU attention on jagged q [Tq, Nq, Dqk], k [Tk, Nk, Dqk], v [Tk, Nk, Dv]:
O[i,h] = sum_j round(silu(alpha * (q_i.k_j + bias_hij)) * scale * m_hij) * v_j (no softmax).
num_context / num_target: empty or [B]; mask / attn_bias: [B, Nq, max_seq_len, max_seq_len_k]
(mask only read for mask_type 'custom', attn_bias only with has_bias). Relative bias computed per
tile instead of attn_bias: with has_time_bias, time_bias_weights[bucket(|t_j - t_(i+delta)|)]
(timestamps [Tk] per key row, bucket = min(floor(ln(max(gap, 1)) / bucket_divisor), NB - 1));
with has_position_bias, position_bias_weights[max_seq_len_k - 1 + j - (i + delta)]
(length 2 * max_seq_len_k - 1); delta = Lk - Lq. Unused inputs may be empty.
mask_rules 'gr': generative-recommenders' visibility instead (self-attention, mask_type causal
or none; num_target as GR's num_targets; max_attn_len, contextual_seq_len and
min_full_attn_seq_len as GR's arguments of those names), evaluated per tile.
)doc");

REGISTER_OP("Recops>HstuDenseBackward")
    .Input("grad: T")
    .RECOPS_HSTU_INPUTS.Output("dq: T")
    .Output("dk: T")
    .Output("dv: T")
    .Output("d_attn_bias: T")
    .Output("d_time_bias_weights: T")
    .Output("d_position_bias_weights: T")
    .RECOPS_HSTU_ATTRS
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      for (int i = 0; i < 4; ++i) {
        ShapeHandle unused;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 3, &unused));
      }
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(2));
      c->set_output(2, c->input(3));
      c->set_output(3, c->input(9));
      c->set_output(4, c->input(11));
      c->set_output(5, c->input(12));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradients of HstuDenseForward (recomputes scores per tile): dq, dk, dv, d_attn_bias = dS
(zero outside each sequence's valid block; shaped like attn_bias), and the relative-bias
weights' gradients (dS summed over heads per bucket / offset; deterministic).
)doc");

#undef RECOPS_HSTU_ATTRS
#undef RECOPS_HSTU_INPUTS

REGISTER_OP("Recops>HstuPagedForward")
    .Input("q: T")
    .Input("k: T")
    .Input("v: T")
    .Input("kv_cache: T")
    .Input("seq_offsets: Tidx")
    .Input("page_offsets: Tidx")
    .Input("page_ids: Tidx")
    .Input("last_page_len: Tidx")
    .Input("num_target: Tidx")
    .Output("output: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .Attr("max_seq_len: int >= 1")
    .Attr("max_seq_len_k: int >= 1")
    .Attr("alpha: float = 1.0")
    .Attr("silu_scale: float = 0.0")
    .Attr("target_group_size: int >= 0 = 1")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle q, k, cache;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &q));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &k));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 5, &cache));
      for (int i = 4; i < 9; ++i) TF_RETURN_IF_ERROR(RequireVector(c, i));
      c->set_output(0, c->MakeShape({c->Dim(q, 0), c->Dim(q, 1), c->Dim(k, 2)}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Paged KV-cache HSTU forward (inference): keys of sequence b = its cached pages
kv_cache[page_ids[page_offsets[b]:page_offsets[b+1]], 0] (the last page holding
last_page_len[b] rows) followed by the k rows of its last num_target[b] tokens (values alike);
causal attention with the target-group rule.
)doc");

REGISTER_OP("Recops>HstuCachedForward")
    .Input("q: T")
    .Input("k: T")
    .Input("v: T")
    .Input("past_keys: T")
    .Input("past_values: T")
    .Input("timestamps: int64")
    .Input("time_bias_weights: T")
    .Input("position_bias_weights: T")
    .Output("output: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("key_column: int >= 0 = 0")
    .Attr("value_column: int >= 0 = 0")
    .Attr("max_seq_len: int >= 1")
    .Attr("alpha: float = 1.0")
    .Attr("silu_scale: float = 0.0")
    .Attr("bucket_divisor: float = 0.301")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle q, k, v, past_k, past_v;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &q));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &k));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 3, &v));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &past_k));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 2, &past_v));
      for (int i = 5; i < 8; ++i) TF_RETURN_IF_ERROR(RequireVector(c, i));
      c->set_output(0, c->MakeShape({c->Dim(q, 0), c->Dim(q, 1), c->Dim(v, 2)}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
HSTU attention of one sequence's n new tokens (q, k, v [n, N, D*]) over its P cached tokens
and themselves (inference): key j < P is row j of past_keys at columns key_column +
h * Dqk.. (values: past_values at value_column + h * Dv..), key P + i is k[i]; query i is
position P + i and sees keys j <= P + i. Scores, relative bias (time buckets of timestamps
[P + n] when time_bias_weights is not empty, position_bias_weights[max_seq_len - 1 + j -
(P + i)] when not empty), alpha, SiLU and scale as HstuDenseForward's. The cached rows are
read where they are, without concatenating past and new keys.
)doc");

}  // namespace recops
