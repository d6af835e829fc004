#include "kernels/common/parallel.h"

#include <algorithm>
#include <atomic>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/work_sharder.h"

namespace recops {

void ParallelFor(tensorflow::OpKernelContext* ctx, int64_t total, int64_t cost_per_unit,
                 const std::function<void(int64_t, int64_t)>& fn) {
  if (total <= 0) return;
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(workers->num_threads, workers->workers, total,
                    std::max<int64_t>(cost_per_unit, 1), fn);
}

void ParallelForDynamic(tensorflow::OpKernelContext* ctx, int64_t num_items,
                        const std::function<void(int64_t)>& fn) {
  if (num_items <= 0) return;
  const int64_t workers = std::min<int64_t>(NumThreads(ctx), num_items);
  if (workers <= 1) {
    for (int64_t i = 0; i < num_items; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  // One unit per worker, each with a cost large enough that Shard runs them all in parallel.
  ParallelFor(ctx, workers, int64_t{1} << 30, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      for (int64_t i = next.fetch_add(1); i < num_items; i = next.fetch_add(1)) fn(i);
    }
  });
}

int NumThreads(tensorflow::OpKernelContext* ctx) {
  return ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
}

}  // namespace recops
