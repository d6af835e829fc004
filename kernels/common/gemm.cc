// The register-blocked GEMM of kernels/common/microkernels.h (GemmAccBody) compiled once per
// variant: float and double, AVX-512, AVX2 + FMA and baseline x86-64 (each under its target
// attribute), overwrite or accumulate, A plain or transposed. Every kernel's GEMM calls one
// of these.
#include "kernels/common/microkernels.h"

namespace recops {

#define RECOPS_GEMM_DEFINE_(Acc, I, OVERWRITE, TRANS_A, ATTR)                                   \
  template <>                                                                                   \
  ATTR void GemmAcc<Acc, I, OVERWRITE, TRANS_A>(int64_t M, int64_t N, int64_t K, const Acc* a,  \
                                                int64_t lda, const Acc* B, int64_t ldb, Acc* C, \
                                                int64_t ldc) {                                  \
    GemmAccBody<Acc, I, OVERWRITE, TRANS_A>(M, N, K, a, lda, B, ldb, C, ldc);                   \
  }
#define RECOPS_GEMM_BASE_(Acc, I, OVERWRITE, TRANS_A) \
  RECOPS_GEMM_DEFINE_(Acc, I, OVERWRITE, TRANS_A, )
RECOPS_GEMM_VARIANTS(RECOPS_GEMM_BASE_, Isa::kBase)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RECOPS_GEMM_AVX2_(Acc, I, OVERWRITE, TRANS_A) \
  RECOPS_GEMM_DEFINE_(Acc, I, OVERWRITE, TRANS_A, __attribute__((target("arch=x86-64-v3"))))
#define RECOPS_GEMM_AVX512_(Acc, I, OVERWRITE, TRANS_A) \
  RECOPS_GEMM_DEFINE_(Acc, I, OVERWRITE, TRANS_A, __attribute__((target("arch=x86-64-v4"))))
RECOPS_GEMM_VARIANTS(RECOPS_GEMM_AVX2_, Isa::kAvx2)
RECOPS_GEMM_VARIANTS(RECOPS_GEMM_AVX512_, Isa::kAvx512)
#endif

}  // namespace recops
