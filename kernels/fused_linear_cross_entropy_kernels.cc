// Kernels of stem fused_linear_cross_entropy: argument checks, then the tiles of
// kernels/fused_linear_cross_entropy.cc.
#include <cmath>

#include "kernels/common/dtypes.h"
#include "kernels/common/parallel.h"
#include "kernels/common/validation.h"
#include "kernels/fused_linear_cross_entropy.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

absl::Status CheckIndices(const std::vector<int64_t>& v, const char* name, int64_t bound) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0 || v[i] >= bound) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "[", i, "] = ", v[i], " is out of range [0, ", bound, ")"));
    }
  }
  return absl::OkStatus();
}

template <typename T>
class FlceBase : public OpKernel {
 public:
  explicit FlceBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("temperature", &temperature_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label_smoothing", &label_smoothing_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("normalize_items", &normalize_items_));
    OP_REQUIRES(ctx, std::isfinite(temperature_) && temperature_ > 0.0f,
                absl::InvalidArgumentError(
                    absl::StrCat("temperature must be positive and finite, got ", temperature_)));
    OP_REQUIRES(ctx, label_smoothing_ >= 0.0f && label_smoothing_ < 1.0f,
                absl::InvalidArgumentError(
                    absl::StrCat("label_smoothing must be in [0, 1), got ", label_smoothing_)));
  }

 protected:
  // Reads and checks the forward's eight inputs from input `first` on.
  absl::Status Read(OpKernelContext* ctx, int first, FlceInputs<T>* in) const {
    const Tensor& states = ctx->input(first);
    const Tensor& items = ctx->input(first + 1);
    const Tensor& targets = ctx->input(first + 2);
    const Tensor& bias = ctx->input(first + 3);
    const Tensor& ex_pos = ctx->input(first + 4);
    const Tensor& ex_item = ctx->input(first + 5);
    const Tensor& ex_val = ctx->input(first + 6);
    const Tensor& weights = ctx->input(first + 7);
    TF_RETURN_IF_ERROR(CheckRank(states, "states", 2));
    TF_RETURN_IF_ERROR(CheckRank(items, "items", 2));
    TF_RETURN_IF_ERROR(CheckRank(targets, "targets", 1));
    TF_RETURN_IF_ERROR(CheckRank(bias, "bias", 1));
    TF_RETURN_IF_ERROR(CheckRank(ex_pos, "extra_positions", 1));
    TF_RETURN_IF_ERROR(CheckRank(ex_item, "extra_items", 1));
    TF_RETURN_IF_ERROR(CheckRank(ex_val, "extra_values", 1));
    TF_RETURN_IF_ERROR(CheckRank(weights, "weights", 1));
    in->P = states.dim_size(0);
    in->d = states.dim_size(1);
    in->N = items.dim_size(0);
    if (items.dim_size(1) != in->d) {
      return absl::InvalidArgumentError(
          absl::StrCat("items [N, d] must have the states' d = ", in->d, " columns, got ",
                       items.shape().DebugString()));
    }
    if (in->N < 1) return absl::InvalidArgumentError("items must have at least one row");
    if (targets.dim_size(0) != in->P) {
      return absl::InvalidArgumentError(absl::StrCat("targets must have one entry per position (",
                                                     in->P, "), got ", targets.dim_size(0)));
    }
    if (bias.dim_size(0) != 0 && bias.dim_size(0) != in->N) {
      return absl::InvalidArgumentError(
          absl::StrCat("bias must be [N] = [", in->N, "] or empty, got [", bias.dim_size(0), "]"));
    }
    if (weights.dim_size(0) != 0 && weights.dim_size(0) != in->P) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights must be [P] = [", in->P, "] or empty, got [", weights.dim_size(0), "]"));
    }
    const int64_t K = ex_pos.dim_size(0);
    if (ex_item.dim_size(0) != K || ex_val.dim_size(0) != K) {
      return absl::InvalidArgumentError(absl::StrCat(
          "extra_positions, extra_items and extra_values must have the same length, got ", K, ", ",
          ex_item.dim_size(0), " and ", ex_val.dim_size(0)));
    }
    TF_RETURN_IF_ERROR(ReadInt64Vector(targets, "targets", &in->targets));
    TF_RETURN_IF_ERROR(CheckIndices(in->targets, "targets", in->N));
    TF_RETURN_IF_ERROR(ReadInt64Vector(ex_pos, "extra_positions", &in->extra_positions));
    TF_RETURN_IF_ERROR(CheckIndices(in->extra_positions, "extra_positions", in->P));
    TF_RETURN_IF_ERROR(ReadInt64Vector(ex_item, "extra_items", &in->extra_items));
    TF_RETURN_IF_ERROR(CheckIndices(in->extra_items, "extra_items", in->N));
    in->states = states.flat<T>().data();
    in->items = items.flat<T>().data();
    in->bias = bias.dim_size(0) == 0 ? nullptr : bias.flat<T>().data();
    in->extra_values = ex_val.flat<T>().data();
    in->weights = weights.dim_size(0) == 0 ? nullptr : weights.flat<T>().data();
    in->temperature = temperature_;
    in->label_smoothing = label_smoothing_;
    in->normalize_items = normalize_items_;
    return absl::OkStatus();
  }

  float temperature_ = 1.0f, label_smoothing_ = 0.0f;
  bool normalize_items_ = false;
};

template <typename T, typename Acc>
class FlceOp : public FlceBase<T> {
 public:
  using FlceBase<T>::FlceBase;

  void Compute(OpKernelContext* ctx) override {
    FlceInputs<T> in;
    OP_REQUIRES_OK(ctx, this->Read(ctx, 0, &in));
    Tensor *loss = nullptr, *lse = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({in.P}), &loss));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({in.P}), &lse));
    FlceForward<T, Acc>(ctx, in, loss->flat<Acc>().data(), lse->flat<Acc>().data());
  }
};

template <typename T, typename Acc>
class FlceGradOp : public FlceBase<T> {
 public:
  using FlceBase<T>::FlceBase;

  void Compute(OpKernelContext* ctx) override {
    FlceInputs<T> in;
    OP_REQUIRES_OK(ctx, this->Read(ctx, 2, &in));
    const char* names[] = {"dloss", "dlse", "lse"};
    const int at[] = {0, 1, 10};
    for (int i = 0; i < 3; ++i) {
      const Tensor& t = ctx->input(at[i]);
      OP_REQUIRES(ctx, t.dims() == 1 && t.dim_size(0) == in.P,
                  absl::InvalidArgumentError(absl::StrCat(names[i], " must be [P] = [", in.P,
                                                          "], got ", t.shape().DebugString())));
    }
    Tensor *dstates = nullptr, *ditems = nullptr, *dbias = nullptr, *dextra = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(2).shape(), &dstates));
    // dItems in items' buffer where nothing else holds it (a gathered catalogue in a training
    // step: one [N, d] tensor less at the step's peak); FlceBackward reads each item row before
    // it writes that row's gradient.
    OP_REQUIRES_OK(ctx,
                   ctx->forward_input_or_allocate_output({3}, 1, ctx->input(3).shape(), &ditems));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(5).shape(), &dbias));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ctx->input(8).shape(), &dextra));
    FlceBackward<T, Acc>(
        ctx, in, ctx->input(0).flat<Acc>().data(), ctx->input(1).flat<Acc>().data(),
        ctx->input(10).flat<Acc>().data(), dstates->flat<T>().data(), ditems->flat<T>().data(),
        in.bias == nullptr ? nullptr : dbias->flat<T>().data(), dextra->flat<T>().data());
  }
};

// The forward with the gradients for a unit upstream (FlceForwardBackward): outputs loss, lse
// and the gradients of states, items, bias ([0] without one) and extra_values for dloss = 1,
// dlse = 0, in Acc (float for bfloat16 inputs), which FlceApplyGradOp scales by the real
// upstream and rounds to T once.
template <typename T, typename Acc>
class FlceWithGradOp : public FlceBase<T> {
 public:
  using FlceBase<T>::FlceBase;

  void Compute(OpKernelContext* ctx) override {
    FlceInputs<T> in;
    OP_REQUIRES_OK(ctx, this->Read(ctx, 0, &in));
    Tensor *loss = nullptr, *lse = nullptr, *dstates = nullptr, *ditems = nullptr, *dbias = nullptr,
           *dextra = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({in.P}), &loss));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({in.P}), &lse));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(0).shape(), &dstates));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ctx->input(1).shape(), &ditems));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, ctx->input(3).shape(), &dbias));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, ctx->input(6).shape(), &dextra));
    FlceForwardBackward<T, Acc>(ctx, in, loss->flat<Acc>().data(), lse->flat<Acc>().data(),
                                dstates->flat<Acc>().data(), ditems->flat<Acc>().data(),
                                in.bias == nullptr ? nullptr : dbias->flat<Acc>().data(),
                                dextra->flat<Acc>().data());
  }
};

// The gradient of FlceWithGradOp: where dlse is 0 and dloss the same value g at every position
// (a loss summed or averaged over positions), g times the forward's unit gradients (in their
// buffers where nothing else holds them); otherwise the backward (FlceBackward) from scratch.
template <typename T, typename Acc>
class FlceApplyGradOp : public FlceBase<T> {
 public:
  using FlceBase<T>::FlceBase;

  void Compute(OpKernelContext* ctx) override {
    FlceInputs<T> in;
    OP_REQUIRES_OK(ctx, this->Read(ctx, 6, &in));
    const char* names[] = {"dloss", "dlse", "lse"};
    const int at[] = {0, 1, 14};
    for (int i = 0; i < 3; ++i) {
      const Tensor& t = ctx->input(at[i]);
      OP_REQUIRES(ctx, t.dims() == 1 && t.dim_size(0) == in.P,
                  absl::InvalidArgumentError(absl::StrCat(names[i], " must be [P] = [", in.P,
                                                          "], got ", t.shape().DebugString())));
    }
    const int units[] = {2, 3, 4, 5}, like[] = {6, 7, 9, 12};
    const char* unit_names[] = {"unit_dstates", "unit_ditems", "unit_dbias", "unit_dextra_values"};
    for (int i = 0; i < 4; ++i) {
      OP_REQUIRES(
          ctx, ctx->input(units[i]).shape() == ctx->input(like[i]).shape(),
          absl::InvalidArgumentError(absl::StrCat(
              unit_names[i], " must have the shape ", ctx->input(like[i]).shape().DebugString(),
              ", got ", ctx->input(units[i]).shape().DebugString())));
    }
    const auto dloss = ctx->input(0).flat<Acc>();
    const auto dlse = ctx->input(1).flat<Acc>();
    bool uniform = true;
    for (int64_t p = 0; p < in.P && uniform; ++p)
      uniform = dloss(p) == dloss(0) && dlse(p) == Acc(0);
    if (!uniform) {
      Tensor *dstates = nullptr, *ditems = nullptr, *dbias = nullptr, *dextra = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(6).shape(), &dstates));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ctx->input(7).shape(), &ditems));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(9).shape(), &dbias));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ctx->input(12).shape(), &dextra));
      FlceBackward<T, Acc>(ctx, in, dloss.data(), dlse.data(), ctx->input(14).flat<Acc>().data(),
                           dstates->flat<T>().data(), ditems->flat<T>().data(),
                           in.bias == nullptr ? nullptr : dbias->flat<T>().data(),
                           dextra->flat<T>().data());
      return;
    }
    const Acc g = in.P == 0 ? Acc(0) : dloss(0);
    for (int i = 0; i < 4; ++i) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                              {units[i]}, i, ctx->input(units[i]).shape(), &out));
      const auto src = ctx->input(units[i]).flat<Acc>();
      auto dst = out->flat<T>();
      const int64_t n = src.size();
      ParallelFor(ctx, n, 2, [&](int64_t x0, int64_t x1) {
        for (int64_t x = x0; x < x1; ++x) dst(x) = FromAcc<T, Acc>(src(x) * g);
      });
    }
  }
};

#define REGISTER(T, Acc)                                                  \
  REGISTER_KERNEL_BUILDER(Name("Recops>FusedLinearCrossEntropy")          \
                              .Device(tensorflow::DEVICE_CPU)             \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Acc>("Tout"),               \
                          FlceOp<T, Acc>);                                \
  REGISTER_KERNEL_BUILDER(Name("Recops>FusedLinearCrossEntropyGrad")      \
                              .Device(tensorflow::DEVICE_CPU)             \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Acc>("Tout"),               \
                          FlceGradOp<T, Acc>);                            \
  REGISTER_KERNEL_BUILDER(Name("Recops>FusedLinearCrossEntropyWithGrad")  \
                              .Device(tensorflow::DEVICE_CPU)             \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Acc>("Tout"),               \
                          FlceWithGradOp<T, Acc>);                        \
  REGISTER_KERNEL_BUILDER(Name("Recops>FusedLinearCrossEntropyApplyGrad") \
                              .Device(tensorflow::DEVICE_CPU)             \
                              .TypeConstraint<T>("T")                     \
                              .TypeConstraint<Acc>("Tout"),               \
                          FlceApplyGradOp<T, Acc>);
REGISTER(float, float)
REGISTER(Eigen::bfloat16, float)
REGISTER(double, double)
#undef REGISTER

}  // namespace

}  // namespace recops
