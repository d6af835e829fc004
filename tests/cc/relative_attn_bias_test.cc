// Unit test of kernels/relative_attn_bias.h: BucketTable (the branch-free buckets of the
// relative bias fused into HSTU attention) must equal the exact Bucketizer for every gap:
// all gaps below 2^18, every bucket edge and its neighbours, and random gaps of every bit
// length, for divisors that need 0 to 8 sub-bin bits. Built and run by tests/test_cc_units.py.
#include <cstdio>
#include <random>

#include "kernels/relative_attn_bias.h"

using recops::Bucketizer;
using recops::BucketTable;

int main() {
  std::mt19937_64 rng(7);
  int bad = 0, usable = 0;
  const double divisors[] = {44.0, 3.0, 1.0, 0.7, 0.301, 0.1, 0.05, 0.01, 0.0041, 0.001};
  const int64_t bucket_counts[] = {1, 2, 5, 129, 1000, 100000};
  for (double divisor : divisors) {
    for (int64_t num_buckets : bucket_counts) {
      const Bucketizer exact(divisor, num_buckets);
      const BucketTable table(exact);
      if (!table.usable()) {
        if (divisor > 0.004) bad++, std::printf("divisor %g: table unusable\n", divisor);
        continue;
      }
      ++usable;
      const auto check = [&](uint64_t a) {
        if (table(a) != exact(a) && bad++ < 10) {
          std::printf("divisor %g, %lld buckets, gap %llu: table %d, exact %d\n", divisor,
                      static_cast<long long>(num_buckets), static_cast<unsigned long long>(a),
                      table(a), exact(a));
        }
      };
      for (uint64_t a = 0; a < (uint64_t{1} << 18); ++a) check(a);
      for (int64_t k = 1; k <= exact.reachable(); ++k) {
        const uint64_t edge = exact.first(k);
        check(edge - 1);
        check(edge);
        check(edge + 1);
      }
      for (int i = 0; i < 200000; ++i) check(rng() >> (rng() % 64));
      check(~uint64_t{0});
    }
  }
  if (usable < 40) bad++, std::printf("only %d configurations were usable\n", usable);
  std::printf("%s\n", bad ? "FAILED" : "OK");
  return bad ? 1 : 0;
}
