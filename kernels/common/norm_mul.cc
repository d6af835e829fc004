#include "kernels/common/norm_mul.h"

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

absl::Status CheckNormMulInputs(const tensorflow::Tensor& x, const tensorflow::Tensor& u,
                                const tensorflow::Tensor& gamma, const tensorflow::Tensor& beta,
                                const char* gamma_name, const char* beta_name, int64_t* rows,
                                int64_t* cols) {
  if (x.dims() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("x must have rank >= 1 ([..., C]), got shape ", x.shape().DebugString()));
  }
  if (u.shape() != x.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "u must have x's shape ", x.shape().DebugString(), ", got ", u.shape().DebugString()));
  }
  *cols = x.dim_size(x.dims() - 1);
  if (*cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the normalised (last) axis of x must not be empty, got shape ", x.shape().DebugString()));
  }
  *rows = x.NumElements() / *cols;
  for (const auto& [t, name] :
       {std::pair<const tensorflow::Tensor*, const char*>{&gamma, gamma_name},
        {&beta, beta_name}}) {
    if (t->dims() != 1 || t->dim_size(0) != *cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " must have shape [", *cols, "] (x's last axis), got ", t->shape().DebugString()));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadEpsilon(tensorflow::OpKernelConstruction* ctx, float* epsilon_out) {
  float epsilon = 0.0f;
  TF_RETURN_IF_ERROR(ctx->GetAttr("epsilon", &epsilon));
  *epsilon_out = epsilon;
  if (!(epsilon > 0.0f) || !std::isfinite(epsilon)) {
    return absl::InvalidArgumentError(
        absl::StrCat("epsilon must be a positive finite number, got ", epsilon));
  }
  return absl::OkStatus();
}

#define RECOPS_NORM_MUL_INSTANTIATE_(T) RECOPS_NORM_MUL_TEMPLATES(, T)
RECOPS_CALL_FLOAT_TYPES(RECOPS_NORM_MUL_INSTANTIATE_)
#undef RECOPS_NORM_MUL_INSTANTIATE_

}  // namespace recops
