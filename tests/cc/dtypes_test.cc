// Unit test of kernels/common/dtypes.h: the branch-free float16 / bfloat16 conversions must
// equal Eigen's (round to nearest even) bit for bit. Built and run by tests/test_cc_units.py.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "kernels/common/dtypes.h"

using recops::FloatToHalfBits;
using recops::HalfBitsToFloat;

static bool IsNanHalf(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static bool IsNanBf16(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

int main() {
  int bad = 0;
  for (uint32_t b = 0; b < 65536; ++b) {  // every float16: to float and back
    const auto h = Eigen::numext::bit_cast<Eigen::half>(static_cast<uint16_t>(b));
    const float ref = static_cast<float>(h), mine = HalfBitsToFloat(static_cast<uint16_t>(b));
    if (std::isnan(ref) != std::isnan(mine) ||
        (!std::isnan(ref) && std::memcmp(&ref, &mine, 4) != 0)) {
      if (bad++ < 5) std::printf("half->float %04x differs\n", b);
    }
    if (!std::isnan(ref) && FloatToHalfBits(ref) != b) {
      if (bad++ < 5) std::printf("half round trip %04x differs\n", b);
    }
  }
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4093) {  // a sweep of float32 bit patterns
    const uint32_t fb = static_cast<uint32_t>(u);
    float f;
    std::memcpy(&f, &fb, 4);
    const uint16_t ref = Eigen::numext::bit_cast<uint16_t>(Eigen::half(f));
    const uint16_t mine = FloatToHalfBits(f);
    if (ref != mine && !(IsNanHalf(ref) && IsNanHalf(mine))) {
      if (bad++ < 10) std::printf("float->half %08x: %04x vs %04x\n", fb, ref, mine);
    }
    const uint16_t bref = Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(f));
    const uint16_t bmine =
        Eigen::numext::bit_cast<uint16_t>(recops::FromAcc<Eigen::bfloat16, float>(f));
    if (bref != bmine && !(IsNanBf16(bref) && IsNanBf16(bmine))) {
      if (bad++ < 15) std::printf("float->bfloat16 %08x: %04x vs %04x\n", fb, bref, bmine);
    }
  }
  std::printf("%d mismatches\n", bad);
  return bad == 0 ? 0 : 1;
}
