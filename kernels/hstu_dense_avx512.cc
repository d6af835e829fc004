// The work items of stem hstu_dense (kernels/hstu_dense.h) compiled for AVX-512 (x86-64-v4:
// F, BW, DQ, VL, CD), for the float dtypes; HstuBestEntries (kernels/hstu_dense.cc) picks them
// at run time on CPUs that have it. One instruction set per translation unit: each heavy
// instantiation is compiled once, and the units build in parallel.
#include "kernels/hstu_dense.h"

namespace recops {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
RECOPS_HSTU_ENTRIES(Isa::kAvx512, __attribute__((target("arch=x86-64-v4"))))
#endif

}  // namespace recops
