#include "kernels/multislice_concat.h"

#include "absl/strings/str_cat.h"

namespace recops {

absl::Status MultislicePlan::Init(int64_t num_outputs, const std::vector<int64_t>& concat_sizes,
                                  const std::vector<int64_t>& slice_begins,
                                  const std::vector<int64_t>& slice_lengths) {
  if (static_cast<int64_t>(concat_sizes.size()) != num_outputs) {
    return absl::InvalidArgumentError(absl::StrCat("concat_sizes must have one entry per output (",
                                                   num_outputs, "), got ", concat_sizes.size()));
  }
  int64_t total = 0;
  for (size_t k = 0; k < concat_sizes.size(); ++k) {
    if (concat_sizes[k] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("concat_sizes[", k, "] = ", concat_sizes[k], " must be >= 1"));
    }
    total += concat_sizes[k];
  }
  if (static_cast<int64_t>(slice_begins.size()) != total ||
      static_cast<int64_t>(slice_lengths.size()) != total) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice_begins and slice_lengths must each have sum(concat_sizes) = ", total,
                     " entries, got ", slice_begins.size(), " and ", slice_lengths.size()));
  }
  for (int64_t s = 0; s < total; ++s) {
    if (slice_begins[s] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice_begins[", s, "] = ", slice_begins[s], " must be >= 0"));
    }
    if (slice_lengths[s] < 1 && slice_lengths[s] != -1) {
      return absl::InvalidArgumentError(absl::StrCat("slice_lengths[", s, "] = ", slice_lengths[s],
                                                     " must be >= 1 or -1 (to the end)"));
    }
  }
  concat_sizes_ = concat_sizes;
  begins_ = slice_begins;
  lengths_ = slice_lengths;
  return absl::OkStatus();
}

absl::Status MultislicePlan::Resolve(int64_t columns, std::vector<ColumnSlice>* slices,
                                     std::vector<int64_t>* widths) const {
  slices->clear();
  widths->assign(concat_sizes_.size(), 0);
  size_t s = 0;
  for (size_t k = 0; k < concat_sizes_.size(); ++k) {
    for (int64_t j = 0; j < concat_sizes_[k]; ++j, ++s) {
      const int64_t begin = begins_[s];
      if (begin >= columns) {
        return absl::InvalidArgumentError(absl::StrCat("slice_begins[", s, "] = ", begin,
                                                       " is out of range [0, ", columns,
                                                       ") (the columns of input)"));
      }
      const int64_t length = lengths_[s] == -1 ? columns - begin : lengths_[s];
      if (begin + length > columns) {
        return absl::InvalidArgumentError(
            absl::StrCat("slice ", s, ": slice_begins[", s, "] + slice_lengths[", s, "] = ", begin,
                         " + ", length, " exceeds the columns of input, ", columns));
      }
      slices->push_back({static_cast<int64_t>(k), (*widths)[k], begin, length});
      (*widths)[k] += length;
    }
  }
  return absl::OkStatus();
}

}  // namespace recops
