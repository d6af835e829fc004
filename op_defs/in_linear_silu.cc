// Stem in_linear_silu: the UVQK projection of an HSTU layer. The GEMM is TensorFlow's matmul;
// these ops are its fused epilogue (bias, SiLU, four-way split) and the epilogue's gradient.
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("Recops>InLinearSilu")
    .Input("xw: T")
    .Input("bias: T")
    .Output("u: T")
    .Output("v: T")
    .Output("q: T")
    .Output("k: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("split_sizes: list(int)")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle xw;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &xw));
      std::vector<int64_t> sizes;
      TF_RETURN_IF_ERROR(c->GetAttr("split_sizes", &sizes));
      if (sizes.size() != 4) {
        return absl::InvalidArgumentError("split_sizes must have 4 entries (u, v, q, k)");
      }
      for (int s = 0; s < 4; ++s) c->set_output(s, c->Matrix(c->Dim(xw, 0), sizes[s]));
      return absl::OkStatus();
    })
    .Doc(R"doc(
For xw = x·weightᵀ [M, Nw] and bias [Nw]: z = xw + bias, a = silu(z) split by columns into u, v,
q, k of split_sizes (summing to Nw). z is not stored: the backward recomputes it from xw and
bias (the seed's linear_output).
)doc");

REGISTER_OP("Recops>InLinearSiluBackward")
    .Input("du: T")
    .Input("dv: T")
    .Input("dq: T")
    .Input("dk: T")
    .Input("xw: T")
    .Input("bias: T")
    .Output("dxw: T")
    .Output("dbias: T")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("split_sizes: list(int)")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle z;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 2, &z));
      c->set_output(0, z);
      c->set_output(1, c->Vector(c->Dim(z, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of InLinearSilu: dxw = [du dv dq dk] · silu'(xw + bias) (rounded to T), dbias = its
column sums (unrounded, summed in a fixed order).
)doc");

}  // namespace recops
