// Kernels of stem fused_sgd: sparse SGD with weight decay on resource variables and by address.
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

// var -= lr * (g + decay * var): the summed gradient of a row's occurrences and their weight
// decay (count * weight_decay, each from the value before the step).
RECOPS_MULTIVERSION void SgdRow(const float* __restrict g, int64_t dim, float lr, float decay,
                                float* __restrict var) {
  if (decay == 0) {
    for (int64_t c = 0; c < dim; ++c) var[c] -= lr * g[c];
  } else {
    for (int64_t c = 0; c < dim; ++c) var[c] -= lr * (g[c] + decay * var[c]);
  }
}

// Sparse SGD on a resource variable (kByAddress false) or on a table's rows (kByAddress
// true): the rows come from SparseStepRows.
template <bool kByAddress>
class SgdOp : public OpKernel {
 public:
  explicit SgdOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("weight_decay", &weight_decay_));
    OP_REQUIRES(ctx, std::isfinite(weight_decay_) && weight_decay_ >= 0,
                absl::InvalidArgumentError(
                    absl::StrCat("weight_decay must be >= 0 and finite, got ", weight_decay_)));
  }

  // var[r] -= lr * (sum of the occurrences' gradients + count * weight_decay * var_old[r]):
  // every occurrence applies its own step from the value before the batch, as the seed does.
  void Compute(OpKernelContext* ctx) override {
    static const char* const kNames[] = {"var"};
    const SparseStepRows step(ctx, kByAddress, 1, kNames, "Sgd");
    OP_REQUIRES_OK(ctx, step.status());
    const int64_t dim = step.dim();
    const float lr = step.lr(), wd = weight_decay_;
    ForEachDistinctRowSum(
        ctx, step.rows(), step.num_updates(), step.gradient(), dim, 8 * dim,
        [&](int64_t row, const float* sum, int64_t count) {
          SgdRow(sum, dim, lr, static_cast<float>(count) * wd, step.Row(row, 0));
        },
        [&](int64_t row) {
          PrefetchBytes(step.Row(row, 0), dim * static_cast<int64_t>(sizeof(float)), true);
        });
  }

 private:
  float weight_decay_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("Recops>Sgd").Device(tensorflow::DEVICE_CPU), SgdOp<false>);
REGISTER_KERNEL_BUILDER(Name("Recops>SgdByAddress").Device(tensorflow::DEVICE_CPU), SgdOp<true>);

}  // namespace recops
