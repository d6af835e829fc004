// Kernels of stem in_linear_silu: the fused epilogue of the UVQK projection. The GEMM x·Wᵀ
// (and dz·W, dzᵀ·x in the backward) is TensorFlow's own matmul, the fastest on the machine
// (oneDNN); these kernels fuse everything around it into one pass over memory each way:
// forward z = xw + b, a = silu(z) split four ways, backward dz = dA·silu'(z) (z recomputed
// from xw and b, so z is never stored) and db (deterministic column sums).
#include <algorithm>
#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/dispatch.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/layer_norm.h"
#include "kernels/common/microkernels.h"
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

constexpr int64_t kSegment = 256;  // columns per SiLU pass (fits the row buffers)

// The four outputs' column ranges in [0, Nw).
struct Splits {
  std::array<int64_t, 5> begin{};  // begin[s]; begin[4] = Nw
  std::array<int64_t, 4> size{};
};

absl::Status ReadSplits(OpKernelConstruction* ctx, Splits* splits) {
  std::vector<int64_t> sizes;
  TF_RETURN_IF_ERROR(ctx->GetAttr("split_sizes", &sizes));
  if (sizes.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("split_sizes must have 4 entries (u, v, q, k), got ", sizes.size()));
  }
  for (int s = 0; s < 4; ++s) {
    if (sizes[s] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("split_sizes[", s, "] = ", sizes[s], " must be >= 0"));
    }
    splits->size[s] = sizes[s];
    splits->begin[s + 1] = splits->begin[s] + sizes[s];
  }
  return absl::OkStatus();
}

// Row r of silu(xw + b) into the four outputs.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void ForwardRow(const T* __restrict xw, const Acc* __restrict bias, int64_t nw,
                              const Splits& splits, int64_t r, Acc* __restrict z,
                              Acc* __restrict sig, Acc* __restrict a,
                              const std::array<T*, 4>& outs) {
  for (int64_t n0 = 0; n0 < nw; n0 += kSegment) {
    const int64_t nc = std::min(kSegment, nw - n0);
    for (int64_t j = 0; j < nc; ++j) z[j] = ToAcc<T, Acc>(xw[r * nw + n0 + j]) + bias[n0 + j];
    SigmoidRow<I>(z, nc, sig);
    for (int64_t j = 0; j < nc; ++j) a[n0 + j] = z[j] * sig[j];
  }
  for (int s = 0; s < 4; ++s) {
    T* dst = outs[s] + r * splits.size[s];
    const Acc* src = a + splits.begin[s];
    for (int64_t j = 0; j < splits.size[s]; ++j) dst[j] = FromAcc<T, Acc>(src[j]);
  }
}

// Row r of dz = dA · (σ + z·σ·(1 − σ)), z = xw + b (rounded to T into dz_out); the unrounded
// dz added to the column partial db.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void BackwardRow(const std::array<const T*, 4>& grads, const T* __restrict xw,
                               const Acc* __restrict bias, int64_t nw, const Splits& splits,
                               int64_t r, Acc* __restrict da, Acc* __restrict z,
                               Acc* __restrict sig, Acc* __restrict db, T* __restrict dz_out) {
  for (int s = 0; s < 4; ++s) {
    const T* g = grads[s] + r * splits.size[s];
    Acc* dst = da + splits.begin[s];
    for (int64_t j = 0; j < splits.size[s]; ++j) dst[j] = ToAcc<T, Acc>(g[j]);
  }
  for (int64_t n0 = 0; n0 < nw; n0 += kSegment) {
    const int64_t nc = std::min(kSegment, nw - n0);
    for (int64_t j = 0; j < nc; ++j) z[j] = ToAcc<T, Acc>(xw[r * nw + n0 + j]) + bias[n0 + j];
    SigmoidRow<I>(z, nc, sig);
    for (int64_t j = 0; j < nc; ++j) {
      const Acc s = sig[j];
      const Acc dz = da[n0 + j] * (s + z[j] * s * (Acc(1) - s));
      db[n0 + j] += dz;
      dz_out[r * nw + n0 + j] = FromAcc<T, Acc>(dz);
    }
  }
}

// Validates xw [M, Nw] and bias [Nw] against the split sizes; the bias as Acc.
template <typename T>
absl::Status ReadXwBias(const Tensor& xw, const Tensor& b, const Splits& splits,
                        std::vector<AccumT<T>>* bias) {
  if (xw.dims() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("xw (x · weightᵀ) must be [M, Nw], got ", xw.shape().DebugString()));
  }
  const int64_t nw = xw.dim_size(1);
  if (nw != splits.begin[4]) {
    return absl::InvalidArgumentError(absl::StrCat("split_sizes must sum to Nw = ", nw,
                                                   " (weight's rows), got ", splits.begin[4]));
  }
  if (b.dims() != 1 || b.dim_size(0) != nw) {
    return absl::InvalidArgumentError(
        absl::StrCat("bias must have shape [", nw, "], got ", b.shape().DebugString()));
  }
  bias->resize(nw);
  for (int64_t n = 0; n < nw; ++n) (*bias)[n] = ToAcc<T, AccumT<T>>(b.flat<T>()(n));
  return absl::OkStatus();
}

// Inputs: xw [M, Nw] (= x·Wᵀ), bias [Nw]. Outputs: u, v, q, k.
template <typename T>
class InLinearSiluOp : public OpKernel {
 public:
  explicit InLinearSiluOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadSplits(ctx, &splits_));
  }

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    const Tensor& xw = ctx->input(0);
    std::vector<Acc> bias;
    OP_REQUIRES_OK(ctx, ReadXwBias<T>(xw, ctx->input(1), splits_, &bias));
    const int64_t m = xw.dim_size(0), nw = xw.dim_size(1);
    std::array<T*, 4> outs{};
    for (int s = 0; s < 4; ++s) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(s, TensorShape({m, splits_.size[s]}), &out));
      outs[s] = out->flat<T>().data();
    }
    const T* xp = xw.flat<T>().data();
    ParallelFor(
        ctx, m, 2 * nw * static_cast<int64_t>(sizeof(T)) + 24 * nw, [&](int64_t r0, int64_t r1) {
          std::vector<Acc> buf(2 * kSegment + nw);
          for (int64_t r = r0; r < r1; ++r) {
            RECOPS_WITH_ISA(
                (ForwardRow<T, Acc, I>(xp, bias.data(), nw, splits_, r, buf.data(),
                                       buf.data() + kSegment, buf.data() + 2 * kSegment, outs)));
          }
        });
  }

 private:
  Splits splits_;
};

// Inputs: du, dv, dq, dk, xw, bias. Outputs: dz [M, Nw] (the gradient of xw), dbias.
template <typename T>
class InLinearSiluBackwardOp : public OpKernel {
 public:
  explicit InLinearSiluBackwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadSplits(ctx, &splits_));
  }

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    const Tensor& z = ctx->input(4);
    std::vector<Acc> bias;
    OP_REQUIRES_OK(ctx, ReadXwBias<T>(z, ctx->input(5), splits_, &bias));
    const int64_t m = z.dim_size(0), nw = z.dim_size(1);
    std::array<const T*, 4> grads{};
    for (int s = 0; s < 4; ++s) {
      const Tensor& g = ctx->input(s);
      OP_REQUIRES(ctx, g.shape() == TensorShape({m, splits_.size[s]}),
                  absl::InvalidArgumentError(absl::StrCat("gradient ", s, " must have shape [", m,
                                                          ", ", splits_.size[s], "], got ",
                                                          g.shape().DebugString())));
      grads[s] = g.flat<T>().data();
    }
    Tensor *dz = nullptr, *db = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, z.shape(), &dz));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({nw}), &db));
    ColumnPartials<Acc> partials(m, nw, 1);
    const int64_t per_chunk = (m + partials.chunks() - 1) / partials.chunks();
    const T* zp = z.flat<T>().data();
    T* dzp = dz->flat<T>().data();
    ParallelFor(ctx, partials.chunks(),
                per_chunk * (3 * nw * static_cast<int64_t>(sizeof(T)) + 32 * nw),
                [&](int64_t k0, int64_t k1) {
                  std::vector<Acc> buf(2 * kSegment + nw);
                  for (int64_t k = k0; k < k1; ++k) {
                    Acc* db_k = partials.Partial(k, 0);
                    const int64_t end = partials.ChunkBegin(k + 1, m);
                    for (int64_t r = partials.ChunkBegin(k, m); r < end; ++r) {
                      RECOPS_WITH_ISA((BackwardRow<T, Acc, I>(
                          grads, zp, bias.data(), nw, splits_, r, buf.data() + 2 * kSegment,
                          buf.data(), buf.data() + kSegment, db_k, dzp)));
                    }
                  }
                });
    partials.Reduce(0, db->flat<T>().data());
  }

 private:
  Splits splits_;
};

#define REGISTER(T)                                                                              \
  REGISTER_KERNEL_BUILDER(                                                                       \
      Name("Recops>InLinearSilu").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),         \
      InLinearSiluOp<T>);                                                                        \
  REGISTER_KERNEL_BUILDER(                                                                       \
      Name("Recops>InLinearSiluBackward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      InLinearSiluBackwardOp<T>);
RECOPS_CALL_FLOAT_TYPES(REGISTER)
#undef REGISTER

}  // namespace

}  // namespace recops
