// Stem token_mixing: LayerNorm of x + xᵀ over the last axis, for x [B, S, S].
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("Recops>TokenMixing")
    .Input("x: T")
    .Input("gamma: T")
    .Input("beta: T")
    .Output("y: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("epsilon: float = 1e-7")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &x));
      c->set_output(0, x);
      return absl::OkStatus();
    })
    .Doc(R"doc(
t[b, i, :] = x[b, i, :] + x[b, :, i]; y[b, i, :] = (t - mean) / sqrt(var + epsilon) * gamma +
beta (biased variance over the last axis) for x [B, S, S], gamma and beta [S].
)doc");

REGISTER_OP("Recops>TokenMixingGrad")
    .Input("dy: T")
    .Input("x: T")
    .Input("gamma: T")
    .Input("beta: T")
    .Output("dx: T")
    .Output("dgamma: T")
    .Output("dbeta: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("epsilon: float = 1e-7")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(2));
      c->set_output(2, c->input(3));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of TokenMixing: dx = dt + dtᵀ with dt the gradient through the LayerNorm; dgamma and
dbeta summed in a fixed order.
)doc");

}  // namespace recops
