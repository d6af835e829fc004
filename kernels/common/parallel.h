// Parallel loops on the CPU device's intra-op thread pool.
#ifndef RECOPS_KERNELS_COMMON_PARALLEL_H_
#define RECOPS_KERNELS_COMMON_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace tensorflow {
class OpKernelContext;
}  // namespace tensorflow

namespace recops {

// Runs fn(begin, end) over disjoint ranges covering [0, total) on the intra-op pool.
// cost_per_unit is an estimate of the work of one unit in nanoseconds-ish units (bytes
// touched is a good proxy for memory-bound loops); small totals run inline.
void ParallelFor(tensorflow::OpKernelContext* ctx, int64_t total, int64_t cost_per_unit,
                 const std::function<void(int64_t, int64_t)>& fn);

// Runs fn(item) for every item in [0, num_items) on the intra-op pool, handing items out one
// at a time from a shared counter: for work items of very different cost (attention over
// sequences of different lengths), listed most expensive first.
void ParallelForDynamic(tensorflow::OpKernelContext* ctx, int64_t num_items,
                        const std::function<void(int64_t)>& fn);

// Number of threads ParallelFor may use.
int NumThreads(tensorflow::OpKernelContext* ctx);

}  // namespace recops

#endif  // RECOPS_KERNELS_COMMON_PARALLEL_H_
