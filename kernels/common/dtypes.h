// Accumulation types: bfloat16/float16 accumulate in float32, everything else in itself.
#ifndef RECOPS_KERNELS_COMMON_DTYPES_H_
#define RECOPS_KERNELS_COMMON_DTYPES_H_

#include <cstdint>
#include <cstring>

#include "tensorflow/core/framework/numeric_types.h"

namespace recops {

template <typename T>
struct Accum {
  using type = T;
};
template <>
struct Accum<Eigen::half> {
  using type = float;
};
template <>
struct Accum<Eigen::bfloat16> {
  using type = float;
};
template <typename T>
using AccumT = typename Accum<T>::type;

// Fast, vectorisable conversions between an input dtype T and its accumulator: bfloat16 is
// the top half of a float32 (round to nearest even on the way down); other types cast.
template <typename T, typename Acc>
inline __attribute__((always_inline)) Acc ToAcc(T x) {
  return static_cast<Acc>(x);
}
template <>
inline __attribute__((always_inline)) float ToAcc<Eigen::bfloat16, float>(Eigen::bfloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(Eigen::numext::bit_cast<uint16_t>(x)) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Rounds an accumulator value to T and back (a no-op for float32 and float64).
template <typename T, typename Acc>
inline __attribute__((always_inline)) Acc RoundTo(Acc x) {
  return static_cast<Acc>(static_cast<T>(x));
}
template <>
inline __attribute__((always_inline)) float RoundTo<float, float>(float x) {
  return x;
}
template <>
inline __attribute__((always_inline)) double RoundTo<double, double>(double x) {
  return x;
}
template <>
inline __attribute__((always_inline)) float RoundTo<Eigen::bfloat16, float>(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  // Round to nearest even on bit 16; NaNs stay NaN (their payload is kept non-zero).
  // Branch-free (a select the vectoriser keeps).
  const uint32_t nan_mask = 0u - static_cast<uint32_t>((bits & 0x7fffffffu) > 0x7f800000u);
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  bits = (((bits | 0x00400000u) & nan_mask) | (rounded & ~nan_mask)) & 0xffff0000u;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Converts an accumulator value to T (round to nearest even), vectorisably for bfloat16.
template <typename T, typename Acc>
inline __attribute__((always_inline)) T FromAcc(Acc x) {
  return static_cast<T>(x);
}
template <>
inline __attribute__((always_inline)) Eigen::bfloat16 FromAcc<Eigen::bfloat16, float>(float x) {
  const float r = RoundTo<Eigen::bfloat16, float>(x);
  uint32_t bits;
  std::memcpy(&bits, &r, sizeof(bits));
  return Eigen::numext::bit_cast<Eigen::bfloat16>(static_cast<uint16_t>(bits >> 16));
}

}  // namespace recops

// Registration helper: the float dtypes every arithmetic kernel supports.
#define RECOPS_CALL_FLOAT_TYPES(m) \
  m(Eigen::half) m(Eigen::bfloat16) m(float) m(double)

#endif  // RECOPS_KERNELS_COMMON_DTYPES_H_
