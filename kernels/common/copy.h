// Byte copies tuned for row-wise data movement.
#ifndef RECOPS_KERNELS_COMMON_COPY_H_
#define RECOPS_KERNELS_COMMON_COPY_H_

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

// Outputs at least this large do not stay in cache for their consumer anyway: write them with
// non-temporal (streaming) stores, which skip reading the destination lines first.
constexpr int64_t kStreamingOutputBytes = int64_t{8} << 20;

// Copies n bytes; with `stream`, runs of >= 256 bytes use streaming stores (SSE2). Call
// StreamFence() after the last streaming copy of a thread, before others read the data.
inline void CopyRun(char* dst, const char* src, int64_t n, bool stream) {
#if defined(__SSE2__)
  if (stream && n >= 256) {
    const int64_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
    std::memcpy(dst, src, head);
    int64_t i = head;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    for (; i + 16 <= n; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    }
    std::memcpy(dst + i, src + i, n - i);
    return;
  }
#endif
  CopyBytes(dst, src, n);
}

inline void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Prefetches the cache lines of [p, p + bytes) (for writing when `write`).
inline void PrefetchBytes(const void* p, int64_t bytes, bool write) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) {
    if (write) {
      __builtin_prefetch(c + i, 1, 3);
    } else {
      __builtin_prefetch(c + i, 0, 3);
    }
  }
}

}  // namespace recops

#endif  // RECOPS_KERNELS_COMMON_COPY_H_
