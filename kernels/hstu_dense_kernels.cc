// Kernels of stem hstu_dense: validation, work lists, and dispatch to the tiled work items
// (compiled for AVX-512, AVX2 and baseline x86-64, picked at load time).
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/common/dispatch.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/parallel.h"
#include "kernels/common/validation.h"
#include "kernels/hstu_dense.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

// The work items compiled for AVX-512, AVX2 + FMA and baseline x86-64, one set per dtype; the
// best the CPU supports (BestIsa) is picked once at run time. Entry points rather than
// RECOPS_WITH_ISA: the items are called many times per op, through one function pointer.
template <typename T>
struct HstuEntries {
  using Acc = AccumT<T>;
  using Fn = void (*)(const HstuProblem&, const HstuTensors<T>&, const HstuItem&);
  Fn forward, backward_kv, backward_q, backward_seq;
};

#define RECOPS_HSTU_SET(T, Acc, NAME, ATTR, I)                                                \
  ATTR void NAME##Forward(const HstuProblem& p, const HstuTensors<T>& t,                     \
                          const HstuItem& i) {                   \
    HstuForwardItem<T, Acc, I>(p, t, i);                                                   \
  }                                                                                           \
  ATTR void NAME##BackwardKv(const HstuProblem& p, const HstuTensors<T>& t,                   \
                             const HstuItem& i) {                 \
    HstuBackwardKvItem<T, Acc, I>(p, t, i);                                                \
  }                                                                                           \
  ATTR void NAME##BackwardQ(const HstuProblem& p, const HstuTensors<T>& t,                    \
                            const HstuItem& i) {                  \
    HstuBackwardQItem<T, Acc, I>(p, t, i);                                                 \
  }                                                                                           \
  ATTR void NAME##BackwardSeq(const HstuProblem& p, const HstuTensors<T>& t,                  \
                              const HstuItem& i) {                \
    HstuBackwardSeqItem<T, Acc, I>(p, t, i);                                               \
  }

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RECOPS_HSTU_SETS(T, Acc, TAG)                                                         \
  RECOPS_HSTU_SET(T, Acc, TAG##Avx512, __attribute__((target("arch=x86-64-v4"))), Isa::kAvx512)          \
  RECOPS_HSTU_SET(T, Acc, TAG##Avx2, __attribute__((target("arch=x86-64-v3"))), Isa::kAvx2)            \
  RECOPS_HSTU_SET(T, Acc, TAG##Base, , Isa::kBase)                                                     \
  const HstuEntries<T>& Entries(const T*) {                                                   \
    static const HstuEntries<T> entries = [] {                                                \
      switch (BestIsa()) {                                                                    \
        case Isa::kAvx512:                                                                    \
          return HstuEntries<T>{TAG##Avx512Forward, TAG##Avx512BackwardKv,                    \
                                TAG##Avx512BackwardQ, TAG##Avx512BackwardSeq};                \
        case Isa::kAvx2:                                                                      \
          return HstuEntries<T>{TAG##Avx2Forward, TAG##Avx2BackwardKv, TAG##Avx2BackwardQ,    \
                                TAG##Avx2BackwardSeq};                                        \
        default:                                                                              \
          return HstuEntries<T>{TAG##BaseForward, TAG##BaseBackwardKv, TAG##BaseBackwardQ,    \
                                TAG##BaseBackwardSeq};                                        \
      }                                                                                       \
    }();                                                                                      \
    return entries;                                                                           \
  }
#else
#define RECOPS_HSTU_SETS(T, Acc, TAG)                                                         \
  RECOPS_HSTU_SET(T, Acc, TAG##Base, , Isa::kBase)                                                     \
  const HstuEntries<T>& Entries(const T*) {                                                   \
    static const HstuEntries<T> entries{TAG##BaseForward, TAG##BaseBackwardKv,                \
                                        TAG##BaseBackwardQ, TAG##BaseBackwardSeq};            \
    return entries;                                                                           \
  }
#endif
RECOPS_HSTU_SETS(float, float, F32)
RECOPS_HSTU_SETS(Eigen::half, float, F16)
RECOPS_HSTU_SETS(Eigen::bfloat16, float, Bf16)
RECOPS_HSTU_SETS(double, double, F64)
#undef RECOPS_HSTU_SETS
#undef RECOPS_HSTU_SET

// The relative bias's time buckets for one number of buckets (the exact bucketizer and its
// table), immutable once built: calls share them.
struct HstuBuckets {
  HstuBuckets(double divisor, int64_t num_buckets)
      : num_buckets(num_buckets), exact(divisor, num_buckets), table(exact) {}
  const int64_t num_buckets;
  const Bucketizer exact;
  const BucketTable table;
};

// One call's validated problem and the vectors it points into. Per call, not per kernel
// instance: TF runs concurrent Compute calls on one kernel (one tf.function called from
// several threads, inter-op parallelism), which must share nothing mutable.
struct HstuCall {
  HstuCall() = default;
  HstuCall(const HstuCall&) = delete;  // p points into the vectors
  HstuCall& operator=(const HstuCall&) = delete;

  HstuProblem p;
  std::vector<int64_t> off_q, off_k, num_context, num_target, timestamps;
  std::shared_ptr<const HstuBuckets> buckets;
};

// Attributes (read only after construction) and the validation shared by the forward and
// backward kernels. Input indices are those of the forward op; the backward's are shifted by
// one (grad comes first).
class HstuBase : public OpKernel {
 public:
  explicit HstuBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_seq_len", &max_q_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("silu_scale", &silu_scale_));
    // The Fuxi op has one sequence length, no alpha and no target groups.
    max_k_ = max_q_;
    if (ctx->HasAttr("max_seq_len_k")) OP_REQUIRES_OK(ctx, ctx->GetAttr("max_seq_len_k", &max_k_));
    if (ctx->HasAttr("alpha")) OP_REQUIRES_OK(ctx, ctx->GetAttr("alpha", &alpha_));
    if (ctx->HasAttr("target_group_size")) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("target_group_size", &group_));
    }
    // The paged op has no mask / window / bias attributes: causal, unbounded, none.
    std::string mask_type = "causal";
    if (ctx->HasAttr("mask_type")) OP_REQUIRES_OK(ctx, ctx->GetAttr("mask_type", &mask_type));
    mask_type_ = mask_type == "causal" ? HstuMask::kCausal
                 : mask_type == "none" ? HstuMask::kNone
                                       : HstuMask::kCustom;
    if (ctx->HasAttr("window_left")) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("window_left", &window_left_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("window_right", &window_right_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("has_bias", &has_bias_));
    }
    if (ctx->HasAttr("has_time_bias")) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("has_time_bias", &time_bias_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("has_position_bias", &pos_bias_));
      float divisor = 0.0f;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("bucket_divisor", &divisor));
      OP_REQUIRES(ctx, divisor > 0.0f && std::isfinite(divisor),
                  absl::InvalidArgumentError(absl::StrCat(
                      "bucket_divisor must be a positive finite number, got ", divisor)));
      divisor_ = divisor;
    }
  }

 protected:
  // Validates inputs first..first+8 (q, k, v, offsets_q, offsets_k, num_context, num_target,
  // mask, attn_bias) and fills call->p (pointing into call's vectors).
  absl::Status Prepare(OpKernelContext* ctx, int first, HstuCall* call) const {
    std::array<const Tensor*, 9> in;
    for (int i = 0; i < 9; ++i) in[i] = &ctx->input(first + i);
    return Prepare(in, call);
  }

  absl::Status Prepare(const std::array<const Tensor*, 9>& in, HstuCall* call) const {
    const Tensor& q = *in[0];
    const Tensor& k = *in[1];
    const Tensor& v = *in[2];
    TF_RETURN_IF_ERROR(CheckRank(q, "q", 3));
    TF_RETURN_IF_ERROR(CheckRank(k, "k", 3));
    TF_RETURN_IF_ERROR(CheckRank(v, "v", 3));
    HstuProblem& p = call->p;
    const std::vector<int64_t>& off_q = call->off_q;
    const std::vector<int64_t>& off_k = call->off_k;
    const std::vector<int64_t>& contexts = call->num_context;
    const std::vector<int64_t>& targets = call->num_target;
    p.heads_q = q.dim_size(1);
    p.heads_k = k.dim_size(1);
    p.dim_qk = q.dim_size(2);
    p.dim_v = v.dim_size(2);
    if (k.dim_size(2) != p.dim_qk) {
      return absl::InvalidArgumentError(absl::StrCat("q and k must have the same head dim, got ",
                                                     p.dim_qk, " and ", k.dim_size(2)));
    }
    if (v.dim_size(0) != k.dim_size(0) || v.dim_size(1) != p.heads_k) {
      return absl::InvalidArgumentError(
          absl::StrCat("k and v must have the same rows and heads, got shapes ",
                       k.shape().DebugString(), " and ", v.shape().DebugString()));
    }
    if (p.heads_k < 1 || p.heads_q < 1 || p.heads_q % p.heads_k != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the number of query heads (", p.heads_q,
          ") must be a positive multiple of the number of key/value heads (", p.heads_k, ")"));
    }
    TF_RETURN_IF_ERROR(ReadOffsets(*in[3], "seq_offsets", q.dim_size(0), &call->off_q));
    TF_RETURN_IF_ERROR(
        ReadOffsets(*in[4], "seq_offsets_k", k.dim_size(0), &call->off_k));
    if (off_q.size() != off_k.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "seq_offsets and seq_offsets_k must have the same length, got ", off_q.size(),
          " and ", off_k.size()));
    }
    p.batch = static_cast<int64_t>(off_q.size()) - 1;
    p.max_q = max_q_;
    p.max_k = max_k_;
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t lq = off_q[b + 1] - off_q[b], lk = off_k[b + 1] - off_k[b];
      if (lq > max_q_) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", b, " has length ", lq,
                                                       " > max_seq_len = ", max_q_));
      }
      if (lk > max_k_) {
        return absl::InvalidArgumentError(absl::StrCat("key sequence ", b, " has length ", lk,
                                                       " > max_seq_len_k = ", max_k_));
      }
      if (lq > lk) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", b, " has more queries (", lq, ") than keys (", lk,
            "): queries are the last positions of the key sequence"));
      }
    }
    TF_RETURN_IF_ERROR(ReadCounts(*in[5], "num_context", p.batch, &call->num_context));
    TF_RETURN_IF_ERROR(ReadCounts(*in[6], "num_target", p.batch, &call->num_target));
    if ((!contexts.empty() || !targets.empty()) && mask_type_ != HstuMask::kCausal) {
      return absl::InvalidArgumentError(
          "num_context / num_target need mask_type 'causal'");
    }
    for (int64_t b = 0; b < p.batch && (!contexts.empty() || !targets.empty()); ++b) {
      const int64_t c = contexts.empty() ? 0 : contexts[b];
      const int64_t t = targets.empty() ? 0 : targets[b];
      const int64_t lq = off_q[b + 1] - off_q[b];
      if (c + t > lq || c + t >= max_q_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "num_context[", b, "] + num_target[", b, "] = ", c, " + ", t,
            " must be <= the sequence length (", lq, ") and < max_seq_len (", max_q_, ")"));
      }
    }
    p.off_q = off_q.data();
    p.off_k = off_k.data();
    p.num_context = contexts.empty() ? nullptr : contexts.data();
    p.num_target = targets.empty() ? nullptr : targets.data();
    p.group = group_;
    p.mask_type = mask_type_;
    p.window_left = window_left_;
    p.window_right = window_right_;
    p.alpha = alpha_;
    // silu_scale 0 means 1 / max_seq_len, computed in float as the seed's wrappers do.
    p.scale = silu_scale_ == 0.0f ? 1.0f / static_cast<float>(max_q_) : silu_scale_;
    p.has_bias = has_bias_;
    const TensorShape plane({p.batch, p.heads_q, max_q_, max_k_});
    if (mask_type_ == HstuMask::kCustom && in[7]->shape() != plane) {
      return absl::InvalidArgumentError(absl::StrCat("mask must have shape ", plane.DebugString(),
                                                     " [B, Nq, max_seq_len, max_seq_len_k], got ",
                                                     in[7]->shape().DebugString()));
    }
    if (has_bias_ && in[8]->shape() != plane) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attn_bias must have shape ", plane.DebugString(),
          " [B, Nq, max_seq_len, max_seq_len_k], got ",
          in[8]->shape().DebugString()));
    }
    return absl::OkStatus();
  }

  // The relative bias inputs first..first+2 (timestamps, time weights, position weights),
  // after Prepare: fills call->p's and `t`'s relative-bias fields.
  template <typename T>
  absl::Status PrepareRelBias(OpKernelContext* ctx, int first, HstuCall* call,
                              HstuTensors<T>* t) const {
    HstuProblem& p = call->p;
    p.time_bias = time_bias_;
    p.pos_bias = pos_bias_;
    p.hist_buckets = 0;
    if (!p.rel_bias()) return absl::OkStatus();
    if (has_bias_) {
      return absl::InvalidArgumentError(
          "attn_bias and the relative (time / position) bias cannot be combined: add the "
          "dense bias to attn_bias instead");
    }
    const Tensor& ts = ctx->input(first);
    const Tensor& time_w = ctx->input(first + 1);
    const Tensor& pos_w = ctx->input(first + 2);
    if (time_bias_) {
      const int64_t rows_k = call->off_k.back();
      TF_RETURN_IF_ERROR(CheckRank(ts, "timestamps", 1));
      TF_RETURN_IF_ERROR(ReadInt64Vector(ts, "timestamps", &call->timestamps));
      if (static_cast<int64_t>(call->timestamps.size()) != rows_k) {
        return absl::InvalidArgumentError(absl::StrCat(
            "timestamps must have one entry per key row (", rows_k, "), got shape ",
            ts.shape().DebugString()));
      }
      TF_RETURN_IF_ERROR(CheckRank(time_w, "time_bias_weights", 1));
      const int64_t num_buckets = time_w.dim_size(0);
      if (num_buckets < 1) {
        return absl::InvalidArgumentError(
            "time_bias_weights must have at least one bucket, got shape [0]");
      }
      call->buckets = Buckets(num_buckets);
      const HstuBuckets& buckets = *call->buckets;
      p.bucketizer = &buckets.exact;
      p.bucket_table = buckets.table.usable() ? &buckets.table : nullptr;
      p.hist_buckets = buckets.exact.reachable() + 1;
      t->timestamps = call->timestamps.data();
      t->time_w = Ptr<T>(time_w);
    }
    if (pos_bias_) {
      const TensorShape want({2 * max_k_ - 1});
      if (pos_w.shape() != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            "position_bias_weights must have shape ", want.DebugString(),
            " [2 * max_seq_len_k - 1], got ", pos_w.shape().DebugString()));
      }
      t->pos_w = Ptr<T>(pos_w);
    }
    return absl::OkStatus();
  }

  // num_context / num_target: empty (not given) or one non-negative count per sequence.
  static absl::Status ReadCounts(const Tensor& t, const char* name, int64_t batch,
                                 std::vector<int64_t>* out) {
    TF_RETURN_IF_ERROR(ReadInt64Vector(t, name, out));
    if (out->empty()) return absl::OkStatus();
    if (static_cast<int64_t>(out->size()) != batch) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must have one entry per sequence (",
                                                     batch, "), got ", out->size()));
    }
    for (size_t b = 0; b < out->size(); ++b) {
      if ((*out)[b] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, "[", b, "] = ", (*out)[b], " must be >= 0"));
      }
    }
    return absl::OkStatus();
  }

  template <typename T>
  static const T* Ptr(const Tensor& t) {
    return t.NumElements() ? t.flat<T>().data() : nullptr;
  }

  // The buckets for num_buckets time buckets: those of the last call when it had as many,
  // else new ones (a call keeps its own alive, so replacing them never pulls them from under
  // a concurrent call).
  std::shared_ptr<const HstuBuckets> Buckets(int64_t num_buckets) const {
    absl::MutexLock lock(&buckets_mu_);
    if (buckets_ == nullptr || buckets_->num_buckets != num_buckets) {
      buckets_ = std::make_shared<const HstuBuckets>(divisor_, num_buckets);
    }
    return buckets_;
  }

  // The only state a call writes: a cache of the (immutable) buckets.
  mutable absl::Mutex buckets_mu_;
  mutable std::shared_ptr<const HstuBuckets> buckets_ ABSL_GUARDED_BY(buckets_mu_);
  double divisor_ = 0.301;
  bool time_bias_ = false, pos_bias_ = false;
  int64_t max_q_, max_k_, group_ = 0, window_left_ = -1, window_right_ = -1;
  float alpha_ = 1.0f, silu_scale_ = 0.0f;
  HstuMask mask_type_;
  bool has_bias_ = false;
};

// The tiled forward over validated inputs: q, k, v, the custom mask and the bias.
template <typename T>
void RunForward(OpKernelContext* ctx, const HstuProblem& p, const Tensor& q, const Tensor& k,
                const Tensor& v, const Tensor* mask, const Tensor* bias, Tensor* out,
                const Tensor* ts_bias = nullptr, const Tensor* pos_bias = nullptr,
                HstuTensors<T> t = {}) {
  if (p.fuxi_bias) {
    t.ts_bias = ts_bias->flat<T>().data();
    t.pos_bias = pos_bias->flat<T>().data();
  }
  t.q = q.flat<T>().data();
  t.k = k.flat<T>().data();
  t.v = v.flat<T>().data();
  t.mask = mask && mask->NumElements() ? mask->flat<T>().data() : nullptr;
  t.bias = bias && bias->NumElements() ? bias->flat<T>().data() : nullptr;
  t.out = out->flat<T>().data();
  const std::vector<HstuItem> items = HstuWorkItems(p, /*kv_side=*/false, NumThreads(ctx));
  const auto forward = Entries(t.q).forward;
  ParallelForDynamic(ctx, items.size(), [&](int64_t i) { forward(p, t, items[i]); });
}

template <typename T>
class HstuDenseForwardOp : public HstuBase {
 public:
  using HstuBase::HstuBase;

  void Compute(OpKernelContext* ctx) override {
    HstuCall call;
    OP_REQUIRES_OK(ctx, Prepare(ctx, 0, &call));
    HstuTensors<T> rel;
    OP_REQUIRES_OK(ctx, PrepareRelBias<T>(ctx, 9, &call, &rel));
    const HstuProblem& p = call.p;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({ctx->input(0).dim_size(0), p.heads_q, p.dim_v}),
                            &out));
    RunForward<T>(ctx, p, ctx->input(0), ctx->input(1), ctx->input(2), &ctx->input(7),
                  &ctx->input(8), out, nullptr, nullptr, rel);
  }
};

// Paged KV-cache forward (spec §2.4): the keys of sequence b are its cached pages (all but the
// last full, the last holding last_page_len rows) followed by the fresh k/v rows of its
// num_target[b] target tokens (the last rows of the sequence); then the causal HSTU forward
// with the target-group rule. The effective keys are gathered once (O(T·N·D)) and the shared
// tiled forward runs on them.
template <typename T>
class HstuPagedForwardOp : public HstuBase {
 public:
  using HstuBase::HstuBase;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& q = ctx->input(0);
    const Tensor& k = ctx->input(1);
    const Tensor& v = ctx->input(2);
    const Tensor& cache = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckRank(q, "q", 3));
    OP_REQUIRES_OK(ctx, CheckRank(k, "k", 3));
    OP_REQUIRES_OK(ctx, CheckRank(v, "v", 3));
    OP_REQUIRES_OK(ctx, CheckRank(cache, "kv_cache", 5));
    const int64_t heads_k = k.dim_size(1), dim = k.dim_size(2);
    const int64_t num_pages = cache.dim_size(0), page_size = cache.dim_size(2);
    OP_REQUIRES(ctx, k.dim_size(0) == q.dim_size(0) && v.shape() == k.shape(),
                absl::InvalidArgumentError(absl::StrCat(
                    "k and v must be [Tq, Nk, D] rows of the same tokens as q, got q ",
                    q.shape().DebugString(), ", k ", k.shape().DebugString(), ", v ",
                    v.shape().DebugString())));
    OP_REQUIRES(ctx,
                cache.dim_size(1) == 2 && cache.dim_size(3) == heads_k &&
                    cache.dim_size(4) == dim && page_size >= 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "kv_cache must have shape [num_pages, 2, page_size, Nk, D] = [*, 2, *, ",
                    heads_k, ", ", dim, "], got ", cache.shape().DebugString())));
    std::vector<int64_t> off_q, page_off, page_ids, last_len, targets;
    OP_REQUIRES_OK(ctx, ReadOffsets(ctx->input(4), "seq_offsets", q.dim_size(0), &off_q));
    OP_REQUIRES_OK(ctx, ReadInt64Vector(ctx->input(6), "page_ids", &page_ids));
    OP_REQUIRES_OK(ctx, ReadOffsets(ctx->input(5), "page_offsets",
                                    static_cast<int64_t>(page_ids.size()), &page_off));
    OP_REQUIRES_OK(ctx, ReadInt64Vector(ctx->input(7), "last_page_len", &last_len));
    OP_REQUIRES_OK(ctx, ReadInt64Vector(ctx->input(8), "num_target", &targets));
    const int64_t batch = static_cast<int64_t>(off_q.size()) - 1;
    OP_REQUIRES(ctx,
                static_cast<int64_t>(page_off.size()) == batch + 1 &&
                    static_cast<int64_t>(last_len.size()) == batch &&
                    static_cast<int64_t>(targets.size()) == batch,
                absl::InvalidArgumentError(absl::StrCat(
                    "page_offsets must have ", batch + 1, " entries and last_page_len and "
                    "num_target ", batch, " (one per sequence), got ", page_off.size(), ", ",
                    last_len.size(), " and ", targets.size())));
    for (size_t i = 0; i < page_ids.size(); ++i) {
      OP_REQUIRES(ctx, page_ids[i] >= 0 && page_ids[i] < num_pages,
                  absl::InvalidArgumentError(absl::StrCat("page_ids[", i, "] = ", page_ids[i],
                                                          " is out of range [0, ", num_pages,
                                                          ")")));
    }
    // Key offsets: cache length + targets per sequence.
    Tensor off_k_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT64, TensorShape({batch + 1}),
                                           &off_k_t));
    auto off_k = off_k_t.flat<int64_t>();
    off_k(0) = 0;
    std::vector<int64_t> cache_len(batch);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t pages = page_off[b + 1] - page_off[b], lq = off_q[b + 1] - off_q[b];
      OP_REQUIRES(ctx, pages == 0 || (last_len[b] >= 1 && last_len[b] <= page_size),
                  absl::InvalidArgumentError(absl::StrCat(
                      "last_page_len[", b, "] = ", last_len[b], " must lie in [1, page_size = ",
                      page_size, "]")));
      OP_REQUIRES(ctx, targets[b] >= 0 && targets[b] <= lq,
                  absl::InvalidArgumentError(absl::StrCat(
                      "num_target[", b, "] = ", targets[b], " must lie in [0, ", lq,
                      "] (the sequence length)")));
      cache_len[b] = pages == 0 ? 0 : (pages - 1) * page_size + last_len[b];
      off_k(b + 1) = off_k(b) + cache_len[b] + targets[b];
    }
    // The effective keys and values.
    const int64_t rows_k = off_k(batch), row = heads_k * dim;
    Tensor k_eff, v_eff;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(k.dtype(), TensorShape({rows_k, heads_k, dim}), &k_eff));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(k.dtype(), TensorShape({rows_k, heads_k, dim}), &v_eff));
    const T* cache_p = cache.flat<T>().data();
    const T* k_p = k.flat<T>().data();
    const T* v_p = v.flat<T>().data();
    T* ke = k_eff.flat<T>().data();
    T* ve = v_eff.flat<T>().data();
    ParallelFor(ctx, batch, 64 * row, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t dst = off_k(b);
        for (int64_t pg = page_off[b]; pg < page_off[b + 1]; ++pg) {
          const int64_t rows = pg + 1 < page_off[b + 1] ? page_size : last_len[b];
          const T* page = cache_p + page_ids[pg] * 2 * page_size * row;
          std::copy(page, page + rows * row, ke + dst * row);
          std::copy(page + page_size * row, page + (page_size + rows) * row, ve + dst * row);
          dst += rows;
        }
        const int64_t first = off_q[b + 1] - targets[b];
        std::copy(k_p + first * row, k_p + off_q[b + 1] * row, ke + dst * row);
        std::copy(v_p + first * row, v_p + off_q[b + 1] * row, ve + dst * row);
      }
    });
    const Tensor empty(tensorflow::DT_INT64, TensorShape({0}));
    const Tensor empty_t(q.dtype(), TensorShape({0}));
    HstuCall call;
    OP_REQUIRES_OK(ctx, Prepare({&q, &k_eff, &v_eff, &ctx->input(4), &off_k_t, &empty,
                                 &ctx->input(8), &empty_t, &empty_t},
                                &call));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({q.dim_size(0), call.p.heads_q, dim}), &out));
    RunForward<T>(ctx, call.p, q, k_eff, v_eff, nullptr, nullptr, out);
  }
};

// The backward over validated inputs (t filled, dq / dk / dv allocated; the bias gradient
// zeroed by the caller when there is a bias).
template <typename T>
void RunBackward(OpKernelContext* ctx, const HstuProblem& p, const HstuTensors<T>& t) {
  // Every row of dq, dk, dv is written by the items below (with zeros where nothing is
  // visible), except in the one-pass path the rows of sequences without keys or queries,
  // zeroed here. The bias gradient is written only on visible tiles.
  const HstuEntries<T>& entries = Entries(t.q);
  // One pass per (sequence, kv head) when those items alone keep the threads busy;
  // otherwise (few, long sequences) two passes over 64-row blocks. Same bits either way.
  // The relative bias's gradient histograms are per (sequence, kv head): one pass only.
  const std::vector<HstuItem> seq_items = HstuSequenceItems(p);
  if (p.rel_bias() || static_cast<int64_t>(seq_items.size()) >= 4 * NumThreads(ctx)) {
    for (int64_t b = 0; b < p.batch; ++b) {
      if (p.off_q[b + 1] > p.off_q[b] && p.off_k[b + 1] > p.off_k[b]) continue;
      const auto zero_rows = [](T* x, int64_t r0, int64_t r1, int64_t row) {
        std::fill(x + r0 * row, x + r1 * row, T(0));
      };
      zero_rows(t.dq, p.off_q[b], p.off_q[b + 1], p.heads_q * p.dim_qk);
      zero_rows(t.dk, p.off_k[b], p.off_k[b + 1], p.heads_k * p.dim_qk);
      zero_rows(t.dv, p.off_k[b], p.off_k[b + 1], p.heads_k * p.dim_v);
    }
    ParallelForDynamic(ctx, seq_items.size(),
                       [&](int64_t i) { entries.backward_seq(p, t, seq_items[i]); });
    return;
  }
  const std::vector<HstuItem> kv_items = HstuWorkItems(p, /*kv_side=*/true, NumThreads(ctx));
  ParallelForDynamic(ctx, kv_items.size(),
                     [&](int64_t i) { entries.backward_kv(p, t, kv_items[i]); });
  const std::vector<HstuItem> q_items = HstuWorkItems(p, /*kv_side=*/false, NumThreads(ctx));
  ParallelForDynamic(ctx, q_items.size(),
                     [&](int64_t i) { entries.backward_q(p, t, q_items[i]); });
}

template <typename T>
class HstuDenseBackwardOp : public HstuBase {
 public:
  using HstuBase::HstuBase;

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    HstuCall call;
    OP_REQUIRES_OK(ctx, Prepare(ctx, 1, &call));
    HstuTensors<T> t;
    OP_REQUIRES_OK(ctx, PrepareRelBias<T>(ctx, 10, &call, &t));
    const HstuProblem& p = call.p;
    const Tensor& grad = ctx->input(0);
    const Tensor& q = ctx->input(1);
    OP_REQUIRES(ctx,
                grad.shape() == TensorShape({q.dim_size(0), p.heads_q, p.dim_v}),
                absl::InvalidArgumentError(absl::StrCat(
                    "grad must have shape [Tq, Nq, Dv] = ",
                    TensorShape({q.dim_size(0), p.heads_q, p.dim_v}).DebugString(), ", got ",
                    grad.shape().DebugString())));
    Tensor *dq = nullptr, *dk = nullptr, *dv = nullptr, *dbias = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, q.shape(), &dq));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ctx->input(2).shape(), &dk));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(3).shape(), &dv));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ctx->input(9).shape(), &dbias));
    Tensor *d_time_w = nullptr, *d_pos_w = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, ctx->input(11).shape(), &d_time_w));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, ctx->input(12).shape(), &d_pos_w));
    t.grad = Ptr<T>(grad);
    t.q = Ptr<T>(q);
    t.k = Ptr<T>(ctx->input(2));
    t.v = Ptr<T>(ctx->input(3));
    t.mask = Ptr<T>(ctx->input(8));
    t.bias = Ptr<T>(ctx->input(9));
    t.dq = dq->flat<T>().data();
    t.dk = dk->flat<T>().data();
    t.dv = dv->flat<T>().data();
    t.dbias = dbias->flat<T>().data();
    if (p.has_bias) dbias->flat<T>().setZero();
    std::vector<Acc> rel_acc;
    if (p.rel_bias()) {
      rel_acc.assign(p.batch * p.heads_k * p.rel_hist_size(), Acc(0));
      t.rel_grad_acc = rel_acc.data();
    }
    RunBackward<T>(ctx, p, t);
    if (!p.rel_bias()) return;
    // Each weight's gradient: the items' histograms summed in (sequence, kv head) order
    // (deterministic); time buckets past the reachable ones get zero.
    const int64_t items = p.batch * p.heads_k, size = p.rel_hist_size();
    const auto reduce = [&](int64_t begin, int64_t n, int64_t valid, T* out) {
      ParallelFor(ctx, n, 4 * items, [&](int64_t e0, int64_t e1) {
        for (int64_t e = e0; e < e1; ++e) {
          Acc sum = Acc(0);
          for (int64_t it = 0; e < valid && it < items; ++it) sum += rel_acc[it * size + begin + e];
          out[e] = FromAcc<T, Acc>(sum);
        }
      });
    };
    if (p.time_bias) {
      reduce(0, d_time_w->NumElements(), p.hist_buckets, d_time_w->flat<T>().data());
    }
    if (p.pos_bias) {
      reduce(p.hist_buckets, 2 * max_k_ - 1, 2 * max_k_ - 1, d_pos_w->flat<T>().data());
    }
  }
};

// Fuxi-alpha ops (spec §4, §5): inputs q, k, v, seq_offsets, mask, timestamp_bias,
// position_bias (after grad for the backward). The HSTU problem with alpha 1, no bias inside
// the SiLU, one head count and one head size, plus the temporal / positional channels when
// both biases are given (has_bias).
class HstuFuxiBase : public HstuBase {
 public:
  explicit HstuFuxiBase(OpKernelConstruction* ctx) : HstuBase(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("has_bias", &fuxi_bias_));
  }

 protected:
  // Validates inputs first..first+6 and fills call->p (with fuxi_bias).
  absl::Status PrepareFuxi(OpKernelContext* ctx, int first, HstuCall* call) const {
    const Tensor& q = ctx->input(first);
    const Tensor& k = ctx->input(first + 1);
    const Tensor& v = ctx->input(first + 2);
    TF_RETURN_IF_ERROR(CheckRank(q, "q", 3));
    TF_RETURN_IF_ERROR(CheckRank(k, "k", 3));
    TF_RETURN_IF_ERROR(CheckRank(v, "v", 3));
    if (q.dim_size(1) != k.dim_size(1) || q.dim_size(2) != v.dim_size(2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Fuxi attention takes q, k, v with one head count and one head size (no GQA, "
          "Dqk = Dv), got q ", q.shape().DebugString(), ", k ", k.shape().DebugString(),
          ", v ", v.shape().DebugString()));
    }
    const Tensor empty(tensorflow::DT_INT64, TensorShape({0}));
    const Tensor empty_t(q.dtype(), TensorShape({0}));
    const Tensor& offsets = ctx->input(first + 3);
    TF_RETURN_IF_ERROR(Prepare({&q, &k, &v, &offsets, &offsets, &empty, &empty,
                                &ctx->input(first + 4), &empty_t},
                               call));
    call->p.fuxi_bias = fuxi_bias_;
    if (!fuxi_bias_) return absl::OkStatus();
    const Tensor& ts_bias = ctx->input(first + 5);
    const Tensor& pos_bias = ctx->input(first + 6);
    const TensorShape ts_shape({call->p.batch, max_q_, max_q_}), pos_shape({1, max_q_, max_q_});
    if (ts_bias.shape() != ts_shape || pos_bias.shape() != pos_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "timestamp_bias must have shape ", ts_shape.DebugString(),
          " [B, S, S] and position_bias ", pos_shape.DebugString(),
          " [1, S, S] (S = max_seq_len), got ", ts_bias.shape().DebugString(), " and ",
          pos_bias.shape().DebugString()));
    }
    return absl::OkStatus();
  }

  bool fuxi_bias_ = false;
};

template <typename T>
class HstuFuxiForwardOp : public HstuFuxiBase {
 public:
  using HstuFuxiBase::HstuFuxiBase;

  void Compute(OpKernelContext* ctx) override {
    HstuCall call;
    OP_REQUIRES_OK(ctx, PrepareFuxi(ctx, 0, &call));
    const HstuProblem& p = call.p;
    const Tensor& q = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({q.dim_size(0),
                                            (fuxi_bias_ ? 3 : 1) * p.heads_q * p.dim_v}),
                            &out));
    RunForward<T>(ctx, p, q, ctx->input(1), ctx->input(2), &ctx->input(4), nullptr, out,
                  &ctx->input(5), &ctx->input(6));
  }
};

// Fuxi-alpha backward (spec §5) with the upstream gradient in the forward's layout (rows of
// [dO_s | dO_t | dO_p] head-major blocks, so no permutation is needed). Without biases it is the
// HSTU backward (alpha 1, no bias). With biases: one item per sequence over all its heads, so
// that the sequence's timestamp-bias gradient plane has one writer; the position-bias
// gradient is summed over the sequences in order afterwards (deterministic).
template <typename T>
class HstuFuxiBackwardOp : public HstuFuxiBase {
 public:
  using HstuFuxiBase::HstuFuxiBase;

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    HstuCall call;
    OP_REQUIRES_OK(ctx, PrepareFuxi(ctx, 1, &call));
    const HstuProblem& p = call.p;
    const Tensor& grad = ctx->input(0);
    const Tensor& q = ctx->input(1);
    const Tensor& k = ctx->input(2);
    const Tensor& v = ctx->input(3);
    const int64_t channels = fuxi_bias_ ? 3 : 1;
    const TensorShape grad_shape({q.dim_size(0), channels * p.heads_q * p.dim_v});
    OP_REQUIRES(ctx, grad.shape() == grad_shape,
                absl::InvalidArgumentError(absl::StrCat(
                    "grad must have the forward output's shape ", grad_shape.DebugString(),
                    ", got ", grad.shape().DebugString())));
    Tensor *dq = nullptr, *dk = nullptr, *dv = nullptr, *d_ts = nullptr, *d_pos = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, q.shape(), &dq));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, k.shape(), &dk));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, v.shape(), &dv));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ctx->input(6).shape(), &d_ts));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, ctx->input(7).shape(), &d_pos));
    HstuTensors<T> t;
    t.grad = Ptr<T>(grad);
    t.q = Ptr<T>(q);
    t.k = Ptr<T>(k);
    t.v = Ptr<T>(v);
    t.mask = Ptr<T>(ctx->input(5));
    t.dq = dq->flat<T>().data();
    t.dk = dk->flat<T>().data();
    t.dv = dv->flat<T>().data();
    if (!fuxi_bias_) {
      RunBackward<T>(ctx, p, t);
      return;
    }
    t.ts_bias = Ptr<T>(ctx->input(6));
    t.pos_bias = Ptr<T>(ctx->input(7));
    const int64_t plane = max_q_ * max_q_;
    std::vector<Acc> acc(2 * p.batch * plane, Acc(0));
    t.fuxi_grad_acc = acc.data();
    std::vector<HstuItem> items;
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t len = p.off_q[b + 1] - p.off_q[b];
      if (len > 0) items.push_back({b, -1, 0, len, len * len});
    }
    std::stable_sort(items.begin(), items.end(),
                     [](const HstuItem& a, const HstuItem& b) { return a.cost > b.cost; });
    const HstuEntries<T>& entries = Entries(t.q);
    ParallelForDynamic(ctx, items.size(),
                       [&](int64_t i) { entries.backward_seq(p, t, items[i]); });
    T* ts_out = d_ts->flat<T>().data();
    T* pos_out = d_pos->flat<T>().data();
    const Acc* pos_acc = acc.data() + p.batch * plane;
    ParallelFor(ctx, plane, 8 * p.batch, [&](int64_t e0, int64_t e1) {
      for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t e = e0; e < e1; ++e) ts_out[b * plane + e] = FromAcc<T, Acc>(acc[b * plane + e]);
      }
      for (int64_t e = e0; e < e1; ++e) {
        Acc sum = Acc(0);
        for (int64_t b = 0; b < p.batch; ++b) sum += pos_acc[b * plane + e];
        pos_out[e] = FromAcc<T, Acc>(sum);
      }
    });
  }
};

#define REGISTER(T)                                                                            \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name("Recops>HstuDenseForward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),   \
      HstuDenseForwardOp<T>);                                                                  \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name("Recops>HstuDenseBackward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),  \
      HstuDenseBackwardOp<T>);                                                                 \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name("Recops>HstuPagedForward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),   \
      HstuPagedForwardOp<T>);                                                                  \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name("Recops>HstuFuxiForward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),    \
      HstuFuxiForwardOp<T>);                                                                   \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name("Recops>HstuFuxiBackward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),   \
      HstuFuxiBackwardOp<T>);
REGISTER(float)
REGISTER(Eigen::half)
REGISTER(Eigen::bfloat16)
REGISTER(double)
#undef REGISTER

}  // namespace

}  // namespace recops
