// Kernels of stem fused_sgd: sparse SGD with weight decay on resource variables and by address.
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/embedding_by_address.h"
#include "kernels/common/microkernels.h"
#include "kernels/common/sparse_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

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

class SgdOpBase : public OpKernel {
 public:
  explicit SgdOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("weight_decay", &weight_decay_));
    OP_REQUIRES(ctx, std::isfinite(weight_decay_) && weight_decay_ >= 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "weight_decay must be >= 0 and finite, got ", weight_decay_)));
  }

 protected:
  // var[r] -= lr * (sum of the occurrences' gradients + count * weight_decay * var_old[r]):
  // every occurrence applies its own step from the value before the batch, as the seed does.
  template <typename RowPointer>
  void Apply(OpKernelContext* ctx, float lr, const Tensor& gradient,
             const int64_t* rows, const RowPointer& row_ptr) {
    const int64_t dim = gradient.dim_size(1);
    const float* g = gradient.flat<float>().data();
    const float wd = weight_decay_;
    ForEachDistinctRowSum(
        ctx, rows, gradient.dim_size(0), g, dim, 8 * dim,
        [&](int64_t row, const float* sum, int64_t count) {
          SgdRow(sum, dim, lr, static_cast<float>(count) * wd, row_ptr(row));
        },
        [&](int64_t row) {
          PrefetchBytes(row_ptr(row), dim * static_cast<int64_t>(sizeof(float)), true);
        });
  }

  float weight_decay_;
};

class SgdOp : public SgdOpBase {
 public:
  using SgdOpBase::SgdOpBase;

  void Compute(OpKernelContext* ctx) override {
    static const char* const kNames[] = {"var"};
    LockedVariables vars(ctx, 1, kNames);
    OP_REQUIRES_OK(ctx, vars.status());
    const int64_t num_rows = vars.tensor(0).dim_size(0), dim = vars.tensor(0).dim_size(1);
    const Tensor& gradient = ctx->input(2);
    float lr;
    OP_REQUIRES_OK(ctx, CheckStepInputs(ctx->input(1), gradient, dim, &lr));
    std::vector<int64_t> storage;
    const int64_t* rows;
    OP_REQUIRES_OK(ctx, ReadRowIndices(ctx->input(3), gradient.dim_size(0), num_rows, &storage,
                                       &rows));
    float* var = vars.data(0);
    Apply(ctx, lr, gradient, rows, [&](int64_t r) { return var + r * dim; });
  }
};

class SgdByAddressOp : public SgdOpBase {
 public:
  using SgdOpBase::SgdOpBase;

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<DynamicTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    const Tensor& gradient = ctx->input(2);
    const Tensor& address = ctx->input(3);
    float lr;
    OP_REQUIRES_OK(ctx, CheckStepInputs(ctx->input(1), gradient, table->dim(), &lr));
    absl::MutexLock lock(table->mu());
    std::vector<int64_t> rows;
    OP_REQUIRES_OK(ctx, DecodeStepAddresses(ctx, *table, address, gradient, &rows));
    Apply(ctx, lr, gradient, rows.data(), [&](int64_t r) { return table->Row(r); });
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("Recops>Sgd").Device(tensorflow::DEVICE_CPU), SgdOp);
REGISTER_KERNEL_BUILDER(Name("Recops>SgdByAddress").Device(tensorflow::DEVICE_CPU),
                        SgdByAddressOp);

}  // namespace recops
