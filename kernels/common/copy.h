// Byte copies tuned for the short runs of row-wise data movement.
#ifndef RECOPS_KERNELS_COMMON_COPY_H_
#define RECOPS_KERNELS_COMMON_COPY_H_

#include <cstdint>
#include <cstring>

namespace recops {

// memcpy, but short copies (a few columns of a row) are done inline with fixed-size moves
// instead of a library call per run.
inline void CopyBytes(char* dst, const char* src, int64_t n) {
  if (n > 256) {
    std::memcpy(dst, src, n);
    return;
  }
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) std::memcpy(dst + i, src + i, 16);
  if (i + 8 <= n) std::memcpy(dst + i, src + i, 8), i += 8;
  if (i + 4 <= n) std::memcpy(dst + i, src + i, 4), i += 4;
  if (i + 2 <= n) std::memcpy(dst + i, src + i, 2), i += 2;
  if (i < n) dst[i] = src[i];
}

}  // namespace recops

#endif  // RECOPS_KERNELS_COMMON_COPY_H_
