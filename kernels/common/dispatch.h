// Run-time choice of the instruction set for hot loops: the same always-inline template code
// compiled three times (AVX-512, AVX2 + FMA, baseline x86-64) and picked once per process
// from the CPU's features. Binaries stay portable (no -march=native).
#ifndef RECOPS_KERNELS_COMMON_DISPATCH_H_
#define RECOPS_KERNELS_COMMON_DISPATCH_H_

#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "kernels/common/microkernels.h"

namespace recops {

// The paths a kernel may take, lowest first: the Isa of the hot loops, and above AVX-512 the
// bfloat16 dot products (vdpbf16ps) that bfloat16 tile GEMMs use where the CPU has AVX512-BF16,
// then the same GEMMs on AMX-BF16 tiles (tdpbf16ps; kernels/common/gemm_bf16.cc).
enum class IsaPath { kBase, kAvx2, kAvx512, kAvx512Bf16, kAmx };

// Whether the CPU has AMX tiles with bfloat16 dot products: CPUID.(EAX=7, ECX=0):EDX bits 24
// (AMX-TILE) and 22 (AMX-BF16). The OS must also grant the tile state (RequestAmxState).
inline bool CpuHasAmxBf16() {
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return ((d >> 24) & 1u) && ((d >> 22) & 1u);
#else
  return false;
#endif
}

// Asks Linux for the AMX tile data state of this process (arch_prctl ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA; needed once per process before the first tile instruction, which
// otherwise faults) and returns whether it is granted (ARCH_GET_XCOMP_PERM).
inline bool RequestAmxState() {
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
  constexpr long kGetPerm = 0x1022, kRequestPerm = 0x1023, kXtileData = 18;
  if (syscall(SYS_arch_prctl, kRequestPerm, kXtileData) != 0) return false;
  unsigned long granted = 0;
  return syscall(SYS_arch_prctl, kGetPerm, &granted) == 0 && ((granted >> kXtileData) & 1ul);
#else
  return false;
#endif
}

// The path this process takes (and whether its AMX tiles are emulated): the best path of this
// CPU (AVX-512 needs F, BW, DQ, VL and CD; its bfloat16 path AVX512-BF16 as well; above it AMX
// where the CPU has AMX-BF16 and the OS grants the tile state), or another one named by the
// environment variable RECOPS_ISA ("amx", "avx512bf16", "avx512", "avx2" or "baseline"; read
// once, at the first kernel that dispatches), so that one machine runs and cross-checks every
// path it has. A path the CPU lacks, or an unknown name, is not taken: the best path runs. AMX
// is the default since it was measured on an AMX machine (a Xeon with AMX-BF16, bfloat16 HSTU
// attention 1.8-1.9x the avx512bf16 path, forward and backward; docs/benchmarks.md);
// RECOPS_ISA=avx512bf16 keeps the vector path. "amx_emulated" runs the AMX path's code on tiles
// emulated in software (gemm_bf16.cc; slow: for tests, on any CPU with AVX512-BF16). The choice
// is printed once to stderr when RECOPS_ISA is set.
struct PathChoice {
  IsaPath path;
  bool emulated_tiles;
};

// Run once (ChosenPath), so kept out of line: inlined, its body (the names, the syscall) was
// copied into every hot function that asks for the path.
#if defined(__GNUC__)
__attribute__((noinline, cold))
#endif
inline PathChoice ChoosePath() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  IsaPath cpu = IsaPath::kBase;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512cd")) {
    cpu = __builtin_cpu_supports("avx512bf16") ? IsaPath::kAvx512Bf16 : IsaPath::kAvx512;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    cpu = IsaPath::kAvx2;
  }
  static const char* const kNames[] = {"baseline",   "avx2", "avx512",
                                       "avx512bf16", "amx",  "amx_emulated"};
  // AMX tiles: the CPU has them and the OS grants their state (asked once, here).
  const bool amx = cpu == IsaPath::kAvx512Bf16 && CpuHasAmxBf16() && RequestAmxState();
  const IsaPath best = amx ? IsaPath::kAmx : cpu;
  const char* wanted = std::getenv("RECOPS_ISA");
  if (wanted == nullptr || *wanted == '\0') return {best, false};
  PathChoice chosen = {best, false};
  const char* why = "unknown name: the CPU's best path runs";
  const char* const lacks = "this CPU lacks it: the CPU's best path runs";
  for (int i = 0; i < 6; ++i) {
    if (std::strcmp(wanted, kNames[i]) != 0) continue;
    why = "";
    if (i == 5) {  // amx_emulated
      if (cpu == IsaPath::kAvx512Bf16) {
        chosen = {IsaPath::kAmx, true};
      } else {
        why = lacks;
      }
    } else if (static_cast<IsaPath>(i) == IsaPath::kAmx) {
      if (cpu != IsaPath::kAvx512Bf16 || !CpuHasAmxBf16()) {
        why = lacks;
      } else if (!amx) {
        why = "the OS did not grant the AMX tile state (arch_prctl): the CPU's best path runs";
      } else {
        chosen = {IsaPath::kAmx, false};
      }
    } else if (static_cast<IsaPath>(i) <= cpu) {
      chosen = {static_cast<IsaPath>(i), false};
    } else {
      why = lacks;
    }
  }
  std::fprintf(stderr, "recops_tf: RECOPS_ISA=%s: %s path (CPU best: %s)%s%s\n", wanted,
               chosen.emulated_tiles ? kNames[5] : kNames[static_cast<int>(chosen.path)],
               kNames[static_cast<int>(best)], *why ? "; " : "", why);
  return chosen;
#else
  return {IsaPath::kBase, false};
#endif
}

inline const PathChoice& ChosenPath() {
  static const PathChoice choice = ChoosePath();
  return choice;
}

inline IsaPath BestPath() { return ChosenPath().path; }

// The instruction set of the hot loops (the bfloat16 path's loops are AVX-512 ones).
inline Isa BestIsa() {
  const IsaPath path = BestPath();
  return path >= IsaPath::kAvx512 ? Isa::kAvx512 : static_cast<Isa>(static_cast<int>(path));
}

// Whether bfloat16 tile GEMMs run on the CPU's bfloat16 dot products (GemmBf16).
inline bool Bf16DotPath() { return BestPath() >= IsaPath::kAvx512Bf16; }

// Whether GemmBf16 runs its whole 16 x 16 blocks on AMX tiles, and whether those are emulated.
inline bool AmxPath() { return BestPath() == IsaPath::kAmx; }
inline bool AmxEmulated() { return ChosenPath().emulated_tiles; }

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
