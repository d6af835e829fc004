// Kernels of stem ln_mul: y = (LayerNorm(x) * gamma + beta) * u and its gradient (the shared
// row implementation of kernels/common/norm_mul.h; statistics recomputed in the backward).
#include "kernels/common/dtypes.h"
#include "kernels/common/norm_mul.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

// Inputs (after dy for the gradient): x, u, gamma, beta.
template <typename T>
class LnMulBase : public OpKernel {
 public:
  explicit LnMulBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadEpsilon(ctx, &epsilon_));
  }

 protected:
  absl::Status Prepare(OpKernelContext* ctx, int first, NormMulArgs<T>* a) const {
    return ReadNormMulArgs(ctx, first, "gamma", "beta", epsilon_, a);
  }

  float epsilon_ = 1e-5f;
};

template <typename T>
class LnMulOp : public LnMulBase<T> {
 public:
  using LnMulBase<T>::LnMulBase;

  void Compute(OpKernelContext* ctx) override {
    NormMulArgs<T> a;
    OP_REQUIRES_OK(ctx, this->Prepare(ctx, 0, &a));
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(0).shape(), &y));
    NormMulForward<T>(ctx, a, y->flat<T>().data());
  }
};

template <typename T>
class LnMulGradOp : public LnMulBase<T> {
 public:
  using LnMulBase<T>::LnMulBase;

  void Compute(OpKernelContext* ctx) override {
    NormMulArgs<T> a;
    OP_REQUIRES_OK(ctx, this->Prepare(ctx, 1, &a));
    const Tensor& dy = ctx->input(0);
    OP_REQUIRES(ctx, dy.shape() == ctx->input(1).shape(),
                absl::InvalidArgumentError(absl::StrCat("dy must have x's shape ",
                                                        ctx->input(1).shape().DebugString(),
                                                        ", got ", dy.shape().DebugString())));
    Tensor *dx = nullptr, *du = nullptr, *dgamma = nullptr, *dbeta = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, dy.shape(), &dx));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, dy.shape(), &du));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(3).shape(), &dgamma));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ctx->input(4).shape(), &dbeta));
    NormMulBackward<T>(ctx, a, dy.flat<T>().data(), dx->flat<T>().data(), du->flat<T>().data(),
                       dgamma->flat<T>().data(), dbeta->flat<T>().data());
  }
};

#define REGISTER(T)                                                                            \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name("Recops>LnMul").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), LnMulOp<T>); \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name("Recops>LnMulGrad").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),          \
      LnMulGradOp<T>);
RECOPS_CALL_FLOAT_TYPES(REGISTER)
#undef REGISTER

}  // namespace

}  // namespace recops
