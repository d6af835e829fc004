// Stem fused_sgd: the Rec SDK's fused sparse SGD step, on resource variables (Sgd) and on a
// growing table by address (SgdByAddress).
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("Recops>Sgd")
    .Input("var: resource")
    .Input("lr: float")
    .Input("gradient: float")
    .Input("indices: Tindices")
    .Attr("weight_decay: float = 0.0")
    .Attr("Tindices: {int32, int64} = DT_INT32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      return c->WithRank(c->input(2), 2, &unused);
    })
    .Doc(R"doc(
In place: var[r] += -lr (g_i + weight_decay var_old[r]) for every i with r = indices[i] >= 0;
duplicates accumulate (weight decay counted once per occurrence), negative indices skipped.
)doc");

REGISTER_OP("Recops>SgdByAddress")
    .Input("table: resource")
    .Input("lr: float")
    .Input("gradient: float")
    .Input("address: int64")
    .Attr("weight_decay: float = 0.0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      TF_RETURN_IF_ERROR(RequireVector(c, 3));
      return c->WithRank(c->input(2), 2, &unused);
    })
    .Doc("Sgd on the embedding columns of a growing table's rows by address (0 skipped).");

}  // namespace recops
