// GemmBf16 (kernels/common/microkernels.h): tile GEMMs on the CPU's bfloat16 dot products
// (AVX512-BF16 vdpbf16ps: 32 products of bfloat16 pairs summed into 16 float lanes per
// instruction, twice the multiply-adds of a float FMA of the same width), and on the AMX path
// (RECOPS_ISA=amx) the whole 16 x 16 blocks of C on AMX-BF16 tiles (tdpbf16ps: a 16 x 16 float
// tile += 16 rows x 32 bfloat16 of A times 32 x 16 of B per instruction). Compiled for those
// targets here alone; callers reach it only where the CPU has AVX512-BF16 (Bf16DotPath), and
// the tiles only on the AMX path (AmxPath: the CPU has AMX-BF16 and the OS granted its state).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/common/dispatch.h"
#include "kernels/common/microkernels.h"

namespace recops {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,avx512bf16,amx-tile,amx-bf16")

namespace {

// Per-thread packed operands, grown on demand and reused (as the HSTU workspace is).
struct Bf16Packs {
  std::vector<uint32_t> a, at, b;  // at: a transposed A's pairs in rows, for the tiles
  static Bf16Packs& ForThread() {
    thread_local Bf16Packs packs;
    return packs;
  }
};

// Operands registered for reuse (Bf16RegisterOperand): a float buffer of rows x ld values
// whose bfloat16 forms are made on first use and kept until the buffer is registered anew or
// the registry cleared: as pairs of consecutive rows (a B whose k runs down the rows) and as
// bfloat16 rows (an A whose k runs along them).
struct Operand {
  const float* base = nullptr;
  int64_t rows = 0, ld = 0;
  bool b_ready = false, a_ready = false;
  std::vector<uint32_t> b;  // pair row kk: (row 2kk, row 2kk + 1) in ld lanes, + 16 of slack
  std::vector<uint32_t> a;  // the values as bfloat16, two to a word
};
constexpr int kOperands = 8;
struct Operands {
  Operand slot[kOperands];
  int next = 0;
  static Operands& ForThread() {
    thread_local Operands operands;
    return operands;
  }
};

// Pairs of two float vectors as 16 lanes of bfloat16 pairs: lane n holds (r0[n], r1[n]), r0's
// in the low half (the element a dot product pairs with the other operand's low half). Both
// rounded to nearest even, which is exact for values that are bfloat16 numbers.
inline __m512i PairLanes(__m512 r0, __m512 r1) {
  const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(r1, r0));  // r0's, r1's
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, both);
}

// The first n of 16 lanes (none for n <= 0): masked loads read nothing past a row's end.
inline __mmask16 Lanes(int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

// Rows k, k + 1 of a row-major [K x n] matrix (ld), as pair lanes: packed[j] = (x[k][j],
// x[k + 1][j]) for j < n, zero past n and for a row past K; np (a multiple of 16) lanes.
inline void PackRowPairs(const float* x, int64_t ld, int64_t K, int64_t k, int64_t n, int64_t np,
                         uint32_t* packed) {
  for (int64_t j = 0; j < np; j += 16) {
    const __mmask16 m = Lanes(n - j);
    const __m512 r0 = _mm512_maskz_loadu_ps(m, x + k * ld + j);
    const __m512 r1 =
        k + 1 < K ? _mm512_maskz_loadu_ps(m, x + (k + 1) * ld + j) : _mm512_setzero_ps();
    _mm512_storeu_si512(packed + j, PairLanes(r0, r1));
  }
}

// out row i = in column i for a 16 x 16 block of 32-bit values (rows ld_in and ld_out apart):
// 32-bit, then 64-bit interleaves within 128-bit lanes, then a 4 x 4 transpose of the lanes.
// Constant shuffles of vector extensions (the <immintrin.h> unpack and lane-shuffle wrappers
// start from undefined registers, which GCC 12 reports as uninitialised once inlined).
inline void Transpose16x16(const uint32_t* in, int64_t ld_in, uint32_t* out, int64_t ld_out) {
  typedef uint32_t U16 __attribute__((vector_size(64)));
  typedef int32_t I16 __attribute__((vector_size(64)));
  U16 r[16], t[16];
  for (int i = 0; i < 16; ++i) std::memcpy(&r[i], in + i * ld_in, sizeof(U16));
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane L: a[4L], b[4L], a[4L + 1], b[4L + 1]
    t[i] = __builtin_shuffle(r[i], r[i + 1],
                             I16{0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29});
    t[i + 1] = __builtin_shuffle(r[i], r[i + 1],
                                 I16{2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31});
  }
  // r[4g + c], lane L: rows 4g .. 4g + 3 of column 4L + c.
  const I16 lo64{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
  const I16 hi64{2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
  for (int g = 0; g < 16; g += 4) {
    r[g] = __builtin_shuffle(t[g], t[g + 2], lo64);
    r[g + 1] = __builtin_shuffle(t[g], t[g + 2], hi64);
    r[g + 2] = __builtin_shuffle(t[g + 1], t[g + 3], lo64);
    r[g + 3] = __builtin_shuffle(t[g + 1], t[g + 3], hi64);
  }
  const I16 lanes01{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const I16 lanes23{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const I16 lanes02{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const I16 lanes13{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  for (int c = 0; c < 4; ++c) {
    const U16 v0 = __builtin_shuffle(r[c], r[4 + c], lanes01);
    const U16 v1 = __builtin_shuffle(r[c], r[4 + c], lanes23);
    const U16 v2 = __builtin_shuffle(r[8 + c], r[12 + c], lanes01);
    const U16 v3 = __builtin_shuffle(r[8 + c], r[12 + c], lanes23);
    const U16 o[4] = {__builtin_shuffle(v0, v2, lanes02), __builtin_shuffle(v0, v2, lanes13),
                      __builtin_shuffle(v1, v3, lanes02), __builtin_shuffle(v1, v3, lanes13)};
    for (int L = 0; L < 4; ++L) std::memcpy(out + (4 * L + c) * ld_out, &o[L], sizeof(U16));
  }
}

// R rows x NV vectors of 16 columns of C (+)= A · B over kh pairs of k: ap points to the
// block's first row's pairs (pair kk of row r at ap[r * si + kk * sk]), bp to B's pair row 0
// at the block's first column (pair row kk at bp[kk * ldbp]). The last vector's columns are
// masked by `last`.
template <int R, int NV, bool kOverwrite>
inline void Block(int64_t kh, const uint32_t* ap, int64_t si, int64_t sk, const uint32_t* bp,
                  int64_t ldbp, float* c, int64_t ldc, __mmask16 last) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : static_cast<__mmask16>(0xffff);
      acc[r][v] = kOverwrite ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, c + r * ldc + 16 * v);
    }
  }
  for (int64_t kk = 0; kk < kh; ++kk) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v) {
      b[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(bp + kk * ldbp + 16 * v));
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh a =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(ap[r * si + kk * sk])));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : static_cast<__mmask16>(0xffff);
      _mm512_mask_storeu_ps(c + r * ldc + 16 * v, m, acc[r][v]);
    }
  }
}

template <int NV, bool kOverwrite>
inline void Columns(int64_t M, int64_t kh, const uint32_t* ap, int64_t si, int64_t sk,
                    const uint32_t* bp, int64_t ldbp, float* c, int64_t ldc, __mmask16 last) {
  int64_t i = 0;
  for (; i + 8 <= M; i += 8)
    Block<8, NV, kOverwrite>(kh, ap + i * si, si, sk, bp, ldbp, c + i * ldc, ldc, last);
  for (; i + 4 <= M; i += 4)
    Block<4, NV, kOverwrite>(kh, ap + i * si, si, sk, bp, ldbp, c + i * ldc, ldc, last);
  for (; i < M; ++i)
    Block<1, NV, kOverwrite>(kh, ap + i * si, si, sk, bp, ldbp, c + i * ldc, ldc, last);
}

// The registered operand holding p (nullptr if none) and p's row and column in it.
Operand* Find(const float* p, int64_t* row, int64_t* col) {
  for (Operand& o : Operands::ForThread().slot) {
    if (o.base != nullptr && p >= o.base && p < o.base + o.rows * o.ld) {
      *row = (p - o.base) / o.ld;
      *col = (p - o.base) % o.ld;
      return &o;
    }
  }
  return nullptr;
}

// B's pair rows from a registered operand: rows [row, row + K) from an even row, K even (an
// odd K's last pair must end in a zero, which the next row of the buffer is not), the N
// columns inside its rows.
const uint32_t* FindB(const float* B, int64_t ldb, int64_t K, int64_t N, int64_t* ldbp) {
  int64_t row, col;
  Operand* o = Find(B, &row, &col);
  if (o == nullptr || o->ld != ldb || row % 2 != 0 || K % 2 != 0 || row + K > o->rows ||
      col + N > o->ld)
    return nullptr;
  if (!o->b_ready) {
    const int64_t pairs = (o->rows + 1) / 2;
    if (static_cast<int64_t>(o->b.size()) < pairs * o->ld + 16) o->b.resize(pairs * o->ld + 16);
    const int64_t np = (o->ld + 15) / 16 * 16;
    // Row kk's lanes past ld spill into row kk + 1's, which its own pack then overwrites.
    for (int64_t kk = 0; kk < pairs; ++kk)
      PackRowPairs(o->base, o->ld, o->rows, 2 * kk, o->ld, np, o->b.data() + kk * o->ld);
    o->b_ready = true;
  }
  *ldbp = o->ld;
  return o->b.data() + row / 2 * o->ld + col;
}

// A's pairs (plain A) from a registered operand: whole even rows of K values from an even
// column, the M rows inside the buffer.
const uint32_t* FindA(const float* a, int64_t lda, int64_t M, int64_t K, int64_t* si) {
  int64_t row, col;
  Operand* o = Find(a, &row, &col);
  if (o == nullptr || o->ld != lda || lda % 2 != 0 || col % 2 != 0 || K % 2 != 0 ||
      col + K > o->ld || row + M > o->rows)
    return nullptr;
  if (!o->a_ready) {
    const int64_t n = o->rows * o->ld;
    if (static_cast<int64_t>(o->a.size()) < n / 2 + 16) o->a.resize(n / 2 + 16);
    for (int64_t e = 0; e < n; e += 32) {
      const __m512 lo = _mm512_maskz_loadu_ps(Lanes(n - e), o->base + e);
      const __m512 hi = _mm512_maskz_loadu_ps(Lanes(n - e - 16), o->base + e + 16);
      _mm512_storeu_si512(o->a.data() + e / 2,
                          reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
    o->a_ready = true;
  }
  *si = o->ld / 2;
  return o->a.data() + (row * o->ld + col) / 2;
}

// AMX tiles. GemmBf16 configures every tile as 16 rows of 64 bytes, one configuration for all
// its GEMMs: tiles 0-3 hold a 32 x 32 block of C (tile c: rows 16 (c / 2) on, columns 16 (c % 2)
// on; 16 x 16 floats each), tiles 4-5 16 rows of A's pairs (16 pairs of k each), tiles 6-7 16
// pair rows of B x 16 columns. That is the layout of the B pair rows packed above (Intel's
// "VNNI" layout) and of A's plain pack: the packs serve both paths.
struct TileConfig {  // LDTILECFG's 64-byte operand, palette 1
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile t
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

const TileConfig& GemmTiles() {
  alignas(64) static const TileConfig config = [] {
    TileConfig c;
    for (int t = 0; t < 8; ++t) {
      c.colsb[t] = 64;
      c.rows[t] = 16;
    }
    return c;
  }();
  return config;
}

// The CPU's tiles. GCC's tile intrinsics paste the tile number into the instruction (it must
// be a literal: hence the switches, resolved at compile time) and their asm statements declare
// no memory operands: compiler barriers order them against the packs written before and the
// rows of C read after.
struct AmxTiles {
  // Whether this thread's tiles hold GemmTiles(): reset by Bf16ClearOperands at each work
  // item's start, since between items other code on the thread (oneDNN) may configure them.
  static bool& Configured() {
    thread_local bool configured = false;
    return configured;
  }
  static void Configure(const TileConfig& config) {
    asm volatile("" ::: "memory");
    _tile_loadconfig(&config);
  }
  static void Release() { _tile_release(); }
  template <int t>
  static void Load(const void* p, int64_t stride) {
    asm volatile("" ::: "memory");
    switch (t) {
      case 0:
        _tile_loadd(0, p, stride);
        break;
      case 1:
        _tile_loadd(1, p, stride);
        break;
      case 2:
        _tile_loadd(2, p, stride);
        break;
      case 3:
        _tile_loadd(3, p, stride);
        break;
      case 4:
        _tile_loadd(4, p, stride);
        break;
      case 5:
        _tile_loadd(5, p, stride);
        break;
      case 6:
        _tile_loadd(6, p, stride);
        break;
      default:
        _tile_loadd(7, p, stride);
        break;
    }
  }
  template <int t>
  static void Zero() {
    switch (t) {
      case 0:
        _tile_zero(0);
        break;
      case 1:
        _tile_zero(1);
        break;
      case 2:
        _tile_zero(2);
        break;
      default:
        _tile_zero(3);
        break;
    }
  }
  template <int t>
  static void Store(void* p, int64_t stride) {
    switch (t) {
      case 0:
        _tile_stored(0, p, stride);
        break;
      case 1:
        _tile_stored(1, p, stride);
        break;
      case 2:
        _tile_stored(2, p, stride);
        break;
      default:
        _tile_stored(3, p, stride);
        break;
    }
    asm volatile("" ::: "memory");
  }
  // C tile c += A tile 4 + c / 2 times B tile 6 + c % 2.
  template <int c>
  static void Dot() {
    switch (c) {
      case 0:
        _tile_dpbf16ps(0, 4, 6);
        break;
      case 1:
        _tile_dpbf16ps(1, 4, 7);
        break;
      case 2:
        _tile_dpbf16ps(2, 5, 6);
        break;
      default:
        _tile_dpbf16ps(3, 5, 7);
        break;
    }
  }
};

// AMX tiles emulated from the instructions' definitions (Intel SDM: LDTILECFG, TILELOADD,
// TILESTORED, TILEZERO, TDPBF16PS) so that GemmBf16's tile code runs and is checked on any CPU
// with AVX512-BF16: a load or store moves exactly the rows x bytes per row the configuration
// gives the tile (reading or writing nothing else), and an instruction before the tiles are
// configured, or a product whose tile shapes do not match, aborts (the CPU would raise #UD).
// RECOPS_ISA=amx_emulated runs the kernels on it; tests/cc/gemm_bf16_test.cc checks it.
struct EmulatedTiles {
  struct State {
    TileConfig config;
    bool valid = false;
    uint8_t tile[8][16][64];
  };
  static State& S() {
    thread_local State s;
    return s;
  }
  static bool& Configured() {
    thread_local bool configured = false;
    return configured;
  }
  [[noreturn]] static void Fault(const char* what) {
    std::fprintf(stderr, "recops_tf: emulated AMX tiles: %s\n", what);
    std::abort();
  }
  static void Configure(const TileConfig& c) {
    State& s = S();
    s.config = c;
    s.valid = c.palette == 1;
    for (int t = 0; t < 8; ++t) s.valid = s.valid && c.rows[t] <= 16 && c.colsb[t] <= 64;
    if (!s.valid) Fault("a configuration LDTILECFG rejects");
    std::memset(s.tile, 0, sizeof(s.tile));
  }
  static void Release() { S().valid = false; }  // back to the initial state: unconfigured
  template <int t>
  static void Load(const void* p, int64_t stride) {
    State& s = S();
    if (!s.valid) Fault("a tile load before configuration");
    std::memset(s.tile[t], 0, sizeof(s.tile[t]));
    for (int r = 0; r < s.config.rows[t]; ++r)
      std::memcpy(s.tile[t][r], static_cast<const char*>(p) + r * stride, s.config.colsb[t]);
  }
  template <int t>
  static void Zero() {
    if (!S().valid) Fault("a tile zeroed before configuration");
    std::memset(S().tile[t], 0, sizeof(S().tile[t]));
  }
  template <int t>
  static void Store(void* p, int64_t stride) {
    State& s = S();
    if (!s.valid) Fault("a tile store before configuration");
    for (int r = 0; r < s.config.rows[t]; ++r)
      std::memcpy(static_cast<char*>(p) + r * stride, s.tile[t][r], s.config.colsb[t]);
  }
  // bfloat16 as float, a denormal as zero (the instruction's DAZ).
  static float Bf16(const uint8_t* p) {
    uint32_t bits = uint32_t{p[0]} << 16 | uint32_t{p[1]} << 24;
    if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
    float x;
    std::memcpy(&x, &bits, 4);
    return x;
  }
  // Tile c += tile 4 + c / 2 times tile 6 + c % 2, as the SDM's TDPBF16PS: per row m and pair
  // k, for each column n the odd then the even product added to the float accumulator.
  template <int c>
  static void Dot() {
    State& s = S();
    const int a = 4 + c / 2, b = 6 + c % 2;
    const TileConfig& g = s.config;
    if (!s.valid) Fault("a dot product before configuration");
    if (g.rows[c] != g.rows[a] || g.colsb[c] != g.colsb[b] || g.rows[b] * 4 != g.colsb[a])
      Fault("a dot product of tiles whose shapes do not match");
    for (int m = 0; m < g.rows[c]; ++m) {
      for (int k = 0; k < g.colsb[a] / 4; ++k) {
        for (int n = 0; n < g.colsb[c] / 4; ++n) {
          float acc;
          std::memcpy(&acc, s.tile[c][m] + 4 * n, 4);
          acc += Bf16(s.tile[a][m] + 4 * k + 2) * Bf16(s.tile[b][k] + 4 * n + 2);
          acc += Bf16(s.tile[a][m] + 4 * k) * Bf16(s.tile[b][k] + 4 * n);
          std::memcpy(s.tile[c][m] + 4 * n, &acc, 4);
        }
      }
    }
  }
};

// The vector path alone (no tiles).
struct NoTiles {};

// C[0, M16) x [0, N16) (+)= A · B over pairs [0, kh16) of k, all three multiples of 16, on
// Tiles: blocks of 32 x 32 (16 rows or columns at an edge). A's pairs in rows (row i's pair kk
// at ap[i * si + kk]), B's pair row kk at bp[kk * ldbp]. Every tile load and store stays inside
// those rows, pairs and columns.
template <class Tiles, bool kOverwrite>
void TileBlocks(int64_t M16, int64_t N16, int64_t kh16, const uint32_t* ap, int64_t si,
                const uint32_t* bp, int64_t ldbp, float* c, int64_t ldc) {
  if (!Tiles::Configured()) {
    Tiles::Configure(GemmTiles());
    Tiles::Configured() = true;
  }
  const int64_t sa = si * 4, sb = ldbp * 4, sc = ldc * 4;  // row strides in bytes
  for (int64_t i = 0; i < M16; i += 32) {
    const bool two_rows = i + 32 <= M16;
    for (int64_t n = 0; n < N16; n += 32) {
      const bool two_cols = n + 32 <= N16;
      float* const c0 = c + i * ldc + n;
      float* const c1 = c0 + 16;
      float* const c2 = c0 + 16 * ldc;
      float* const c3 = c2 + 16;
      if (kOverwrite) {
        Tiles::template Zero<0>();
        Tiles::template Zero<1>();
        Tiles::template Zero<2>();
        Tiles::template Zero<3>();
      } else {
        Tiles::template Load<0>(c0, sc);
        if (two_cols) Tiles::template Load<1>(c1, sc);
        if (two_rows) Tiles::template Load<2>(c2, sc);
        if (two_rows && two_cols) Tiles::template Load<3>(c3, sc);
      }
      for (int64_t kk = 0; kk < kh16; kk += 16) {
        Tiles::template Load<4>(ap + i * si + kk, sa);
        if (two_rows) Tiles::template Load<5>(ap + (i + 16) * si + kk, sa);
        Tiles::template Load<6>(bp + kk * ldbp + n, sb);
        if (two_cols) Tiles::template Load<7>(bp + kk * ldbp + n + 16, sb);
        Tiles::template Dot<0>();
        if (two_cols) Tiles::template Dot<1>();
        if (two_rows) Tiles::template Dot<2>();
        if (two_rows && two_cols) Tiles::template Dot<3>();
      }
      Tiles::template Store<0>(c0, sc);
      if (two_cols) Tiles::template Store<1>(c1, sc);
      if (two_rows) Tiles::template Store<2>(c2, sc);
      if (two_rows && two_cols) Tiles::template Store<3>(c3, sc);
    }
  }
}

// C rows [0, M) x columns [n_begin, N) (+)= A · B over kh pairs in float vectors (n_begin a
// multiple of 16; ap, si, sk as Block's, bp at column 0).
template <bool kOverwrite>
void VectorColumns(int64_t M, int64_t n_begin, int64_t N, int64_t kh, const uint32_t* ap,
                   int64_t si, int64_t sk, const uint32_t* bp, int64_t ldbp, float* C,
                   int64_t ldc) {
  const int64_t np = (N + 15) / 16 * 16;
  const __mmask16 whole = static_cast<__mmask16>(0xffff);
  int64_t n0 = n_begin;
  for (; n0 + 32 <= np; n0 += 32) {
    Columns<2, kOverwrite>(M, kh, ap, si, sk, bp + n0, ldbp, C + n0, ldc,
                           n0 + 32 <= N ? whole : Lanes(N - n0 - 16));
  }
  if (n0 < np) Columns<1, kOverwrite>(M, kh, ap, si, sk, bp + n0, ldbp, C + n0, ldc, Lanes(N - n0));
}

// C (+)= A · B from packed operands (A's pair kk of row i at ap[i * si + kk * sk], B's pair row
// kk at bp[kk * ldbp]) over kh pairs of k: the whole 16 x 16 blocks on Tiles where there are
// any (sk 1), their last pairs of k (fewer than 16) in vectors, then the columns right of them
// and the rows below them in vectors.
template <class Tiles, bool kOverwrite>
void MultiplyPacked(int64_t M, int64_t N, int64_t kh, const uint32_t* ap, int64_t si, int64_t sk,
                    const uint32_t* bp, int64_t ldbp, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const int64_t M16 = M / 16 * 16, N16 = N / 16 * 16, kh16 = kh / 16 * 16;
  if constexpr (!std::is_same_v<Tiles, NoTiles>) {
    if (sk == 1 && M16 > 0 && N16 > 0 && kh16 > 0) {
      TileBlocks<Tiles, kOverwrite>(M16, N16, kh16, ap, si, bp, ldbp, C, ldc);
      if (kh16 < kh) {
        VectorColumns<false>(M16, 0, N16, kh - kh16, ap + kh16, si, sk, bp + kh16 * ldbp, ldbp, C,
                             ldc);
      }
      if (N16 < N) VectorColumns<kOverwrite>(M16, N16, N, kh, ap, si, sk, bp, ldbp, C, ldc);
      if (M16 < M) {
        VectorColumns<kOverwrite>(M - M16, 0, N, kh, ap + M16 * si, si, sk, bp, ldbp, C + M16 * ldc,
                                  ldc);
      }
      return;
    }
  }
  VectorColumns<kOverwrite>(M, 0, N, kh, ap, si, sk, bp, ldbp, C, ldc);
}

// GemmBf16 with its whole 16 x 16 blocks on Tiles (AmxTiles or EmulatedTiles; or NoTiles:
// vectors only).
template <class Tiles, bool kOverwrite, bool kTransA>
void GemmBf16With(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* B,
                  int64_t ldb, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const int64_t kh = (K + 1) / 2;         // pairs of k (an odd K's last pair ends in 0)
  const int64_t np = (N + 15) / 16 * 16;  // B's packed columns
  constexpr bool kHasTiles = !std::is_same_v<Tiles, NoTiles>;
  const int64_t M16 = M / 16 * 16, N16 = N / 16 * 16, kh16 = kh / 16 * 16;
  const bool tiles = kHasTiles && M16 > 0 && N16 > 0 && kh16 > 0;
  Bf16Packs& packs = Bf16Packs::ForThread();
  // A's pairs: plain, row i's pairs contiguous (as bfloat16 in k order: one conversion of
  // 32 values gives 16 pairs); transposed, pair row kk of the [K x M] storage, and for the
  // tiles (which read pairs in rows) that transposed once more.
  int64_t si = 0, sk = 1, ldbp = np;
  const uint32_t* ap = kTransA ? nullptr : FindA(a, lda, M, K, &si);
  const uint32_t* bp = FindB(B, ldb, K, N, &ldbp);
  // A registered A (found above) was packed once for the work item; otherwise pack it here.
  if (ap == nullptr && kTransA) {
    const int64_t mp = (M + 15) / 16 * 16;
    if (static_cast<int64_t>(packs.a.size()) < kh * mp) packs.a.resize(kh * mp);
    for (int64_t kk = 0; kk < kh; ++kk)
      PackRowPairs(a, lda, K, 2 * kk, M, mp, packs.a.data() + kk * mp);
    si = 1;
    sk = mp;
    if (tiles) {
      // Whole 16 x 16 blocks in registers, the edges element by element: a 64 x 32 repack
      // took 445-473 ns against 663-785 ns element by element (a Zen 4, one core). Either is
      // about the time of the 32 tile products of a 64 x 64 x 64 GEMM (~512 cycles): forming
      // dVᵀ = dOᵀ·P instead would need no repack, at the cost of a transposed accumulator.
      if (static_cast<int64_t>(packs.at.size()) < M * kh) packs.at.resize(M * kh);
      for (int64_t i = 0; i < M; i += 16) {
        for (int64_t kk = 0; kk < kh; kk += 16) {
          const uint32_t* in = packs.a.data() + kk * mp + i;
          uint32_t* out = packs.at.data() + i * kh + kk;
          if (i + 16 <= M && kk + 16 <= kh) {
            Transpose16x16(in, mp, out, kh);
            continue;
          }
          for (int64_t r = 0; r < std::min<int64_t>(16, M - i); ++r) {
            for (int64_t q = 0; q < std::min<int64_t>(16, kh - kk); ++q)
              out[r * kh + q] = in[q * mp + r];
          }
        }
      }
      ap = packs.at.data();
      si = kh;
      sk = 1;
    }
  } else if (ap == nullptr) {
    const int64_t kp = (kh + 15) / 16 * 16;
    if (static_cast<int64_t>(packs.a.size()) < M * kp) packs.a.resize(M * kp);
    for (int64_t i = 0; i < M; ++i) {
      uint32_t* row = packs.a.data() + i * kp;
      for (int64_t k = 0; k < 2 * kp; k += 32) {
        const __m512 lo = _mm512_maskz_loadu_ps(Lanes(K - k), a + i * lda + k);
        const __m512 hi = _mm512_maskz_loadu_ps(Lanes(K - k - 16), a + i * lda + k + 16);
        _mm512_storeu_si512(row + k / 2, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
      }
    }
    si = kp;
    sk = 1;
  }
  if (ap == nullptr) ap = packs.a.data();
  if (bp == nullptr) {
    if (static_cast<int64_t>(packs.b.size()) < kh * np) packs.b.resize(kh * np);
    for (int64_t kk = 0; kk < kh; ++kk)
      PackRowPairs(B, ldb, K, 2 * kk, N, np, packs.b.data() + kk * np);
    bp = packs.b.data();
  }
  MultiplyPacked<Tiles, kOverwrite>(M, N, kh, ap, si, sk, bp, ldbp, C, ldc);
}

}  // namespace

void Bf16RegisterOperand(const float* base, int64_t rows, int64_t ld) {
  Operands& all = Operands::ForThread();
  // A registration overlapping this buffer is stale; the first such slot is reused (a buffer
  // registered anew block after block keeps one slot, and the other operands theirs).
  int reuse = -1;
  for (int s = 0; s < kOperands; ++s) {
    Operand& o = all.slot[s];
    if (o.base != nullptr && o.base < base + rows * ld && base < o.base + o.rows * o.ld) {
      o.base = nullptr;
      if (reuse < 0) reuse = s;
    }
  }
  if (reuse < 0) {
    reuse = all.next;
    all.next = (all.next + 1) % kOperands;
  }
  Operand& o = all.slot[reuse];
  o.base = base;
  o.rows = rows;
  o.ld = ld;
  o.a_ready = o.b_ready = false;
}

void Bf16ClearOperands() {
  for (Operand& o : Operands::ForThread().slot) o.base = nullptr;
  AmxTiles::Configured() = false;
  EmulatedTiles::Configured() = false;
}

void Bf16ReleaseTiles() {
  if (AmxTiles::Configured()) AmxTiles::Release();  // only after this thread's tile GEMMs ran
  if (EmulatedTiles::Configured()) EmulatedTiles::Release();
  AmxTiles::Configured() = false;
  EmulatedTiles::Configured() = false;
}

template <bool kOverwrite>
void GemmBf16Packed(int64_t M, int64_t N, int64_t kh, const uint32_t* ap, int64_t si,
                    const uint32_t* bp, int64_t ldbp, float* C, int64_t ldc) {
  if (AmxPath() && !AmxEmulated()) {
    MultiplyPacked<AmxTiles, kOverwrite>(M, N, kh, ap, si, 1, bp, ldbp, C, ldc);
  } else if (AmxPath()) {
    MultiplyPacked<EmulatedTiles, kOverwrite>(M, N, kh, ap, si, 1, bp, ldbp, C, ldc);
  } else {
    MultiplyPacked<NoTiles, kOverwrite>(M, N, kh, ap, si, 1, bp, ldbp, C, ldc);
  }
}
template void GemmBf16Packed<false>(int64_t, int64_t, int64_t, const uint32_t*, int64_t,
                                    const uint32_t*, int64_t, float*, int64_t);
template void GemmBf16Packed<true>(int64_t, int64_t, int64_t, const uint32_t*, int64_t,
                                   const uint32_t*, int64_t, float*, int64_t);

template <bool kOverwrite, bool kTransA>
void GemmBf16(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* B,
              int64_t ldb, float* C, int64_t ldc) {
  if (AmxPath() && !AmxEmulated()) {
    GemmBf16With<AmxTiles, kOverwrite, kTransA>(M, N, K, a, lda, B, ldb, C, ldc);
  } else if (AmxPath()) {
    GemmBf16With<EmulatedTiles, kOverwrite, kTransA>(M, N, K, a, lda, B, ldb, C, ldc);
  } else {
    GemmBf16With<NoTiles, kOverwrite, kTransA>(M, N, K, a, lda, B, ldb, C, ldc);
  }
}

#define RECOPS_GEMM_BF16_DEFINE_(OVERWRITE, TRANS_A)                                           \
  template void GemmBf16<OVERWRITE, TRANS_A>(int64_t, int64_t, int64_t, const float*, int64_t, \
                                             const float*, int64_t, float*, int64_t);
RECOPS_GEMM_BF16_DEFINE_(false, false)
RECOPS_GEMM_BF16_DEFINE_(false, true)
RECOPS_GEMM_BF16_DEFINE_(true, false)
RECOPS_GEMM_BF16_DEFINE_(true, true)
#undef RECOPS_GEMM_BF16_DEFINE_

#pragma GCC pop_options
#else
// Without GCC on x86-64 there is no bfloat16 path (Bf16DotPath is false): the plain GEMM.
void Bf16RegisterOperand(const float*, int64_t, int64_t) {}
void Bf16ClearOperands() {}
void Bf16ReleaseTiles() {}
template <bool kOverwrite, bool kTransA>
void GemmBf16(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* B,
              int64_t ldb, float* C, int64_t ldc) {
  GemmAcc<float, Isa::kBase, kOverwrite, kTransA>(M, N, K, a, lda, B, ldb, C, ldc);
}
template void GemmBf16<false, false>(int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                                     int64_t, float*, int64_t);
template void GemmBf16<false, true>(int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                                    int64_t, float*, int64_t);
template void GemmBf16<true, false>(int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                                    int64_t, float*, int64_t);
template void GemmBf16<true, true>(int64_t, int64_t, int64_t, const float*, int64_t, const float*,
                                   int64_t, float*, int64_t);
template <bool kOverwrite>
void GemmBf16Packed(int64_t, int64_t, int64_t, const uint32_t*, int64_t, const uint32_t*, int64_t,
                    float*, int64_t) {
  std::abort();  // unreachable: callers check Bf16DotPath(), false without GCC on x86-64
}
template void GemmBf16Packed<false>(int64_t, int64_t, int64_t, const uint32_t*, int64_t,
                                    const uint32_t*, int64_t, float*, int64_t);
template void GemmBf16Packed<true>(int64_t, int64_t, int64_t, const uint32_t*, int64_t,
                                   const uint32_t*, int64_t, float*, int64_t);
#endif

}  // namespace recops
