// Kernels of stem relative_attn_bias: the bucketised time bias (output-write bound), its
// deterministic scatter-add gradient and the inference position bias.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/copy.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/parallel.h"
#include "kernels/common/validation.h"
#include "kernels/relative_attn_bias.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

template <typename T, typename Tidx>
class RelativeAttnBiasTimeOp : public OpKernel {
 public:
  explicit RelativeAttnBiasTimeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    float divisor = 0.0f;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bucket_divisor", &divisor));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("duplicate", &duplicate_));
    OP_REQUIRES(ctx, divisor > 0.0f && std::isfinite(divisor),
                absl::InvalidArgumentError(absl::StrCat(
                    "bucket_divisor must be a positive finite number, got ", divisor)));
    divisor_ = divisor;
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ts = ctx->input(0);
    const Tensor& weights = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckRank(ts, "timestamps", 2));
    OP_REQUIRES_OK(ctx, CheckRank(weights, "weights", 2));
    const int64_t batch = ts.dim_size(0), s = ts.dim_size(1);
    const int64_t layers = weights.dim_size(0), num_buckets = weights.dim_size(1);
    OP_REQUIRES(ctx, num_buckets >= 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "weights must have at least one bucket (shape [L, NB], NB >= 1), got ",
                    weights.shape().DebugString())));
    const int64_t f = duplicate_ ? 2 : 1, s2 = f * s;
    Tensor *bias = nullptr, *buckets = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({layers, batch, s2, s2}), &bias));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({batch, s, s}), &buckets));
    if (batch == 0 || s == 0) return;
    const Bucketizer bucketize(divisor_, num_buckets);
    const Tidx* t = ts.flat<Tidx>().data();
    const T* w = weights.flat<T>().data();
    T* out = bias->flat<T>().data();
    int32_t* idx = buckets->flat<int32_t>().data();
    const bool stream = bias->TotalBytes() >= static_cast<size_t>(kStreamingOutputBytes);
    const int64_t row_bytes = s2 * static_cast<int64_t>(sizeof(T));
    // One unit = query row (b, i): its buckets once, then f output rows per layer.
    ParallelFor(ctx, batch * s, layers * f * row_bytes + 8 * s, [&](int64_t r0, int64_t r1) {
      std::vector<T> row(s2);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / s, i = r % s;
        const Tidx* tb = t + b * s;
        int32_t* bucket_row = idx + r * s;
        const int64_t ti = static_cast<int64_t>(tb[i]);
        for (int64_t j = 0; j < s; ++j) {
          // |t_j - t_i| in unsigned arithmetic: exact for any pair of int64 timestamps.
          const int64_t tj = static_cast<int64_t>(tb[j]);
          bucket_row[j] =
              bucketize(tj >= ti ? static_cast<uint64_t>(tj) - static_cast<uint64_t>(ti)
                                 : static_cast<uint64_t>(ti) - static_cast<uint64_t>(tj));
        }
        for (int64_t l = 0; l < layers; ++l) {
          const T* wl = w + l * num_buckets;
          if (duplicate_) {
            for (int64_t j = 0; j < s; ++j) row[2 * j] = row[2 * j + 1] = wl[bucket_row[j]];
          } else {
            for (int64_t j = 0; j < s; ++j) row[j] = wl[bucket_row[j]];
          }
          for (int64_t a = 0; a < f; ++a) {
            char* dst = reinterpret_cast<char*>(out + ((l * batch + b) * s2 + f * i + a) * s2);
            CopyRun(dst, reinterpret_cast<const char*>(row.data()), row_bytes, stream);
          }
        }
      }
      if (stream) StreamFence();
    });
  }

 private:
  double divisor_ = 0.0;
  bool duplicate_ = true;
};

// Rows (b, i) are cut into a fixed number of chunks that depends only on the problem size;
// each chunk sums its rows in order into its own [L, NB] partial, and the partials are added
// in chunk order: deterministic on any thread count.
constexpr int64_t kBiasGradChunks = 64;

template <typename T>
class RelativeAttnBiasBackwardOp : public OpKernel {
 public:
  explicit RelativeAttnBiasBackwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("duplicate", &duplicate_));
  }

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    const Tensor& grad = ctx->input(0);
    const Tensor& buckets = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckRank(grad, "grad", 4));
    OP_REQUIRES_OK(ctx, CheckRank(buckets, "buckets", 3));
    OP_REQUIRES_OK(ctx, CheckRank(ctx->input(2), "num_buckets", 0));
    const int64_t nb = ctx->input(2).scalar<int32_t>()();
    OP_REQUIRES(ctx, nb >= 1,
                absl::InvalidArgumentError(absl::StrCat("num_buckets must be >= 1, got ", nb)));
    const int64_t layers = grad.dim_size(0), batch = buckets.dim_size(0);
    const int64_t s = buckets.dim_size(1), f = duplicate_ ? 2 : 1, s2 = f * s;
    OP_REQUIRES(
        ctx,
        buckets.dim_size(2) == s && grad.dim_size(1) == batch && grad.dim_size(2) == s2 &&
            grad.dim_size(3) == s2,
        absl::InvalidArgumentError(absl::StrCat(
            "grad must be [L, B, ", f, "s, ", f, "s] for buckets [B, s, s]",
            duplicate_ ? " (duplicate: every bucket covers a 2 x 2 block)" : "", "; got grad ",
            grad.shape().DebugString(), " and buckets ", buckets.shape().DebugString())));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({layers, nb}), &out));
    const int64_t rows = batch * s;
    const int64_t chunks = std::max<int64_t>(1, std::min(rows, kBiasGradChunks));
    std::vector<Acc> partial(chunks * layers * nb, Acc(0));
    const T* g = grad.flat<T>().data();
    const int32_t* idx = buckets.flat<int32_t>().data();
    BadIndexTracker bad;
    ParallelFor(ctx, chunks, (rows / chunks + 1) * layers * f * s2 * sizeof(T),
                [&](int64_t c0, int64_t c1) {
                  for (int64_t c = c0; c < c1; ++c) {
                    Acc* acc = partial.data() + c * layers * nb;
                    for (int64_t r = rows * c / chunks; r < rows * (c + 1) / chunks; ++r) {
                      const int64_t b = r / s, i = r % s;
                      const int32_t* bucket_row = idx + r * s;
                      bool ok = true;
                      for (int64_t j = 0; j < s; ++j) {
                        ok &= bucket_row[j] >= 0 && bucket_row[j] < nb;
                      }
                      if (!ok) {
                        for (int64_t j = 0; j < s; ++j) {
                          if (bucket_row[j] < 0 || bucket_row[j] >= nb) {
                            bad.Report(r * s + j, bucket_row[j]);
                            break;
                          }
                        }
                        continue;
                      }
                      for (int64_t l = 0; l < layers; ++l) {
                        Acc* al = acc + l * nb;
                        const T* g0 = g + ((l * batch + b) * s2 + f * i) * s2;
                        // Runs of equal buckets (the usual case: timestamps grow, so buckets rise
                        // monotonically away from the diagonal) are summed in a register before one
                        // update of the histogram, which avoids a load-add-store chain per element.
                        const T* g1 = g0 + s2;
                        int32_t run_bucket = bucket_row[0];
                        Acc run = Acc(0);
                        for (int64_t j = 0; j < s; ++j) {
                          const Acc x =
                              duplicate_
                                  ? (ToAcc<T, Acc>(g0[2 * j]) + ToAcc<T, Acc>(g0[2 * j + 1])) +
                                        (ToAcc<T, Acc>(g1[2 * j]) + ToAcc<T, Acc>(g1[2 * j + 1]))
                                  : ToAcc<T, Acc>(g0[j]);
                          if (bucket_row[j] != run_bucket) {
                            al[run_bucket] += run;
                            run_bucket = bucket_row[j];
                            run = Acc(0);
                          }
                          run += x;
                        }
                        al[run_bucket] += run;
                      }
                    }
                  }
                });
    OP_REQUIRES_OK(ctx, bad.ToStatus("buckets (flattened)", nb));
    T* dw = out->flat<T>().data();
    for (int64_t k = 0; k < layers * nb; ++k) {
      Acc sum = Acc(0);
      for (int64_t c = 0; c < chunks; ++c) sum += partial[c * layers * nb + k];
      dw[k] = FromAcc<T, Acc>(sum);
    }
  }

 private:
  bool duplicate_ = true;
};

// The checks of RelativeAttnBiasPos and its backward: rel_pos_bias and identity square and of
// one shape [n, n], every past_valid_lens entry in [0, n] (read into *lens).
absl::Status ReadPosArgs(const Tensor& pos, const Tensor& identity, const Tensor& lens_t,
                         std::vector<int64_t>* lens) {
  TF_RETURN_IF_ERROR(CheckRank(pos, "rel_pos_bias", 2));
  TF_RETURN_IF_ERROR(CheckRank(identity, "identity", 2));
  const int64_t n = pos.dim_size(0);
  if (pos.dim_size(1) != n || identity.shape() != pos.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rel_pos_bias and identity must be square and of one shape, got ",
                     pos.shape().DebugString(), " and ", identity.shape().DebugString()));
  }
  TF_RETURN_IF_ERROR(ReadInt64Vector(lens_t, "past_valid_lens", lens));
  for (size_t b = 0; b < lens->size(); ++b) {
    if ((*lens)[b] < 0 || (*lens)[b] > n) {
      return absl::InvalidArgumentError(
          absl::StrCat("past_valid_lens[", b, "] = ", (*lens)[b], " must lie in [0, ", n,
                       "] (a row of rel_pos_bias, or n: no clamping)"));
    }
  }
  return absl::OkStatus();
}

template <typename T, typename Tidx>
class RelativeAttnBiasPosOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    const Tensor& pos = ctx->input(0);
    const Tensor& identity = ctx->input(1);
    std::vector<int64_t> lens;
    OP_REQUIRES_OK(ctx, ReadPosArgs(pos, identity, ctx->input(2), &lens));
    const int64_t n = pos.dim_size(0);
    const int64_t batch = static_cast<int64_t>(lens.size());
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, n, n}), &out));
    if (n == 0 || batch == 0) return;
    const T* p = pos.flat<T>().data();
    const T* id = identity.flat<T>().data();
    T* o = out->flat<T>().data();
    const Acc p00 = ToAcc<T, Acc>(p[0]);
    const bool stream = out->TotalBytes() >= static_cast<size_t>(kStreamingOutputBytes);
    // Row i of every sequence, one after the other: identity row i and the rows of P they
    // read stay in cache across the batch (the output is written once, streamed when large).
    ParallelFor(ctx, n, batch * 3 * n * sizeof(T), [&](int64_t i0, int64_t i1) {
      std::vector<T> row(n);
      for (int64_t i = i0; i < i1; ++i) {
        const T* irow = id + i * n;
        for (int64_t b = 0; b < batch; ++b) {
          const T* prow = p + (i < lens[b] ? i : lens[b]) * n;
          for (int64_t j = 0; j < n; ++j) {
            const Acc e = ToAcc<T, Acc>(irow[j]);
            row[j] = FromAcc<T, Acc>((Acc(1) - e) * ToAcc<T, Acc>(prow[j]) + e * p00);
          }
          CopyRun(reinterpret_cast<char*>(o + (b * n + i) * n),
                  reinterpret_cast<const char*>(row.data()), n * sizeof(T), stream);
        }
      }
      if (stream) StreamFence();
    });
  }
};

// The gradient of RelativeAttnBiasPos in one pass over grad. Each work item owns a block of
// kColumns columns of both outputs (no two items write one element) and walks every (b, i) in
// order: the sums, and the corner sum (added to d_rel_pos_bias[0, 0] block by block in column
// order), have a fixed order whatever the thread count.
template <typename T, typename Tidx>
class RelativeAttnBiasPosBackwardOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    constexpr int64_t kColumns = 64;
    const Tensor& grad = ctx->input(0);
    const Tensor& pos = ctx->input(1);
    const Tensor& identity = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRank(grad, "grad", 3));
    std::vector<int64_t> lens;
    OP_REQUIRES_OK(ctx, ReadPosArgs(pos, identity, ctx->input(3), &lens));
    const int64_t n = pos.dim_size(0);
    const int64_t batch = static_cast<int64_t>(lens.size());
    OP_REQUIRES(ctx, grad.dim_size(0) == batch && grad.dim_size(1) == n && grad.dim_size(2) == n,
                absl::InvalidArgumentError(
                    absl::StrCat("grad must have the forward output's shape [", batch, ", ", n,
                                 ", ", n, "], got ", grad.shape().DebugString())));
    Tensor *d_pos = nullptr, *d_id = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, pos.shape(), &d_pos));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, pos.shape(), &d_id));
    if (n == 0) return;
    const T* g = grad.flat<T>().data();
    const T* p = pos.flat<T>().data();
    const T* id = identity.flat<T>().data();
    T* dp = d_pos->flat<T>().data();
    T* di = d_id->flat<T>().data();
    const Acc p00 = ToAcc<T, Acc>(p[0]);
    const int64_t blocks = (n + kColumns - 1) / kColumns;
    std::vector<Acc> corner(blocks, Acc(0));
    Acc p00_sum = 0;  // d_rel_pos_bias[0, 0] before the corner sum (block 0 writes it)
    ParallelFor(ctx, blocks, (batch + 2) * n * kColumns * 8, [&](int64_t k0, int64_t k1) {
      std::vector<Acc> acc_p(n * kColumns), acc_i(n * kColumns), e(kColumns);
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t j0 = k * kColumns, w = std::min(kColumns, n - j0);
        std::fill(acc_p.begin(), acc_p.end(), Acc(0));
        std::fill(acc_i.begin(), acc_i.end(), Acc(0));
        Acc c = 0;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < w; ++j) e[j] = ToAcc<T, Acc>(id[i * n + j0 + j]);
          Acc* ai = acc_i.data() + i * kColumns;
          for (int64_t b = 0; b < batch; ++b) {
            const int64_t r = i < lens[b] ? i : lens[b];
            const T* grow = g + (b * n + i) * n + j0;
            const T* prow = p + r * n + j0;
            Acc* ap = acc_p.data() + r * kColumns;
            for (int64_t j = 0; j < w; ++j) {
              const Acc gv = ToAcc<T, Acc>(grow[j]);
              ap[j] += gv * (Acc(1) - e[j]);
              ai[j] += gv * (p00 - ToAcc<T, Acc>(prow[j]));
              c += gv * e[j];
            }
          }
        }
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t j = 0; j < w; ++j) {
            dp[r * n + j0 + j] = FromAcc<T, Acc>(acc_p[r * kColumns + j]);
            di[r * n + j0 + j] = FromAcc<T, Acc>(acc_i[r * kColumns + j]);
          }
        }
        corner[k] = c;
        if (k == 0) p00_sum = acc_p[0];
      }
    });
    // d_rel_pos_bias[0, 0] gets the corner sum, in block order, before its one rounding.
    Acc total = p00_sum;
    for (int64_t k = 0; k < blocks; ++k) total += corner[k];
    dp[0] = FromAcc<T, Acc>(total);
  }
};

#define REGISTER_T(T)                                             \
  REGISTER_KERNEL_BUILDER(Name("Recops>RelativeAttnBiasBackward") \
                              .Device(tensorflow::DEVICE_CPU)     \
                              .TypeConstraint<T>("T"),            \
                          RelativeAttnBiasBackwardOp<T>);
#define REGISTER_T_IDX(T, Tidx)                                      \
  REGISTER_KERNEL_BUILDER(Name("Recops>RelativeAttnBiasTime")        \
                              .Device(tensorflow::DEVICE_CPU)        \
                              .TypeConstraint<T>("T")                \
                              .TypeConstraint<Tidx>("Tidx"),         \
                          RelativeAttnBiasTimeOp<T, Tidx>);          \
  REGISTER_KERNEL_BUILDER(Name("Recops>RelativeAttnBiasPosBackward") \
                              .Device(tensorflow::DEVICE_CPU)        \
                              .TypeConstraint<T>("T")                \
                              .TypeConstraint<Tidx>("Tidx"),         \
                          RelativeAttnBiasPosBackwardOp<T, Tidx>);   \
  REGISTER_KERNEL_BUILDER(Name("Recops>RelativeAttnBiasPos")         \
                              .Device(tensorflow::DEVICE_CPU)        \
                              .TypeConstraint<T>("T")                \
                              .TypeConstraint<Tidx>("Tidx"),         \
                          RelativeAttnBiasPosOp<T, Tidx>);
#define REGISTER(T)          \
  REGISTER_T(T)              \
  REGISTER_T_IDX(T, int32_t) \
  REGISTER_T_IDX(T, int64_t)
RECOPS_CALL_FLOAT_TYPES(REGISTER)
#undef REGISTER
#undef REGISTER_T_IDX
#undef REGISTER_T

}  // namespace

}  // namespace recops
