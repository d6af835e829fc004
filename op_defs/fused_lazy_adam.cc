// Stem fused_lazy_adam: the Rec SDK's fused LazyAdam step, on resource variables (LazyAdam)
// and on a growing table's co-located slots (LazyAdamByAddress).
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

namespace {

absl::Status SparseStepShapes(InferenceContext* c, int lr, int gradient) {
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(lr), 0, &unused));
  return c->WithRank(c->input(gradient), 2, &unused);
}

}  // namespace

REGISTER_OP("Recops>LazyAdam")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("lr: float")
    .Input("gradient: float")
    .Input("indices: Tindices")
    .Attr("beta1: float")
    .Attr("beta2: float")
    .Attr("epsilon: float = 1e-7")
    .Attr("Tindices: {int32, int64} = DT_INT32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return SparseStepShapes(c, 3, 4); })
    .Doc(R"doc(
In place, for each distinct row r = indices[i] >= 0 (gradients of duplicates summed first,
in order; negative indices skipped): m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g^2,
var -= lr m / (sqrt(v) + epsilon). lr is already bias-corrected by the caller.
)doc");

REGISTER_OP("Recops>LazyAdamByAddress")
    .Input("table: resource")
    .Input("lr: float")
    .Input("gradient: float")
    .Input("address: int64")
    .Attr("beta1: float")
    .Attr("beta2: float")
    .Attr("epsilon: float = 1e-7")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(RequireVector(c, 3));
      return SparseStepShapes(c, 1, 2);
    })
    .Doc(R"doc(
LazyAdam on the rows of a growing table by address: m and v are the row's slots 0 and 1;
address 0 is skipped, duplicates are summed first.
)doc");

}  // namespace recops
