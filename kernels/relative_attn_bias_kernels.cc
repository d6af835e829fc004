// Kernels of stem relative_attn_bias: the bucketised time bias (output-write bound), its
// deterministic scatter-add gradient and the inference position bias.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
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
                  std::vector<char> skip;
                  for (int64_t c = c0; c < c1; ++c) {
                    Acc* acc = partial.data() + c * layers * nb;
                    const int64_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
                    // Rows with an out-of-range bucket are reported and left out.
                    skip.assign(r1 - r0, 0);
                    for (int64_t r = r0; r < r1; ++r) {
                      const int32_t* bucket_row = idx + r * s;
                      for (int64_t j = 0; j < s; ++j) {
                        if (bucket_row[j] < 0 || bucket_row[j] >= nb) {
                          bad.Report(r * s + j, bucket_row[j]);
                          skip[r - r0] = 1;
                          break;
                        }
                      }
                    }
                    // Layer by layer, so that each layer's rows of the chunk are read in memory
                    // order (rows innermost, the layers' rows lay 64 MB apart at B=64, s=256, and
                    // every read waited). Each histogram still sums its rows in row order.
                    for (int64_t l = 0; l < layers; ++l) {
                      Acc* al = acc + l * nb;
                      for (int64_t r = r0; r < r1; ++r) {
                        if (skip[r - r0]) continue;
                        const int64_t b = r / s, i = r % s;
                        const int32_t* bucket_row = idx + r * s;
                        const T* g0 = g + ((l * batch + b) * s2 + f * i) * s2;
                        // Runs of equal buckets (the usual case: timestamps grow, so buckets rise
                        // monotonically away from the diagonal) are summed in a register before
                        // one update of the histogram, which avoids a load-add-store chain per
                        // element.
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
    // Blocks of kPosBiasRows rows i. The rows below a sequence's cached length are the same in
    // every sequence: they are formed once per block, and each sequence's rows of the block,
    // contiguous in the output, are then written in turn (streamed when the output is large).
    const int64_t blocks = (n + kPosBiasRows - 1) / kPosBiasRows;
    ParallelFor(
        ctx, blocks, (batch + 2) * kPosBiasRows * n * sizeof(T), [&](int64_t k0, int64_t k1) {
          std::vector<T> rows(kPosBiasRows * n), clamped(n);
          for (int64_t k = k0; k < k1; ++k) {
            const int64_t i0 = k * kPosBiasRows, i1 = std::min(n, i0 + kPosBiasRows);
            for (int64_t i = i0; i < i1; ++i)
              PosBiasRowValues<T, Acc>(id + i * n, p + i * n, p00, n, rows.data() + (i - i0) * n);
            for (int64_t b = 0; b < batch; ++b) {
              char* dst = reinterpret_cast<char*>(o + (b * n + i0) * n);
              const int64_t own = std::clamp(lens[b], i0, i1) - i0;  // the block's rows below len
              CopyRun(dst, reinterpret_cast<const char*>(rows.data()), own * n * sizeof(T), stream);
              for (int64_t i = i0 + own; i < i1; ++i) {
                PosBiasRowValues<T, Acc>(id + i * n, p + PosBiasRow(i, lens[b]) * n, p00, n,
                                         clamped.data());
                CopyRun(dst + (i - i0) * n * sizeof(T),
                        reinterpret_cast<const char*>(clamped.data()), n * sizeof(T), stream);
              }
            }
          }
          if (stream) StreamFence();
        });
  }
};

// The gradient of RelativeAttnBiasPos in one pass over grad, in memory order. Work items are
// blocks of kPosBiasRows rows i; an item reads its rows of every sequence in turn (b, then i:
// contiguous) and owns
//  - rows [i0, i1) of d_identity (sums over b, in b order);
//  - rows [i0, i1) of d_rel_pos_bias, which sum the rows (b, i) that read them (PosBiasRow),
//    except the clamped rows of later blocks;
//  - one partial row per distinct cached length L < i0: the block's clamped rows (i >= L) of
//    the sequences of length L, which read row L of rel_pos_bias. Once every item has run, row
//    L adds the partial rows of the blocks after its own, in block order;
//  - its share of the corner sum (what rel_pos_bias[0, 0] receives through the identity), per
//    column; added up in block then column order at the end.
// The blocks have a fixed size, so every sum has one order whatever the thread count. The
// partial rows are at most one per block and sequence: 1/kPosBiasRows of grad's elements.
template <typename T, typename Tidx>
class RelativeAttnBiasPosBackwardOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
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
    const int64_t blocks = (n + kPosBiasRows - 1) / kPosBiasRows;
    // below[x]: how many distinct cached lengths below x clamp rows (a length of n clamps
    // none). Length L's partial row is number below[L] of each block after L's.
    std::vector<int64_t> below(n + 1, 0), first(blocks + 1, 0);
    {
      std::vector<char> is_len(n, 0);
      for (int64_t len : lens) {
        if (len < n) is_len[len] = 1;
      }
      for (int64_t x = 0; x < n; ++x) below[x + 1] = below[x] + is_len[x];
      for (int64_t k = 0; k < blocks; ++k) first[k + 1] = first[k] + below[k * kPosBiasRows];
    }
    // The d_rel_pos_bias sums (in the output itself when it is of Acc), partial rows, corners.
    std::vector<Acc> sums_buffer(std::is_same_v<T, Acc> ? 0 : n * n);
    Acc* sums = std::is_same_v<T, Acc> ? reinterpret_cast<Acc*>(dp) : sums_buffer.data();
    std::vector<Acc> partial(first[blocks] * n), corner(blocks * n);
    ParallelFor(ctx, blocks, (batch + 2) * kPosBiasRows * n * sizeof(T),
                [&](int64_t k0, int64_t k1) {
                  std::vector<Acc> di_sums(kPosBiasRows * n);
                  for (int64_t k = k0; k < k1; ++k) {
                    const int64_t i0 = k * kPosBiasRows, i1 = std::min(n, i0 + kPosBiasRows);
                    Acc* part = partial.data() + first[k] * n;
                    Acc* cor = corner.data() + k * n;
                    std::fill(sums + i0 * n, sums + i1 * n, Acc(0));
                    std::fill(di_sums.begin(), di_sums.end(), Acc(0));
                    for (int64_t b = 0; b < batch; ++b) {
                      for (int64_t i = i0; i < i1; ++i) {
                        const int64_t r = PosBiasRow(i, lens[b]);
                        Acc* dst = r >= i0 ? sums + r * n : part + below[r] * n;
                        PosBiasGradRow<T, Acc>(g + (b * n + i) * n, id + i * n, p + r * n, p00, n,
                                               dst, di_sums.data() + (i - i0) * n, cor);
                      }
                    }
                    for (int64_t x = 0; x < (i1 - i0) * n; ++x)
                      di[i0 * n + x] = FromAcc<T, Acc>(di_sums[x]);
                  }
                });
    // Each row of d_rel_pos_bias adds its partial rows in block order, then is rounded once.
    ParallelFor(ctx, n, (blocks + 2) * n * sizeof(Acc), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        Acc* row = sums + r * n;
        if (below[r + 1] > below[r]) {
          for (int64_t k = r / kPosBiasRows + 1; k < blocks; ++k) {
            const Acc* part = partial.data() + (first[k] + below[r]) * n;
            for (int64_t j = 0; j < n; ++j) row[j] += part[j];
          }
        }
        if constexpr (!std::is_same_v<T, Acc>) {
          for (int64_t j = 0; j < n; ++j) dp[r * n + j] = FromAcc<T, Acc>(row[j]);
        }
      }
    });
    // d_rel_pos_bias[0, 0] gets the corner sum, in block then column order, before its one
    // rounding.
    Acc total = sums[0];
    for (int64_t x = 0; x < blocks * n; ++x) total += corner[x];
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
