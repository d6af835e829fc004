// The OpKernel side of stem hstu_dense shared with stem hstu_dense_fuxi: attributes,
// validation of the jagged HSTU problem, and the tiled forward / backward over validated
// inputs (dispatched to the work items of kernels/hstu_dense.h compiled per instruction set).
#ifndef RECOPS_KERNELS_HSTU_DENSE_KERNELS_H_
#define RECOPS_KERNELS_HSTU_DENSE_KERNELS_H_

#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/validation.h"
#include "kernels/hstu_dense.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

// The names every kernel file of the library uses (redeclaring them there is harmless).
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// The relative bias's time buckets for one number of buckets (the exact bucketizer and its
// table), immutable once built: calls share them.
struct HstuBuckets {
  HstuBuckets(double divisor, int64_t num_buckets)
      : num_buckets(num_buckets), exact(divisor, num_buckets), table(exact) {}
  const int64_t num_buckets;
  const Bucketizer exact;
  const BucketTable table;
};

// The relative bias's bucket_divisor attribute and the buckets built from it: those of the
// last call when it had as many buckets, else new ones (a call keeps its own alive, so
// replacing them never pulls them from under a concurrent call). The only state a call writes.
class HstuBucketCache {
 public:
  // Reads and checks the `bucket_divisor` attribute.
  absl::Status Init(OpKernelConstruction* ctx) {
    float divisor = 0.0f;
    TF_RETURN_IF_ERROR(ctx->GetAttr("bucket_divisor", &divisor));
    if (!(divisor > 0.0f && std::isfinite(divisor))) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket_divisor must be a positive finite number, got ", divisor));
    }
    divisor_ = divisor;
    return absl::OkStatus();
  }

  std::shared_ptr<const HstuBuckets> Get(int64_t num_buckets) const {
    absl::MutexLock lock(&mu_);
    if (buckets_ == nullptr || buckets_->num_buckets != num_buckets) {
      buckets_ = std::make_shared<const HstuBuckets>(divisor_, num_buckets);
    }
    return buckets_;
  }

 private:
  mutable absl::Mutex mu_;
  mutable std::shared_ptr<const HstuBuckets> buckets_ ABSL_GUARDED_BY(mu_);
  double divisor_ = 0.301;
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
    if (ctx->HasAttr("mask_rules")) {
      std::string rules;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("mask_rules", &rules));
      gr_ = rules == "gr";
      OP_REQUIRES_OK(ctx, ctx->GetAttr("max_attn_len", &gr_window_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("contextual_seq_len", &gr_context_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("min_full_attn_seq_len", &gr_full_));
    }
    if (ctx->HasAttr("window_left")) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("window_left", &window_left_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("window_right", &window_right_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("has_bias", &has_bias_));
    }
    if (ctx->HasAttr("has_time_bias")) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("has_time_bias", &time_bias_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("has_position_bias", &pos_bias_));
      OP_REQUIRES_OK(ctx, buckets_.Init(ctx));
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

  // With kv_shape, in[1] and in[2] (k, v) are not read: the keys and values have that
  // (rank-3) shape without being a tensor (the paged decode reads them from the cache).
  absl::Status Prepare(const std::array<const Tensor*, 9>& in, HstuCall* call,
                       const TensorShape* kv_shape = nullptr) const {
    const Tensor& q = *in[0];
    TF_RETURN_IF_ERROR(CheckRank(q, "q", 3));
    if (kv_shape == nullptr) {
      TF_RETURN_IF_ERROR(CheckRank(*in[1], "k", 3));
      TF_RETURN_IF_ERROR(CheckRank(*in[2], "v", 3));
    }
    const TensorShape k = kv_shape ? *kv_shape : in[1]->shape();
    const TensorShape v = kv_shape ? *kv_shape : in[2]->shape();
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
          absl::StrCat("k and v must have the same rows and heads, got shapes ", k.DebugString(),
                       " and ", v.DebugString()));
    }
    if (p.heads_k < 1 || p.heads_q < 1 || p.heads_q % p.heads_k != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the number of query heads (", p.heads_q,
          ") must be a positive multiple of the number of key/value heads (", p.heads_k, ")"));
    }
    TF_RETURN_IF_ERROR(ReadOffsets(*in[3], "seq_offsets", q.dim_size(0), &call->off_q));
    TF_RETURN_IF_ERROR(ReadOffsets(*in[4], "seq_offsets_k", k.dim_size(0), &call->off_k));
    if (off_q.size() != off_k.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("seq_offsets and seq_offsets_k must have the same length, got ",
                       off_q.size(), " and ", off_k.size()));
    }
    p.batch = static_cast<int64_t>(off_q.size()) - 1;
    p.max_q = max_q_;
    p.max_k = max_k_;
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t lq = off_q[b + 1] - off_q[b], lk = off_k[b + 1] - off_k[b];
      if (lq > max_q_) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", b, " has length ", lq, " > max_seq_len = ", max_q_));
      }
      if (lk > max_k_) {
        return absl::InvalidArgumentError(
            absl::StrCat("key sequence ", b, " has length ", lk, " > max_seq_len_k = ", max_k_));
      }
      if (lq > lk) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", b, " has more queries (", lq, ") than keys (", lk,
                         "): queries are the last positions of the key sequence"));
      }
    }
    TF_RETURN_IF_ERROR(ReadCounts(*in[5], "num_context", p.batch, &call->num_context));
    TF_RETURN_IF_ERROR(ReadCounts(*in[6], "num_target", p.batch, &call->num_target));
    if (gr_) {
      TF_RETURN_IF_ERROR(CheckGrRules(contexts, targets, off_q, off_k));
    } else if ((!contexts.empty() || !targets.empty()) && mask_type_ != HstuMask::kCausal) {
      return absl::InvalidArgumentError("num_context / num_target need mask_type 'causal'");
    }
    for (int64_t b = 0; b < p.batch && !gr_ && (!contexts.empty() || !targets.empty()); ++b) {
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
    p.gr = gr_;
    p.gr_window = gr_window_;
    p.gr_context = gr_context_;
    p.gr_full = gr_full_;
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
      return absl::InvalidArgumentError(
          absl::StrCat("attn_bias must have shape ", plane.DebugString(),
                       " [B, Nq, max_seq_len, max_seq_len_k], got ", in[8]->shape().DebugString()));
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
        return absl::InvalidArgumentError(
            absl::StrCat("timestamps must have one entry per key row (", rows_k, "), got shape ",
                         ts.shape().DebugString()));
      }
      TF_RETURN_IF_ERROR(CheckRank(time_w, "time_bias_weights", 1));
      const int64_t num_buckets = time_w.dim_size(0);
      if (num_buckets < 1) {
        return absl::InvalidArgumentError(
            "time_bias_weights must have at least one bucket, got shape [0]");
      }
      call->buckets = buckets_.Get(num_buckets);
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
        return absl::InvalidArgumentError(
            absl::StrCat("position_bias_weights must have shape ", want.DebugString(),
                         " [2 * max_seq_len_k - 1], got ", pos_w.shape().DebugString()));
      }
      t->pos_w = Ptr<T>(pos_w);
    }
    return absl::OkStatus();
  }

  // The GR rules' constraints (after the counts were read): self-attention, a causal or no
  // mask, contextual_seq_len instead of num_context, no Rec SDK window or target groups, and at
  // most as many targets as positions.
  absl::Status CheckGrRules(const std::vector<int64_t>& contexts,
                            const std::vector<int64_t>& targets, const std::vector<int64_t>& off_q,
                            const std::vector<int64_t>& off_k) const {
    if (mask_type_ == HstuMask::kCustom) {
      return absl::InvalidArgumentError(
          "mask_rules 'gr' needs mask_type 'causal' or 'none', not 'custom'");
    }
    if (!contexts.empty()) {
      return absl::InvalidArgumentError(
          "mask_rules 'gr' takes contextual_seq_len (one count for all sequences), not "
          "num_context");
    }
    if (group_ != 0 || window_left_ != -1 || window_right_ != -1) {
      return absl::InvalidArgumentError(
          "mask_rules 'gr' takes max_attn_len, not target_group_size or window_size");
    }
    for (size_t b = 0; b + 1 < off_q.size(); ++b) {
      const int64_t lq = off_q[b + 1] - off_q[b], lk = off_k[b + 1] - off_k[b];
      if (lq != lk) {
        return absl::InvalidArgumentError(
            absl::StrCat("mask_rules 'gr' is self-attention: sequence ", b, " has ", lq,
                         " queries and ", lk, " keys"));
      }
      if (!targets.empty() && targets[b] > lq) {
        return absl::InvalidArgumentError(absl::StrCat(
            "num_target[", b, "] = ", targets[b], " must be <= the sequence length (", lq, ")"));
      }
    }
    return absl::OkStatus();
  }

  // num_context / num_target: empty (not given) or one non-negative count per sequence.
  static absl::Status ReadCounts(const Tensor& t, const char* name, int64_t batch,
                                 std::vector<int64_t>* out) {
    TF_RETURN_IF_ERROR(ReadInt64Vector(t, name, out));
    if (out->empty()) return absl::OkStatus();
    if (static_cast<int64_t>(out->size()) != batch) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must have one entry per sequence (", batch, "), got ", out->size()));
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

  HstuBucketCache buckets_;
  bool time_bias_ = false, pos_bias_ = false;
  int64_t max_q_, max_k_, group_ = 0, window_left_ = -1, window_right_ = -1;
  float alpha_ = 1.0f, silu_scale_ = 0.0f;
  HstuMask mask_type_;
  bool has_bias_ = false;
  bool gr_ = false;
  int64_t gr_window_ = 0, gr_context_ = 0, gr_full_ = 0;
};

// The tiled forward over validated inputs: q, k, v, the custom mask and the bias (instantiated
// for the float dtypes in kernels/hstu_dense_kernels.cc).
template <typename T>
void RunForward(OpKernelContext* ctx, const HstuProblem& p, const Tensor& q, const Tensor& k,
                const Tensor& v, const Tensor* mask, const Tensor* bias, Tensor* out,
                const Tensor* ts_bias = nullptr, const Tensor* pos_bias = nullptr,
                HstuTensors<T> t = {});

// The backward over validated inputs (t filled, dq / dk / dv allocated; the bias gradient
// zeroed by the caller when there is a bias).
template <typename T>
void RunBackward(OpKernelContext* ctx, const HstuProblem& p, const HstuTensors<T>& t);

}  // namespace recops

#endif  // RECOPS_KERNELS_HSTU_DENSE_KERNELS_H_
