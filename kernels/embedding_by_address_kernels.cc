// Kernels of stem embedding_by_address: the growing table resource and by-address lookup and
// update.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/copy.h"
#include "kernels/common/parallel.h"
#include "kernels/common/sparse_update.h"
#include "kernels/embedding_by_address.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_handle.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::core::RefCountPtr;

namespace {

class DynamicEmbeddingTableOp : public OpKernel {
 public:
  explicit DynamicEmbeddingTableOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string initializer;
    float a, b;
    int64_t seed;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &config_.dim));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &config_.num_slots));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("block_rows", &config_.block_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer", &initializer));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_a", &a));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_b", &b));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("has_padding_key", &config_.has_padding_key));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("padding_key", &config_.padding_key));
    OP_REQUIRES_OK(ctx, RowInitializer::Parse(initializer, a, b, seed, &config_.init));
    // Rows of at most 2^28 floats (1 GiB), blocks of at most 16 GiB; checked by division so
    // that no product of user values can overflow.
    constexpr int64_t kMaxWidth = int64_t{1} << 28;
    OP_REQUIRES(ctx,
                config_.num_slots < kMaxWidth && config_.dim <= kMaxWidth / (1 + config_.num_slots),
                absl::InvalidArgumentError(absl::StrCat(
                    "rows of dim * (1 + num_slots) = ", config_.dim, " * (1 + ", config_.num_slots,
                    ") floats are too wide (at most ", kMaxWidth, ")")));
    const int64_t row_bytes = config_.dim * (1 + config_.num_slots) * 4;
    OP_REQUIRES(ctx, config_.block_rows <= (int64_t{1} << 34) / row_bytes,
                absl::InvalidArgumentError(absl::StrCat("block_rows = ", config_.block_rows,
                                                        " makes blocks over 16 GiB")));
  }

  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::ResourceHandle>()() = tensorflow::ResourceHandle::MakeRefCountingHandle(
        new DynamicTable(config_), ctx->device()->name());
  }

 private:
  TableConfig config_;
};

class LookupAddressesOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DynamicTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    const Tensor& keys = ctx->input(1);
    const Tensor& training = ctx->input(2);
    OP_REQUIRES(ctx, training.dims() == 0,
                absl::InvalidArgumentError(absl::StrCat("training must be a scalar, got shape ",
                                                        training.shape().DebugString())));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &out));
    OP_REQUIRES_OK(ctx,
                   table->LookupAddresses(ctx, keys.flat<int64_t>().data(), keys.NumElements(),
                                          training.scalar<bool>()(), out->flat<int64_t>().data()));
  }
};

class TableSizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DynamicTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    Tensor *size, *capacity;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &size));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &capacity));
    absl::ReaderMutexLock lock(table->mu());
    size->scalar<int64_t>()() = table->size();
    capacity->scalar<int64_t>()() = table->capacity();
  }
};

class TableExportOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DynamicTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    absl::ReaderMutexLock lock(table->mu());
    const int64_t n = table->size(), width = table->width();
    Tensor *keys, *rows;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n, width}), &rows));
    if (n == 0) return;
    std::memcpy(keys->flat<int64_t>().data(), table->row_keys().data(), n * sizeof(int64_t));
    float* dst = rows->flat<float>().data();
    ParallelFor(ctx, n, 8 * width, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        std::memcpy(dst + r * width, table->Row(r), width * sizeof(float));
      }
    });
  }
};

class TableImportOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DynamicTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    const Tensor& keys = ctx->input(1);
    const Tensor& rows = ctx->input(2);
    OP_REQUIRES(ctx,
                keys.dims() == 1 && rows.dims() == 2 && rows.dim_size(0) == keys.dim_size(0) &&
                    rows.dim_size(1) == table->width(),
                absl::InvalidArgumentError(
                    absl::StrCat("import needs keys [N] and rows [N, ", table->width(),
                                 "] (dim * (1 + num_slots)), got ", keys.shape().DebugString(),
                                 " and ", rows.shape().DebugString())));
    absl::MutexLock lock(table->mu());
    OP_REQUIRES_OK(ctx, table->Import(keys.flat<int64_t>().data(), rows.flat<float>().data(),
                                      keys.dim_size(0)));
  }
};

absl::Status CheckAddresses(const Tensor& address) {
  if (address.dims() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("address must be a vector, got shape ", address.shape().DebugString()));
  }
  return absl::OkStatus();
}

class EmbeddingLookupByAddressOp : public OpKernel {
 public:
  explicit EmbeddingLookupByAddressOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("embedding_dim", &dim_));
  }

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DynamicTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    const Tensor& address = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckAddresses(address));
    OP_REQUIRES(ctx, dim_ <= table->width(),
                absl::InvalidArgumentError(
                    absl::StrCat("embedding_dim = ", dim_, " is wider than the table's rows (",
                                 table->width(), " = dim * (1 + num_slots))")));
    const int64_t n = address.dim_size(0);
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &out));
    absl::ReaderMutexLock lock(table->mu());
    std::vector<int64_t> rows;
    OP_REQUIRES_OK(
        ctx, table->DecodeAddresses(ctx, address.flat<int64_t>().data(), n, "address", &rows));
    float* y = out->flat<float>().data();
    const int64_t bytes = dim_ * static_cast<int64_t>(sizeof(float));
    const bool stream = n * bytes >= kStreamingOutputBytes;
    constexpr int64_t kAhead = 8;  // rows in flight
    ParallelFor(ctx, n, 2 * bytes, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < std::min(end, begin + kAhead); ++i) {
        if (rows[i] >= 0) PrefetchBytes(table->Row(rows[i]), bytes, false);
      }
      for (int64_t i = begin; i < end; ++i) {
        if (i + kAhead < end && rows[i + kAhead] >= 0) {
          PrefetchBytes(table->Row(rows[i + kAhead]), bytes, false);
        }
        char* dst = reinterpret_cast<char*>(y + i * dim_);
        if (rows[i] < 0) {
          std::memset(dst, 0, bytes);
        } else {
          CopyRun(dst, reinterpret_cast<const char*>(table->Row(rows[i])), bytes, stream);
        }
      }
      if (stream) StreamFence();
    });
  }

 private:
  int64_t dim_;
};

class EmbeddingUpdateByAddressOp : public OpKernel {
 public:
  explicit EmbeddingUpdateByAddressOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("update_type", &update_type_));
    OP_REQUIRES(ctx, update_type_ == 0 || update_type_ == 1,
                absl::InvalidArgumentError(
                    absl::StrCat("update_type must be 0 (add) or 1 (assign), got ", update_type_)));
  }

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<DynamicTable> table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, 0, &table));
    const Tensor& address = ctx->input(1);
    const Tensor& embedding = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckAddresses(address));
    const int64_t n = address.dim_size(0);
    OP_REQUIRES(ctx,
                embedding.dims() == 2 && embedding.dim_size(0) == n &&
                    embedding.dim_size(1) <= table->width(),
                absl::InvalidArgumentError(
                    absl::StrCat("embedding must have shape [N, D] with N = len(address) = ", n,
                                 " and D <= the row width ", table->width(), ", got ",
                                 embedding.shape().DebugString())));
    const int64_t dim = embedding.dim_size(1);
    const float* e = embedding.flat<float>().data();
    absl::MutexLock lock(table->mu());
    std::vector<int64_t> rows;
    OP_REQUIRES_OK(
        ctx, table->DecodeAddresses(ctx, address.flat<int64_t>().data(), n, "address", &rows));
    const int64_t bytes = dim * static_cast<int64_t>(sizeof(float));
    const auto prefetch = [&](int64_t row) { PrefetchBytes(table->Row(row), bytes, true); };
    if (update_type_ == 1) {  // assign: the last occurrence wins
      ForEachDistinctRow(
          ctx, rows.data(), n, 8 * dim,
          [&](int64_t row, int64_t first, const int64_t* next) {
            int64_t last = first;
            while (next[last] >= 0) last = next[last];
            std::memcpy(table->Row(row), e + last * dim, bytes);
          },
          prefetch);
    } else {  // add: the row gets the sum of its occurrences' values
      ForEachDistinctRowSum(
          ctx, rows.data(), n, e, dim, 8 * dim,
          [&](int64_t row, const float* sum, int64_t) {
            float* __restrict dst = table->Row(row);
            for (int64_t c = 0; c < dim; ++c) dst[c] += sum[c];
          },
          prefetch);
    }
    ctx->set_output(0, embedding);
  }

 private:
  int64_t update_type_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("Recops>DynamicEmbeddingTable").Device(tensorflow::DEVICE_CPU),
                        DynamicEmbeddingTableOp);
REGISTER_KERNEL_BUILDER(
    Name("Recops>DynamicEmbeddingLookupAddresses").Device(tensorflow::DEVICE_CPU),
    LookupAddressesOp);
REGISTER_KERNEL_BUILDER(Name("Recops>DynamicEmbeddingTableSize").Device(tensorflow::DEVICE_CPU),
                        TableSizeOp);
REGISTER_KERNEL_BUILDER(Name("Recops>DynamicEmbeddingTableExport").Device(tensorflow::DEVICE_CPU),
                        TableExportOp);
REGISTER_KERNEL_BUILDER(Name("Recops>DynamicEmbeddingTableImport").Device(tensorflow::DEVICE_CPU),
                        TableImportOp);
REGISTER_KERNEL_BUILDER(Name("Recops>EmbeddingLookupByAddress").Device(tensorflow::DEVICE_CPU),
                        EmbeddingLookupByAddressOp);
REGISTER_KERNEL_BUILDER(Name("Recops>EmbeddingUpdateByAddress").Device(tensorflow::DEVICE_CPU),
                        EmbeddingUpdateByAddressOp);

}  // namespace recops
