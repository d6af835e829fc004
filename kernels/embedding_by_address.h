// Stem embedding_by_address: the growing embedding table behind its ops and the by-address
// steps of fused_lazy_adam and fused_sgd.
//
// A DynamicTable maps int64 keys to float32 rows of `width = dim * (1 + num_slots)` columns
// ([embedding | slot 0 | slot 1 ...], the Rec SDK's "extended" row). Rows live in blocks of
// `block_rows` rows that are allocated as the table grows and never move, so a row's place is
// stable for the table's lifetime.
//
// Rows are named by int64 *addresses*, the Rec SDK's by-address ABI, but an address is a
// handle, never a pointer: bits 40..62 hold the table's tag (unique per table instance and per
// restore), bits 0..39 the row's byte offset in the table's address space, (row + 1) * row
// bytes. Every address a kernel receives is decoded and checked (tag, alignment, row < size)
// before any memory is touched; 0 is the invalid address (zeros on lookup, skipped on update).
#ifndef RECOPS_KERNELS_EMBEDDING_BY_ADDRESS_H_
#define RECOPS_KERNELS_EMBEDDING_BY_ADDRESS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/framework/resource_base.h"
#include "absl/synchronization/mutex.h"
#include "tensorflow/core/platform/refcount.h"

namespace tensorflow {
class OpKernelContext;
}  // namespace tensorflow

namespace recops {

// How the embedding columns of a new row are filled (slots always start at 0). Values are a
// pure function of (seed, key, column): a key's first row does not depend on the order in which
// keys arrive or on the thread count.
struct RowInitializer {
  enum Kind { kZeros, kConstant, kUniform, kNormal, kTruncatedNormal };
  Kind kind = kUniform;
  float a = -0.05f;  // constant value; uniform min; normal / truncated normal mean
  float b = 0.05f;   // uniform max; normal / truncated normal stddev
  int64_t seed = 0;

  // Parses "zeros", "constant", "uniform", "normal" or "truncated_normal".
  static absl::Status Parse(const std::string& name, float a, float b, int64_t seed,
                            RowInitializer* out);
  // Fills row[0, dim) for `key`.
  void Fill(int64_t key, int64_t dim, float* row) const;
};

struct TableConfig {
  int64_t dim = 0;
  int64_t num_slots = 0;
  int64_t block_rows = 65536;
  RowInitializer init;
  bool has_padding_key = false;
  int64_t padding_key = 0;
};

// Open-addressing int64 key -> row index map (linear probing, load <= 1/2). Not thread-safe:
// DynamicTable guards it.
class KeyIndex {
 public:
  // Row of `key`, or -1.
  int64_t Find(int64_t key) const;
  // Inserts key -> row (key must be absent).
  void Insert(int64_t key, int64_t row);
  void Clear();
  int64_t size() const { return size_; }

 private:
  void Grow();
  std::vector<int64_t> keys_;
  std::vector<int64_t> rows_;  // -1 marks an empty slot
  int64_t size_ = 0;
};

class DynamicTable : public tensorflow::ResourceBase {
 public:
  static constexpr int kOffsetBits = 40;
  static constexpr int64_t kOffsetMask = (int64_t{1} << kOffsetBits) - 1;

  explicit DynamicTable(const TableConfig& config);
  ~DynamicTable() override;

  std::string DebugString() const override;
  int64_t MemoryUsed() const override;

  const TableConfig& config() const { return config_; }
  int64_t dim() const { return config_.dim; }
  int64_t width() const { return width_; }

  // Lock for row data and the key map: lookups and exports share it; inserts, updates,
  // optimizer steps and imports hold it exclusively (so concurrent updates never lose one).
  absl::Mutex& mu() const { return mu_; }

  // Addresses of keys[0, n): the padding key -> 0; a known key -> its row; an unknown key ->
  // a new row when `training` (initialised, slots zero; the same new key seen by several
  // threads or several times gets one row), else 0. Locks internally.
  absl::Status LookupAddresses(tensorflow::OpKernelContext* ctx, const int64_t* keys, int64_t n,
                               bool training, int64_t* addresses);

  // Decodes every address of [0, n) into a row (-1 for address 0). InvalidArgument names
  // `what`, the first bad position and why (negative, another table's or a stale tag,
  // misaligned, beyond the table's rows). Caller holds mu() (shared or exclusive).
  absl::Status DecodeAddresses(tensorflow::OpKernelContext* ctx, const int64_t* addresses,
                               int64_t n, const char* what, std::vector<int64_t>* rows) const;

  // Pointer to row `row` (0 <= row < size()). Caller holds mu().
  float* Row(int64_t row) const {
    return blocks_[row / config_.block_rows].get() + (row % config_.block_rows) * width_;
  }
  int64_t size() const { return static_cast<int64_t>(row_keys_.size()); }  // caller holds mu()
  int64_t capacity() const { return static_cast<int64_t>(blocks_.size()) * config_.block_rows; }
  int64_t Address(int64_t row) const { return (tag_ << kOffsetBits) | ((row + 1) * row_bytes_); }
  // Key of each row, in row order. Caller holds mu().
  const std::vector<int64_t>& row_keys() const { return row_keys_; }

  // Replaces the contents with keys[i] -> rows[i, :] (full width), and retags the table so
  // addresses handed out before are rejected. Caller holds mu() exclusively.
  absl::Status Import(const int64_t* keys, const float* rows, int64_t n);

 private:
  // Appends a row for `key` (allocating a block when full). Caller holds mu() exclusively.
  absl::Status AppendRow(int64_t key, int64_t* row);
  static int64_t NewTag();

  const TableConfig config_;
  const int64_t width_;
  const int64_t row_bytes_;
  // ceil(2^64 / row_bytes_): offset / row_bytes_ as a multiply (see DecodeAddresses).
  const uint64_t row_reciprocal_;
  const int64_t max_rows_;
  static constexpr size_t kHugePage = size_t{2} << 20;
  const size_t block_align_;
  mutable absl::Mutex mu_;
  int64_t tag_;
  KeyIndex index_;
  std::vector<int64_t> row_keys_;
  struct FreeAligned {
    size_t align;
    void operator()(float* p) const;
  };
  std::vector<std::unique_ptr<float[], FreeAligned>> blocks_;
};

// The DynamicTable behind the resource handle of input `input`; InvalidArgument when the input
// is not a DynamicEmbeddingTable handle.
absl::Status LookupTable(tensorflow::OpKernelContext* ctx, int input,
                         tensorflow::core::RefCountPtr<DynamicTable>* table);

}  // namespace recops

#endif  // RECOPS_KERNELS_EMBEDDING_BY_ADDRESS_H_
