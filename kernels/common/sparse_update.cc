#include "kernels/common/sparse_update.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/microkernels.h"
#include "kernels/common/parallel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

// sum[0, dim) += src[0, dim): a repeated row's gradient added to its sum (compiled for
// AVX-512, AVX2 and baseline x86-64: the baseline build's SSE2 loop made summing the
// duplicates of a Zipf batch a third of a LazyAdam step).
RECOPS_MULTIVERSION void AddRow(float* __restrict sum, const float* __restrict src, int64_t dim) {
  for (int64_t c = 0; c < dim; ++c) sum[c] += src[c];
}

// Bits needed to write x >= 0.
inline int BitWidth(int64_t x) {
  return x <= 0 ? 0 : 64 - __builtin_clzll(static_cast<uint64_t>(x));
}

inline uint64_t HashRow(int64_t row) {
  uint64_t x = static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 29);
}

// Groups the positions `mine` (each row's in ascending order) by row with a small
// open-addressing hash: calls first(i) at the first position of each distinct row (the rows
// are numbered 0, 1, ... in order of first sight) and repeat(d, i) at each later position of
// row number d, in ascending position order. prefetch(i) is called a few positions ahead of
// position i being grouped.
template <typename First, typename Repeat, typename Prefetch>
void GroupByRow(const int64_t* rows, const int64_t* mine, size_t size, const First& first,
                const Repeat& repeat, const Prefetch& prefetch) {
  // Per-thread scratch, kept between calls (no allocation, no page faults per step); used
  // through a local pointer (a thread_local in a shared library costs a call per access).
  struct Slot {
    int64_t row;     // -1: empty
    int64_t number;  // the row's number in order of first sight
  };
  thread_local std::vector<Slot> scratch;
  size_t capacity = 16;
  while (capacity < 2 * size) capacity <<= 1;
  scratch.assign(capacity, Slot{-1, 0});
  Slot* const slots = scratch.data();
  int64_t distinct = 0;
  constexpr size_t kAhead = 8;
  for (size_t k = 0; k < std::min(kAhead, size); ++k) prefetch(mine[k]);
  for (size_t k = 0; k < size; ++k) {
    if (k + kAhead < size) prefetch(mine[k + kAhead]);
    const int64_t i = mine[k], r = rows[i];
    Slot* slot = slots + (HashRow(r) & (capacity - 1));
    while (slot->row != r && slot->row >= 0) {
      slot = slot + 1 == slots + capacity ? slots : slot + 1;
    }
    if (slot->row < 0) {
      *slot = Slot{r, distinct++};
      first(i);
    } else {
      repeat(static_cast<size_t>(slot->number), i);
    }
  }
}

// Runs body(mine, size) once per task, in parallel (tasks handed out dynamically), where
// mine[0, size) lists the positions i whose rows[i] >= 0 belong to the task, each row's in
// ascending order. Tasks are ranges of row numbers: every row has one task, each position is
// read by one task only, and a task's rows come near each other in memory, so updating them in
// turn shares page-table walks (random rows split by a hash took 4-13% longer per LazyAdam step
// on 4 KiB pages).
template <typename Body>
void RunRowTasks(OpKernelContext* ctx, const int64_t* rows, int64_t n, int64_t cost_per_row,
                 const Body& body) {
  if (n == 0) return;
  // Several tasks per thread, handed out one at a time, so a thread that starts late does not
  // hold the step up.
  const int64_t tasks = n * cost_per_row < 65536
                            ? 1
                            : std::max<int64_t>(1, std::min<int64_t>(8 * NumThreads(ctx), n / 256));
  // A stable counting sort of the positions by bucket = the top bits of the row's offset from
  // the smallest row (at most 4,096 buckets; the skipped rows last), in scratch of the calling
  // thread kept between calls, used through local pointers (workers see their own
  // thread_locals, and each access of one in a shared library costs a call).
  int64_t min_row = std::numeric_limits<int64_t>::max(), max_row = -1;
  for (int64_t i = 0; i < n; ++i) {
    min_row = std::min(min_row, rows[i] < 0 ? min_row : rows[i]);
    max_row = std::max(max_row, rows[i]);
  }
  if (max_row < 0) return;
  const int shift = std::max(0, BitWidth(max_row - min_row) - std::min(12, BitWidth(n)));
  const int64_t buckets = ((max_row - min_row) >> shift) + 1;
  const auto bucket = [&](int64_t r) { return r < 0 ? buckets : (r - min_row) >> shift; };
  thread_local std::vector<int64_t> order_scratch, end_scratch, cut_scratch;
  order_scratch.resize(n);
  end_scratch.assign(buckets + 2, 0);
  cut_scratch.resize(tasks + 1);
  int64_t* const positions = order_scratch.data();
  int64_t* const end = end_scratch.data();
  int64_t* const cut = cut_scratch.data();
  for (int64_t i = 0; i < n; ++i) ++end[bucket(rows[i]) + 1];
  for (int64_t b = 0; b <= buckets; ++b) end[b + 1] += end[b];
  // end[b] starts as bucket b's first slot and ends one past its last.
  for (int64_t i = 0; i < n; ++i) positions[end[bucket(rows[i])]++] = i;
  // Tasks are runs of whole buckets with about equal numbers of positions (a bucket holding a
  // hot row can leave the next tasks empty).
  const int64_t valid = end[buckets - 1];
  int64_t t = 1;
  cut[0] = 0;
  for (int64_t b = 0; b < buckets && t < tasks; ++b) {
    while (t < tasks && end[b] * tasks >= t * valid) cut[t++] = end[b];
  }
  while (t <= tasks) cut[t++] = valid;
  const auto run = [&](int64_t task) {
    body(positions + cut[task], static_cast<size_t>(cut[task + 1] - cut[task]));
  };
  if (tasks == 1) {
    run(0);
  } else {
    ParallelForDynamic(ctx, tasks, run);
  }
}

// Calls visit(k) for k in [0, size) with prefetch(k + kAhead) issued ahead of it.
template <typename Visit, typename Prefetch>
void VisitWithPrefetch(size_t size, const Visit& visit, const Prefetch& prefetch) {
  constexpr size_t kAhead = 16;  // rows in flight
  for (size_t k = 0; k < std::min(kAhead, size); ++k) prefetch(k);
  for (size_t k = 0; k < size; ++k) {
    if (k + kAhead < size) prefetch(k + kAhead);
    visit(k);
  }
}

}  // namespace

void ForEachDistinctRow(
    OpKernelContext* ctx, const int64_t* rows, int64_t n, int64_t cost_per_row,
    const std::function<void(int64_t row, int64_t first, const int64_t* next)>& fn,
    const std::function<void(int64_t row)>& prefetch) {
  std::vector<int64_t> next(n, -1);
  RunRowTasks(ctx, rows, n, cost_per_row, [&](const int64_t* mine, size_t size) {
    thread_local std::vector<int64_t> firsts_scratch, lasts_scratch;
    std::vector<int64_t>& firsts = firsts_scratch;
    std::vector<int64_t>& lasts = lasts_scratch;
    firsts.clear();
    lasts.clear();
    GroupByRow(
        rows, mine, size,
        [&](int64_t i) {
          firsts.push_back(i);
          lasts.push_back(i);
        },
        [&](size_t d, int64_t i) {
          next[lasts[d]] = i;
          lasts[d] = i;
        },
        [](int64_t) {});
    VisitWithPrefetch(
        firsts.size(), [&](size_t k) { fn(rows[firsts[k]], firsts[k], next.data()); },
        [&](size_t k) {
          if (prefetch) prefetch(rows[firsts[k]]);
        });
  });
}

void ForEachDistinctRowSum(
    OpKernelContext* ctx, const int64_t* rows, int64_t n, const float* values, int64_t dim,
    int64_t cost_per_row,
    const std::function<void(int64_t row, const float* sum, int64_t count)>& fn,
    const std::function<void(int64_t row)>& prefetch) {
  RunRowTasks(ctx, rows, n, cost_per_row + 8 * dim, [&](const int64_t* mine, size_t size) {
    // Per distinct row: the row, its first occurrence, its count, and where its sum is (-1
    // when it occurs once: the sum is then its value, not copied).
    struct Distinct {
      int64_t row, first, count, sum;
    };
    thread_local std::vector<Distinct> distinct_scratch;
    thread_local std::vector<float> sums_scratch;
    std::vector<Distinct>& distinct = distinct_scratch;
    std::vector<float>& sums = sums_scratch;
    distinct.clear();
    sums.clear();
    const int64_t bytes = dim * static_cast<int64_t>(sizeof(float));
    GroupByRow(
        rows, mine, size, [&](int64_t i) { distinct.push_back(Distinct{rows[i], i, 1, -1}); },
        [&](size_t k, int64_t i) {
          // A repeated row: its values are added in ascending position order.
          Distinct& d = distinct[k];
          if (d.sum < 0) {
            d.sum = static_cast<int64_t>(sums.size());
            sums.insert(sums.end(), values + d.first * dim, values + (d.first + 1) * dim);
          }
          AddRow(sums.data() + d.sum, values + i * dim, dim);
          ++d.count;
        },
        // Every value row is read here or by fn: fetch them while grouping.
        [&](int64_t i) { PrefetchBytes(values + i * dim, bytes, false); });
    VisitWithPrefetch(
        distinct.size(),
        [&](size_t k) {
          const Distinct& d = distinct[k];
          fn(d.row, d.sum < 0 ? values + d.first * dim : sums.data() + d.sum, d.count);
        },
        [&](size_t k) {
          const Distinct& d = distinct[k];
          PrefetchBytes(d.sum < 0 ? values + d.first * dim : sums.data() + d.sum,
                        dim * static_cast<int64_t>(sizeof(float)), false);
          if (prefetch) prefetch(d.row);
        });
  });
}

namespace {

// Checks `indices` (int32 or int64, shape [N] or [N, 1]): entries >= num_rows are an
// InvalidArgument naming the first one. *rows points at the indices themselves (int64) or at
// their int64 copy in `storage` (int32); negative entries stay as they are (the ForEach helpers
// above skip them).
absl::Status ReadRowIndices(const Tensor& indices, int64_t n, int64_t num_rows,
                            std::vector<int64_t>* storage, const int64_t** rows) {
  const bool column = indices.dims() == 2 && indices.dim_size(1) == 1;
  if (!(indices.dims() == 1 || column) || indices.NumElements() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("indices must have shape [N] or [N, 1] with N = gradient rows = ", n, ", got ",
                     indices.shape().DebugString()));
  }
  const int64_t* data;
  if (indices.dtype() == tensorflow::DT_INT32) {
    const int32_t* narrow = indices.flat<int32_t>().data();
    storage->assign(narrow, narrow + n);
    data = storage->data();
  } else {
    data = indices.flat<int64_t>().data();
  }
  bool any_out_of_range = false;  // a branch-free pass (it vectorises); the culprit only on error
  for (int64_t i = 0; i < n; ++i) any_out_of_range |= data[i] >= num_rows;
  if (any_out_of_range) {
    const int64_t i = std::find_if(data, data + n, [&](int64_t r) { return r >= num_rows; }) - data;
    return absl::InvalidArgumentError(absl::StrCat("indices[", i, "] = ", data[i],
                                                   " is out of range [0, ", num_rows,
                                                   ") (negative indices are skipped)"));
  }
  *rows = data;
  return absl::OkStatus();
}

// Checks the scalar float32 learning rate and the [N, dim] float32 gradient of an optimizer op.
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
    return absl::InvalidArgumentError(absl::StrCat("gradient must have shape [N, ", dim, "], got ",
                                                   gradient.shape().DebugString()));
  }
  return absl::OkStatus();
}

// The rows of an optimizer step's [N] int64 addresses into `table` (one per gradient row),
// checked and decoded (-1 for address 0). Caller holds table.mu().
absl::Status DecodeStepAddresses(OpKernelContext* ctx, const DynamicTable& table,
                                 const Tensor& address, const Tensor& gradient,
                                 std::vector<int64_t>* rows) {
  if (address.dims() != 1 || address.dim_size(0) != gradient.dim_size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("address must be a vector of gradient's ",
                                                   gradient.dim_size(0), " rows, got shape ",
                                                   address.shape().DebugString()));
  }
  return table.DecodeAddresses(ctx, address.flat<int64_t>().data(), address.dim_size(0), "address",
                               rows);
}

}  // namespace

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
  std::sort(order_.begin(), order_.end(),
            [](tensorflow::Var* a, tensorflow::Var* b) { return a->mu() < b->mu(); });
  for (tensorflow::Var* v : order_) v->mu()->lock();
  for (int i = 0; i < count; ++i) {
    tensorflow::Var* var = vars_[i].get();
    Tensor* t = var->tensor();
    if (!var->is_initialized) {
      status_ = absl::FailedPreconditionError(absl::StrCat(names[i], " is not initialized"));
      return;
    }
    if (t->dtype() != tensorflow::DT_FLOAT) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat(names[i], " must be float32, got ", tensorflow::DataTypeString(t->dtype())));
      return;
    }
    if (t->dims() != 2 || (i > 0 && t->shape() != vars_[0]->tensor()->shape())) {
      status_ = absl::InvalidArgumentError(absl::StrCat(
          names[i], " must be a matrix", i > 0 ? " of " : "", i > 0 ? names[0] : "",
          i > 0 ? "'s shape " : "", i > 0 ? vars_[0]->tensor()->shape().DebugString() : "",
          ", got ", t->shape().DebugString()));
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

SparseStepRows::SparseStepRows(OpKernelContext* ctx, bool by_address, int num_state,
                               const char* const* names, const char* optimizer) {
  status_ =
      by_address ? ByAddress(ctx, num_state, names, optimizer) : ByVariable(ctx, num_state, names);
}

SparseStepRows::~SparseStepRows() {
  if (table_locked_) table_->mu().Unlock();
}

absl::Status SparseStepRows::ByVariable(OpKernelContext* ctx, int num_state,
                                        const char* const* names) {
  vars_.emplace(ctx, num_state, names);
  TF_RETURN_IF_ERROR(vars_->status());
  const int64_t num_rows = vars_->tensor(0).dim_size(0);
  dim_ = vars_->tensor(0).dim_size(1);
  const Tensor& gradient = ctx->input(num_state + 1);
  TF_RETURN_IF_ERROR(CheckStepInputs(ctx->input(num_state), gradient, dim_, &lr_));
  num_updates_ = gradient.dim_size(0);
  gradient_ = gradient.flat<float>().data();
  TF_RETURN_IF_ERROR(
      ReadRowIndices(ctx->input(num_state + 2), num_updates_, num_rows, &storage_, &rows_));
  for (int s = 0; s < num_state; ++s) base_.push_back(vars_->data(s));
  return absl::OkStatus();
}

absl::Status SparseStepRows::ByAddress(OpKernelContext* ctx, int num_state,
                                       const char* const* names, const char* optimizer) {
  TF_RETURN_IF_ERROR(LookupTable(ctx, 0, &table_));
  if (table_->config().num_slots < num_state - 1) {
    std::string slots;
    for (int s = 1; s < num_state; ++s) {
      absl::StrAppend(&slots, s == 1 ? "" : " and ", names[s]);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        optimizer, " keeps ", slots, " in the table's slots: the table needs num_slots >= ",
        num_state - 1, ", it has ", table_->config().num_slots));
  }
  dim_ = table_->dim();
  const Tensor& gradient = ctx->input(2);
  TF_RETURN_IF_ERROR(CheckStepInputs(ctx->input(1), gradient, dim_, &lr_));
  num_updates_ = gradient.dim_size(0);
  gradient_ = gradient.flat<float>().data();
  table_->mu().Lock();
  table_locked_ = true;
  TF_RETURN_IF_ERROR(DecodeStepAddresses(ctx, *table_, ctx->input(3), gradient, &storage_));
  rows_ = storage_.data();
  return absl::OkStatus();
}

}  // namespace recops
