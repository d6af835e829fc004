// Kernels of stem fused_lazy_adam: LazyAdam on resource variables and by address.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/common/microkernels.h"
#include "kernels/common/sparse_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;

namespace {

struct AdamParams {
  float lr, beta1, beta2, epsilon;
};

// One Adam step on a row (the seed's math: v stored as |v|, epsilon outside the sqrt),
// compiled for AVX-512, AVX2 and baseline x86-64.
RECOPS_MULTIVERSION void AdamRow(const float* __restrict g, int64_t dim, AdamParams p,
                                 float* __restrict var, float* __restrict m, float* __restrict v) {
  const float beta1 = p.beta1, beta2 = p.beta2, lr = p.lr, epsilon = p.epsilon;
  const float one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2;
  for (int64_t c = 0; c < dim; ++c) {
    const float m_new = beta1 * m[c] + one_minus_b1 * g[c];
    const float v_new = std::fabs(beta2 * v[c] + one_minus_b2 * g[c] * g[c]);
    m[c] = m_new;
    v[c] = v_new;
    var[c] -= lr * m_new / (std::sqrt(v_new) + epsilon);
  }
}

// LazyAdam on resource variables var, m, v (kByAddress false) or on a table's rows with m
// and v in its slots 0 and 1 (kByAddress true): the rows come from SparseStepRows.
template <bool kByAddress>
class LazyAdamOp : public OpKernel {
 public:
  explicit LazyAdamOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta1", &params_.beta1));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta2", &params_.beta2));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &params_.epsilon));
    OP_REQUIRES(
        ctx, params_.beta1 >= 0 && params_.beta1 < 1,
        absl::InvalidArgumentError(absl::StrCat("beta1 must be in [0, 1), got ", params_.beta1)));
    OP_REQUIRES(
        ctx, params_.beta2 >= 0 && params_.beta2 < 1,
        absl::InvalidArgumentError(absl::StrCat("beta2 must be in [0, 1), got ", params_.beta2)));
    OP_REQUIRES(ctx, params_.epsilon > 0 && std::isfinite(params_.epsilon),
                absl::InvalidArgumentError(
                    absl::StrCat("epsilon must be positive and finite, got ", params_.epsilon)));
  }

  // Applies the step to the distinct rows (their gradients summed).
  void Compute(OpKernelContext* ctx) override {
    static const char* const kNames[] = {"var", "m", "v"};
    const SparseStepRows step(ctx, kByAddress, 3, kNames, "LazyAdam");
    OP_REQUIRES_OK(ctx, step.status());
    AdamParams p = params_;
    p.lr = step.lr();
    const int64_t dim = step.dim();
    const int64_t bytes = dim * static_cast<int64_t>(sizeof(float));
    ForEachDistinctRowSum(
        ctx, step.rows(), step.num_updates(), step.gradient(), dim, 24 * dim,
        [&](int64_t row, const float* sum, int64_t) {
          AdamRow(sum, dim, p, step.Row(row, 0), step.Row(row, 1), step.Row(row, 2));
        },
        [&](int64_t row) {
          for (int s = 0; s < 3; ++s) PrefetchBytes(step.Row(row, s), bytes, true);
        });
  }

 private:
  AdamParams params_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("Recops>LazyAdam").Device(tensorflow::DEVICE_CPU), LazyAdamOp<false>);
REGISTER_KERNEL_BUILDER(Name("Recops>LazyAdamByAddress").Device(tensorflow::DEVICE_CPU),
                        LazyAdamOp<true>);

}  // namespace recops
