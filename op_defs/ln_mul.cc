// Stem ln_mul: LayerNorm over the last axis, affine, then an elementwise product.
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("Recops>LnMul")
    .Input("x: T")
    .Input("u: T")
    .Input("gamma: T")
    .Input("beta: T")
    .Output("y: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("epsilon: float = 1e-5")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &x));
      TF_RETURN_IF_ERROR(c->Merge(x, c->input(1), &x));
      c->set_output(0, x);
      return absl::OkStatus();
    })
    .Doc(R"doc(
y = ((x - mean) / sqrt(var + epsilon) * gamma + beta) * u, with mean and the biased variance
over the last axis of x [..., C]; u like x, gamma and beta [C].
)doc");

REGISTER_OP("Recops>LnMulGrad")
    .Input("dy: T")
    .Input("x: T")
    .Input("u: T")
    .Input("gamma: T")
    .Input("beta: T")
    .Output("dx: T")
    .Output("du: T")
    .Output("dgamma: T")
    .Output("dbeta: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("epsilon: float = 1e-5")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(2));
      c->set_output(2, c->input(3));
      c->set_output(3, c->input(4));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of LnMul (statistics recomputed; dgamma and dbeta summed in a fixed order).
)doc");

}  // namespace recops
