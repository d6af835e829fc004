// The compute floor of the HSTU forward on short sequences, with no TensorFlow: the kernel's own
// work items and tile code (kernels/hstu_dense.h, the GEMMs of kernels/common/gemm.cc) run on B
// sequences of lengths uniform in [1, MAX_LEN], causal, float32, by one thread per core that are
// already running (no wake-up). Each takes a sequence in turn, longest first, and runs its heads'
// items, as the op runs many short sequences (HstuGroupBySequence). Four stages, alternating rep
// by rep so that a noisy host slows them alike:
//
//   peak        the tile GEMM alone on one L1-resident 64 x 64 x 64 tile, over and over: the
//               most these GEMMs give on this machine;
//   items       HstuForwardItem as the op runs it: the sequence's rows prefetched, packing K
//               (transposed), V and Q from [rows, heads, dim] tensors, the tiles (S = Q·Kᵀ,
//               scoring, P·V), the output stores;
//   tiles       the same tiles with operands packed once per thread (in L2) and no stores:
//               the items without their data movement;
//   GEMMs only  the same tile GEMMs with the same row-block bounds, and no scoring.
//
// `tiles` is what the forward costs if packing, stores and the op's call were free; the GEMMs
// bound it from below. docs/benchmarks.md sets them against the goal of 60% of TensorFlow's
// float32 matmul ceiling at B=32, L<=256 (give that ceiling, in GFLOP/s, as CEILING: `recops-tf
// bench` or tools/bench_bf16.py print it; 0 uses the `peak` stage). FLOPs are counted as
// tools/bench.py counts them: 2 · H · 2D · Σ L² / 2.
//
//   TF="$(python -c 'import tensorflow as tf; s = tf.sysconfig;
//       print(*s.get_compile_flags(), *s.get_link_flags(), "-Wl,-rpath," + s.get_lib())')"
//   SRC="tools/hstu_forward_floor.cc kernels/common/gemm.cc"
//   g++ -O3 -pthread -Wno-psabi -Wno-deprecated-declarations -I. $SRC $TF -o /tmp/hstu_floor
//   /tmp/hstu_floor [B MAX_LEN H D REPS CEILING]   (default 32 256 4 64 200 0)
//
// Compiled as the library is (no -march): the stages run on the best instruction set this CPU
// has (AVX-512, AVX2 + FMA, baseline), each under its target attribute.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "kernels/hstu_dense.h"

namespace recops {

// The tile scoring the items call (kernels/hstu_dense_<isa>.cc defines it in the library).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RECOPS_FLOOR_AVX512 __attribute__((target("arch=x86-64-v4")))
#define RECOPS_FLOOR_AVX2 __attribute__((target("arch=x86-64-v3")))
RECOPS_HSTU_DEFINE_TILE_SCORES_(float, Isa::kAvx512, RECOPS_FLOOR_AVX512)
RECOPS_HSTU_DEFINE_TILE_SCORES_(float, Isa::kAvx2, RECOPS_FLOOR_AVX2)
#endif
RECOPS_HSTU_DEFINE_TILE_SCORES_(float, Isa::kBase, )

namespace {

using W = HstuWorkspace<float>;

struct Shape {
  int64_t batch = 32, max_len = 256, heads = 4, dim = 64, reps = 200, ceiling = 0;
};

enum Stage { kPack, kPeak, kItems, kTiles, kGemms };

// The problem (random float32 inputs; sequences longest first) and a pass's shared state.
struct Floor {
  explicit Floor(const Shape& shape) : s(shape) {
    std::mt19937_64 rng(0);
    std::uniform_int_distribution<int64_t> len(1, s.max_len);
    offsets.push_back(0);
    for (int64_t b = 0; b < s.batch; ++b) {
      const int64_t l = len(rng);
      offsets.push_back(offsets.back() + l);
      flops += 2.0 * s.heads * 2 * s.dim * static_cast<double>(l) * l / 2;
    }
    std::uniform_real_distribution<float> u(-1, 1);
    const int64_t n = offsets.back() * s.heads * s.dim;
    for (auto* x : {&q, &k, &v}) {
      x->resize(n);
      for (float& e : *x) e = u(rng);
    }
    out.assign(n, 0.0f);  // touched: no page faults while timed
    p.batch = s.batch;
    p.heads_q = p.heads_k = s.heads;
    p.dim_qk = p.dim_v = s.dim;
    p.max_q = p.max_k = s.max_len;
    p.off_q = p.off_k = offsets.data();
    p.alpha = 1.0 / 8;
    p.scale = 1.0 / s.max_len;
    t.q = q.data();
    t.k = k.data();
    t.v = v.data();
    t.out = out.data();
    for (int64_t b = 0; b < s.batch; ++b) order.push_back(b);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return offsets[a + 1] - offsets[a] > offsets[b + 1] - offsets[b];
    });
  }

  // FLOPs of one peak tile GEMM, and how many a pass runs (about the items' useful FLOPs).
  double PeakTileFlops() const { return 2.0 * kTile * kTile * s.dim; }
  int64_t PeakTiles() const { return static_cast<int64_t>(flops / PeakTileFlops()) + 1; }

  Shape s;
  HstuProblem p;
  HstuTensors<float> t;
  std::vector<int64_t> offsets;
  std::vector<float> q, k, v, out;
  std::vector<int64_t> order;  // sequences, longest first
  double flops = 0;
  std::atomic<int64_t> next{0};
  std::atomic<float> sink{0};
};

// A worker's operands for kTiles / kGemms / kPeak: Kᵀ, V and Q tiles of the first rows' head
// 0, packed as HstuForwardItem packs them, into workspace slots the forward items do not use.
template <Isa I>
RECOPS_INLINE void PackOnce(Floor& f) {
  W& w = W::ForThread();
  const int64_t tiles = (f.s.max_len + kTile - 1) / kTile, n = tiles * kTile * f.s.dim;
  const int64_t rows = std::min(f.s.max_len, f.offsets.back());
  PackTiles<float, float>(f.k.data(), f.s.heads, 0, f.s.dim, 0, rows, true, w.Get(W::kK, n));
  PackTiles<float, float>(f.v.data(), f.s.heads, 0, f.s.dim, 0, rows, false, w.Get(W::kVt, n));
  PackTiles<float, float>(f.q.data(), f.s.heads, 0, f.s.dim, 0, rows, false, w.Get(W::kDout, n));
}

// One item's tiles as HstuForwardItem runs them, on the worker's packed operands: scoring and
// P·V (TileScoresBody, ScoresTimes), or with `gemms_only` the GEMMs alone, with the same
// row-block bounds.
template <Isa I>
RECOPS_INLINE float Tiles(const Floor& f, const HstuItem& item, bool gemms_only) {
  W& w = W::ForThread();
  const HstuSeq s = SeqOf(f.p, item.b);
  const int64_t d = f.s.dim;
  const float* kt = w.buffers[W::kK].data();
  const float* v = w.buffers[W::kVt].data();
  const float* q = w.buffers[W::kDout].data();
  float* o = w.Get(W::kAcc2, kTile * d);
  for (int64_t i0 = 0; i0 < s.lq; i0 += kTile) {
    const int64_t mq = std::min(kTile, s.lq - i0);
    std::fill(o, o + kTile * d, 0.0f);
    for (int64_t j0 = 0; j0 <= i0; j0 += kTile) {
      const int64_t nk = std::min(kTile, s.lk - j0), tile = j0 / kTile;
      const float* qi = q + i0 * d;
      if (gemms_only) {
        constexpr int R = kGemmRows<I>;
        w.partial = !HstuTileFullyVisible(f.p, s, i0, i0 + mq, j0, j0 + nk);
        for (int64_t r = 0; r < mq && w.partial; r += R)
          w.bound[r / R] = HstuColumnBound(f.p, s, i0 + r, i0 + std::min(r + R, mq), j0, nk);
        TileTimesT<float, float, I>(qi, mq, d, kt + tile * kTile * d, w.s,
                                    w.partial ? w.bound : nullptr);
      } else {
        TileScoresBody<float, float, I>(f.p, f.t, s, item.b, item.h, i0, mq, j0, nk, qi,
                                        kt + tile * kTile * d, nullptr, nullptr, w);
      }
      ScoresTimes<float, float, I>(w, w.s, mq, nk, v + tile * kTile * d, d, o);
    }
  }
  return o[0];
}

// One worker's share of a pass: items (or peak tiles) claimed in turn.
template <Isa I>
RECOPS_INLINE void WorkBody(Floor& f, Stage stage) {
  float sink = 0;
  if (stage == kPack) {
    PackOnce<I>(f);
  } else if (stage == kPeak) {
    W& w = W::ForThread();
    for (int64_t i; (i = f.next.fetch_add(1)) < f.PeakTiles();) {
      GemmAcc<float, I, true>(kTile, kTile, f.s.dim, w.buffers[W::kDout].data(), f.s.dim,
                              w.buffers[W::kK].data(), kTile, w.s, kTile);
      sink += w.s[i % kTile];
    }
  } else {
    // A sequence's heads in turn, its rows prefetched first, as the op runs many short
    // sequences (HstuGroupBySequence).
    for (int64_t i; (i = f.next.fetch_add(1)) < f.s.batch;) {
      const int64_t b = f.order[i], l = f.offsets[b + 1] - f.offsets[b];
      if (l == 0) continue;
      if (stage == kItems) HstuPrefetchSequence(f.p, f.t, b, /*out=*/true);
      for (int64_t h = 0; h < f.s.heads; ++h) {
        const HstuItem item{b, h, 0, l, l * l};
        if (stage == kItems) {
          HstuForwardItem<float, float, I>(f.p, f.t, item);
        } else {
          sink += Tiles<I>(f, item, stage == kGemms);
        }
      }
    }
  }
  f.sink.store(f.sink.load() + sink);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
RECOPS_FLOOR_AVX512 void WorkAvx512(Floor& f, Stage stage) { WorkBody<Isa::kAvx512>(f, stage); }
RECOPS_FLOOR_AVX2 void WorkAvx2(Floor& f, Stage stage) { WorkBody<Isa::kAvx2>(f, stage); }
#endif
void WorkBase(Floor& f, Stage stage) { WorkBody<Isa::kBase>(f, stage); }

// `threads` workers: the caller and threads - 1 helpers that spin between passes, so that a pass
// starts with every worker running (the op's pool threads must be woken; that cost is not the
// kernel's), and thread-local workspaces persist across passes as in the op.
class Workers {
 public:
  Workers(Floor& f, int threads, void (*work)(Floor&, Stage)) : f_(f), work_(work) {
    for (int th = 1; th < threads; ++th) {
      helpers_.emplace_back([this] {
        for (int64_t seen = 0;;) {
          int64_t g;
          while ((g = generation_.load(std::memory_order_acquire)) == seen) {
          }
          if (g < 0) return;
          seen = g;
          work_(f_, stage_);
          done_.fetch_add(1, std::memory_order_acq_rel);
        }
      });
    }
    Run(kPack);
  }
  ~Workers() {
    generation_.store(-1, std::memory_order_release);
    for (auto& t : helpers_) t.join();
  }

  // Seconds of one pass of `stage`.
  double Run(Stage stage) {
    stage_ = stage;
    f_.next.store(0);
    done_.store(0);
    const auto t0 = std::chrono::steady_clock::now();
    generation_.fetch_add(1, std::memory_order_acq_rel);
    work_(f_, stage);
    while (done_.load(std::memory_order_acquire) < static_cast<int>(helpers_.size())) {
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  Floor& f_;
  void (*work_)(Floor&, Stage);
  std::vector<std::thread> helpers_;
  std::atomic<int64_t> generation_{0};
  std::atomic<int> done_{0};
  Stage stage_ = kPack;
};

double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace
}  // namespace recops

int main(int argc, char** argv) {
  using namespace recops;  // NOLINT: a tool's main
  Shape s;
  int64_t* fields[] = {&s.batch, &s.max_len, &s.heads, &s.dim, &s.reps, &s.ceiling};
  for (int a = 1; a < argc && a <= 6; ++a) *fields[a - 1] = std::atoll(argv[a]);
  if (s.batch < 1 || s.max_len < 1 || s.heads < 1 || s.dim < 1 || s.reps < 1 || s.ceiling < 0) {
    std::fprintf(stderr,
                 "usage: %s [B MAX_LEN H D REPS CEILING], all positive but CEILING (GFLOP/s, 0: "
                 "the peak stage)\n",
                 argv[0]);
    return 2;
  }
  void (*work)(Floor&, Stage) = WorkBase;
  const char* isa = "baseline x86-64";
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    work = WorkAvx512;
    isa = "AVX-512";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    work = WorkAvx2;
    isa = "AVX2 + FMA";
  }
#endif
  Floor f(s);
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  const struct {
    Stage stage;
    const char* name;
  } stages[] = {{kPeak, "peak (64^3 tile GEMM, L1)"},
                {kItems, "items (pack, tiles, store)"},
                {kTiles, "tiles (GEMMs + scoring)"},
                {kGemms, "tile GEMMs only"}};
  std::vector<std::vector<double>> t(4);
  {
    Workers workers(f, threads, work);
    for (const auto& st : stages) workers.Run(st.stage);  // warm-up: buffers, caches
    for (int64_t r = 0; r < s.reps; ++r) {
      for (int i = 0; i < 4; ++i) t[i].push_back(workers.Run(stages[i].stage));
    }
  }
  const double peak = f.PeakTiles() * f.PeakTileFlops() / Median(t[0]) / 1e9;
  const double ceiling = s.ceiling > 0 ? static_cast<double>(s.ceiling) : peak;
  std::printf(
      "B=%lld L<=%lld H=%lld D=%lld float32, %s, %d threads: %lld rows, %.1f MFLOP "
      "(causal)\n",
      static_cast<long long>(s.batch), static_cast<long long>(s.max_len),
      static_cast<long long>(s.heads), static_cast<long long>(s.dim), isa, threads,
      static_cast<long long>(f.offsets.back()), f.flops / 1e6);
  std::printf("ceiling: %.1f GFLOP/s (%s)\n", ceiling, s.ceiling > 0 ? "given" : "the peak stage");
  for (int i = 0; i < 4; ++i) {
    const double med = Median(t[i]);
    const double rate = i == 0 ? peak : f.flops / med / 1e9;
    std::printf("%-28s median %7.3f ms  %7.1f GFLOP/s  %5.1f%% of the ceiling\n", stages[i].name,
                med * 1e3, rate, 100 * rate / ceiling);
  }
  std::printf("60%% of the ceiling: %.3f ms per forward\n", f.flops / (0.6 * ceiling * 1e9) * 1e3);
  return f.sink.load() == 12345.0f ? 1 : 0;  // keeps the sums live
}
