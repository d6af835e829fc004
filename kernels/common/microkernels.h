// Small dense building blocks for tiled kernels: a register-blocked GEMM-accumulate on
// row-major tiles and vectorisable sigmoid / SiLU. Everything is inline (always_inline) so
// that a caller compiled for several targets (function multiversioning) gets each target's
// instructions; GCC vector extensions lower to whatever the target has.
#ifndef RECOPS_KERNELS_COMMON_MICROKERNELS_H_
#define RECOPS_KERNELS_COMMON_MICROKERNELS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>  // declares the target builtins used under target attributes
#endif

#define RECOPS_INLINE inline __attribute__((always_inline))

// Function multiversioning for hot non-template entry points: AVX-512, AVX2+FMA, baseline.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RECOPS_MULTIVERSION \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RECOPS_MULTIVERSION
#endif

#include "kernels/common/dtypes.h"

namespace recops {

// The instruction set a kernel instantiation is compiled for (with the matching target
// attribute on its entry point): picks the vector width, register blocking and the few
// operations that need a target-specific builtin.
enum class Isa { kBase, kAvx2, kAvx512 };

// A GCC vector of Bytes bytes. Hot loops use the width of their target's registers,
// IsaVec<Acc, I>: a vector wider than the target's registers (64 bytes without AVX-512) has
// no machine mode, and GCC then keeps every such value in memory: splats are built element
// by element on the stack, accumulators round-trip through the stack and general registers
// on every operation (a 64-byte GEMM accumulate ran ~30x slower on an AVX2-only CPU than
// its 32-byte form). Vec<Acc> (64 bytes) remains for reductions whose summation order must
// not depend on the instruction set.
template <typename Acc, int Bytes = 64>
struct Vec {
  typedef Acc type __attribute__((vector_size(Bytes)));
  static constexpr int kLanes = Bytes / sizeof(Acc);
};

// Bytes of one vector register: zmm, ymm, xmm.
template <Isa I>
constexpr int kVecBytes = I == Isa::kAvx512 ? 64 : (I == Isa::kAvx2 ? 32 : 16);

template <typename Acc, Isa I>
using IsaVec = Vec<Acc, kVecBytes<I>>;

template <typename V, typename Acc>
RECOPS_INLINE V LoadVec(const Acc* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

// A store through an unaligned, may_alias vector type (as the intrinsics' own storeu): with a
// memcpy, GCC merged a GEMM block's contiguous stores into one copy through the stack.
template <typename V, typename Acc>
RECOPS_INLINE void StoreVec(Acc* p, const V& v) {
  typedef V Unaligned __attribute__((aligned(alignof(Acc)), may_alias));
  *reinterpret_cast<Unaligned*>(p) = v;
}

// Rows of C a GEMM block keeps in registers: 8 x 2 vectors fit AVX-512's 32 registers; on AVX2,
// 4 x 3 fill the 16 (12 accumulators, 3 B vectors, the broadcast A element), with 4 x 2 blocks
// for the remaining columns.
template <Isa I>
constexpr int kGemmRows = I == Isa::kAvx512 ? 8 : 4;

// n rounded up to a multiple of the register block (callers pad their tiles to that).
template <Isa I>
constexpr int64_t RoundRows(int64_t n) {
  return (n + kGemmRows<I> - 1) / kGemmRows<I> * kGemmRows<I>;
}

// Rows [i, i + RR) of one vector of columns of C (+)= the A rows times B, over kc values of
// k from k0: b points to B's row k0 at that vector's first column, c to C's row 0 at it. With
// nc < W, only the first nc lanes of C are read and written (B must then have W readable
// values per row: GemmAcc's zero-padded copy). One accumulator per row: RR independent FMA
// chains (8 keep two FMA pipes of 4-cycle latency busy).
template <typename Acc, Isa I, int RR, bool kTransA>
RECOPS_INLINE void GemmVecRows(int64_t i, int64_t k0, int64_t kc, const Acc* a, int64_t lda,
                               const Acc* b, int64_t ldb, Acc* c, int64_t ldc, int64_t nc,
                               bool zero) {
  using V = typename IsaVec<Acc, I>::type;
  constexpr int64_t W = IsaVec<Acc, I>::kLanes;
  V acc[RR];
  for (int r = 0; r < RR; ++r) {
    acc[r] = V{};
    if (zero) continue;
    if (nc == W) {
      acc[r] = LoadVec<V>(c + (i + r) * ldc);
    } else {
      for (int64_t l = 0; l < nc; ++l) acc[r][l] = c[(i + r) * ldc + l];
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    const V bk = LoadVec<V>(b + k * ldb);
    for (int r = 0; r < RR; ++r) {
      acc[r] += (kTransA ? a[(k0 + k) * lda + i + r] : a[(i + r) * lda + k0 + k]) * bk;
    }
  }
  for (int r = 0; r < RR; ++r) {
    if (nc == W) {
      StoreVec(c + (i + r) * ldc, acc[r]);
    } else {
      for (int64_t l = 0; l < nc; ++l) c[(i + r) * ldc + l] = acc[r][l];
    }
  }
}

// GemmVecRows over all M rows: blocks of 8, then 4, then single rows.
template <typename Acc, Isa I, bool kTransA>
RECOPS_INLINE void GemmVecColumn(int64_t M, int64_t k0, int64_t kc, const Acc* a, int64_t lda,
                                 const Acc* b, int64_t ldb, Acc* c, int64_t ldc, int64_t nc,
                                 bool zero) {
  int64_t i = 0;
  for (; i + 8 <= M; i += 8)
    GemmVecRows<Acc, I, 8, kTransA>(i, k0, kc, a, lda, b, ldb, c, ldc, nc, zero);
  for (; i + 4 <= M; i += 4)
    GemmVecRows<Acc, I, 4, kTransA>(i, k0, kc, a, lda, b, ldb, c, ldc, nc, zero);
  for (; i < M; ++i) GemmVecRows<Acc, I, 1, kTransA>(i, k0, kc, a, lda, b, ldb, c, ldc, nc, zero);
}

// Columns [0, NV * W) of C (+)= A times B (B and C pointing at the block's first column): R
// rows x NV vectors of C in registers at a time (M a multiple of R: GemmAccBody gives the rest
// to GemmFewRows). Each element is one FMA chain over k ascending, as on every other path.
template <typename Acc, Isa I, bool kOverwrite, bool kTransA, int NV>
RECOPS_INLINE void GemmColumnBlock(int64_t M, int64_t K, const Acc* a, int64_t lda, const Acc* B,
                                   int64_t ldb, Acc* C, int64_t ldc) {
  constexpr int R = kGemmRows<I>;
  using V = typename IsaVec<Acc, I>::type;
  constexpr int64_t W = IsaVec<Acc, I>::kLanes;
  const auto A = [&](int64_t i, int64_t k) -> Acc {
    return kTransA ? a[k * lda + i] : a[i * lda + k];
  };
  const auto load_c = [&](int64_t offset) { return kOverwrite ? V{} : LoadVec<V>(C + offset); };
  int64_t i = 0;
  for (; i + R <= M; i += R) {
    V c[R][NV];
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < NV; ++v) c[r][v] = load_c((i + r) * ldc + v * W);
    }
    for (int64_t k = 0; k < K; ++k) {
      V b[NV];
      for (int v = 0; v < NV; ++v) b[v] = LoadVec<V>(B + k * ldb + v * W);
      for (int r = 0; r < R; ++r) {
        const Acc x = A(i + r, k);
        for (int v = 0; v < NV; ++v) c[r][v] += x * b[v];
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < NV; ++v) StoreVec(C + (i + r) * ldc + v * W, c[r][v]);
    }
  }
}

// Rows [i0, i0 + RR) x NV vectors of columns of C (+)= A times B (B and C pointing at the
// columns' first): RR x NV accumulators, each element one FMA chain over k ascending.
template <typename Acc, Isa I, bool kOverwrite, bool kTransA, int RR, int NV>
RECOPS_INLINE void GemmRowBlock(int64_t i0, int64_t K, const Acc* a, int64_t lda, const Acc* B,
                                int64_t ldb, Acc* C, int64_t ldc) {
  using V = typename IsaVec<Acc, I>::type;
  constexpr int64_t W = IsaVec<Acc, I>::kLanes;
  V c[RR][NV];
  for (int r = 0; r < RR; ++r) {
    for (int v = 0; v < NV; ++v)
      c[r][v] = kOverwrite ? V{} : LoadVec<V>(C + (i0 + r) * ldc + v * W);
  }
  for (int64_t k = 0; k < K; ++k) {
    V b[NV];
    for (int v = 0; v < NV; ++v) b[v] = LoadVec<V>(B + k * ldb + v * W);
    for (int r = 0; r < RR; ++r) {
      const Acc x = kTransA ? a[k * lda + i0 + r] : a[(i0 + r) * lda + k];
      for (int v = 0; v < NV; ++v) c[r][v] += x * b[v];
    }
  }
  for (int r = 0; r < RR; ++r) {
    for (int v = 0; v < NV; ++v) StoreVec(C + (i0 + r) * ldc + v * W, c[r][v]);
  }
}

// Rows [i0, M) (fewer than kGemmRows) x NV vectors of columns: 4, then 2, then 1 rows at a
// time, each across all NV vectors (2 rows x 4 vectors keep 8 FMA chains going where a lone row
// of a 2-vector block keeps 2).
template <typename Acc, Isa I, bool kOverwrite, bool kTransA, int NV>
RECOPS_INLINE void GemmFewRows(int64_t i0, int64_t M, int64_t K, const Acc* a, int64_t lda,
                               const Acc* B, int64_t ldb, Acc* C, int64_t ldc) {
  int64_t i = i0;
  for (; i + 4 <= M; i += 4)
    GemmRowBlock<Acc, I, kOverwrite, kTransA, 4, NV>(i, K, a, lda, B, ldb, C, ldc);
  if (i + 2 <= M) {
    GemmRowBlock<Acc, I, kOverwrite, kTransA, 2, NV>(i, K, a, lda, B, ldb, C, ldc);
    i += 2;
  }
  if (i < M) GemmRowBlock<Acc, I, kOverwrite, kTransA, 1, NV>(i, K, a, lda, B, ldb, C, ldc);
}

// C[M x N] (+)= A[M x K] * B[K x N] in vectors of instruction set I; row-major with leading
// dimensions lda, ldb, ldc. With kOverwrite, C is written without being read (C = A * B);
// with kTransA, A is stored transposed (element (i, k) at A[k * lda + i]: C += Aᵀ·B of a
// row-major [K x M] A, which costs nothing extra since A is only ever broadcast element by
// element). The main block keeps R = kGemmRows<I> rows x 2 vectors of C in registers (on
// AVX2, R x 3 first: GemmColumnBlock); on L1-resident 64 x 64 float tiles it ran at 143
// GFLOP/s on one core of the development machine (AVX-512; TF's own matmul: ~130 per core),
// 17% slower with B rows 1 KB apart: keep B contiguous. On a Zen 3 core (AVX2, 2.45 GHz), R x 3
// gave 59-69 GFLOP/s plain and 64-73 with A transposed, against 52-65 and 37-55 for R x 2. A last
// single vector of columns runs in blocks of rows (GemmVecColumn), and the last N mod W columns
// likewise through a zero-padded copy of B's last columns (with D = 50 heads a scalar column was a
// chain of K dependent FMAs per element, 2/3 of a tile GEMM's time). The last M mod R rows of
// the blocks' columns go 4 or 2 rows x 4 vectors at a time (GemmFewRows): a 50-row dSᵀ (d 50)
// costs 50 rows' work, where padding to 56 cost 56 and single rows of 2 vectors about 64.
// Every element of C is the same sum in the same order (k ascending) on every path and at
// every vector width. This is the body; kernels call GemmAcc (below), its one compiled copy
// per variant.
template <typename Acc, Isa I, bool kOverwrite, bool kTransA>
RECOPS_INLINE void GemmAccBody(int64_t M, int64_t N, int64_t K, const Acc* a, int64_t lda,
                               const Acc* B, int64_t ldb, Acc* C, int64_t ldc) {
  constexpr int64_t W = IsaVec<Acc, I>::kLanes;
  // The blocks take the rows in whole register blocks; the rest, GemmFewRows below.
  const int64_t Mb = M - M % kGemmRows<I>;
  int64_t n0 = 0;
  // AVX2: blocks of R rows x 3 vectors first (12 accumulators, the 3 B vectors and the
  // broadcast fill the 16 registers), then of 2 vectors. 8 accumulators are just the FMA
  // pipes' latency x throughput (2 x 4 on Zen 3), with no slack for the loads. A 3-vector
  // block is skipped where it would leave one lone vector of columns (N = 32: 2 + 2, not 3 + 1).
  if constexpr (I == Isa::kAvx2) {
    for (; n0 + 3 * W <= N && (N - n0 - 3 * W < W || N - n0 - 3 * W >= 2 * W); n0 += 3 * W)
      GemmColumnBlock<Acc, I, kOverwrite, kTransA, 3>(Mb, K, a, lda, B + n0, ldb, C + n0, ldc);
  }
  // AVX-512: an odd number of whole vectors (>= 3) starts with one block of 3 (24 accumulators)
  // rather than ending on a lone vector, whose 8 rows load 9 values for 8 FMAs (N = 48: dE at
  // d 50).
  if constexpr (I == Isa::kAvx512) {
    if (N / W >= 3 && N / W % 2 == 1) {
      GemmColumnBlock<Acc, I, kOverwrite, kTransA, 3>(Mb, K, a, lda, B, ldb, C, ldc);
      n0 = 3 * W;
    }
  }
  for (; n0 + 2 * W <= N; n0 += 2 * W)
    GemmColumnBlock<Acc, I, kOverwrite, kTransA, 2>(Mb, K, a, lda, B + n0, ldb, C + n0, ldc);
  if (Mb < M) {
    // The blocks' columns [0, n0) of the last rows: 4 vectors at a time on AVX-512 (at most 4
    // x 4 accumulators), then 2, then 1 (n0 may be odd in vectors after a block of 3).
    constexpr int kWide = I == Isa::kAvx512 ? 4 : 2;
    int64_t n = 0;
    for (; n + kWide * W <= n0; n += kWide * W)
      GemmFewRows<Acc, I, kOverwrite, kTransA, kWide>(Mb, M, K, a, lda, B + n, ldb, C + n, ldc);
    for (; n + 2 * W <= n0; n += 2 * W)
      GemmFewRows<Acc, I, kOverwrite, kTransA, 2>(Mb, M, K, a, lda, B + n, ldb, C + n, ldc);
    for (; n < n0; n += W)
      GemmFewRows<Acc, I, kOverwrite, kTransA, 1>(Mb, M, K, a, lda, B + n, ldb, C + n, ldc);
  }
  if (n0 + W <= N) {
    GemmVecColumn<Acc, I, kTransA>(M, 0, K, a, lda, B + n0, ldb, C + n0, ldc, W, kOverwrite);
    n0 += W;
  }
  if (n0 < N) {
    // nt < W columns: B's in zero-padded vectors, kKc rows of B at a time (C's sums go on
    // from chunk to chunk in k order).
    const int64_t nt = N - n0;
    constexpr int64_t kKc = 64;
    Acc bt[kKc * W];
    for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += kKc) {
      const int64_t kc = K - k0 < kKc ? K - k0 : kKc;
      for (int64_t k = 0; k < kc; ++k) {
        for (int64_t l = 0; l < W; ++l)
          bt[k * W + l] = l < nt ? B[(k0 + k) * ldb + n0 + l] : Acc(0);
      }
      GemmVecColumn<Acc, I, kTransA>(M, k0, kc, a, lda, bt, W, C + n0, ldc, nt,
                                     kOverwrite && k0 == 0);
    }
  }
}

// GemmAccBody compiled once per variant (Acc float / double, instruction set I, kOverwrite,
// kTransA) in kernels/common/gemm.cc, each under I's target attribute: the kernels call these
// 24 copies instead of inlining their own at every call site (which made the GEMM most of the
// library's compile time). A call costs nothing next to a tile GEMM's work.
template <typename Acc, Isa I, bool kOverwrite = false, bool kTransA = false>
void GemmAcc(int64_t M, int64_t N, int64_t K, const Acc* a, int64_t lda, const Acc* B, int64_t ldb,
             Acc* C, int64_t ldc);

// m(Acc, I, kOverwrite, kTransA) for every variant of instruction set I.
#define RECOPS_GEMM_VARIANTS(m, I)                                                 \
  m(float, I, false, false) m(float, I, false, true) m(float, I, true, false)      \
      m(float, I, true, true) m(double, I, false, false) m(double, I, false, true) \
          m(double, I, true, false) m(double, I, true, true)
#define RECOPS_GEMM_DECLARE_(Acc, I, OVERWRITE, TRANS_A)                                   \
  template <>                                                                              \
  void GemmAcc<Acc, I, OVERWRITE, TRANS_A>(int64_t, int64_t, int64_t, const Acc*, int64_t, \
                                           const Acc*, int64_t, Acc*, int64_t);
RECOPS_GEMM_VARIANTS(RECOPS_GEMM_DECLARE_, Isa::kBase)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
RECOPS_GEMM_VARIANTS(RECOPS_GEMM_DECLARE_, Isa::kAvx2)
RECOPS_GEMM_VARIANTS(RECOPS_GEMM_DECLARE_, Isa::kAvx512)
#endif
#undef RECOPS_GEMM_DECLARE_

// C[M x N] (+)= A[M x K] · B[K x N] (A transposed with kTransA, as GemmAcc) on the CPU's
// bfloat16 dot products (AVX512-BF16 vdpbf16ps), for float operands whose values are bfloat16
// numbers (a bfloat16 kernel's packed inputs and the scores it has rounded to bfloat16): both
// are packed as bfloat16 pairs along k (exact for such values; others would be rounded to
// nearest even), their products are exact and summed in float. Each element is the same sum
// of the same products as GemmAcc's, in another order: pairs of k (from 0; an odd K's last
// pair ends in a zero), then the pairs in k order; denormal inputs and results are zero (the
// instruction's DAZ / FTZ). Call only where Bf16DotPath() (kernels/common/dispatch.h) holds.
// On the AMX path (AmxPath()) the whole 16 x 16 blocks of C over whole 16-pair steps of k run on
// AMX tiles (tdpbf16ps, the same exact products summed in float); the thread's tiles are
// configured by its first GEMM after Bf16ClearOperands(), which a caller therefore calls at the
// start of each work item (other code on the thread may configure them between items), and
// released by Bf16ReleaseTiles() at its end: a Bf16Item does both.
//
// A caller that multiplies the same packed buffer in many GEMMs (a work item's tiles) registers
// it once, Bf16RegisterOperand(base, rows, ld): rows x ld floats at base, not to be written
// until registered anew or Bf16ClearOperands() (per thread; a registration overlapping an
// earlier one replaces it, and eight are kept). GemmBf16 then converts the buffer once, on
// first use, and reads its operands from that copy (in a 64 x 64 x 64 tile, packing both
// operands per call took ~30% of the time).
void Bf16RegisterOperand(const float* base, int64_t rows, int64_t ld);
void Bf16ClearOperands();
// Releases this thread's AMX tiles if its GEMMs configured them (TILERELEASE: the tile state
// returns to its initial state, which context switches need not save); nothing otherwise.
void Bf16ReleaseTiles();

// A work item's use of GemmBf16 (when `active`): the registered operands cleared at its start,
// the AMX tiles released at its end.
class Bf16Item {
 public:
  explicit Bf16Item(bool active) : active_(active) {
    if (active_) Bf16ClearOperands();
  }
  ~Bf16Item() {
    if (active_) Bf16ReleaseTiles();
  }
  Bf16Item(const Bf16Item&) = delete;
  Bf16Item& operator=(const Bf16Item&) = delete;

 private:
  bool active_;
};
template <bool kOverwrite = false, bool kTransA = false>
void GemmBf16(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* B,
              int64_t ldb, float* C, int64_t ldc);
// GemmBf16 from operands the caller packed (Bf16DotPath() only): C[M x N] (+)= A · B over kh
// pairs of k, A's pairs by row (pair kk of row i, as (a[i][2kk], a[i][2kk + 1]) in the low and
// high halves, at ap[i * si + kk]) and B's pair rows (pair row kk, (b[2kk][n], b[2kk + 1][n])
// at bp[kk * ldbp + n], ldbp >= N rounded up to 16 with those columns readable). What a kernel
// uses when it forms the operands' bfloat16 pairs itself, as it rounds them, instead of
// writing floats for GemmBf16 to convert.
template <bool kOverwrite = false>
void GemmBf16Packed(int64_t M, int64_t N, int64_t kh, const uint32_t* ap, int64_t si,
                    const uint32_t* bp, int64_t ldbp, float* C, int64_t ldc);

// Pair sums of two vectors of W lanes for a transposing reduction (DotRows), in 128-bit
// blocks of G lanes (4 floats or 2 doubles), so that each shuffle is one instruction:
//  - within blocks (kCross false): block j of the result holds the sums of adjacent lane pairs
//    of block j of a, then of b (shufps / shufpd);
//  - across blocks (kCross true): the sums of adjacent block pairs of a, then of b
//    (vperm2f128 / vshuff32x4).
template <typename V, int W, int G, bool kCross>
RECOPS_INLINE V PairSums(const V& a, const V& b) {
#if defined(__clang__)
#define RECOPS_SHUFFLE_(...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
  typedef std::conditional_t<sizeof(a[0]) == 4, int32_t, int64_t> Lane;
  typedef Lane Mask __attribute__((vector_size(sizeof(V))));
#define RECOPS_SHUFFLE_(...) __builtin_shuffle(a, b, Mask{__VA_ARGS__})
#endif
  if constexpr (!kCross && W == 2) {
    return RECOPS_SHUFFLE_(0, 2) + RECOPS_SHUFFLE_(1, 3);
  } else if constexpr (!kCross && G == 2 && W == 4) {
    return RECOPS_SHUFFLE_(0, 4, 2, 6) + RECOPS_SHUFFLE_(1, 5, 3, 7);
  } else if constexpr (!kCross && G == 2 && W == 8) {
    return RECOPS_SHUFFLE_(0, 8, 2, 10, 4, 12, 6, 14) + RECOPS_SHUFFLE_(1, 9, 3, 11, 5, 13, 7, 15);
  } else if constexpr (!kCross && W == 4) {
    return RECOPS_SHUFFLE_(0, 2, 4, 6) + RECOPS_SHUFFLE_(1, 3, 5, 7);
  } else if constexpr (!kCross && W == 8) {
    return RECOPS_SHUFFLE_(0, 2, 8, 10, 4, 6, 12, 14) + RECOPS_SHUFFLE_(1, 3, 9, 11, 5, 7, 13, 15);
  } else if constexpr (!kCross && W == 16) {
    return RECOPS_SHUFFLE_(0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30) +
           RECOPS_SHUFFLE_(1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31);
  } else if constexpr (G == 2 && W == 4) {
    return RECOPS_SHUFFLE_(0, 1, 4, 5) + RECOPS_SHUFFLE_(2, 3, 6, 7);
  } else if constexpr (G == 2 && W == 8) {
    return RECOPS_SHUFFLE_(0, 1, 4, 5, 8, 9, 12, 13) + RECOPS_SHUFFLE_(2, 3, 6, 7, 10, 11, 14, 15);
  } else if constexpr (W == 8) {
    return RECOPS_SHUFFLE_(0, 1, 2, 3, 8, 9, 10, 11) + RECOPS_SHUFFLE_(4, 5, 6, 7, 12, 13, 14, 15);
  } else {
    static_assert(W == 16 && G == 4, "vectors of 2, 4, 8 or 16 lanes in 128-bit blocks");
    return RECOPS_SHUFFLE_(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           RECOPS_SHUFFLE_(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
#undef RECOPS_SHUFFLE_
}

// One round of a transposing reduction of n vectors into n / 2 (acc[k] = PairSums of acc[2k],
// acc[2k + 1]), then the next rounds: within 128-bit blocks while n > W / G, across them after.
template <typename V, int W, int G, int N>
RECOPS_INLINE void PairRounds(V* acc) {
  for (int k = 0; k < N / 2; ++k)
    acc[k] = PairSums<V, W, G, (N <= W / G)>(acc[2 * k], acc[2 * k + 1]);
  if constexpr (N > 2) PairRounds<V, W, G, N / 2>(acc);
}

// out[k] = Σ_d a[offset[k] + d] · x[d] for the W rows k of a at offset[k] (W: the vector's
// lanes), as one vector stored at out: dot products of a few long rows with one vector, in
// vectors over d, then the W accumulators reduced together (a transposing reduction: log2(W)
// rounds of PairSums, no horizontal sum per row). For a decode step's scores, a few query
// rows against many keys, where a GEMM with the keys as its rows would pad the query side to
// a whole vector. Each lane sums d = l, l + W, ... in order, then the lanes in a fixed tree.
template <typename Acc, Isa I>
RECOPS_INLINE void DotRows(const Acc* a, const int64_t* offset, const Acc* x, int64_t dim,
                           Acc* out) {
  using V = typename IsaVec<Acc, I>::type;
  constexpr int W = IsaVec<Acc, I>::kLanes, G = 16 / sizeof(Acc);
  V acc[W];
  for (int k = 0; k < W; ++k) acc[k] = V{};
  const int64_t whole = dim / W * W;
  for (int64_t d = 0; d < whole; d += W) {
    const V xv = LoadVec<V>(x + d);
    for (int k = 0; k < W; ++k) acc[k] += LoadVec<V>(a + offset[k] + d) * xv;
  }
  PairRounds<V, W, G, W>(acc);
  V sum = acc[0];
  for (int64_t d = whole; d < dim; ++d) {
    for (int k = 0; k < W; ++k) sum[k] += a[offset[k] + d] * x[d];
  }
  StoreVec(out, sum);
}

// C[M x N] += A[M x K] · B[K x N] for a few rows M (row-major, leading dimensions lda, ldb,
// ldc): a decode step's O += P·V, where GemmAcc's register block would pad M to kGemmRows
// rows. Blocks of 2 rows x 4 vectors keep 8 independent FMA chains; every element is summed
// in k order from C's value, as GemmAcc sums it.
template <typename Acc, Isa I, int RR, int CV>
RECOPS_INLINE void FewRowsBlock(int64_t K, const Acc* a, int64_t lda, const Acc* b, int64_t ldb,
                                Acc* c, int64_t ldc) {
  using V = typename IsaVec<Acc, I>::type;
  constexpr int W = IsaVec<Acc, I>::kLanes;
  V acc[RR][CV];
  for (int r = 0; r < RR; ++r) {
    for (int u = 0; u < CV; ++u) acc[r][u] = LoadVec<V>(c + r * ldc + u * W);
  }
  for (int64_t k = 0; k < K; ++k) {
    V bk[CV];
    for (int u = 0; u < CV; ++u) bk[u] = LoadVec<V>(b + k * ldb + u * W);
    for (int r = 0; r < RR; ++r) {
      const Acc x = a[r * lda + k];
      for (int u = 0; u < CV; ++u) acc[r][u] += x * bk[u];
    }
  }
  for (int r = 0; r < RR; ++r) {
    for (int u = 0; u < CV; ++u) StoreVec(c + r * ldc + u * W, acc[r][u]);
  }
}

template <typename Acc, Isa I>
RECOPS_INLINE void FewRowsGemmAcc(int64_t M, int64_t N, int64_t K, const Acc* a, int64_t lda,
                                  const Acc* b, int64_t ldb, Acc* c, int64_t ldc) {
  constexpr int W = IsaVec<Acc, I>::kLanes;
  int64_t n0 = 0;
  for (; n0 + 4 * W <= N; n0 += 4 * W) {
    int64_t i = 0;
    for (; i + 2 <= M; i += 2) {
      FewRowsBlock<Acc, I, 2, 4>(K, a + i * lda, lda, b + n0, ldb, c + i * ldc + n0, ldc);
    }
    if (i < M) FewRowsBlock<Acc, I, 1, 4>(K, a + i * lda, lda, b + n0, ldb, c + i * ldc + n0, ldc);
  }
  for (; n0 + W <= N; n0 += W) {
    for (int64_t i = 0; i < M; ++i) {
      FewRowsBlock<Acc, I, 1, 1>(K, a + i * lda, lda, b + n0, ldb, c + i * ldc + n0, ldc);
    }
  }
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t n = n0; n < N; ++n) {
      Acc sum = c[i * ldc + n];
      for (int64_t k = 0; k < K; ++k) sum += a[i * lda + k] * b[k * ldb + n];
      c[i * ldc + n] = sum;
    }
  }
}

// Eight float rows of `dim` values (a multiple of 8) at src, src + ld, ... written transposed:
// value d of row r to dst[d * ldd + r] (8 consecutive floats per d), through 8 x 8 register
// transposes (three rounds of constant shuffles) instead of one scattered store per value.
RECOPS_INLINE void TransposeRows8(const float* src, int64_t ld, int64_t dim, float* dst,
                                  int64_t ldd) {
  typedef float V8 __attribute__((vector_size(32)));
#if defined(__clang__)
#define RECOPS_SHUFFLE8_(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
  typedef int32_t M8 __attribute__((vector_size(32)));
#define RECOPS_SHUFFLE8_(a, b, ...) __builtin_shuffle(a, b, M8{__VA_ARGS__})
#endif
  for (int64_t d0 = 0; d0 < dim; d0 += 8) {
    V8 x[8], t[8], u[8];
    for (int r = 0; r < 8; ++r) x[r] = LoadVec<V8>(src + r * ld + d0);
    for (int r = 0; r < 8; r += 2) {  // interleave row pairs within 128-bit halves
      t[r] = RECOPS_SHUFFLE8_(x[r], x[r + 1], 0, 8, 1, 9, 4, 12, 5, 13);
      t[r + 1] = RECOPS_SHUFFLE8_(x[r], x[r + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int h = 0; h < 8; h += 4) {  // pairs of pairs: 4 rows' values d, d + 4 per vector
      for (int j = 0; j < 2; ++j) {
        u[h + 2 * j] = RECOPS_SHUFFLE8_(t[h + j], t[h + j + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[h + 2 * j + 1] = RECOPS_SHUFFLE8_(t[h + j], t[h + j + 2], 2, 3, 10, 11, 6, 7, 14, 15);
      }
    }
    for (int c = 0; c < 4; ++c) {  // the two row quads' halves: columns c and c + 4
      StoreVec(dst + (d0 + c) * ldd, RECOPS_SHUFFLE8_(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11));
      StoreVec(dst + (d0 + c + 4) * ldd,
               RECOPS_SHUFFLE8_(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15));
    }
  }
#undef RECOPS_SHUFFLE8_
}

// dst [cols, rows] = srcᵀ for a row-major src [rows, cols], converted to Acc. Floats with cols
// a multiple of 8: bands of 8 rows through 8 x 8 register transposes (TransposeRows8), each
// band's rows read in order. Otherwise, and for the rows past the last band, in 16 x 16 tiles
// element by element (the strided side then stays within a few cache lines per tile;
// transposing straight through a 256 x 256 block strides 1 KB per element). On a Zen 4, with
// the element-wise tiles alone, token_mixing's forward (B=1024, S=256) ran at 3.6 GB/s, 1.29x
// its composite, nearly all of it waiting on the transpose's loads; with the bands, 10.5 GB/s
// and 3.33x.
template <typename T, typename Acc>
RECOPS_INLINE void TransposeTiles(const T* __restrict src, int64_t rows, int64_t cols,
                                  Acc* __restrict dst) {
  constexpr int64_t kT = 16;
  int64_t first = 0;  // rows done in register bands
  if constexpr (std::is_same_v<T, float> && std::is_same_v<Acc, float>) {
    if (cols % 8 == 0) {
      for (; first + 8 <= rows; first += 8)
        TransposeRows8(src + first * cols, cols, cols, dst + first, rows);
    }
  }
  for (int64_t i0 = first; i0 < rows; i0 += kT) {
    for (int64_t j0 = 0; j0 < cols; j0 += kT) {
      const int64_t i1 = i0 + kT < rows ? i0 + kT : rows, j1 = j0 + kT < cols ? j0 + kT : cols;
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) dst[j * rows + i] = ToAcc<T, Acc>(src[i * cols + j]);
      }
    }
  }
}

// exp(x) = p * 2^n for a float vector x: n = round(x log2 e) (returned in *n, a whole float)
// and p = exp(x - n ln 2) on Cephes' polynomial. The caller clamps x and applies 2^n.
template <typename V>
RECOPS_INLINE V ExpMantissa(V x, V* n) {
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  *n = (x * 1.44269504088896341f + magic) - magic;
  V r = x - *n * 0.693359375f;
  r = r - *n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

// exp of a float vector without library calls: Cephes-style range reduction and polynomial,
// about 1 ulp on [-87, 88]; inputs are clamped to that range.
template <typename V>
RECOPS_INLINE V ExpVec(V x) {
  typedef int32_t Vi __attribute__((vector_size(sizeof(V))));
  x = x < -87.0f ? V{} - 87.0f : (x > 88.0f ? V{} + 88.0f : x);
  V n;
  const V p = ExpMantissa(x, &n);
  const Vi bits = (__builtin_convertvector(n, Vi) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// 1 / x of a float vector: AVX-512's 14-bit reciprocal estimate refined by one Newton step
// (relative error ~1e-7, a few float ulps; no divider, which would otherwise bound the
// sigmoid); an exact division elsewhere.
template <Isa I>
RECOPS_INLINE typename IsaVec<float, I>::type RecipVec(typename IsaVec<float, I>::type x) {
  using V = typename IsaVec<float, I>::type;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if constexpr (I == Isa::kAvx512) {
    typedef float V16 __attribute__((vector_size(64)));
    const V r = (V)__builtin_ia32_rcp14ps512_mask((V16)x, (V16)x, (uint16_t)0xffff);
    return r * (2.0f - x * r);
  }
#endif
  return 1.0f / x;
}

// RoundTo<T, float> on a float vector, lane by lane with the same bits: the identity for
// float, round to nearest even for bfloat16 (a NaN passes through as it is).
template <typename T, typename V>
RECOPS_INLINE V RoundVecTo(V x) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, Eigen::bfloat16>,
                "float and bfloat16 rows only");
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    typedef uint32_t Vu __attribute__((vector_size(sizeof(V))));
    return RoundToBfloat16<V, Vu>(x);
  }
}

// The first n (< the vector's lanes) values of v to p; nothing past them is written. One masked
// store for AVX-512 vectors (a memcpy of n floats was a library call, around which the scoring
// loop spilled and reloaded its ~20 vector registers on every row of a diagonal tile).
template <typename V>
RECOPS_INLINE void StoreVecHead(float* p, const V& v, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if constexpr (sizeof(V) == 64) {
    typedef float V16 __attribute__((vector_size(64)));
    __builtin_ia32_storeups512_mask(p, (V16)v, static_cast<uint16_t>((1u << n) - 1));
    return;
  }
#endif
  for (int64_t l = 0; l < n; ++l) p[l] = v[l];
}

// sigmoid(z) of a float vector: 1 / (1 + exp(-z)), the one form of every float sigmoid here.
template <Isa I>
RECOPS_INLINE typename IsaVec<float, I>::type SigmoidVec(typename IsaVec<float, I>::type z) {
  using V = typename IsaVec<float, I>::type;
  return RecipVec<I>(1.0f + ExpVec(V{} - z));
}

// sig[c] = sigmoid(z[c]) for c < n; float rows are processed in whole vectors, so z and sig
// must have room for n rounded up to a vector (the lanes past n are computed and ignored).
template <Isa I, typename Acc>
RECOPS_INLINE void SigmoidRow(const Acc* z, int64_t n, Acc* sig) {
  if constexpr (std::is_same_v<Acc, float>) {
    using V = typename IsaVec<float, I>::type;
    constexpr int64_t W = IsaVec<float, I>::kLanes;
    for (int64_t c = 0; c < n; c += W) StoreVec(sig + c, SigmoidVec<I>(LoadVec<V>(z + c)));
  } else {
    for (int64_t c = 0; c < n; ++c) sig[c] = Acc(1) / (Acc(1) + std::exp(-z[c]));
  }
}

}  // namespace recops

#endif  // RECOPS_KERNELS_COMMON_MICROKERNELS_H_
