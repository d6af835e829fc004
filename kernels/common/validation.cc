#include "kernels/common/validation.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::Tensor;

absl::Status CheckRank(const Tensor& t, absl::string_view name, int rank) {
  if (t.dims() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must have rank ", rank, ", got shape ", t.shape().DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckMinRank(const Tensor& t, absl::string_view name, int rank) {
  if (t.dims() < rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must have rank >= ", rank, ", got shape ", t.shape().DebugString()));
  }
  return absl::OkStatus();
}

absl::Status ReadInt64Vector(const Tensor& t, absl::string_view name, std::vector<int64_t>* out) {
  if (auto s = CheckRank(t, name, 1); !s.ok()) return s;
  const int64_t n = t.dim_size(0);
  out->resize(n);
  if (t.dtype() == tensorflow::DT_INT32) {
    auto v = t.flat<int32_t>();
    for (int64_t i = 0; i < n; ++i) (*out)[i] = v(i);
  } else if (t.dtype() == tensorflow::DT_INT64) {
    auto v = t.flat<int64_t>();
    for (int64_t i = 0; i < n; ++i) (*out)[i] = v(i);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be int32 or int64, got ", tensorflow::DataTypeString(t.dtype())));
  }
  return absl::OkStatus();
}

absl::Status ReadOffsets(const Tensor& t, absl::string_view name, int64_t expected_last,
                         std::vector<int64_t>* out) {
  if (auto s = ReadInt64Vector(t, name, out); !s.ok()) return s;
  const std::vector<int64_t>& o = *out;
  if (o.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must have at least one entry (offsets of B rows have B+1 entries)"));
  }
  if (o[0] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, "[0] must be 0, got ", o[0]));
  }
  for (size_t i = 1; i < o.size(); ++i) {
    if (o[i] < o[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be non-decreasing, but ", name,
                                                     "[", i, "] = ", o[i], " < ", name, "[", i - 1,
                                                     "] = ", o[i - 1]));
    }
  }
  if (expected_last >= 0 && o.back() != expected_last) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "[-1] = ", o.back(), " must equal the number of rows, ", expected_last));
  }
  return absl::OkStatus();
}

void BadIndexTracker::Report(int64_t pos, int64_t value) {
  // Rare path (the op fails anyway): a mutex keeps position and value consistent.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (pos < pos_.load(std::memory_order_relaxed)) {
    value_.store(value, std::memory_order_relaxed);
    pos_.store(pos, std::memory_order_relaxed);
  }
}

absl::Status BadIndexTracker::ToStatus(absl::string_view name, int64_t bound) const {
  if (ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, "[", pos_.load(), "] = ", value_.load(),
                                                 " is out of range [0, ", bound, ")"));
}

}  // namespace recops
