// Input validation shared by all kernels: jagged offsets, ranks, index bounds.
// Every failure is an InvalidArgument naming the argument and the bad value.
#ifndef RECOPS_KERNELS_COMMON_VALIDATION_H_
#define RECOPS_KERNELS_COMMON_VALIDATION_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tensorflow {
class Tensor;
}  // namespace tensorflow

namespace recops {

// Checks that `t` has rank `rank`.
absl::Status CheckRank(const tensorflow::Tensor& t, absl::string_view name, int rank);
// Checks that `t` has rank >= `rank`.
absl::Status CheckMinRank(const tensorflow::Tensor& t, absl::string_view name, int rank);

// Reads a rank-1 int32/int64 jagged offsets tensor into int64 and validates it:
// at least one entry, offsets[0] == 0, non-decreasing, offsets[-1] == expected_last
// (pass expected_last < 0 to skip that check).
absl::Status ReadOffsets(const tensorflow::Tensor& t, absl::string_view name, int64_t expected_last,
                         std::vector<int64_t>* out);

// Reads a rank-1 int32/int64 tensor into int64 (no value checks).
absl::Status ReadInt64Vector(const tensorflow::Tensor& t, absl::string_view name,
                             std::vector<int64_t>* out);

// Records the first (lowest position) out-of-range index seen by parallel workers, so
// a kernel can validate indices in the same pass that uses them and fail afterwards.
class BadIndexTracker {
 public:
  // Remembers position `pos` holding `value` if it is the lowest position seen so far.
  void Report(int64_t pos, int64_t value);
  bool ok() const { return pos_.load(std::memory_order_relaxed) == kNone; }
  // InvalidArgument "<name>[pos] = value is out of range [0, bound)".
  absl::Status ToStatus(absl::string_view name, int64_t bound) const;

 private:
  static constexpr int64_t kNone = INT64_MAX;
  std::atomic<int64_t> pos_{kNone};
  std::atomic<int64_t> value_{0};
};

}  // namespace recops

#endif  // RECOPS_KERNELS_COMMON_VALIDATION_H_
