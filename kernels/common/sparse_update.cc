#include "kernels/common/sparse_update.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/common/parallel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

inline uint64_t HashRow(int64_t row) {
  uint64_t x = static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 29);
}

}  // namespace

void ForEachDistinctRow(
    OpKernelContext* ctx, const int64_t* rows, int64_t n, int64_t cost_per_row,
    const std::function<void(int64_t row, int64_t first, const int64_t* next)>& fn) {
  if (n == 0) return;
  // One task per thread (more would rescan the rows for nothing); a task owns the rows
  // hashed to it and visits them in first-occurrence order.
  const int64_t tasks =
      n * cost_per_row < 65536 ? 1 : std::max<int64_t>(1, std::min<int64_t>(NumThreads(ctx), n));
  std::vector<int64_t> next(n, -1);
  ParallelFor(ctx, tasks, n * (8 + cost_per_row) / tasks, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const auto mine = [&](int64_t r) {
        return r >= 0 && static_cast<int64_t>(HashRow(r) >> 40) % tasks == task;
      };
      int64_t count = 0;
      for (int64_t i = 0; i < n; ++i) count += mine(rows[i]);
      // Open addressing (load <= 1/2): slot -> distinct row and its last occurrence so far.
      size_t capacity = 16;
      while (capacity < static_cast<size_t>(2 * count + 2)) capacity *= 2;
      const uint64_t mask = capacity - 1;
      std::vector<int64_t> slot_row(capacity, -1), slot_last(capacity);
      std::vector<int64_t> firsts;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = rows[i];
        if (!mine(r)) continue;
        uint64_t s = HashRow(r) & mask;
        while (slot_row[s] >= 0 && slot_row[s] != r) s = (s + 1) & mask;
        if (slot_row[s] < 0) {
          slot_row[s] = r;
          firsts.push_back(i);
        } else {
          next[slot_last[s]] = i;
        }
        slot_last[s] = i;
      }
      for (int64_t first : firsts) fn(rows[first], first, next.data());
    }
  });
}

absl::Status ReadRowIndices(const Tensor& indices, int64_t n, int64_t num_rows,
                            std::vector<int64_t>* rows) {
  const bool column = indices.dims() == 2 && indices.dim_size(1) == 1;
  if (!(indices.dims() == 1 || column) || indices.NumElements() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "indices must have shape [N] or [N, 1] with N = gradient rows = ", n, ", got ",
        indices.shape().DebugString()));
  }
  rows->resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = indices.dtype() == tensorflow::DT_INT32
                          ? static_cast<int64_t>(indices.flat<int32_t>()(i))
                          : indices.flat<int64_t>()(i);
    if (r >= num_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices[", i, "] = ", r, " is out of range [0, ", num_rows,
          ") (negative indices are skipped)"));
    }
    (*rows)[i] = r < 0 ? -1 : r;
  }
  return absl::OkStatus();
}

absl::Status CheckStepInputs(const Tensor& lr, const Tensor& gradient, int64_t dim,
                             float* lr_value) {
  if (lr.dims() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr must be a scalar, got shape ", lr.shape().DebugString()));
  }
  *lr_value = lr.scalar<float>()();
  if (!std::isfinite(*lr_value)) {
    return absl::InvalidArgumentError(absl::StrCat("lr must be finite, got ", *lr_value));
  }
  if (gradient.dims() != 2 || gradient.dim_size(1) != dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient must have shape [N, ", dim, "], got ",
                     gradient.shape().DebugString()));
  }
  return absl::OkStatus();
}

LockedVariables::LockedVariables(OpKernelContext* ctx, int count, const char* const* names)
    : vars_(count) {
  for (int i = 0; i < count; ++i) {
    status_ = tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, i), &vars_[i]);
    if (!status_.ok()) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat(names[i], " must be a resource variable: ", status_.message()));
      vars_.resize(i);
      return;
    }
    for (int j = 0; j < i; ++j) {
      if (vars_[j].get() == vars_[i].get()) {
        status_ = absl::InvalidArgumentError(
            absl::StrCat(names[j], " and ", names[i], " are the same variable"));
        vars_.resize(i + 1);
        return;
      }
    }
  }
  for (auto& v : vars_) order_.push_back(v.get());
  std::sort(order_.begin(), order_.end(), [](tensorflow::Var* a, tensorflow::Var* b) {
    return a->mu() < b->mu();
  });
  for (tensorflow::Var* v : order_) v->mu()->lock();
  for (int i = 0; i < count; ++i) {
    tensorflow::Var* var = vars_[i].get();
    Tensor* t = var->tensor();
    if (!var->is_initialized) {
      status_ = absl::FailedPreconditionError(absl::StrCat(names[i], " is not initialized"));
      return;
    }
    if (t->dtype() != tensorflow::DT_FLOAT) {
      status_ = absl::InvalidArgumentError(absl::StrCat(
          names[i], " must be float32, got ", tensorflow::DataTypeString(t->dtype())));
      return;
    }
    if (t->dims() != 2 || (i > 0 && t->shape() != vars_[0]->tensor()->shape())) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat(names[i], " must be a matrix", i > 0 ? " of var's shape " : "",
                       i > 0 ? vars_[0]->tensor()->shape().DebugString() : "", ", got ",
                       t->shape().DebugString()));
      return;
    }
    var->copy_on_read_mode.store(true);
    if (!t->RefCountIsOne()) {
      Tensor copy;
      status_ = ctx->allocate_temp(tensorflow::DT_FLOAT, t->shape(), &copy);
      if (!status_.ok()) return;
      std::memcpy(copy.data(), t->data(), t->TotalBytes());
      *t = copy;
    }
  }
}

LockedVariables::~LockedVariables() {
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) (*it)->mu()->unlock();
}

float* LockedVariables::data(int i) { return vars_[i]->tensor()->flat<float>().data(); }

const Tensor& LockedVariables::tensor(int i) { return *vars_[i]->tensor(); }

}  // namespace recops
