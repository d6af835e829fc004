// Stem norm_multiply_dropout: LayerNorm · u with inverted dropout (stateless seeded mask).
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

#define RECOPS_NMD_ATTRS                        \
  Attr("T: {float, half, bfloat16, double}")    \
      .Attr("Tstat: {float, double}")           \
      .Attr("Tseed: {int32, int64} = DT_INT64") \
      .Attr("epsilon: float = 1e-5")            \
      .Attr("dropout_rate: float = 0.0")

REGISTER_OP("Recops>NormMultiplyDropout")
    .Input("x: T")
    .Input("u: T")
    .Input("weight: T")
    .Input("bias: T")
    .Input("seed: Tseed")
    .Output("y: T")
    .Output("mean: Tstat")
    .Output("var: Tstat")
    .RECOPS_NMD_ATTRS
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &x));
      TF_RETURN_IF_ERROR(c->Merge(x, c->input(1), &x));
      c->set_output(0, x);
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(2, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
y = ((x - mean) / sqrt(var + epsilon) * weight + bias) * u * keep / (1 - dropout_rate) over the
last axis of x [..., C]; keep is a hash of (seed, element index) (seed [2]: the same seed gives
the same mask). mean and the biased var [rows] (Tstat: float32, float64 for float64 x) are kept
for the backward.
)doc");

REGISTER_OP("Recops>NormMultiplyDropoutBackward")
    .Input("dy: T")
    .Input("x: T")
    .Input("u: T")
    .Input("weight: T")
    .Input("bias: T")
    .Input("mean: Tstat")
    .Input("var: Tstat")
    .Input("seed: Tseed")
    .Output("dx: T")
    .Output("du: T")
    .Output("dweight: T")
    .Output("dbias: T")
    .RECOPS_NMD_ATTRS
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(2));
      c->set_output(2, c->input(3));
      c->set_output(3, c->input(4));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of NormMultiplyDropout (the mask recomputed from the seed; dweight and dbias summed in
a fixed order).
)doc");

#undef RECOPS_NMD_ATTRS

}  // namespace recops
