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

// float16 <-> float32 bit conversions without branches (so loops over them vectorise; Eigen's
// scalar versions branch). Round to nearest even; subnormals, infinities and NaNs handled.
inline __attribute__((always_inline)) float HalfBitsToFloat(uint16_t h) {
  const uint32_t magnitude = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exponent = magnitude & (0x7c00u << 13);
  const uint32_t normal = magnitude + ((127u - 15u) << 23);
  const uint32_t inf_nan = normal + ((128u - 16u) << 23);
  // Zero / subnormal: let the float unit renormalise (value = mantissa * 2^-24).
  float sub;
  const uint32_t sub_bits = normal + (1u << 23);
  std::memcpy(&sub, &sub_bits, sizeof(sub));
  const float magic_f = 6.103515625e-05f;  // 2^-14, the bits (113 << 23)
  sub -= magic_f;
  uint32_t sub_out;
  std::memcpy(&sub_out, &sub, sizeof(sub_out));
  const uint32_t is_special = 0u - static_cast<uint32_t>(exponent == (0x7c00u << 13));
  const uint32_t is_small = 0u - static_cast<uint32_t>(exponent == 0u);
  uint32_t out = (inf_nan & is_special) | (normal & ~is_special);
  out = (sub_out & is_small) | (out & ~is_small);
  out |= static_cast<uint32_t>(h & 0x8000u) << 16;
  float f;
  std::memcpy(&f, &out, sizeof(f));
  return f;
}

inline __attribute__((always_inline)) uint16_t FloatToHalfBits(float x) {
  uint32_t f;
  std::memcpy(&f, &x, sizeof(f));
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  // Overflow / infinity / NaN.
  const uint32_t big = f > (255u << 23) ? 0x7e00u : 0x7c00u;
  // Subnormal results: add a magic number so the float unit rounds at the right bit.
  const uint32_t denorm_magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  float denorm_magic;
  std::memcpy(&denorm_magic, &denorm_magic_bits, sizeof(denorm_magic));
  float ff;
  std::memcpy(&ff, &f, sizeof(ff));
  const float tmp = ff + denorm_magic;
  uint32_t tmp_bits;
  std::memcpy(&tmp_bits, &tmp, sizeof(tmp_bits));
  const uint32_t small = tmp_bits - denorm_magic_bits;
  // Normal results: rebias the exponent and round to nearest even on bit 13.
  const uint32_t mant_odd = (f >> 13) & 1u;
  const uint32_t normal = (f + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd) >> 13;
  const uint32_t is_big = 0u - static_cast<uint32_t>(f >= ((127u + 16u) << 23));
  const uint32_t is_small = 0u - static_cast<uint32_t>(f < (113u << 23));
  uint32_t out = (big & is_big) | (normal & ~is_big);
  out = (small & is_small) | (out & ~is_small);
  return static_cast<uint16_t>(out | (sign >> 16));
}

template <>
inline __attribute__((always_inline)) float ToAcc<Eigen::half, float>(Eigen::half x) {
  return HalfBitsToFloat(Eigen::numext::bit_cast<uint16_t>(x));
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
inline __attribute__((always_inline)) float RoundTo<Eigen::half, float>(float x) {
  return HalfBitsToFloat(FloatToHalfBits(x));
}
// bfloat16 bits of x, rounded to nearest even; NaNs stay NaN (their payload made non-zero).
inline __attribute__((always_inline)) uint32_t Bfloat16Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  // Branch-free (a select the vectoriser keeps).
  const uint32_t nan_mask = 0u - static_cast<uint32_t>((bits & 0x7fffffffu) > 0x7f800000u);
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return (((bits | 0x00400000u) & nan_mask) | (rounded & ~nan_mask)) & 0xffff0000u;
}

// x rounded to bfloat16 (to nearest even) and back, for a float (U = uint32_t) or a GCC
// vector of floats (U: the vector of uint32_t of its size), lane by lane. Hot (every score is
// rounded twice): a NaN passes through as it is, which costs one compare instead of the bit
// juggling of Bfloat16Bits.
template <typename F, typename U>
inline __attribute__((always_inline)) F RoundToBfloat16(F x) {
  static_assert(sizeof(F) == sizeof(U), "U: the unsigned integers of F's size");
  U bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  F r;
  std::memcpy(&r, &bits, sizeof(r));
  return x != x ? x : r;
}

template <>
inline __attribute__((always_inline)) float RoundTo<Eigen::bfloat16, float>(float x) {
  return RoundToBfloat16<float, uint32_t>(x);
}

// Converts an accumulator value to T (round to nearest even), vectorisably for the 16-bit
// floats.
template <typename T, typename Acc>
inline __attribute__((always_inline)) T FromAcc(Acc x) {
  return static_cast<T>(x);
}
template <>
inline __attribute__((always_inline)) Eigen::bfloat16 FromAcc<Eigen::bfloat16, float>(float x) {
  return Eigen::numext::bit_cast<Eigen::bfloat16>(static_cast<uint16_t>(Bfloat16Bits(x) >> 16));
}

template <>
inline __attribute__((always_inline)) Eigen::half FromAcc<Eigen::half, float>(float x) {
  return Eigen::numext::bit_cast<Eigen::half>(FloatToHalfBits(x));
}

}  // namespace recops

// Registration helpers: the float dtypes every arithmetic kernel supports, the one list.
// RECOPS_CALL_FLOAT_TYPES(m) is m(T) for each; RECOPS_CALL_FLOAT_TYPES_WITH(m, args...)
// m(T, args...).
#define RECOPS_CALL_FLOAT_TYPES_WITH(m, ...)                                        \
  m(Eigen::half, __VA_ARGS__) m(Eigen::bfloat16, __VA_ARGS__) m(float, __VA_ARGS__) \
      m(double, __VA_ARGS__)
#define RECOPS_CALL_FLOAT_TYPES(m) RECOPS_CALL_FLOAT_TYPES_WITH(RECOPS_APPLY_TO_TYPE_, m)
#define RECOPS_APPLY_TO_TYPE_(T, m) m(T)

#endif  // RECOPS_KERNELS_COMMON_DTYPES_H_
