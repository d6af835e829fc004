#include "kernels/embedding_by_address.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <new>
#include <random>

#include <sys/mman.h>

#include "absl/strings/str_cat.h"
#include "kernels/common/parallel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"

namespace recops {

namespace {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from (seed, key, column, draw).
inline double Uniform01(int64_t seed, int64_t key, int64_t column, uint64_t draw) {
  uint64_t h = SplitMix64(static_cast<uint64_t>(seed) ^ 0x5EEDull);
  h = SplitMix64(h ^ static_cast<uint64_t>(key));
  h = SplitMix64(h ^ (static_cast<uint64_t>(column) << 20) ^ draw);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// Standard normal by Box-Muller from two uniform draws.
inline double Normal(int64_t seed, int64_t key, int64_t column, uint64_t draw) {
  const double u1 = 1.0 - Uniform01(seed, key, column, 2 * draw);  // (0, 1]
  const double u2 = Uniform01(seed, key, column, 2 * draw + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace

absl::Status RowInitializer::Parse(const std::string& name, float a, float b, int64_t seed,
                                   RowInitializer* out) {
  out->a = a;
  out->b = b;
  out->seed = seed;
  if (!std::isfinite(a) || !std::isfinite(b)) {
    return absl::InvalidArgumentError(
        absl::StrCat("initializer parameters must be finite, got ", a, " and ", b));
  }
  if (name == "zeros") {
    out->kind = kZeros;
  } else if (name == "constant") {
    out->kind = kConstant;
  } else if (name == "uniform") {
    out->kind = kUniform;
    if (!(a < b)) {
      return absl::InvalidArgumentError(
          absl::StrCat("uniform initializer needs minval < maxval, got ", a, " and ", b));
    }
  } else if (name == "normal" || name == "truncated_normal") {
    out->kind = name == "normal" ? kNormal : kTruncatedNormal;
    if (!(b > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " initializer needs stddev > 0, got ", b));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "initializer must be zeros, constant, uniform, normal or truncated_normal, got '", name,
        "'"));
  }
  return absl::OkStatus();
}

void RowInitializer::Fill(int64_t key, int64_t dim, float* row) const {
  for (int64_t c = 0; c < dim; ++c) {
    double value = 0;
    switch (kind) {
      case kZeros:
        break;
      case kConstant:
        value = a;
        break;
      case kUniform:
        value = a + (static_cast<double>(b) - a) * Uniform01(seed, key, c, 0);
        break;
      case kNormal:
        value = a + b * Normal(seed, key, c, 0);
        break;
      case kTruncatedNormal: {
        // Redraw beyond two standard deviations, as tf.random.truncated_normal does.
        double z = Normal(seed, key, c, 0);
        for (uint64_t draw = 1; std::fabs(z) > 2.0; ++draw) z = Normal(seed, key, c, draw);
        value = a + b * z;
        break;
      }
    }
    row[c] = static_cast<float>(value);
  }
}

// --- KeyIndex -------------------------------------------------------------------------------

int64_t KeyIndex::Find(int64_t key) const {
  if (keys_.empty()) return -1;
  const uint64_t mask = keys_.size() - 1;
  for (uint64_t i = SplitMix64(static_cast<uint64_t>(key)) & mask;; i = (i + 1) & mask) {
    if (rows_[i] < 0) return -1;
    if (keys_[i] == key) return rows_[i];
  }
}

void KeyIndex::Insert(int64_t key, int64_t row) {
  if (2 * (size_ + 1) > static_cast<int64_t>(keys_.size())) Grow();
  const uint64_t mask = keys_.size() - 1;
  uint64_t i = SplitMix64(static_cast<uint64_t>(key)) & mask;
  while (rows_[i] >= 0) i = (i + 1) & mask;
  keys_[i] = key;
  rows_[i] = row;
  ++size_;
}

void KeyIndex::Grow() {
  std::vector<int64_t> old_keys = std::move(keys_), old_rows = std::move(rows_);
  const size_t capacity = std::max<size_t>(1024, 2 * old_keys.size());
  keys_.assign(capacity, 0);
  rows_.assign(capacity, -1);
  size_ = 0;
  for (size_t i = 0; i < old_keys.size(); ++i) {
    if (old_rows[i] >= 0) Insert(old_keys[i], old_rows[i]);
  }
}

void KeyIndex::Clear() {
  keys_.clear();
  rows_.clear();
  size_ = 0;
}

// --- DynamicTable ---------------------------------------------------------------------------

void DynamicTable::FreeAligned::operator()(float* p) const {
  ::operator delete[](p, std::align_val_t(align));
}

DynamicTable::DynamicTable(const TableConfig& config)
    : config_(config),
      width_(config.dim * (1 + config.num_slots)),
      row_bytes_(width_ * static_cast<int64_t>(sizeof(float))),
      row_reciprocal_(~uint64_t{0} / static_cast<uint64_t>(row_bytes_) + 1),
      max_rows_(kOffsetMask / row_bytes_ - 1),
      block_align_(config.block_rows * row_bytes_ >= (int64_t{1} << 20) ? kHugePage : 64),
      tag_(NewTag()) {}

DynamicTable::~DynamicTable() = default;

int64_t DynamicTable::NewTag() {
  // Tags are unique per process until 2^23 - 1 tables or restores have been made; the start
  // is random so tags (and so addresses) differ between runs.
  static std::atomic<uint64_t> next{std::random_device{}()};
  constexpr uint64_t kTags = (uint64_t{1} << 23) - 1;
  return static_cast<int64_t>(next.fetch_add(1) % kTags + 1);
}

std::string DynamicTable::DebugString() const {
  absl::ReaderMutexLock lock(mu_);
  return absl::StrCat("DynamicEmbeddingTable(dim=", config_.dim, ", num_slots=", config_.num_slots,
                      ", size=", size(), ", capacity=", capacity(), ")");
}

int64_t DynamicTable::MemoryUsed() const {
  absl::ReaderMutexLock lock(mu_);
  return capacity() * row_bytes_ + static_cast<int64_t>(row_keys_.size()) * 3 * 8;
}

absl::Status DynamicTable::AppendRow(int64_t key, int64_t* row) {
  const int64_t r = size();
  if (r >= max_rows_) {
    return absl::ResourceExhaustedError(absl::StrCat("the embedding table is full: ", r,
                                                     " rows of ", width_,
                                                     " floats is the most one table can address"));
  }
  if (r == capacity()) {
    const size_t floats = static_cast<size_t>(config_.block_rows * width_);
    // Blocks of 1 MiB or more are 2 MiB-aligned and advised to use transparent huge pages:
    // random row accesses then miss the TLB far less often.
    const size_t bytes = (floats * sizeof(float) + block_align_ - 1) / block_align_ * block_align_;
    float* block = static_cast<float*>(::operator new[](bytes, std::align_val_t(block_align_)));
#ifdef MADV_HUGEPAGE
    if (block_align_ == kHugePage) madvise(block, bytes, MADV_HUGEPAGE);
#endif
    blocks_.emplace_back(block, FreeAligned{block_align_});
  }
  row_keys_.push_back(key);
  index_.Insert(key, r);
  *row = r;
  return absl::OkStatus();
}

absl::Status DynamicTable::LookupAddresses(tensorflow::OpKernelContext* ctx, const int64_t* keys,
                                           int64_t n, bool training, int64_t* addresses) {
  constexpr int64_t kMissing = -1;
  std::atomic<int64_t> missing{0};
  int64_t tag_seen;
  {
    absl::ReaderMutexLock lock(mu_);
    tag_seen = tag_;
    ParallelFor(ctx, n, 64, [&](int64_t begin, int64_t end) {
      int64_t local = 0;
      for (int64_t i = begin; i < end; ++i) {
        if (config_.has_padding_key && keys[i] == config_.padding_key) {
          addresses[i] = 0;
          continue;
        }
        const int64_t row = index_.Find(keys[i]);
        addresses[i] = row >= 0 ? Address(row) : kMissing;
        local += row < 0;
      }
      missing.fetch_add(local, std::memory_order_relaxed);
    });
  }
  if (missing.load() == 0) return absl::OkStatus();
  if (!training) {
    for (int64_t i = 0; i < n; ++i) {
      if (addresses[i] == kMissing) addresses[i] = 0;
    }
    return absl::OkStatus();
  }
  absl::MutexLock lock(mu_);
  // Another thread may have inserted some of the keys (or imported) since the shared phase.
  const bool retagged = tag_ != tag_seen;
  const int64_t first_new = size();
  absl::Status status;
  for (int64_t i = 0; i < n && status.ok(); ++i) {
    if (addresses[i] != kMissing && !(retagged && addresses[i] != 0)) continue;
    int64_t row = index_.Find(keys[i]);
    if (row < 0) status = AppendRow(keys[i], &row);
    if (status.ok()) addresses[i] = Address(row);
  }
  const int64_t new_rows = size() - first_new;
  // Initialise the new rows: embedding from the initializer, slots zero.
  ParallelFor(ctx, new_rows, 4 * width_ + 40 * config_.dim, [&](int64_t begin, int64_t end) {
    for (int64_t r = first_new + begin; r < first_new + end; ++r) {
      float* row = Row(r);
      config_.init.Fill(row_keys_[r], config_.dim, row);
      std::memset(row + config_.dim, 0, (width_ - config_.dim) * sizeof(float));
    }
  });
  return status;
}

absl::Status DynamicTable::DecodeAddresses(tensorflow::OpKernelContext* ctx,
                                           const int64_t* addresses, int64_t n, const char* what,
                                           std::vector<int64_t>* rows) const {
  rows->resize(n);
  int64_t* out = rows->data();
  const int64_t rows_now = size();
  std::atomic<int64_t> first_bad{n};
  const uint64_t rb = static_cast<uint64_t>(row_bytes_), reciprocal = row_reciprocal_;
  ParallelFor(ctx, n, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t a = addresses[i];
      const uint64_t offset = static_cast<uint64_t>(a & kOffsetMask);
      // offset / rb without a division: the high half of offset * ceil(2^64 / rb) is the
      // quotient or one more (offset < 2^64), corrected by one comparison.
      using Wide = unsigned __int128;
      uint64_t q = static_cast<uint64_t>((static_cast<Wide>(offset) * reciprocal) >> 64);
      q -= q * rb > offset;
      const int64_t row = static_cast<int64_t>(q) - 1;
      const bool ok =
          a > 0 && (a >> kOffsetBits) == tag_ && q * rb == offset && row >= 0 && row < rows_now;
      out[i] = a == 0 ? -1 : row;
      if (!ok && a != 0) {
        int64_t seen = first_bad.load(std::memory_order_relaxed);
        while (i < seen && !first_bad.compare_exchange_weak(seen, i)) {
        }
        break;
      }
    }
  });
  const int64_t i = first_bad.load();
  if (i == n) return absl::OkStatus();
  const int64_t a = addresses[i];
  const int64_t offset = a & kOffsetMask;
  std::string why;
  if (a < 0) {
    why = "addresses are never negative";
  } else if ((a >> kOffsetBits) != tag_) {
    why =
        "it was not made by this table (another table's address, one from before the table "
        "was restored, or a forged value)";
  } else if (offset % row_bytes_ != 0) {
    why = absl::StrCat("it is not aligned to a row (rows are ", row_bytes_, " bytes)");
  } else {
    why = absl::StrCat("it names row ", offset / row_bytes_ - 1, " but the table has ", rows_now,
                       " rows");
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, "[", i, "] = ", a, " is not a valid address: ", why));
}

absl::Status DynamicTable::Import(const int64_t* keys, const float* rows, int64_t n) {
  KeyIndex fresh;
  for (int64_t i = 0; i < n; ++i) {
    if (config_.has_padding_key && keys[i] == config_.padding_key) {
      return absl::InvalidArgumentError(
          absl::StrCat("keys[", i, "] = ", keys[i], " is the table's padding key"));
    }
    if (fresh.Find(keys[i]) >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("keys[", i, "] = ", keys[i], " appears more than once"));
    }
    fresh.Insert(keys[i], i);
  }
  if (n > max_rows_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(n, " rows are more than one table can address (", max_rows_, ")"));
  }
  blocks_.clear();
  row_keys_.clear();
  index_.Clear();
  tag_ = NewTag();
  for (int64_t i = 0; i < n; ++i) {
    int64_t row;
    TF_RETURN_IF_ERROR(AppendRow(keys[i], &row));
    std::memcpy(Row(row), rows + i * width_, row_bytes_);
  }
  return absl::OkStatus();
}

absl::Status LookupTable(tensorflow::OpKernelContext* ctx, int input,
                         tensorflow::core::RefCountPtr<DynamicTable>* table) {
  const absl::Status s =
      tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, input), table);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(
      absl::StrCat("table must be the handle of a DynamicEmbeddingTable: ", s.message()));
}

}  // namespace recops
