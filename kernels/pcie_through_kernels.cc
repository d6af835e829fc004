// Kernels of stem pcie_through: the bounded host channel and RmaSwapMultiTables.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/common/parallel.h"
#include "kernels/common/sparse_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace recops {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::core::RefCountPtr;

namespace {

// A bounded FIFO of tensors (items share their buffers: pushing and popping copy nothing).
// Waits are bounded by a timeout and end early when the step is cancelled or the channel is
// closed, so a missing producer or consumer is an error, never a hang.
class HostChannel : public tensorflow::ResourceBase {
 public:
  explicit HostChannel(int64_t capacity) : capacity_(capacity) {}

  std::string DebugString() const override {
    absl::MutexLock lock(&mu_);
    return absl::StrCat("HostChannel(", items_.size(), " of ", capacity_, " items)");
  }

  int64_t capacity() const { return capacity_; }

  int64_t size() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(items_.size());
  }

  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

  absl::Status Push(OpKernelContext* ctx, const Tensor& item, float timeout_seconds) {
    absl::MutexLock lock(&mu_);
    TF_RETURN_IF_ERROR(Wait(
        ctx, timeout_seconds,
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return closed_ || static_cast<int64_t>(items_.size()) < capacity_;
        },
        "for room to push (the channel stayed full: is anything popping?)"));
    if (closed_) return absl::CancelledError("the host channel is closed");
    items_.push_back(item);
    return absl::OkStatus();
  }

  // Pops the oldest item when it has `dtype` (and, when given, `shape`); an item that does not
  // match stays in the channel and is an InvalidArgument.
  absl::Status Pop(OpKernelContext* ctx, float timeout_seconds, DataType dtype,
                   const TensorShape* shape, Tensor* item) {
    absl::MutexLock lock(&mu_);
    TF_RETURN_IF_ERROR(Wait(
        ctx, timeout_seconds,
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !items_.empty(); },
        "for an item to pop (the channel stayed empty: is anything pushing?)"));
    if (items_.empty()) {
      return absl::OutOfRangeError("the host channel is closed and empty");
    }
    const Tensor& front = items_.front();
    if (front.dtype() != dtype || (shape != nullptr && front.shape() != *shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the channel's next item is ", tensorflow::DataTypeString(front.dtype()), " ",
          front.shape().DebugString(), ", expected ", tensorflow::DataTypeString(dtype),
          shape != nullptr ? absl::StrCat(" ", shape->DebugString()) : std::string(),
          " (the item is left in the channel)"));
    }
    *item = front;
    items_.pop_front();
    return absl::OkStatus();
  }

 private:
  // Waits until ready() (true on return OK), the timeout (DeadlineExceeded) or the step's
  // cancellation (Cancelled). Caller holds mu_.
  template <typename Ready>
  absl::Status Wait(OpKernelContext* ctx, float timeout_seconds, const Ready& ready,
                    const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time deadline = absl::Now() + absl::Seconds(timeout_seconds);
    const absl::Condition condition(&ready);
    auto* cancellation = ctx->cancellation_manager();
    while (!ready()) {
      if (cancellation != nullptr && cancellation->IsCancelled()) {
        return absl::CancelledError("the step was cancelled while waiting on a host channel");
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("timed out after ", timeout_seconds, " s waiting ", what));
      }
      // Wake at least every 50 ms to notice a cancelled step.
      mu_.AwaitWithDeadline(condition, std::min(deadline, now + absl::Milliseconds(50)));
    }
    return absl::OkStatus();
  }

  const int64_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<Tensor> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status LookupChannel(OpKernelContext* ctx, int input, const char* what,
                           RefCountPtr<HostChannel>* channel) {
  const absl::Status s =
      tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, input), channel);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be the handle of a HostChannel: ", s.message()));
}

absl::Status ReadTimeout(OpKernelConstruction* ctx, float* timeout_seconds) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("timeout_seconds", timeout_seconds));
  if (!(*timeout_seconds >= 0) || !std::isfinite(*timeout_seconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_seconds must be finite and >= 0 (a wait is always bounded), got ",
                     *timeout_seconds));
  }
  return absl::OkStatus();
}

class HostChannelOp : public OpKernel {
 public:
  explicit HostChannelOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("capacity", &capacity_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
  }

  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    if (shared_name_.empty()) {
      out->scalar<tensorflow::ResourceHandle>()() =
          tensorflow::ResourceHandle::MakeRefCountingHandle(new HostChannel(capacity_),
                                                            ctx->device()->name());
      return;
    }
    auto* manager = ctx->resource_manager();
    HostChannel* channel;
    OP_REQUIRES_OK(ctx,
                   manager->LookupOrCreate<HostChannel>(manager->default_container(), shared_name_,
                                                        &channel, [this](HostChannel** made) {
                                                          *made = new HostChannel(capacity_);
                                                          return absl::OkStatus();
                                                        }));
    RefCountPtr<HostChannel> owned(channel);
    OP_REQUIRES(ctx, channel->capacity() == capacity_,
                absl::InvalidArgumentError(
                    absl::StrCat("host channel '", shared_name_, "' exists with capacity ",
                                 channel->capacity(), ", asked for ", capacity_)));
    out->scalar<tensorflow::ResourceHandle>()() = tensorflow::MakeResourceHandle<HostChannel>(
        ctx, manager->default_container(), shared_name_);
  }

 private:
  int64_t capacity_;
  std::string shared_name_;
};

class HostChannelPushOp : public OpKernel {
 public:
  explicit HostChannelPushOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadTimeout(ctx, &timeout_seconds_));
  }

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<HostChannel> channel;
    OP_REQUIRES_OK(ctx, LookupChannel(ctx, 0, "channel", &channel));
    OP_REQUIRES_OK(ctx, channel->Push(ctx, ctx->input(1), timeout_seconds_));
  }

 private:
  float timeout_seconds_;
};

class HostChannelPopOp : public OpKernel {
 public:
  explicit HostChannelPopOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadTimeout(ctx, &timeout_seconds_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtype", &dtype_));
  }

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<HostChannel> channel;
    OP_REQUIRES_OK(ctx, LookupChannel(ctx, 0, "channel", &channel));
    Tensor item;
    OP_REQUIRES_OK(ctx, channel->Pop(ctx, timeout_seconds_, dtype_, nullptr, &item));
    ctx->set_output(0, item);
  }

 private:
  float timeout_seconds_;
  DataType dtype_;
};

class HostChannelSizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<HostChannel> channel;
    OP_REQUIRES_OK(ctx, LookupChannel(ctx, 0, "channel", &channel));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = channel->size();
  }
};

class HostChannelCloseOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<HostChannel> channel;
    OP_REQUIRES_OK(ctx, LookupChannel(ctx, 0, "channel", &channel));
    channel->Close();
  }
};

// Checks that every entry of the int64 vector `index` is a row of [0, num_rows).
absl::Status CheckSwapIndex(const Tensor& index, const char* what, int64_t num_rows) {
  if (index.dims() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be a vector, got shape ", index.shape().DebugString()));
  }
  const int64_t* data = index.flat<int64_t>().data();
  for (int64_t i = 0; i < index.NumElements(); ++i) {
    if (data[i] < 0 || data[i] >= num_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i, "] = ", data[i], " is out of range [0, ", num_rows, ")"));
    }
  }
  return absl::OkStatus();
}

class RmaSwapMultiTablesOp : public OpKernel {
 public:
  static constexpr int kMaxTables = 6;
  // Status words (the seed reports a non-zero word per core on a queue timeout).
  enum : int64_t { kDone = 0, kOutFull = 1, kInEmpty = 2, kClosed = 3 };

  explicit RmaSwapMultiTablesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &num_tables_));
    OP_REQUIRES(ctx, num_tables_ <= kMaxTables,
                absl::InvalidArgumentError(absl::StrCat("RmaSwapMultiTables takes 1 to ",
                                                        kMaxTables, " tables, got ", num_tables_)));
    OP_REQUIRES_OK(ctx, ReadTimeout(ctx, &timeout_seconds_));
    for (int t = 0; t < num_tables_; ++t) names_.push_back(absl::StrCat("tables[", t, "]"));
    for (const std::string& name : names_) name_ptrs_.push_back(name.c_str());
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = num_tables_;
    const Tensor& in_index = ctx->input(n);
    const Tensor& out_index = ctx->input(n + 1);
    RefCountPtr<HostChannel> channel_in, channel_out;
    OP_REQUIRES_OK(ctx, LookupChannel(ctx, n + 2, "channel_in", &channel_in));
    OP_REQUIRES_OK(ctx, LookupChannel(ctx, n + 3, "channel_out", &channel_out));
    Tensor* status;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &status));

    // 1. Swap-out: every read, under the tables' locks, released before any wait.
    Tensor swapped_out;
    int64_t dim = 0;
    {
      LockedVariables tables(ctx, n, name_ptrs_.data());
      OP_REQUIRES_OK(ctx, tables.status());
      const int64_t num_rows = tables.tensor(0).dim_size(0);
      dim = tables.tensor(0).dim_size(1);
      OP_REQUIRES_OK(ctx, CheckSwapIndex(in_index, "swap_in_index", num_rows));
      OP_REQUIRES_OK(ctx, CheckSwapIndex(out_index, "swap_out_index", num_rows));
      const int64_t rows = out_index.NumElements(), width = n * dim;
      OP_REQUIRES_OK(
          ctx, ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({rows, width}), &swapped_out));
      std::vector<const float*> sources(n);
      for (int t = 0; t < n; ++t) sources[t] = tables.data(t);
      const int64_t* index = out_index.flat<int64_t>().data();
      float* dest = swapped_out.flat<float>().data();
      ParallelFor(ctx, rows, 2 * width * sizeof(float), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          for (int t = 0; t < n; ++t) {
            std::memcpy(dest + i * width + t * dim, sources[t] + index[i] * dim,
                        dim * sizeof(float));
          }
        }
      });
    }
    // 2. Push it, 3. pop the swap-in item (checked before it leaves the channel).
    const absl::Status pushed = channel_out->Push(ctx, swapped_out, timeout_seconds_);
    if (!pushed.ok()) {
      const bool closed = absl::IsCancelled(pushed) && channel_out->closed();
      OP_REQUIRES(ctx, absl::IsDeadlineExceeded(pushed) || closed, pushed);
      status->scalar<int64_t>()() = closed ? kClosed : kOutFull;
      return;
    }
    const TensorShape expected({in_index.NumElements(), n * dim});
    Tensor swapped_in;
    const absl::Status popped =
        channel_in->Pop(ctx, timeout_seconds_, tensorflow::DT_FLOAT, &expected, &swapped_in);
    if (!popped.ok()) {
      const bool closed = absl::IsOutOfRange(popped);
      OP_REQUIRES(ctx, absl::IsDeadlineExceeded(popped) || closed, popped);
      status->scalar<int64_t>()() = closed ? kClosed : kInEmpty;
      return;
    }
    // 4. Swap-in: the writes, under the locks again (rechecked: the tables may have changed
    // while we waited). A row named twice gets its last piece.
    LockedVariables tables(ctx, n, name_ptrs_.data());
    OP_REQUIRES_OK(ctx, tables.status());
    OP_REQUIRES(ctx, tables.tensor(0).dim_size(1) == dim,
                absl::InvalidArgumentError("the tables' shape changed during the swap"));
    OP_REQUIRES_OK(ctx, CheckSwapIndex(in_index, "swap_in_index", tables.tensor(0).dim_size(0)));
    std::vector<float*> targets(n);
    for (int t = 0; t < n; ++t) targets[t] = tables.data(t);
    const float* source = swapped_in.flat<float>().data();
    const int64_t width = n * dim;
    ForEachDistinctRow(ctx, in_index.flat<int64_t>().data(), in_index.NumElements(),
                       2 * width * sizeof(float),
                       [&](int64_t row, int64_t first, const int64_t* next) {
                         int64_t last = first;
                         while (next[last] >= 0) last = next[last];
                         for (int t = 0; t < n; ++t) {
                           std::memcpy(targets[t] + row * dim, source + last * width + t * dim,
                                       dim * sizeof(float));
                         }
                       });
    status->scalar<int64_t>()() = kDone;
  }

 private:
  int num_tables_;
  float timeout_seconds_;
  std::vector<std::string> names_;
  std::vector<const char*> name_ptrs_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("Recops>HostChannel").Device(tensorflow::DEVICE_CPU), HostChannelOp);
REGISTER_KERNEL_BUILDER(Name("Recops>HostChannelPush").Device(tensorflow::DEVICE_CPU),
                        HostChannelPushOp);
REGISTER_KERNEL_BUILDER(Name("Recops>HostChannelPop").Device(tensorflow::DEVICE_CPU),
                        HostChannelPopOp);
REGISTER_KERNEL_BUILDER(Name("Recops>HostChannelSize").Device(tensorflow::DEVICE_CPU),
                        HostChannelSizeOp);
REGISTER_KERNEL_BUILDER(Name("Recops>HostChannelClose").Device(tensorflow::DEVICE_CPU),
                        HostChannelCloseOp);
REGISTER_KERNEL_BUILDER(Name("Recops>RmaSwapMultiTables").Device(tensorflow::DEVICE_CPU),
                        RmaSwapMultiTablesOp);

}  // namespace recops
