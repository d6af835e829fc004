// Accumulation types: bfloat16/float16 accumulate in float32, everything else in itself.
#ifndef RECOPS_KERNELS_COMMON_DTYPES_H_
#define RECOPS_KERNELS_COMMON_DTYPES_H_

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

}  // namespace recops

// Registration helper: the float dtypes every arithmetic kernel supports.
#define RECOPS_CALL_FLOAT_TYPES(m) \
  m(Eigen::half) m(Eigen::bfloat16) m(float) m(double)

#endif  // RECOPS_KERNELS_COMMON_DTYPES_H_
