// Stem gather_for_rank1: GatherForRank1 and its gradient IndexSelectForRank1Backward.
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP("Recops>GatherForRank1")
    .Input("x: T")
    .Input("index: Tidx")
    .Output("y: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(RequireVector(c, 0));
      TF_RETURN_IF_ERROR(RequireVector(c, 1));
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    })
    .Doc("y[k] = x[index[k]] for a rank-1 x; every index must lie in [0, len(x)).");

REGISTER_OP("Recops>IndexSelectForRank1Backward")
    .Input("grad_y: T")
    .Input("x: T")
    .Input("index: Tidx")
    .Output("grad_x: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(RequireVector(c, 0));
      TF_RETURN_IF_ERROR(RequireVector(c, 1));
      TF_RETURN_IF_ERROR(RequireVector(c, 2));
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    })
    .Doc(R"doc(
grad_x[j] = sum of grad_y[k] over k with index[k] == j, in a fixed order that does not
depend on the thread count (deterministic); x is used only for its length.
)doc");

}  // namespace recops
