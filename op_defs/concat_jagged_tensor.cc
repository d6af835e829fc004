// Stem concat_jagged_tensor: ConcatJaggedTensor and its inverse ConcatJaggedTensorGrad (split).
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("Recops>ConcatJaggedTensor")
    .Input("values_a: T")
    .Input("offsets_a: Tidx")
    .Input("values_b: T")
    .Input("offsets_b: Tidx")
    .Output("values: T")
    .Attr("T: {float, half, bfloat16, double, int32, int64}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .Attr("n_prefix_from_right: int >= 0 = 0")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle a, b, a_rest, b_rest, rest, out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &a));
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(2), 1, &b));
      TF_RETURN_IF_ERROR(RequireVector(c, 1));
      TF_RETURN_IF_ERROR(RequireVector(c, 3));
      TF_RETURN_IF_ERROR(c->Subshape(a, 1, &a_rest));
      TF_RETURN_IF_ERROR(c->Subshape(b, 1, &b_rest));
      TF_RETURN_IF_ERROR(c->Merge(a_rest, b_rest, &rest));
      DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->Add(c->Dim(a, 0), c->Dim(b, 0), &rows));
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(rows), rest, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Interleaves two jagged tensors sample by sample: per sample b, the first
min(n_prefix_from_right, len_b(B)) rows of B, then the rows of A, then the rest of B.
Offsets are [num_samples + 1], start at 0, are non-decreasing and end at the row count.
)doc");

REGISTER_OP("Recops>ConcatJaggedTensorGrad")
    .Input("values: T")
    .Input("offsets_a: Tidx")
    .Input("offsets_b: Tidx")
    .Output("values_a: T")
    .Output("values_b: T")
    .Attr("T: {float, half, bfloat16, double, int32, int64}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .Attr("n_prefix_to_right: int >= 0 = 0")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle v, rest, out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &v));
      TF_RETURN_IF_ERROR(RequireVector(c, 1));
      TF_RETURN_IF_ERROR(RequireVector(c, 2));
      TF_RETURN_IF_ERROR(c->Subshape(v, 1, &rest));
      // Row counts are offsets[-1]: data dependent.
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(c->UnknownDim()), rest, &out));
      c->set_output(0, out);
      c->set_output(1, out);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Splits a jagged tensor produced by ConcatJaggedTensor back into its A and B parts
(the exact inverse, with n_prefix_to_right equal to the concat's n_prefix_from_right).
)doc");

}  // namespace recops
