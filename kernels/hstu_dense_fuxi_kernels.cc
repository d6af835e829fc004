// Kernels of stem hstu_dense_fuxi: the Fuxi-alpha three-channel HSTU attention forward and
// backward, on the validation and tiled work items of stem hstu_dense
// (kernels/hstu_dense_kernels.h).
#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/parallel.h"
#include "kernels/common/validation.h"
#include "kernels/hstu_dense.h"
#include "kernels/hstu_dense_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

namespace {

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
          "Dqk = Dv), got q ",
          q.shape().DebugString(), ", k ", k.shape().DebugString(), ", v ",
          v.shape().DebugString()));
    }
    const Tensor empty(tensorflow::DT_INT64, TensorShape({0}));
    const Tensor empty_t(q.dtype(), TensorShape({0}));
    const Tensor& offsets = ctx->input(first + 3);
    TF_RETURN_IF_ERROR(Prepare(
        {&q, &k, &v, &offsets, &offsets, &empty, &empty, &ctx->input(first + 4), &empty_t}, call));
    call->p.fuxi_bias = fuxi_bias_;
    if (!fuxi_bias_) return absl::OkStatus();
    const Tensor& ts_bias = ctx->input(first + 5);
    const Tensor& pos_bias = ctx->input(first + 6);
    const TensorShape ts_shape({call->p.batch, max_q_, max_q_}), pos_shape({1, max_q_, max_q_});
    if (ts_bias.shape() != ts_shape || pos_bias.shape() != pos_shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("timestamp_bias must have shape ", ts_shape.DebugString(),
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
    OP_REQUIRES_OK(
        ctx,
        ctx->allocate_output(
            0, TensorShape({q.dim_size(0), (fuxi_bias_ ? 3 : 1) * p.heads_q * p.dim_v}), &out));
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
                absl::InvalidArgumentError(
                    absl::StrCat("grad must have the forward output's shape ",
                                 grad_shape.DebugString(), ", got ", grad.shape().DebugString())));
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
    T* ts_out = d_ts->flat<T>().data();
    T* pos_out = d_pos->flat<T>().data();
    // The timestamp-bias gradient accumulates in the output itself when it is of Acc; the
    // position bias's per-sequence planes (summed below in sequence order, whatever the thread
    // count) in a buffer. Both are zeroed in parallel: zeroing 256 MB in one thread (B=32,
    // max_len 1024) had been ~10% of the backward on a Zen 4.
    constexpr bool kTsInPlace = std::is_same_v<T, Acc>;
    std::unique_ptr<Acc[]> buffer(new Acc[(kTsInPlace ? 1 : 2) * p.batch * plane]);
    Acc* pos_acc = buffer.get();
    Acc* ts_acc = kTsInPlace ? reinterpret_cast<Acc*>(ts_out) : pos_acc + p.batch * plane;
    ParallelFor(ctx, p.batch, 2 * plane * sizeof(Acc), [&](int64_t b0, int64_t b1) {
      std::fill(ts_acc + b0 * plane, ts_acc + b1 * plane, Acc(0));
      std::fill(pos_acc + b0 * plane, pos_acc + b1 * plane, Acc(0));
    });
    t.fuxi_ts_grad = ts_acc;
    t.fuxi_pos_grad = pos_acc;
    std::vector<HstuItem> items;
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t len = p.off_q[b + 1] - p.off_q[b];
      if (len > 0) items.push_back({b, -1, 0, len, len * len});
    }
    std::stable_sort(items.begin(), items.end(),
                     [](const HstuItem& a, const HstuItem& b) { return a.cost > b.cost; });
    const HstuEntries<T>& entries = HstuBestEntries<T>();
    ParallelForDynamic(ctx, items.size(), [&](int64_t i) { entries.backward_seq(p, t, items[i]); });
    ParallelFor(ctx, plane, 8 * p.batch, [&](int64_t e0, int64_t e1) {
      if constexpr (!kTsInPlace) {
        for (int64_t b = 0; b < p.batch; ++b) {
          for (int64_t e = e0; e < e1; ++e)
            ts_out[b * plane + e] = FromAcc<T, Acc>(ts_acc[b * plane + e]);
        }
      }
      for (int64_t e = e0; e < e1; ++e) {
        Acc sum = Acc(0);
        for (int64_t b = 0; b < p.batch; ++b) sum += pos_acc[b * plane + e];
        pos_out[e] = FromAcc<T, Acc>(sum);
      }
    });
  }
};

#define REGISTER(T)                                                                          \
  REGISTER_KERNEL_BUILDER(                                                                   \
      Name("Recops>HstuFuxiForward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),  \
      HstuFuxiForwardOp<T>);                                                                 \
  REGISTER_KERNEL_BUILDER(                                                                   \
      Name("Recops>HstuFuxiBackward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      HstuFuxiBackwardOp<T>);
RECOPS_CALL_FLOAT_TYPES(REGISTER)
#undef REGISTER

}  // namespace

}  // namespace recops
