// Kernels of stem fused_lazy_adam: LazyAdam on resource variables and by address.
#include <cmath>
#include <cstring>
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

struct AdamParams {
  float lr, beta1, beta2, epsilon;
};

// One Adam step on a row (the seed's math: v stored as |v|, epsilon outside the sqrt),
// compiled for AVX-512, AVX2 and baseline x86-64.
RECOPS_MULTIVERSION void AdamRow(const float* __restrict g, int64_t dim, AdamParams p,
                                 float* __restrict var, float* __restrict m,
                                 float* __restrict v) {
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

class AdamOpBase : public OpKernel {
 public:
  explicit AdamOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta1", &params_.beta1));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta2", &params_.beta2));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &params_.epsilon));
    OP_REQUIRES(ctx, params_.beta1 >= 0 && params_.beta1 < 1,
                absl::InvalidArgumentError(
                    absl::StrCat("beta1 must be in [0, 1), got ", params_.beta1)));
    OP_REQUIRES(ctx, params_.beta2 >= 0 && params_.beta2 < 1,
                absl::InvalidArgumentError(
                    absl::StrCat("beta2 must be in [0, 1), got ", params_.beta2)));
    OP_REQUIRES(ctx, params_.epsilon > 0 && std::isfinite(params_.epsilon),
                absl::InvalidArgumentError(
                    absl::StrCat("epsilon must be positive and finite, got ", params_.epsilon)));
  }

 protected:
  // Applies the step to the distinct rows; row_ptr(r) is the [var | m | v] pointers of row r.
  template <typename RowPointers>
  void Apply(OpKernelContext* ctx, float lr, const Tensor& gradient,
             const int64_t* rows, const RowPointers& row_ptr) {
    AdamParams p = params_;
    p.lr = lr;
    const int64_t dim = gradient.dim_size(1);
    const float* g = gradient.flat<float>().data();
    const int64_t bytes = dim * static_cast<int64_t>(sizeof(float));
    ForEachDistinctRowSum(
        ctx, rows, gradient.dim_size(0), g, dim, 24 * dim,
        [&](int64_t row, const float* sum, int64_t) {
          float *var, *m, *v;
          row_ptr(row, &var, &m, &v);
          AdamRow(sum, dim, p, var, m, v);
        },
        [&](int64_t row) {
          float *var, *m, *v;
          row_ptr(row, &var, &m, &v);
          PrefetchBytes(var, bytes, true);
          PrefetchBytes(m, bytes, true);
          PrefetchBytes(v, bytes, true);
        });
  }

  AdamParams params_;
};

class LazyAdamOp : public AdamOpBase {
 public:
  using AdamOpBase::AdamOpBase;

  void Compute(OpKernelContext* ctx) override {
    static const char* const kNames[] = {"var", "m", "v"};
    LockedVariables vars(ctx, 3, kNames);
    OP_REQUIRES_OK(ctx, vars.status());
    const int64_t num_rows = vars.tensor(0).dim_size(0), dim = vars.tensor(0).dim_size(1);
    const Tensor& gradient = ctx->input(4);
    float lr;
    OP_REQUIRES_OK(ctx, CheckStepInputs(ctx->input(3), gradient, dim, &lr));
    std::vector<int64_t> storage;
    const int64_t* rows;
    OP_REQUIRES_OK(ctx, ReadRowIndices(ctx->input(5), gradient.dim_size(0), num_rows, &storage,
                                       &rows));
    float *var = vars.data(0), *m = vars.data(1), *v = vars.data(2);
    Apply(ctx, lr, gradient, rows, [&](int64_t r, float** pv, float** pm, float** pvv) {
      *pv = var + r * dim;
      *pm = m + r * dim;
      *pvv = v + r * dim;
    });
  }
};

class LazyAdamByAddressOp : public AdamOpBase {
 public:
  using AdamOpBase::AdamOpBase;

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<DynamicTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    OP_REQUIRES(ctx, table->config().num_slots >= 2,
                absl::InvalidArgumentError(absl::StrCat(
                    "LazyAdam keeps m and v in the table's slots: the table needs num_slots "
                    ">= 2, it has ",
                    table->config().num_slots)));
    const int64_t dim = table->dim();
    const Tensor& gradient = ctx->input(2);
    const Tensor& address = ctx->input(3);
    float lr;
    OP_REQUIRES_OK(ctx, CheckStepInputs(ctx->input(1), gradient, dim, &lr));
    absl::MutexLock lock(table->mu());
    std::vector<int64_t> rows;
    OP_REQUIRES_OK(ctx, DecodeStepAddresses(ctx, *table, address, gradient, &rows));
    Apply(ctx, lr, gradient, rows.data(), [&](int64_t r, float** pv, float** pm, float** pvv) {
      *pv = table->Row(r);
      *pm = *pv + dim;
      *pvv = *pv + 2 * dim;
    });
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("Recops>LazyAdam").Device(tensorflow::DEVICE_CPU), LazyAdamOp);
REGISTER_KERNEL_BUILDER(Name("Recops>LazyAdamByAddress").Device(tensorflow::DEVICE_CPU),
                        LazyAdamByAddressOp);

}  // namespace recops
