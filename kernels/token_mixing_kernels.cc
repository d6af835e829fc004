// Kernels of stem token_mixing: y[b, i, :] = LayerNorm(x[b, i, :] + x[b, :, i]) * gamma + beta
// for x [B, S, S], and its gradient dx = dt + dtᵀ (dt: the gradient through the LayerNorm).
// Work is per batch element; its S x S block stays in cache while it is read by rows and by
// columns.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/dispatch.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/layer_norm.h"
#include "kernels/common/norm_mul.h"
#include "kernels/common/parallel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

// One call's validated sizes and affine parameters (per call, not per kernel instance:
// concurrent Compute calls on one kernel share nothing).
template <typename Acc>
struct TokenMixingProblem {
  int64_t batch = 0, s = 0;
  Acc epsilon = Acc(0);
  std::vector<Acc> gamma, beta;
};

// Row i of x + xᵀ from the block and its transpose.
template <typename T, typename Acc>
RECOPS_INLINE void MixedRow(const T* __restrict xb, const Acc* __restrict xt, int64_t s, int64_t i,
                            Acc* __restrict t) {
  for (int64_t c = 0; c < s; ++c) t[c] = ToAcc<T, Acc>(xb[i * s + c]) + xt[i * s + c];
}

// out = xc * rstd * gamma + beta.
template <typename T, typename Acc>
RECOPS_INLINE void AffineRow(const Acc* __restrict xc, Acc rstd, const Acc* __restrict gamma,
                             const Acc* __restrict beta, int64_t n, T* __restrict out) {
  for (int64_t c = 0; c < n; ++c) out[c] = FromAcc<T, Acc>(xc[c] * rstd * gamma[c] + beta[c]);
}

// Forward of batch element b (buf: S * S + 2 * S scratch).
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void TokenMixingBatch(const TokenMixingProblem<Acc>& p, const T* xb, Acc* buf,
                                    T* yb) {
  const int64_t s = p.s;
  Acc *xt = buf, *t = xt + s * s, *tc = t + s;
  TransposeTiles<T, Acc>(xb, s, s, xt);
  for (int64_t i = 0; i < s; ++i) {
    MixedRow<T, Acc>(xb, xt, s, i, t);
    const RowMoments<Acc> m = Moments<Acc, I>(t, s, p.epsilon, tc);
    AffineRow<T, Acc>(tc, m.rstd, p.gamma.data(), p.beta.data(), s, yb + i * s);
  }
}

// Gradient of batch element b: dt through the LayerNorm row by row (dgamma / dbeta added to
// the partials), then dx = dt + dtᵀ (buf: 3 * S * S + 4 * S scratch).
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void TokenMixingGradBatch(const TokenMixingProblem<Acc>& p, const T* xb, const T* dyb,
                                        Acc* buf, Acc* dgamma, Acc* dbeta, T* dxb) {
  const int64_t s = p.s;
  Acc *dt = buf, *xt = dt + s * s, *dtt = xt + s * s, *t = dtt + s * s;
  Acc *xhat = t + s, *g = xhat + s, *tmp = g + s;
  TransposeTiles<T, Acc>(xb, s, s, xt);
  for (int64_t i = 0; i < s; ++i) {
    MixedRow<T, Acc>(xb, xt, s, i, t);
    const RowMoments<Acc> m = Moments<Acc, I>(t, s, p.epsilon, xhat);
    Normalize<Acc>(t, m, s, xhat);
    const Acc* gi = RowAsAcc<T, Acc>(dyb + i * s, s, g);
    LayerNormBackwardRow<Acc, I>(xhat, gi, p.gamma.data(), m.rstd, s, tmp, dgamma, dbeta,
                                 dt + i * s);
  }
  TransposeTiles<Acc, Acc>(dt, s, s, dtt);
  for (int64_t e = 0; e < s * s; ++e) dxb[e] = FromAcc<T, Acc>(dt[e] + dtt[e]);
}

// Inputs (after dy for the gradient): x, gamma, beta.
template <typename T>
class TokenMixingBase : public OpKernel {
 public:
  explicit TokenMixingBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadEpsilon(ctx, &epsilon_));
  }

 protected:
  using Acc = AccumT<T>;

  absl::Status Prepare(OpKernelContext* ctx, int first, TokenMixingProblem<Acc>* p) const {
    const Tensor& x = ctx->input(first);
    if (x.dims() != 3 || x.dim_size(1) != x.dim_size(2)) {
      return absl::InvalidArgumentError(
          absl::StrCat("x must have shape [B, S, S] (S == H: x + xᵀ is normalised), got ",
                       x.shape().DebugString()));
    }
    p->batch = x.dim_size(0);
    p->s = x.dim_size(1);
    p->epsilon = static_cast<Acc>(epsilon_);
    if (p->s < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("x's last axis must not be empty, got shape ", x.shape().DebugString()));
    }
    for (int i : {1, 2}) {
      const Tensor& param = ctx->input(first + i);
      if (param.dims() != 1 || param.dim_size(0) != p->s) {
        return absl::InvalidArgumentError(absl::StrCat(i == 1 ? "gamma" : "beta",
                                                       " must have shape [", p->s, "], got ",
                                                       param.shape().DebugString()));
      }
    }
    p->gamma.resize(p->s);
    p->beta.resize(p->s);
    const T* g = ctx->input(first + 1).flat<T>().data();
    const T* b = ctx->input(first + 2).flat<T>().data();
    for (int64_t c = 0; c < p->s; ++c) {
      p->gamma[c] = ToAcc<T, Acc>(g[c]);
      p->beta[c] = ToAcc<T, Acc>(b[c]);
    }
    return absl::OkStatus();
  }

  float epsilon_ = 1e-7f;
};

template <typename T>
class TokenMixingOp : public TokenMixingBase<T> {
 public:
  using TokenMixingBase<T>::TokenMixingBase;
  using Acc = AccumT<T>;

  void Compute(OpKernelContext* ctx) override {
    TokenMixingProblem<Acc> p;
    OP_REQUIRES_OK(ctx, this->Prepare(ctx, 0, &p));
    const Tensor& x = ctx->input(0);
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    const int64_t s = p.s;
    const T* xp = x.flat<T>().data();
    T* yp = y->flat<T>().data();
    ParallelFor(ctx, p.batch, s * (3 * s * static_cast<int64_t>(sizeof(T)) + 24 * s),
                [&](int64_t b0, int64_t b1) {
                  std::vector<Acc> buf(s * s + 2 * s);
                  for (int64_t b = b0; b < b1; ++b) {
                    RECOPS_WITH_ISA((TokenMixingBatch<T, Acc, I>(p, xp + b * s * s, buf.data(),
                                                                 yp + b * s * s)));
                  }
                });
  }
};

template <typename T>
class TokenMixingGradOp : public TokenMixingBase<T> {
 public:
  using TokenMixingBase<T>::TokenMixingBase;
  using Acc = AccumT<T>;

  void Compute(OpKernelContext* ctx) override {
    TokenMixingProblem<Acc> p;
    OP_REQUIRES_OK(ctx, this->Prepare(ctx, 1, &p));
    const Tensor& dy = ctx->input(0);
    const Tensor& x = ctx->input(1);
    OP_REQUIRES(
        ctx, dy.shape() == x.shape(),
        absl::InvalidArgumentError(absl::StrCat("dy must have x's shape ", x.shape().DebugString(),
                                                ", got ", dy.shape().DebugString())));
    Tensor *dx = nullptr, *dgamma = nullptr, *dbeta = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &dx));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ctx->input(2).shape(), &dgamma));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(3).shape(), &dbeta));
    const int64_t s = p.s, batch = p.batch;
    const T* xp = x.flat<T>().data();
    const T* dyp = dy.flat<T>().data();
    T* dxp = dx->flat<T>().data();
    // Chunks of batch elements (fixed by B) with their own dgamma / dbeta partials.
    ColumnPartials<Acc> partials(batch, s, 2);
    const int64_t per_chunk = (batch + partials.chunks() - 1) / partials.chunks();
    ParallelFor(ctx, partials.chunks(),
                per_chunk * s * (4 * s * static_cast<int64_t>(sizeof(T)) + 32 * s),
                [&](int64_t k0, int64_t k1) {
                  std::vector<Acc> buf(3 * s * s + 4 * s);
                  for (int64_t k = k0; k < k1; ++k) {
                    Acc* dgamma_k = partials.Partial(k, 0);
                    Acc* dbeta_k = partials.Partial(k, 1);
                    const int64_t end = partials.ChunkBegin(k + 1, batch);
                    for (int64_t b = partials.ChunkBegin(k, batch); b < end; ++b) {
                      const int64_t at = b * s * s;
                      RECOPS_WITH_ISA((TokenMixingGradBatch<T, Acc, I>(
                          p, xp + at, dyp + at, buf.data(), dgamma_k, dbeta_k, dxp + at)));
                    }
                  }
                });
    partials.Reduce(0, dgamma->flat<T>().data());
    partials.Reduce(1, dbeta->flat<T>().data());
  }
};

#define REGISTER(T)                                                                         \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("Recops>TokenMixing").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),     \
      TokenMixingOp<T>);                                                                    \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("Recops>TokenMixingGrad").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      TokenMixingGradOp<T>);
RECOPS_CALL_FLOAT_TYPES(REGISTER)
#undef REGISTER

}  // namespace

}  // namespace recops
