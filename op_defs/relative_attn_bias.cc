// Stem relative_attn_bias: HSTU's relative attention bias. RelativeAttnBiasTime (bucketised
// time deltas -> learned weights), its gradient RelativeAttnBiasBackward (scatter-add into the
// bucket weights) and the inference helper RelativeAttnBiasPos.
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("Recops>RelativeAttnBiasTime")
    .Input("timestamps: Tidx")
    .Input("weights: T")
    .Output("bias: T")
    .Output("buckets: int32")
    .Attr("bucket_divisor: float")
    .Attr("duplicate: bool = true")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle ts, w;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &ts));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &w));
      bool duplicate = true;
      TF_RETURN_IF_ERROR(c->GetAttr("duplicate", &duplicate));
      DimensionHandle s = c->Dim(ts, 1), s2 = s;
      if (duplicate) TF_RETURN_IF_ERROR(c->Multiply(s, 2, &s2));
      c->set_output(0, c->MakeShape({c->Dim(w, 0), c->Dim(ts, 0), s2, s2}));
      c->set_output(1, c->MakeShape({c->Dim(ts, 0), s, s}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Time bias of HSTU's relative attention bias. With a = |timestamps[b, j] - timestamps[b, i]|,
buckets[b, i, j] = min(floor(ln(max(a, 1)) / bucket_divisor), NB - 1) (computed in float64 from
the float32 divisor) and bias[l, b, i, j] = weights[l, buckets[b, i, j]]; with duplicate, every
entry fills a 2 x 2 block of a [L, B, 2s, 2s] bias (interleaved item / action tokens).
)doc");

REGISTER_OP("Recops>RelativeAttnBiasBackward")
    .Input("grad: T")
    .Input("buckets: int32")
    .Input("num_buckets: int32")
    .Output("weights_grad: T")
    .Attr("duplicate: bool = true")
    .Attr("T: {float, half, bfloat16, double}")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle g, b, nb;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &g));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &b));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &nb));
      DimensionHandle num_buckets;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &num_buckets));
      c->set_output(0, c->MakeShape({c->Dim(g, 0), num_buckets}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of RelativeAttnBiasTime w.r.t. its weights: weights_grad[l, k] = sum of grad[l, b, i,
j] over the entries whose bucket is k (with duplicate, over each bucket's 2 x 2 block), summed
in a fixed order (deterministic) with float32 accumulation (float64 for float64). num_buckets
(a scalar, so it may come from a dynamic shape) is the weights' second dimension.
)doc");

REGISTER_OP("Recops>RelativeAttnBiasPos")
    .Input("rel_pos_bias: T")
    .Input("identity: T")
    .Input("past_valid_lens: Tidx")
    .Output("bias: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle p, id, lens;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &p));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &id));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &lens));
      TF_RETURN_IF_ERROR(c->Merge(p, id, &p));
      c->set_output(0, c->MakeShape({c->Dim(lens, 0), c->Dim(p, 0), c->Dim(p, 1)}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Position bias for inference with a KV cache: with r = i if i < past_valid_lens[b] else
past_valid_lens[b], bias[b, i, j] = (1 - identity[i, j]) * rel_pos_bias[r, j] + identity[i,
j] * rel_pos_bias[0, 0].
)doc");

REGISTER_OP("Recops>RelativeAttnBiasPosBackward")
    .Input("grad: T")
    .Input("rel_pos_bias: T")
    .Input("identity: T")
    .Input("past_valid_lens: Tidx")
    .Output("d_rel_pos_bias: T")
    .Output("d_identity: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle g, p, id, lens;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &g));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &p));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &id));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &lens));
      TF_RETURN_IF_ERROR(c->Merge(p, id, &p));
      c->set_output(0, p);
      c->set_output(1, p);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of RelativeAttnBiasPos w.r.t. rel_pos_bias and identity, in one pass over grad
[B, S2, S2]: d_rel_pos_bias[r, j] sums grad[b, i, j] * (1 - identity[i, j]) over the (b, i)
that read row r, plus sum(grad * identity) at [0, 0]; d_identity[i, j] sums grad[b, i, j] *
(rel_pos_bias[0, 0] - rel_pos_bias[r, j]) over b. Accumulated in float32 (float64 for double)
in a fixed order: deterministic.
)doc");

}  // namespace recops
