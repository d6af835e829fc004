// Run-time choice of the instruction set for hot loops: the same always-inline template code
// compiled three times (AVX-512, AVX2 + FMA, baseline x86-64) and picked once per process
// from the CPU's features. Binaries stay portable (no -march=native).
#ifndef RECOPS_KERNELS_COMMON_DISPATCH_H_
#define RECOPS_KERNELS_COMMON_DISPATCH_H_

#include "kernels/common/microkernels.h"

namespace recops {

// The best instruction set of this CPU (AVX-512 needs F, BW, DQ, VL and CD).
inline Isa BestIsa() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  static const Isa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512cd")) {
      return Isa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
    return Isa::kBase;
  }();
  return best;
#else
  return Isa::kBase;
#endif
}

}  // namespace recops

// Runs the statement BODY (which may use the compile-time constant `I`, the Isa) inside a
// lambda compiled for BestIsa(): always-inline callees are compiled for that target there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RECOPS_WITH_ISA(BODY)                                                  \
  do {                                                                         \
    switch (::recops::BestIsa()) {                                             \
      case ::recops::Isa::kAvx512:                                             \
        [&]() __attribute__((target("arch=x86-64-v4"))) {                      \
          [[maybe_unused]] constexpr ::recops::Isa I = ::recops::Isa::kAvx512; \
          BODY;                                                                \
        }();                                                                   \
        break;                                                                 \
      case ::recops::Isa::kAvx2:                                               \
        [&]() __attribute__((target("arch=x86-64-v3"))) {                      \
          [[maybe_unused]] constexpr ::recops::Isa I = ::recops::Isa::kAvx2;   \
          BODY;                                                                \
        }();                                                                   \
        break;                                                                 \
      default:                                                                 \
        [&]() {                                                                \
          [[maybe_unused]] constexpr ::recops::Isa I = ::recops::Isa::kBase;   \
          BODY;                                                                \
        }();                                                                   \
    }                                                                          \
  } while (false)
#else
#define RECOPS_WITH_ISA(BODY)                                          \
  do {                                                                 \
    [[maybe_unused]] constexpr ::recops::Isa I = ::recops::Isa::kBase; \
    BODY;                                                              \
  } while (false)
#endif

#endif  // RECOPS_KERNELS_COMMON_DISPATCH_H_
