// Stem multislice_concat: MultisliceConcat and its adjoint MultisliceConcatGrad.
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("Recops>MultisliceConcat")
    .Input("input: T")
    .Output("outputs: N * T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("N: int >= 1")
    .Attr("concat_sizes: list(int)")
    .Attr("slice_begins: list(int)")
    .Attr("slice_lengths: list(int)")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      std::vector<int64_t> sizes, begins, lengths;
      TF_RETURN_IF_ERROR(c->GetAttr("concat_sizes", &sizes));
      TF_RETURN_IF_ERROR(c->GetAttr("slice_begins", &begins));
      TF_RETURN_IF_ERROR(c->GetAttr("slice_lengths", &lengths));
      const int64_t cols = c->Value(c->Dim(x, 1));  // -1 when unknown
      size_t s = 0;
      for (int k = 0; k < c->num_outputs(); ++k) {
        int64_t width = 0;
        bool known = true;
        const int64_t n = k < static_cast<int>(sizes.size()) ? sizes[k] : 0;
        for (int64_t j = 0; j < n && s < begins.size() && s < lengths.size(); ++j, ++s) {
          if (lengths[s] >= 0) {
            width += lengths[s];
          } else if (cols >= 0) {
            width += cols - begins[s];
          } else {
            known = false;
          }
        }
        // Attribute errors are reported by the kernel with full context; the shape function
        // only propagates what it can.
        c->set_output(
            k, c->Matrix(c->Dim(x, 0), known && width >= 0 ? c->MakeDim(width) : c->UnknownDim()));
      }
      return absl::OkStatus();
    })
    .Doc(R"doc(
For input [R, D], output k concatenates along columns the next concat_sizes[k] slices
input[:, slice_begins[s] : slice_begins[s] + slice_lengths[s]] (length -1 = to the end).
)doc");

REGISTER_OP("Recops>MultisliceConcatGrad")
    .Input("grads: N * T")
    .Input("input_shape: int64")
    .Output("grad_input: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("N: int >= 1")
    .Attr("concat_sizes: list(int)")
    .Attr("slice_begins: list(int)")
    .Attr("slice_lengths: list(int)")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(c->num_inputs() - 1, &out));
      TF_RETURN_IF_ERROR(c->WithRank(out, 2, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Adjoint of MultisliceConcat: grad_input = zeros(input_shape), then for every slice the
matching columns of its output's gradient are added in (overlapping slices accumulate).
)doc");

}  // namespace recops
