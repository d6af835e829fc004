// Kernels of stem norm_multiply_dropout: y = dropout((LayerNorm(x) * weight + bias) * u) with
// a stateless counter-based mask (recomputed by the backward from the seed, never stored), the
// row statistics saved for the backward, and the gradient.
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/norm_mul.h"
#include "kernels/common/validation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

// Inputs (after dy for the backward): x, u, weight, bias (then mean, var for the backward),
// and last the seed.
template <typename T>
class NormMulDropoutBase : public OpKernel {
 public:
  explicit NormMulDropoutBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadEpsilon(ctx, &epsilon_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dropout_rate", &rate_));
    OP_REQUIRES(
        ctx, rate_ >= 0.0f && rate_ < 1.0f,
        absl::InvalidArgumentError(absl::StrCat("dropout_rate must lie in [0, 1), got ", rate_)));
  }

 protected:
  absl::Status Prepare(OpKernelContext* ctx, int first, int seed_input, NormMulArgs<T>* a,
                       std::vector<int64_t>* seed) const {
    TF_RETURN_IF_ERROR(ReadNormMulArgs(ctx, first, "weight", "bias", epsilon_, a));
    TF_RETURN_IF_ERROR(ReadInt64Vector(ctx->input(seed_input), "seed", seed));
    if (seed->size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("seed must have shape [2] (seed, step), got ", seed->size(), " values"));
    }
    return absl::OkStatus();
  }

  float epsilon_ = 1e-5f, rate_ = 0.0f;
};

template <typename T>
class NormMultiplyDropoutOp : public NormMulDropoutBase<T> {
 public:
  using NormMulDropoutBase<T>::NormMulDropoutBase;

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    NormMulArgs<T> a;
    std::vector<int64_t> seed;
    OP_REQUIRES_OK(ctx, this->Prepare(ctx, 0, 4, &a, &seed));
    Tensor *y = nullptr, *mean = nullptr, *var = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(0).shape(), &y));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({a.rows}), &mean));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({a.rows}), &var));
    const DropoutMask mask(this->rate_, seed[0], seed[1]);
    a.mask = &mask;
    a.mean_out = mean->flat<Acc>().data();
    a.var_out = var->flat<Acc>().data();
    NormMulForward<T>(ctx, a, y->flat<T>().data());
  }
};

template <typename T>
class NormMultiplyDropoutBackwardOp : public NormMulDropoutBase<T> {
 public:
  using NormMulDropoutBase<T>::NormMulDropoutBase;

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    NormMulArgs<T> a;
    std::vector<int64_t> seed;
    OP_REQUIRES_OK(ctx, this->Prepare(ctx, 1, 7, &a, &seed));
    const Tensor& dy = ctx->input(0);
    const Tensor& mean = ctx->input(5);
    const Tensor& var = ctx->input(6);
    OP_REQUIRES(ctx, dy.shape() == ctx->input(1).shape(),
                absl::InvalidArgumentError(absl::StrCat("dy must have x's shape ",
                                                        ctx->input(1).shape().DebugString(),
                                                        ", got ", dy.shape().DebugString())));
    OP_REQUIRES(ctx, mean.shape() == TensorShape({a.rows}) && var.shape() == mean.shape(),
                absl::InvalidArgumentError(absl::StrCat(
                    "mean and var must have shape [", a.rows, "] (one per row of x), got ",
                    mean.shape().DebugString(), " and ", var.shape().DebugString())));
    Tensor *dx = nullptr, *du = nullptr, *dweight = nullptr, *dbias = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, dy.shape(), &dx));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, dy.shape(), &du));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(3).shape(), &dweight));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ctx->input(4).shape(), &dbias));
    const DropoutMask mask(this->rate_, seed[0], seed[1]);
    a.mask = &mask;
    a.mean_in = mean.flat<Acc>().data();
    a.var_in = var.flat<Acc>().data();
    NormMulBackward<T>(ctx, a, dy.flat<T>().data(), dx->flat<T>().data(), du->flat<T>().data(),
                       dweight->flat<T>().data(), dbias->flat<T>().data());
  }
};

#define REGISTER(T)                                                  \
  REGISTER_KERNEL_BUILDER(Name("Recops>NormMultiplyDropout")         \
                              .Device(tensorflow::DEVICE_CPU)        \
                              .TypeConstraint<T>("T")                \
                              .TypeConstraint<AccumT<T>>("Tstat"),   \
                          NormMultiplyDropoutOp<T>);                 \
  REGISTER_KERNEL_BUILDER(Name("Recops>NormMultiplyDropoutBackward") \
                              .Device(tensorflow::DEVICE_CPU)        \
                              .TypeConstraint<T>("T")                \
                              .TypeConstraint<AccumT<T>>("Tstat"),   \
                          NormMultiplyDropoutBackwardOp<T>);
RECOPS_CALL_FLOAT_TYPES(REGISTER)
#undef REGISTER

}  // namespace

}  // namespace recops
