// y = (LayerNorm(x) * gamma + beta) * u, optionally with inverted dropout, and its backward:
// the one row-parallel implementation behind ln_mul (no dropout, statistics recomputed) and
// norm_multiply_dropout (dropout, statistics saved by the forward). Memory-bound: every row is
// read once into L1-resident Acc buffers and every output written once.
#ifndef RECOPS_KERNELS_COMMON_NORM_MUL_H_
#define RECOPS_KERNELS_COMMON_NORM_MUL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

#include "kernels/common/copy.h"
#include "kernels/common/dispatch.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/layer_norm.h"
#include "kernels/common/parallel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

// Validates x [..., C] and u (same shape), gamma and beta [C]; rows = x's elements / C.
absl::Status CheckNormMulInputs(const tensorflow::Tensor& x, const tensorflow::Tensor& u,
                                const tensorflow::Tensor& gamma, const tensorflow::Tensor& beta,
                                const char* gamma_name, const char* beta_name, int64_t* rows,
                                int64_t* cols);

// The "epsilon" attribute of a LayerNorm-family kernel: positive and finite.
absl::Status ReadEpsilon(tensorflow::OpKernelConstruction* ctx, float* epsilon);

template <typename T>
struct NormMulArgs {
  using Acc = AccumT<T>;
  int64_t rows = 0, cols = 0;
  Acc epsilon = Acc(1e-5);
  const T* x = nullptr;
  const T* u = nullptr;
  const T* gamma = nullptr;
  const T* beta = nullptr;
  const DropoutMask* mask = nullptr;  // nullptr or inactive: no dropout
  // Statistics per row: written by the forward when non-null, read by the backward when
  // non-null (else recomputed).
  Acc* mean_out = nullptr;
  Acc* var_out = nullptr;
  const Acc* mean_in = nullptr;
  const Acc* var_in = nullptr;
};

// The one Prepare of ln_mul and norm_multiply_dropout: validates inputs first..first+3 (x, u,
// and the affine pair, named gamma_name / beta_name in errors) and points *a at them, with
// the kernel's epsilon attribute.
template <typename T>
absl::Status ReadNormMulArgs(tensorflow::OpKernelContext* ctx, int first, const char* gamma_name,
                             const char* beta_name, float epsilon, NormMulArgs<T>* a) {
  const tensorflow::Tensor& x = ctx->input(first);
  const tensorflow::Tensor& u = ctx->input(first + 1);
  const tensorflow::Tensor& gamma = ctx->input(first + 2);
  const tensorflow::Tensor& beta = ctx->input(first + 3);
  TF_RETURN_IF_ERROR(
      CheckNormMulInputs(x, u, gamma, beta, gamma_name, beta_name, &a->rows, &a->cols));
  a->epsilon = static_cast<AccumT<T>>(epsilon);
  a->x = x.flat<T>().data();
  a->u = u.flat<T>().data();
  a->gamma = gamma.flat<T>().data();
  a->beta = beta.flat<T>().data();
  return absl::OkStatus();
}

// gamma and beta as Acc vectors (read by every row).
template <typename T>
void AffineAsAcc(const NormMulArgs<T>& a, std::vector<AccumT<T>>* gamma,
                 std::vector<AccumT<T>>* beta) {
  using Acc = AccumT<T>;
  gamma->resize(a.cols);
  beta->resize(a.cols);
  for (int64_t c = 0; c < a.cols; ++c) {
    (*gamma)[c] = ToAcc<T, Acc>(a.gamma[c]);
    (*beta)[c] = ToAcc<T, Acc>(a.beta[c]);
  }
}

// One output row: ((xc * rstd) * gamma + beta) * u (* factor).
template <typename T, typename Acc>
RECOPS_INLINE void NormMulRow(const Acc* __restrict xc, Acc rstd, const Acc* __restrict gamma,
                              const Acc* __restrict beta, const Acc* __restrict u,
                              const Acc* __restrict factor, int64_t n, T* __restrict out) {
  if (factor != nullptr) {
    for (int64_t c = 0; c < n; ++c) {
      out[c] = FromAcc<T, Acc>((xc[c] * rstd * gamma[c] + beta[c]) * u[c] * factor[c]);
    }
  } else {
    for (int64_t c = 0; c < n; ++c) {
      out[c] = FromAcc<T, Acc>((xc[c] * rstd * gamma[c] + beta[c]) * u[c]);
    }
  }
}

// du = g * (xhat * gamma + beta) (written as T) and d_ln = g * u.
template <typename T, typename Acc>
RECOPS_INLINE void NormMulGradRow(const Acc* __restrict g, const Acc* __restrict xhat,
                                  const Acc* __restrict gamma, const Acc* __restrict beta,
                                  const Acc* __restrict u, int64_t n, T* __restrict du,
                                  Acc* __restrict d_ln) {
  for (int64_t c = 0; c < n; ++c) {
    du[c] = FromAcc<T, Acc>(g[c] * (xhat[c] * gamma[c] + beta[c]));
    d_ln[c] = g[c] * u[c];
  }
}

template <typename T, typename Acc>
RECOPS_INLINE void StoreRow(const Acc* __restrict x, int64_t n, T* __restrict out) {
  for (int64_t c = 0; c < n; ++c) out[c] = FromAcc<T, Acc>(x[c]);
}

// a[c] *= b[c].
template <typename Acc>
RECOPS_INLINE void ScaleRow(const Acc* __restrict b, int64_t n, Acc* __restrict a) {
  for (int64_t c = 0; c < n; ++c) a[c] *= b[c];
}

// A row's output: written in place, or (stream: large outputs) built in `staging` and copied
// with streaming stores, which skip reading the destination lines first (~15% less traffic).
template <typename T>
struct RowOut {
  T* base;
  T* staging;  // nullptr: write in place
  int64_t cols;
  T* Row(int64_t r) const { return staging != nullptr ? staging : base + r * cols; }
  void Done(int64_t r) const {
    if (staging == nullptr) return;
    CopyRun(reinterpret_cast<char*>(base + r * cols), reinterpret_cast<const char*>(staging),
            cols * static_cast<int64_t>(sizeof(T)), true);
  }
};

// Forward rows [r0, r1) (buf: 4 * cols scratch).
template <typename T, Isa I>
RECOPS_INLINE void NormMulForwardRows(const NormMulArgs<T>& a, const AccumT<T>* gamma,
                                      const AccumT<T>* beta, int64_t r0, int64_t r1, AccumT<T>* buf,
                                      const RowOut<T>& y) {
  using Acc = AccumT<T>;
  const bool dropout = a.mask != nullptr && a.mask->active();
  const int64_t cols = a.cols;
  Acc *xbuf = buf, *ubuf = xbuf + cols, *xc = ubuf + cols, *factor = xc + cols;
  for (int64_t r = r0; r < r1; ++r) {
    const Acc* x = RowAsAcc<T, Acc>(a.x + r * cols, cols, xbuf);
    const Acc* u = RowAsAcc<T, Acc>(a.u + r * cols, cols, ubuf);
    const RowMoments<Acc> m = Moments<Acc, I>(x, cols, a.epsilon, xc);
    if (a.mean_out != nullptr) {
      a.mean_out[r] = m.mean;
      a.var_out[r] = m.var;
    }
    if (dropout) a.mask->template Factors<Acc>(static_cast<uint64_t>(r), cols, factor);
    NormMulRow<T, Acc>(xc, m.rstd, gamma, beta, u, dropout ? factor : nullptr, cols, y.Row(r));
    y.Done(r);
  }
}

// Backward rows [r0, r1), their dgamma / dbeta contributions added to the partials (buf:
// 8 * cols scratch).
template <typename T, Isa I>
RECOPS_INLINE void NormMulBackwardRows(const NormMulArgs<T>& a, const AccumT<T>* gamma,
                                       const AccumT<T>* beta, const T* dy, int64_t r0, int64_t r1,
                                       AccumT<T>* buf, const RowOut<T>& dx, const RowOut<T>& du,
                                       AccumT<T>* dgamma, AccumT<T>* dbeta) {
  using Acc = AccumT<T>;
  const bool dropout = a.mask != nullptr && a.mask->active();
  const int64_t cols = a.cols;
  Acc *xbuf = buf, *ubuf = xbuf + cols, *gbuf = ubuf + cols, *xhat = gbuf + cols;
  Acc *d_ln = xhat + cols, *t = d_ln + cols, *dxa = t + cols, *factor = dxa + cols;
  for (int64_t r = r0; r < r1; ++r) {
    const Acc* x = RowAsAcc<T, Acc>(a.x + r * cols, cols, xbuf);
    RowMoments<Acc> m;
    if (a.mean_in != nullptr) {
      m.mean = a.mean_in[r];
      m.var = a.var_in[r];
      m.rstd = Acc(1) / std::sqrt(m.var + a.epsilon);
    } else {
      m = Moments<Acc, I>(x, cols, a.epsilon, xhat);
    }
    Normalize<Acc>(x, m, cols, xhat);
    const Acc* u = RowAsAcc<T, Acc>(a.u + r * cols, cols, ubuf);
    const Acc* g = RowAsAcc<T, Acc>(dy + r * cols, cols, gbuf);
    if (dropout) {
      a.mask->template Factors<Acc>(static_cast<uint64_t>(r), cols, factor);
      ScaleRow<Acc>(g, cols, factor);
      g = factor;
    }
    NormMulGradRow<T, Acc>(g, xhat, gamma, beta, u, cols, du.Row(r), d_ln);
    du.Done(r);
    LayerNormBackwardRow<Acc, I>(xhat, d_ln, gamma, m.rstd, cols, t, dgamma, dbeta, dxa);
    StoreRow<T, Acc>(dxa, cols, dx.Row(r));
    dx.Done(r);
  }
}

template <typename T>
void NormMulForward(tensorflow::OpKernelContext* ctx, const NormMulArgs<T>& a, T* y) {
  using Acc = AccumT<T>;
  std::vector<Acc> gamma, beta;
  AffineAsAcc(a, &gamma, &beta);
  const int64_t cols = a.cols;
  const bool stream = a.rows * cols * static_cast<int64_t>(sizeof(T)) >= kStreamingOutputBytes;
  ParallelFor(ctx, a.rows, 3 * cols * static_cast<int64_t>(sizeof(T)) + 16 * cols,
              [&](int64_t r0, int64_t r1) {
                std::vector<Acc> buf(4 * cols);
                std::vector<T> staging(stream ? cols : 0);
                const RowOut<T> out{y, stream ? staging.data() : nullptr, cols};
                RECOPS_WITH_ISA((NormMulForwardRows<T, I>(a, gamma.data(), beta.data(), r0, r1,
                                                          buf.data(), out)));
                if (stream) StreamFence();
              });
}

// dx, du (rows x cols) and dgamma, dbeta (cols; deterministic column sums).
template <typename T>
void NormMulBackward(tensorflow::OpKernelContext* ctx, const NormMulArgs<T>& a, const T* dy, T* dx,
                     T* du, T* dgamma, T* dbeta) {
  using Acc = AccumT<T>;
  std::vector<Acc> gamma, beta;
  AffineAsAcc(a, &gamma, &beta);
  const int64_t rows = a.rows, cols = a.cols;
  ColumnPartials<Acc> partials(rows, cols, 2);
  const bool stream = rows * cols * static_cast<int64_t>(sizeof(T)) >= kStreamingOutputBytes;
  const int64_t rows_per_chunk = (rows + partials.chunks() - 1) / partials.chunks();
  ParallelFor(ctx, partials.chunks(),
              rows_per_chunk * (5 * cols * static_cast<int64_t>(sizeof(T)) + 32 * cols),
              [&](int64_t k0, int64_t k1) {
                std::vector<Acc> buf(8 * cols);
                std::vector<T> staging(stream ? 2 * cols : 0);
                const RowOut<T> dx_out{dx, stream ? staging.data() : nullptr, cols};
                const RowOut<T> du_out{du, stream ? staging.data() + cols : nullptr, cols};
                for (int64_t k = k0; k < k1; ++k) {
                  const int64_t r0 = partials.ChunkBegin(k, rows),
                                r1 = partials.ChunkBegin(k + 1, rows);
                  Acc* dgamma_k = partials.Partial(k, 0);
                  Acc* dbeta_k = partials.Partial(k, 1);
                  RECOPS_WITH_ISA(
                      (NormMulBackwardRows<T, I>(a, gamma.data(), beta.data(), dy, r0, r1,
                                                 buf.data(), dx_out, du_out, dgamma_k, dbeta_k)));
                }
                if (stream) StreamFence();
              });
  partials.Reduce(0, dgamma);
  partials.Reduce(1, dbeta);
}

// NormMulForward / NormMulBackward are instantiated once, for the float dtypes, in
// kernels/common/norm_mul.cc (each is three instruction sets' worth of row code).
#define RECOPS_NORM_MUL_TEMPLATES(PREFIX, T)                                                       \
  PREFIX template void NormMulForward<T>(tensorflow::OpKernelContext*, const NormMulArgs<T>&, T*); \
  PREFIX template void NormMulBackward<T>(tensorflow::OpKernelContext*, const NormMulArgs<T>&,     \
                                          const T*, T*, T*, T*, T*);
#define RECOPS_NORM_MUL_EXTERN_(T) RECOPS_NORM_MUL_TEMPLATES(extern, T)
RECOPS_CALL_FLOAT_TYPES(RECOPS_NORM_MUL_EXTERN_)
#undef RECOPS_NORM_MUL_EXTERN_

}  // namespace recops

#endif  // RECOPS_KERNELS_COMMON_NORM_MUL_H_
