// Kernels of stem concat_jagged_tensor. Both directions are row copies, so one
// dtype-agnostic kernel (bytes per row) serves every registered dtype.

#include "absl/strings/str_cat.h"
#include "kernels/common/copy.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/parallel.h"
#include "kernels/common/validation.h"
#include "kernels/concat_jagged_tensor.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

// Bytes of one row (all dims after the first) of a rank >= 1 tensor.
int64_t RowBytes(const Tensor& t) {
  int64_t n = tensorflow::DataTypeSize(t.dtype());
  for (int d = 1; d < t.dims(); ++d) n *= t.dim_size(d);
  return n;
}

absl::Status CheckSameRowShape(const Tensor& a, absl::string_view a_name, const Tensor& b,
                               absl::string_view b_name) {
  TensorShape ra = a.shape(), rb = b.shape();
  ra.RemoveDim(0);
  rb.RemoveDim(0);
  if (ra != rb) {
    return absl::InvalidArgumentError(
        absl::StrCat(a_name, " and ", b_name, " must have the same row shape, got ",
                     a.shape().DebugString(), " and ", b.shape().DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckSameLength(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() != b.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("offsets_a and offsets_b must have the same length (num_samples + 1), got ",
                     a.size(), " and ", b.size()));
  }
  return absl::OkStatus();
}

// Copies rows between the concatenated tensor and its parts along the layout's pieces.
// to_concat: parts -> concatenated; otherwise concatenated -> parts.
void CopyPieces(OpKernelContext* ctx, const JaggedConcatLayout& layout, int64_t row_bytes,
                char* concat, char* part_a, char* part_b, bool to_concat) {
  const bool stream = layout.rows() * row_bytes >= kStreamingOutputBytes;
  ParallelFor(ctx, layout.rows(), row_bytes + 16, [&](int64_t r0, int64_t r1) {
    layout.ForEachPiece(r0, r1, [&](int64_t out_row, bool from_b, int64_t src_row, int64_t n) {
      char* part = (from_b ? part_b : part_a) + src_row * row_bytes;
      char* whole = concat + out_row * row_bytes;
      if (to_concat) {
        CopyRun(whole, part, n * row_bytes, stream);
      } else {
        CopyRun(part, whole, n * row_bytes, stream);
      }
    });
    if (stream) StreamFence();
  });
}

class ConcatJaggedTensorOp : public OpKernel {
 public:
  explicit ConcatJaggedTensorOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_prefix_from_right", &prefix_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& b = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckMinRank(a, "values_a", 1));
    OP_REQUIRES_OK(ctx, CheckMinRank(b, "values_b", 1));
    OP_REQUIRES_OK(ctx, CheckSameRowShape(a, "values_a", b, "values_b"));
    std::vector<int64_t> off_a, off_b;
    OP_REQUIRES_OK(ctx, ReadOffsets(ctx->input(1), "offsets_a", a.dim_size(0), &off_a));
    OP_REQUIRES_OK(ctx, ReadOffsets(ctx->input(3), "offsets_b", b.dim_size(0), &off_b));
    OP_REQUIRES_OK(ctx, CheckSameLength(off_a, off_b));

    TensorShape out_shape = a.shape();
    out_shape.set_dim(0, a.dim_size(0) + b.dim_size(0));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    const JaggedConcatLayout layout(off_a, off_b, prefix_);
    CopyPieces(ctx, layout, RowBytes(a), const_cast<char*>(out->tensor_data().data()),
               const_cast<char*>(a.tensor_data().data()), const_cast<char*>(b.tensor_data().data()),
               /*to_concat=*/true);
  }

 private:
  int64_t prefix_;
};

class ConcatJaggedTensorGradOp : public OpKernel {
 public:
  explicit ConcatJaggedTensorGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_prefix_to_right", &prefix_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckMinRank(values, "values", 1));
    std::vector<int64_t> off_a, off_b;
    OP_REQUIRES_OK(ctx, ReadOffsets(ctx->input(1), "offsets_a", -1, &off_a));
    OP_REQUIRES_OK(ctx, ReadOffsets(ctx->input(2), "offsets_b", -1, &off_b));
    OP_REQUIRES_OK(ctx, CheckSameLength(off_a, off_b));
    OP_REQUIRES(ctx, off_a.back() + off_b.back() == values.dim_size(0),
                absl::InvalidArgumentError(absl::StrCat(
                    "offsets_a[-1] + offsets_b[-1] = ", off_a.back(), " + ", off_b.back(),
                    " must equal the number of rows of values, ", values.dim_size(0))));

    TensorShape shape_a = values.shape(), shape_b = values.shape();
    shape_a.set_dim(0, off_a.back());
    shape_b.set_dim(0, off_b.back());
    Tensor *a = nullptr, *b = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape_a, &a));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, shape_b, &b));
    const JaggedConcatLayout layout(off_a, off_b, prefix_);
    CopyPieces(ctx, layout, RowBytes(values), const_cast<char*>(values.tensor_data().data()),
               const_cast<char*>(a->tensor_data().data()),
               const_cast<char*>(b->tensor_data().data()), /*to_concat=*/false);
  }

 private:
  int64_t prefix_;
};

#define REGISTER(T)                                                                                \
  REGISTER_KERNEL_BUILDER(                                                                         \
      Name("Recops>ConcatJaggedTensor").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),     \
      ConcatJaggedTensorOp);                                                                       \
  REGISTER_KERNEL_BUILDER(                                                                         \
      Name("Recops>ConcatJaggedTensorGrad").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      ConcatJaggedTensorGradOp);
RECOPS_CALL_FLOAT_TYPES(REGISTER)
REGISTER(int32_t)
REGISTER(int64_t)
#undef REGISTER

}  // namespace

}  // namespace recops
