// Run-time choice of the instruction set for hot loops: the same always-inline template code
// compiled three times (AVX-512, AVX2 + FMA, baseline x86-64) and picked once per process
// from the CPU's features. Binaries stay portable (no -march=native).
#ifndef RECOPS_KERNELS_COMMON_DISPATCH_H_
#define RECOPS_KERNELS_COMMON_DISPATCH_H_

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/common/microkernels.h"

namespace recops {

// The paths a kernel may take, lowest first: the Isa of the hot loops, and above AVX-512 the
// bfloat16 dot products (vdpbf16ps) that bfloat16 tile GEMMs use where the CPU has AVX512-BF16.
enum class IsaPath { kBase, kAvx2, kAvx512, kAvx512Bf16 };

// The path this process takes: the best of this CPU (AVX-512 needs F, BW, DQ, VL and CD; its
// bfloat16 path AVX512-BF16 as well), or a lower one named by the environment variable
// RECOPS_ISA ("avx512bf16", "avx512", "avx2" or "baseline"; read once, at the first kernel
// that dispatches), so that one machine runs and cross-checks every path it has. A path the
// CPU lacks, or an unknown name, is not taken: the best path runs. The choice is printed once
// to stderr when RECOPS_ISA is set.
inline IsaPath BestPath() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  static const IsaPath best = [] {
    __builtin_cpu_init();
    IsaPath cpu = IsaPath::kBase;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512cd")) {
      cpu = __builtin_cpu_supports("avx512bf16") ? IsaPath::kAvx512Bf16 : IsaPath::kAvx512;
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      cpu = IsaPath::kAvx2;
    }
    static const char* const kNames[] = {"baseline", "avx2", "avx512", "avx512bf16"};
    const char* wanted = std::getenv("RECOPS_ISA");
    if (wanted == nullptr || *wanted == '\0') return cpu;
    IsaPath chosen = cpu;
    const char* why = "unknown name: the CPU's best path runs";
    for (int i = 0; i < 4; ++i) {
      if (std::strcmp(wanted, kNames[i]) == 0) {
        const IsaPath path = static_cast<IsaPath>(i);
        why = path <= cpu ? "" : "this CPU lacks it: the CPU's best path runs";
        if (path <= cpu) chosen = path;
      }
    }
    std::fprintf(stderr, "recops_tf: RECOPS_ISA=%s: %s path (CPU best: %s)%s%s\n", wanted,
                 kNames[static_cast<int>(chosen)], kNames[static_cast<int>(cpu)], *why ? "; " : "",
                 why);
    return chosen;
  }();
  return best;
#else
  return IsaPath::kBase;
#endif
}

// The instruction set of the hot loops (the bfloat16 path's loops are AVX-512 ones).
inline Isa BestIsa() {
  const IsaPath path = BestPath();
  return path >= IsaPath::kAvx512 ? Isa::kAvx512 : static_cast<Isa>(static_cast<int>(path));
}

// Whether bfloat16 tile GEMMs run on the CPU's bfloat16 dot products (GemmBf16).
inline bool Bf16DotPath() { return BestPath() == IsaPath::kAvx512Bf16; }

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
