// The memory floor of one paged decode step, with no TensorFlow and no arithmetic: what this
// machine needs just to read every cached key and value row of B sequences whose pages are
// scattered through a [num_pages, 2, page_size, H, D] float32 cache, split over one thread per
// core that are already running (no wake-up), each thread taking whole sequences in turn as
// the kernel's shards do. The paged forward (tools/bench.py hstu_dense, the `paged` case)
// reads the same bytes and also computes with them, so its time can only approach these
// figures; docs/benchmarks.md compares them.
//
//   g++ -O3 -march=native -pthread tools/paged_read_floor.cc -o /tmp/paged_read_floor
//   /tmp/paged_read_floor [B MAX_LEN H D PAGE REPS]   (default 256 2048 4 64 128 30)
//
// Cache lengths are uniform in [1, MAX_LEN] and pages are shuffled, as in the benchmark's
// case. Two readers are timed: a plain pass over each page's rows (summing vectors, so the
// loads cannot be dropped), and the same pass touching the next page's cache lines first, the
// look-ahead the kernel uses.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

namespace {

struct Shape {
  int64_t batch = 256, max_len = 2048, heads = 4, dim = 64, page = 128, reps = 30;
};

typedef float Vec __attribute__((vector_size(32)));  // 8 floats; the compiler picks the ISA

// Sums n floats (a multiple of 32) with four independent accumulators.
float SumRows(const float* x, int64_t n) {
  Vec a[4] = {};
  for (int64_t i = 0; i < n; i += 32) {
    for (int u = 0; u < 4; ++u) {
      Vec v;
      __builtin_memcpy(&v, x + i + 8 * u, sizeof(v));
      a[u] += v;
    }
  }
  const Vec s = (a[0] + a[1]) + (a[2] + a[3]);
  float out = 0;
  for (int l = 0; l < 8; ++l) out += s[l];
  return out;
}

// One byte per 64-byte line, as the kernel's look-ahead does.
unsigned Touch(const float* x, int64_t n) {
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(x);
  unsigned sum = 0;
  for (int64_t e = 0; e < n * 4; e += 64) sum += bytes[e];
  return sum;
}

class Floor {
 public:
  explicit Floor(const Shape& s) : s_(s) {
    std::mt19937_64 rng(1);
    std::uniform_int_distribution<int64_t> len(1, s.max_len);
    std::vector<int64_t> pages_per(s.batch);
    int64_t total = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      lengths_.push_back(len(rng));
      pages_per[b] = (lengths_[b] + s.page - 1) / s.page;
      total += pages_per[b];
      bytes_ += 2 * lengths_[b] * s.heads * s.dim * 4;
    }
    std::vector<int64_t> ids(total);
    for (int64_t i = 0; i < total; ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    page_floats_ = 2 * s.page * s.heads * s.dim;
    cache_.assign(static_cast<size_t>(total * page_floats_), 0.25f);  // touched: no faults later
    offsets_.push_back(0);
    for (int64_t b = 0; b < s.batch; ++b) offsets_.push_back(offsets_.back() + pages_per[b]);
    ids_ = ids;
  }

  int64_t bytes() const { return bytes_; }

  // Seconds of one step read by `threads` threads; look_ahead touches the next page first.
  double Step(int threads, bool look_ahead) {
    std::atomic<int64_t> next{0};
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<float> sinks(threads);
    std::vector<std::thread> pool;
    for (int th = 0; th < threads; ++th) {
      pool.emplace_back([&, th] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
        }
        float sink = 0;
        unsigned touched = 0;
        for (int64_t b; (b = next.fetch_add(1)) < s_.batch;) {
          const int64_t row = s_.heads * s_.dim;
          for (int64_t pg = offsets_[b]; pg < offsets_[b + 1]; ++pg) {
            const bool last = pg + 1 == offsets_[b + 1];
            const int64_t n = last ? lengths_[b] - (pg - offsets_[b]) * s_.page : s_.page;
            const float* k = cache_.data() + ids_[pg] * page_floats_;
            const float* v = k + s_.page * row;
            if (look_ahead && !last) {
              const float* nk = cache_.data() + ids_[pg + 1] * page_floats_;
              touched += Touch(nk, s_.page * row) + Touch(nk + s_.page * row, s_.page * row);
            }
            sink += SumRows(k, n * row) + SumRows(v, n * row);
          }
        }
        sinks[th] = sink + static_cast<float>(touched & 1);
      });
    }
    while (ready.load() < threads) {
    }
    const auto t0 = std::chrono::steady_clock::now();
    go.store(true, std::memory_order_release);
    for (auto& t : pool) t.join();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    float total = 0;
    for (float x : sinks) total += x;
    if (total < 0) std::printf("%f\n", total);  // never: keeps the sums live
    return sec;
  }

 private:
  Shape s_;
  std::vector<int64_t> lengths_, offsets_, ids_;
  std::vector<float> cache_;
  int64_t page_floats_ = 0, bytes_ = 0;
};

double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Shape s;
  int64_t* fields[] = {&s.batch, &s.max_len, &s.heads, &s.dim, &s.page, &s.reps};
  for (int a = 1; a < argc && a <= 6; ++a) *fields[a - 1] = std::atoll(argv[a]);
  if ((s.heads * s.dim) % 32 != 0 || s.batch < 1 || s.max_len < 1 || s.page < 1 || s.reps < 1) {
    std::fprintf(stderr,
                 "usage: %s [B MAX_LEN H D PAGE REPS], all positive, H * D a multiple of 32\n",
                 argv[0]);
    return 2;
  }
  Floor f(s);
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  std::printf("B=%lld cache<=%lld H=%lld D=%lld page=%lld float32: %.1f MB of cached rows\n",
              static_cast<long long>(s.batch), static_cast<long long>(s.max_len),
              static_cast<long long>(s.heads), static_cast<long long>(s.dim),
              static_cast<long long>(s.page), f.bytes() / 1e6);
  std::vector<int> counts = {1};
  if (cores > 1) counts.push_back(cores);
  for (int threads : counts) {
    for (bool look_ahead : {false, true}) {
      std::vector<double> t;
      f.Step(threads, look_ahead);  // warm-up
      for (int64_t r = 0; r < s.reps; ++r) t.push_back(f.Step(threads, look_ahead));
      const double med = Median(t);
      std::printf("%d thread%s, %-14s median %7.2f ms  (%.2f GB/s read)\n", threads,
                  threads == 1 ? " " : "s", look_ahead ? "look-ahead:" : "plain read:", med * 1e3,
                  f.bytes() / med / 1e9);
    }
  }
  return 0;
}
