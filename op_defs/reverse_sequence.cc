// Stem reverse_sequence: ReverseSequence (its own gradient).
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("Recops>ReverseSequence")
    .Input("input: T")
    .Input("seq_lengths: Tlen")
    .Output("output: T")
    .Attr("T: {float, half, bfloat16, double, int64}")
    .Attr("Tlen: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle x, lens;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &lens));
      tensorflow::shape_inference::DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(x, 0), c->Dim(lens, 0), &unused));
      c->set_output(0, x);
      return absl::OkStatus();
    })
    .Doc(R"doc(
For input [B, T, D]: output[b, len_b - 1 - t] = input[b, t] for t < len_b; positions
t >= len_b are copied unchanged. Every len_b must lie in [0, T].
)doc");

}  // namespace recops
