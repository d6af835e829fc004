// The memory floor of one LazyAdam step, with no TensorFlow and no grouping of duplicates:
// what this machine needs just to read a [N, D] float32 gradient and to read-modify-write K
// distinct random rows of three [V, D] float32 arrays (var, m, v), split over one thread per
// core that are already running (no wake-up). The fused step (tools/bench.py
// fused_lazy_adam) does that work plus grouping N ids, validation and the op's own cost, so
// its time can only approach these figures; docs/benchmarks.md compares them.
//
//   g++ -O3 -march=native -pthread tools/lazy_adam_floor.cc -o /tmp/lazy_adam_floor
//   /tmp/lazy_adam_floor [V D K N REPS [huge]]   (default 1000000 64 4327 16384 2000)
//
// K = 4327 is the distinct rows of the benchmark's 16,384 Zipf ids; "huge" asks for
// transparent huge pages on the three arrays (madvise), as glibc.malloc.hugetlb=1 does.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

namespace {

constexpr int kMaxDim = 1024;

struct Shape {
  int64_t rows = 1000000, dim = 64, distinct = 4327, gradient_rows = 16384, reps = 2000;
  bool huge = false;
};

// What a timed step does: 1 reads the gradient, 2 updates the rows, 3 both.
enum Work { kGradient = 1, kRows = 2, kBoth = 3 };

class Step {
 public:
  Step(const Shape& s, int threads) : s_(s), threads_(threads) {
    const size_t bytes = static_cast<size_t>(s.rows * s.dim) * sizeof(float);
    for (int a = 0; a < 3; ++a) {
      float* p = static_cast<float*>(
          std::aligned_alloc(2 << 20, (bytes + (2 << 20) - 1) & ~size_t{(2 << 20) - 1}));
      if (p == nullptr) {
        std::fprintf(stderr, "out of memory\n");
        std::exit(1);
      }
      if (s.huge) madvise(p, bytes, MADV_HUGEPAGE);
      std::fill(p, p + s.rows * s.dim, a == 2 ? 0.5f : 0.1f);  // touched: no page faults later
      arrays_[a] = p;
    }
    gradient_.assign(static_cast<size_t>(s.gradient_rows * s.dim), 0.01f);
    std::mt19937_64 rng(1);
    std::vector<int64_t> all(static_cast<size_t>(s.rows));
    for (int64_t r = 0; r < s.rows; ++r) all[r] = r;
    std::shuffle(all.begin(), all.end(), rng);
    // In ascending order, each thread a contiguous half: the cheapest order (rows near each
    // other share page-table walks; random order takes 10-15% longer here), and the order the
    // fused kernel's range split approaches.
    ids_.assign(all.begin(), all.begin() + s.distinct);
    std::sort(ids_.begin(), ids_.end());
  }

  // Thread t's share of a step.
  void Run(int t, Work work) const {
    const int64_t d = s_.dim;
    float g[kMaxDim];
    for (int64_t c = 0; c < d; ++c) g[c] = 0.01f;
    if (work & kGradient) {  // its slice of the gradient, read in order and summed
      const int64_t b = s_.gradient_rows * t / threads_, e = s_.gradient_rows * (t + 1) / threads_;
      for (int64_t c = 0; c < d; ++c) g[c] = 0;
      for (int64_t i = b; i < e; ++i) {
        for (int64_t c = 0; c < d; ++c) g[c] += gradient_[i * d + c];
      }
      const float scale = 1.0f / static_cast<float>(std::max<int64_t>(1, e - b));
      for (int64_t c = 0; c < d; ++c) g[c] *= scale;
    }
    if (!(work & kRows)) {
      sink_.store(g[0], std::memory_order_relaxed);
      return;
    }
    const int64_t b = s_.distinct * t / threads_, e = s_.distinct * (t + 1) / threads_;
    constexpr int64_t kAhead = 16;  // rows in flight, as the fused kernel prefetches
    for (int64_t k = b; k < e; ++k) {
      if (k + kAhead < e) {
        for (float* a : arrays_) {
          const char* row = reinterpret_cast<const char*>(a + ids_[k + kAhead] * d);
          for (int64_t byte = 0; byte < d * 4; byte += 64) __builtin_prefetch(row + byte, 1, 3);
        }
      }
      float* var = arrays_[0] + ids_[k] * d;
      float* m = arrays_[1] + ids_[k] * d;
      float* v = arrays_[2] + ids_[k] * d;
      for (int64_t c = 0; c < d; ++c) {
        const float m_new = 0.9f * m[c] + 0.1f * g[c];
        const float v_new = std::fabs(0.999f * v[c] + 0.001f * g[c] * g[c]);
        m[c] = m_new;
        v[c] = v_new;
        var[c] -= 1e-3f * m_new / (std::sqrt(v_new) + 1e-7f);
      }
    }
  }

 private:
  Shape s_;
  int threads_;
  float* arrays_[3];
  std::vector<float> gradient_;
  std::vector<int64_t> ids_;
  mutable std::atomic<float> sink_{0};
};

// Times `reps` steps of `work` on `threads` spinning threads; returns {min, median} in us.
std::pair<double, double> Time(const Step& step, Work work, int threads, int64_t reps) {
  std::atomic<int64_t> started{0}, finished{0};
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) {
    helpers.emplace_back([&, t] {
      for (int64_t rep = 0; rep < reps; ++rep) {
        while (started.load(std::memory_order_acquire) <= rep) {
        }
        step.Run(t, work);
        finished.fetch_add(1, std::memory_order_release);
      }
    });
  }
  std::vector<double> us;
  for (int64_t rep = 0; rep < reps; ++rep) {
    const auto begin = std::chrono::steady_clock::now();
    started.store(rep + 1, std::memory_order_release);
    step.Run(0, work);
    while (finished.load(std::memory_order_acquire) < (rep + 1) * (threads - 1)) {
    }
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin)
                     .count());
  }
  for (auto& h : helpers) h.join();
  std::sort(us.begin(), us.end());
  return {us.front(), us[us.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  Shape s;
  int64_t* fields[] = {&s.rows, &s.dim, &s.distinct, &s.gradient_rows, &s.reps};
  for (int i = 1; i < argc && i <= 5; ++i) *fields[i - 1] = std::atoll(argv[i]);
  s.huge = argc > 6 && std::string_view(argv[6]) == "huge";
  if (s.rows < 1 || s.dim < 1 || s.dim > kMaxDim || s.distinct < 1 || s.distinct > s.rows ||
      s.gradient_rows < 1 || s.reps < 1) {
    std::fprintf(stderr, "usage: %s [V D K N REPS [huge]] with 1 <= K <= V, 1 <= D <= %d\n",
                 argv[0], kMaxDim);
    return 2;
  }
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  const Step step(s, threads);
  std::printf(
      "lazy_adam_floor: V=%lld D=%lld, %lld distinct rows, %lld gradient rows, "
      "%d threads, %s pages, %lld reps\n",
      static_cast<long long>(s.rows), static_cast<long long>(s.dim),
      static_cast<long long>(s.distinct), static_cast<long long>(s.gradient_rows), threads,
      s.huge ? "huge" : "4 KiB", static_cast<long long>(s.reps));
  const std::pair<const char*, Work> works[] = {
      {"gradient read", kGradient}, {"rows read-modify-write", kRows}, {"both", kBoth}};
  for (const auto& [name, work] : works) {
    Time(step, work, threads, std::max<int64_t>(1, s.reps / 10));  // warm-up
    const auto [low, median] = Time(step, work, threads, s.reps);
    std::printf("%-24s min %8.1f us  median %8.1f us\n", name, low, median);
  }
  return 0;
}
