// Stem hstu_dense_fuxi: Fuxi-alpha three-channel HSTU attention (semantic SiLU attention plus
// temporal and positional channels that use the raw masked biases as attention weights).
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// The inputs and attributes shared by the forward and the backward (which takes grad first).
#define RECOPS_FUXI_INPUTS        \
  Input("q: T")                   \
      .Input("k: T")              \
      .Input("v: T")              \
      .Input("seq_offsets: Tidx") \
      .Input("mask: T")           \
      .Input("timestamp_bias: T") \
      .Input("position_bias: T")

#define RECOPS_FUXI_ATTRS                                         \
  Attr("T: {float, half, bfloat16, double}")                      \
      .Attr("Tidx: {int32, int64} = DT_INT64")                    \
      .Attr("max_seq_len: int >= 1")                              \
      .Attr("silu_scale: float = 0.0")                            \
      .Attr("mask_type: {'causal', 'none', 'custom'} = 'causal'") \
      .Attr("has_bias: bool = false")

REGISTER_OP("Recops>HstuFuxiForward")
    .RECOPS_FUXI_INPUTS.Output("output: T")
    .RECOPS_FUXI_ATTRS
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle q, k, v;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &q));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &k));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 3, &v));
      TF_RETURN_IF_ERROR(RequireVector(c, 3));
      bool has_bias = false;
      TF_RETURN_IF_ERROR(c->GetAttr("has_bias", &has_bias));
      DimensionHandle width;
      TF_RETURN_IF_ERROR(c->Multiply(c->Dim(q, 1), c->Dim(v, 2), &width));
      if (has_bias) TF_RETURN_IF_ERROR(c->Multiply(width, 3, &width));
      c->set_output(0, c->MakeShape({c->Dim(q, 0), width}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Fuxi-alpha attention on jagged q, k, v [T, N, D] (one head count, one head size): per head,
O_s = round(silu(q.k) * scale * m) . V (no alpha, no bias inside the SiLU) and, with has_bias,
O_t = round(timestamp_bias[b] * m) . V and O_p = round(position_bias[0] * m) . V, the output
rows being [O_s(all heads) | O_t(all heads) | O_p(all heads)] ([T, 3 N D]; [T, N D] without
biases). m: causal visibility, all ones ('none') or the custom mask [B, N, S, S].
timestamp_bias [B, S, S], position_bias [1, S, S], S = max_seq_len.
)doc");

REGISTER_OP("Recops>HstuFuxiBackward")
    .Input("grad: T")
    .RECOPS_FUXI_INPUTS.Output("dq: T")
    .Output("dk: T")
    .Output("dv: T")
    .Output("d_timestamp_bias: T")
    .Output("d_position_bias: T")
    .RECOPS_FUXI_ATTRS
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &unused));
      for (int i = 1; i < 4; ++i) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 3, &unused));
        c->set_output(i - 1, c->input(i));
      }
      c->set_output(3, c->input(6));
      c->set_output(4, c->input(7));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of HstuFuxiForward. grad has the forward output's layout ([T, 3 N D] rows of
[dO_s | dO_t | dO_p] head-major blocks, or [T, N D]): the Rec SDK kernel's [T, N, 3D] layout
is not needed. dq, dk from dS = round(dO_s.V^T * scale * m * silu'(s)); dv = P^T.dO_s +
Tb^T.dO_t + Pb^T.dO_p; d_timestamp_bias[b] = sum_h m * (dO_t.V^T); d_position_bias[0] =
sum_b sum_h m * (dO_p.V^T) (deterministic order); zero outside visible entries.
)doc");

}  // namespace recops
