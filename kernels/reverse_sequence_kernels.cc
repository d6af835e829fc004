// Kernel of stem reverse_sequence: a row permutation, so one dtype-agnostic kernel
// (bytes per row) serves every registered dtype.
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/copy.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/parallel.h"
#include "kernels/common/validation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

class ReverseSequenceOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckRank(input, "input", 3));
    std::vector<int64_t> lens;
    OP_REQUIRES_OK(ctx, ReadInt64Vector(ctx->input(1), "seq_lengths", &lens));
    const int64_t batch = input.dim_size(0), steps = input.dim_size(1);
    OP_REQUIRES(
        ctx, static_cast<int64_t>(lens.size()) == batch,
        absl::InvalidArgumentError(absl::StrCat("seq_lengths must have one entry per batch row (",
                                                batch, "), got ", lens.size())));
    for (int64_t b = 0; b < batch; ++b) {
      OP_REQUIRES(ctx, lens[b] >= 0 && lens[b] <= steps,
                  absl::InvalidArgumentError(absl::StrCat("seq_lengths[", b, "] = ", lens[b],
                                                          " must lie in [0, ", steps,
                                                          "] (the sequence axis of input)")));
    }
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, input.shape(), &output));
    const int64_t row_bytes = input.dim_size(2) * tensorflow::DataTypeSize(input.dtype());
    const char* in = input.tensor_data().data();
    char* out = const_cast<char*>(output->tensor_data().data());
    const bool stream = input.TotalBytes() >= static_cast<size_t>(kStreamingOutputBytes);
    // Reversed rows are read backwards; each source row is prefetched 8 rows ahead (on a Zen 4,
    // B=256 T=512 D=128 floats: 4.7-5.1 ms a call against 6.3-9.3 ms without, alternating by
    // process).
    constexpr int64_t kAheadRows = 8;
    const auto source = [&](int64_t r) {
      const int64_t b = r / steps, t = r % steps;
      return in + (b * steps + (t < lens[b] ? lens[b] - 1 - t : t)) * row_bytes;
    };
    ParallelFor(ctx, batch * steps, row_bytes + 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        if (r + kAheadRows < r1) PrefetchBytes(source(r + kAheadRows), row_bytes, false);
        CopyRun(out + r * row_bytes, source(r), row_bytes, stream);
      }
      if (stream) StreamFence();
    });
  }
};

#define REGISTER(T)                                                                         \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("Recops>ReverseSequence").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      ReverseSequenceOp);
RECOPS_CALL_FLOAT_TYPES(REGISTER)
REGISTER(int64_t)
#undef REGISTER

}  // namespace

}  // namespace recops
