// Stem disentangle_attention: DeBERTa-style disentangled attention (Rec SDK index semantics).
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

#define RECOPS_DISENTANGLE_INPUTS   \
  Input("query: T")                 \
      .Input("key: T")              \
      .Input("value: T")            \
      .Input("pos_key: T")          \
      .Input("pos_query: T")        \
      .Input("relative_pos: int64") \
      .Input("attn_mask: T")

#define RECOPS_DISENTANGLE_ATTRS                \
  Attr("T: {float, half, bfloat16, double}")    \
      .Attr("pos_att_type: string = 'c2p|p2c'") \
      .Attr("score_scale: float")

REGISTER_OP("Recops>DisentangleAttention")
    .RECOPS_DISENTANGLE_INPUTS.Output("attn_output: T")
    .Output("attn_probs: T")
    .Output("attn_weights: T")
    .RECOPS_DISENTANGLE_ATTRS
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle q;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &q));
      c->set_output(0, q);
      ShapeHandle plane = c->MakeShape({c->Dim(q, 0), c->Dim(q, 1), c->Dim(q, 2), c->Dim(q, 2)});
      c->set_output(1, plane);
      c->set_output(2, plane);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Disentangled attention on query, key, value [b, n, s, d] with pos_key, pos_query [2s, n, d]:
idx = clamp(relative_pos + s - 1, 0, 2s - 1); c2p[i, j] = Q_i · PK[idx[i, j]]; p2c[i, j] =
K_j · PQ[idx[j, i]]; W = score_scale · (Q·Kᵀ + c2p + p2c) + attn_mask (additive, [b, 1, s, s] or
[b, s, s], or empty); P = softmax(W); output P·V. Outputs O, P and W.
)doc");

REGISTER_OP("Recops>DisentangleAttentionGrad")
    .Input("d_output: T")
    .Input("d_probs: T")
    .Input("d_weights: T")
    .RECOPS_DISENTANGLE_INPUTS.Output("d_query: T")
    .Output("d_key: T")
    .Output("d_value: T")
    .Output("d_pos_key: T")
    .Output("d_pos_query: T")
    .RECOPS_DISENTANGLE_ATTRS
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      for (int i = 0; i < 5; ++i) c->set_output(i, c->input(3 + i));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of DisentangleAttention w.r.t. query, key, value, pos_key and pos_query (scores
recomputed; the position tables' gradients summed over the batch in a fixed order).
)doc");

#undef RECOPS_DISENTANGLE_ATTRS
#undef RECOPS_DISENTANGLE_INPUTS

}  // namespace recops
