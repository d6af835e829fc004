// Kernels of stem disentangle_attention: DeBERTa-style disentangled attention with the Rec
// SDK's index semantics (spec §16), forward and backward, one work item per (batch, head) on
// the register-blocked GEMM micro-kernel:
//   idx[i, j] = clamp(rel[i, j] + s - 1, 0, 2s - 1)
//   W = scale·(Q·Kᵀ + c2p + p2c) + mask,  c2p[i, j] = (Q·PKᵀ)[i, idx[i, j]],
//   p2c[i, j] = (K·PQᵀ)[j, idx[j, i]],  P = softmax_j(W),  O = P·V.
// The c2p / p2c terms are gathers from the two [s, 2s] position-score matrices, so the
// [s, s, d] position gather is never built; their gradients scatter back into those matrices.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/dispatch.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/microkernels.h"
#include "kernels/common/parallel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

struct DisentangleProblem {
  int64_t batch = 0, heads = 0, s = 0, d = 0;
  bool c2p = false, p2c = false;
  double scale = 1.0;
  bool mask_per_batch = false;  // mask [b, 1, s, s] / [b, s, s] (else none)
  std::vector<int32_t> idx;     // [s, s]
};

// C[M x N] = A[M x K] · B[K x N] (row-major, contiguous), or (+)= with accumulate.
template <typename Acc, Isa I>
RECOPS_INLINE void Matmul(int64_t m, int64_t n, int64_t k, const Acc* a, const Acc* b, Acc* c,
                          bool accumulate = false, bool trans_a = false, int64_t lda = 0) {
  const int64_t ld = lda ? lda : (trans_a ? m : k);
  if (trans_a) {
    if (accumulate) {
      GemmAcc<Acc, I, false, true>(m, n, k, a, ld, b, n, c, n);
    } else {
      GemmAcc<Acc, I, true, true>(m, n, k, a, ld, b, n, c, n);
    }
  } else if (accumulate) {
    GemmAcc<Acc, I, false, false>(m, n, k, a, ld, b, n, c, n);
  } else {
    GemmAcc<Acc, I, true, false>(m, n, k, a, ld, b, n, c, n);
  }
}

// C[M x N] = A[M x K] · B[K x N] where A and B hold input values only (Q·Kᵀ, the position
// scores Q·PKᵀ and K·PQᵀ, dO·Vᵀ): for bfloat16 on the CPU's bfloat16 dot products where it has
// them (GemmBf16: the products of bfloat16 inputs are exact and summed in float, in pairs of
// k), otherwise Matmul. The GEMMs with P or the score gradients stay on float FMAs: those are
// not rounded to bfloat16 here, and packing them would add rounding points.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void InputMatmul(int64_t m, int64_t n, int64_t k, const Acc* a, const Acc* b,
                               Acc* c) {
  if constexpr (std::is_same_v<T, Eigen::bfloat16> && I == Isa::kAvx512) {
    if (Bf16DotPath()) {
      GemmBf16<true, false>(m, n, k, a, k, b, n, c, n);
      return;
    }
  }
  Matmul<Acc, I>(m, n, k, a, b, c);
}

// A contiguous [rows, d] slice (one (b, h) of x [b, n, rows, d]) as Acc.
template <typename T, typename Acc>
void Load(const T* src, int64_t rows, int64_t d, Acc* dst) {
  for (int64_t i = 0; i < rows * d; ++i) dst[i] = ToAcc<T, Acc>(src[i]);
}
// Head h of a position table [2s, n, d] as Acc [2s, d].
template <typename T, typename Acc>
void LoadPositions(const T* table, int64_t rows, int64_t heads, int64_t h, int64_t d, Acc* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t e = 0; e < d; ++e) dst[r * d + e] = ToAcc<T, Acc>(table[(r * heads + h) * d + e]);
  }
}

// Per-thread scratch of the work items, reused across items and calls (fresh buffers
// page-fault on every call).
template <typename Acc>
struct DisentangleScratch {
  static DisentangleScratch& ForThread(int64_t s, int64_t d) {
    thread_local DisentangleScratch scratch;
    scratch.Resize(s, d);
    return scratch;
  }
  std::vector<Acc> q, k, v, kt, pk, pkt, pq, pqt, qp, kp, w, p, buf1, buf2, buf3, dq, dk, dv;
  void Resize(int64_t s, int64_t d) {
    const int64_t sd = s * d, s2 = s * s;
    for (auto* x : {&q, &k, &v, &kt}) x->resize(sd);
    for (auto* x : {&pk, &pkt, &pq, &pqt}) x->resize(2 * sd);
    for (auto* x : {&qp, &kp}) x->resize(2 * s2);
    for (auto* x : {&w, &p}) x->resize(s2);
    buf1.resize(std::max(2 * s2, sd));
    buf2.resize(std::max(2 * s2, 2 * sd));
    buf3.resize(std::max(s2, 2 * sd));
  }
};

// Scores W and probabilities P of item (b, h) into sc.w / sc.p (Acc), after loading q, k, v,
// kt, pk(t), pq(t) and computing qp, kp.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void ScoresOf(const DisentangleProblem& p, const T* mask, int64_t b,
                            DisentangleScratch<Acc>& sc) {
  const int64_t s = p.s, d = p.d;
  const Acc scale = static_cast<Acc>(p.scale);
  InputMatmul<T, Acc, I>(s, s, d, sc.q.data(), sc.kt.data(), sc.w.data());
  if (p.c2p) InputMatmul<T, Acc, I>(s, 2 * s, d, sc.q.data(), sc.pkt.data(), sc.qp.data());
  if (p.p2c) InputMatmul<T, Acc, I>(s, 2 * s, d, sc.k.data(), sc.pqt.data(), sc.kp.data());
  const T* mask_b = p.mask_per_batch ? mask + b * s * s : nullptr;
  for (int64_t i = 0; i < s; ++i) {
    Acc* wr = sc.w.data() + i * s;
    for (int64_t j = 0; j < s; ++j) {
      Acc x = wr[j];
      if (p.c2p) x += sc.qp[i * 2 * s + p.idx[i * s + j]];
      if (p.p2c) x += sc.kp[j * 2 * s + p.idx[j * s + i]];
      wr[j] = scale * x + (mask_b ? ToAcc<T, Acc>(mask_b[i * s + j]) : Acc(0));
    }
    // Softmax of the row.
    Acc* pr = sc.p.data() + i * s;
    Acc mx = wr[0];
    for (int64_t j = 1; j < s; ++j) mx = std::max(mx, wr[j]);
    Acc sum = Acc(0);
    if constexpr (std::is_same_v<Acc, float>) {
      using V = typename IsaVec<float, I>::type;
      constexpr int64_t L = IsaVec<float, I>::kLanes;
      int64_t j = 0;
      for (; j + L <= s; j += L) StoreVec(pr + j, ExpVec(LoadVec<V>(wr + j) - mx));
      for (; j < s; ++j) pr[j] = std::exp(wr[j] - mx);
    } else {
      for (int64_t j = 0; j < s; ++j) pr[j] = std::exp(wr[j] - mx);
    }
    for (int64_t j = 0; j < s; ++j) sum += pr[j];
    const Acc inv = Acc(1) / sum;
    for (int64_t j = 0; j < s; ++j) pr[j] *= inv;
  }
}

// Loads the operands of item (b, h) and its position tables.
template <typename T, typename Acc>
void LoadItem(const DisentangleProblem& p, const T* q, const T* k, const T* v, const T* pk,
              const T* pq, int64_t b, int64_t h, DisentangleScratch<Acc>& sc) {
  const int64_t s = p.s, d = p.d, off = (b * p.heads + h) * s * d;
  Load<T, Acc>(q + off, s, d, sc.q.data());
  Load<T, Acc>(k + off, s, d, sc.k.data());
  Load<T, Acc>(v + off, s, d, sc.v.data());
  TransposeTiles<Acc, Acc>(sc.k.data(), s, d, sc.kt.data());
  if (p.c2p) {
    LoadPositions<T, Acc>(pk, 2 * s, p.heads, h, d, sc.pk.data());
    TransposeTiles<Acc, Acc>(sc.pk.data(), 2 * s, d, sc.pkt.data());
  }
  if (p.p2c) {
    LoadPositions<T, Acc>(pq, 2 * s, p.heads, h, d, sc.pq.data());
    TransposeTiles<Acc, Acc>(sc.pq.data(), 2 * s, d, sc.pqt.data());
  }
}

// Validated inputs shared by the forward and the backward (inputs first.. : q, k, v, pos_key,
// pos_query, relative_pos, attn_mask).
class DisentangleBase : public OpKernel {
 public:
  explicit DisentangleBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string type;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("pos_att_type", &type));
    OP_REQUIRES(ctx, type == "c2p" || type == "p2c" || type == "c2p|p2c" || type == "p2c|c2p",
                absl::InvalidArgumentError(absl::StrCat(
                    "pos_att_type must be 'c2p', 'p2c' or 'c2p|p2c', got '", type, "'")));
    c2p_ = type.find("c2p") != std::string::npos;
    p2c_ = type.find("p2c") != std::string::npos;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("score_scale", &scale_));
    OP_REQUIRES(ctx, std::isfinite(scale_),
                absl::InvalidArgumentError("score_scale must be finite"));
  }

 protected:
  absl::Status Prepare(OpKernelContext* ctx, int first, DisentangleProblem* p) const {
    const Tensor& q = ctx->input(first);
    if (q.dims() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("query must be [b, n, s, d], got ", q.shape().DebugString()));
    }
    for (int i = 1; i < 3; ++i) {
      if (ctx->input(first + i).shape() != q.shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            i == 1 ? "key" : "value", " must have query's shape ", q.shape().DebugString(),
            ", got ", ctx->input(first + i).shape().DebugString()));
      }
    }
    p->batch = q.dim_size(0);
    p->heads = q.dim_size(1);
    p->s = q.dim_size(2);
    p->d = q.dim_size(3);
    p->c2p = c2p_;
    p->p2c = p2c_;
    p->scale = scale_;
    const TensorShape pos({2 * p->s, p->heads, p->d});
    for (int i = 3; i < 5; ++i) {
      if (ctx->input(first + i).shape() != pos) {
        return absl::InvalidArgumentError(
            absl::StrCat(i == 3 ? "pos_key" : "pos_query", " must have shape ", pos.DebugString(),
                         " [2s, n, d], got ", ctx->input(first + i).shape().DebugString()));
      }
    }
    const Tensor& rel = ctx->input(first + 5);
    if (rel.NumElements() != p->s * p->s || rel.dims() < 2 ||
        rel.dim_size(rel.dims() - 1) != p->s || rel.dim_size(rel.dims() - 2) != p->s) {
      return absl::InvalidArgumentError(
          absl::StrCat("relative_pos must be [s, s], [1, s, s] or [1, 1, s, s] with s = ", p->s,
                       ", got ", rel.shape().DebugString()));
    }
    p->idx.resize(p->s * p->s);
    const int64_t* r = rel.flat<int64_t>().data();
    for (int64_t e = 0; e < p->s * p->s; ++e) {
      // clamp(rel + s - 1, 0, 2s - 1) without overflow for any int64 rel.
      const int64_t lo = -(p->s - 1), hi = p->s;
      p->idx[e] = static_cast<int32_t>(std::min(std::max(r[e], lo), hi) + p->s - 1);
    }
    const Tensor& mask = ctx->input(first + 6);
    p->mask_per_batch = mask.NumElements() > 0;
    if (p->mask_per_batch) {
      const bool ok = mask.NumElements() == p->batch * p->s * p->s &&
                      (mask.shape() == TensorShape({p->batch, 1, p->s, p->s}) ||
                       mask.shape() == TensorShape({p->batch, p->s, p->s}));
      if (!ok) {
        return absl::InvalidArgumentError(
            absl::StrCat("attn_mask must be [b, 1, s, s] or [b, s, s] (", p->batch, ", ", p->s,
                         "), got ", mask.shape().DebugString()));
      }
    }
    return absl::OkStatus();
  }

  bool c2p_ = false, p2c_ = false;
  float scale_ = 1.0f;
};

template <typename T>
class DisentangleAttentionOp : public DisentangleBase {
 public:
  using DisentangleBase::DisentangleBase;

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    DisentangleProblem p;
    OP_REQUIRES_OK(ctx, Prepare(ctx, 0, &p));
    const Tensor& q = ctx->input(0);
    Tensor *out = nullptr, *probs = nullptr, *weights = nullptr;
    const TensorShape plane({p.batch, p.heads, p.s, p.s});
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, q.shape(), &out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, plane, &probs));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, plane, &weights));
    const T* in[5];
    for (int i = 0; i < 5; ++i) in[i] = ctx->input(i).flat<T>().data();
    const T* mask = p.mask_per_batch ? ctx->input(6).flat<T>().data() : nullptr;
    T* o = out->flat<T>().data();
    T* pp = probs->flat<T>().data();
    T* wp = weights->flat<T>().data();
    const int64_t s = p.s, d = p.d;
    ParallelForDynamic(ctx, p.batch * p.heads, [&](int64_t item) {
      const int64_t b = item / p.heads, h = item % p.heads;
      DisentangleScratch<Acc>& sc = DisentangleScratch<Acc>::ForThread(s, d);
      // GemmBf16 must not find another kernel's registered operands in reused memory; the AMX
      // tiles are released at the item's end.
      const Bf16Item bf16_item(std::is_same_v<T, Eigen::bfloat16>);
      LoadItem<T, Acc>(p, in[0], in[1], in[2], in[3], in[4], b, h, sc);
      RECOPS_WITH_ISA((ScoresOf<T, Acc, I>(p, mask, b, sc)));
      RECOPS_WITH_ISA((Matmul<Acc, I>(s, d, s, sc.p.data(), sc.v.data(), sc.buf1.data())));
      for (int64_t e = 0; e < s * s; ++e) {
        pp[item * s * s + e] = FromAcc<T, Acc>(sc.p[e]);
        wp[item * s * s + e] = FromAcc<T, Acc>(sc.w[e]);
      }
      for (int64_t e = 0; e < s * d; ++e) o[item * s * d + e] = FromAcc<T, Acc>(sc.buf1[e]);
    });
  }
};

// Backward: inputs d_out, d_probs, d_weights, then the forward's inputs. Outputs dq, dk, dv,
// d_pos_key, d_pos_query (the position tables' gradients summed over the batch in order).
template <typename T>
class DisentangleAttentionGradOp : public DisentangleBase {
 public:
  using DisentangleBase::DisentangleBase;

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    DisentangleProblem p;
    OP_REQUIRES_OK(ctx, Prepare(ctx, 3, &p));
    const int64_t s = p.s, d = p.d, items = p.batch * p.heads;
    const TensorShape plane({p.batch, p.heads, s, s});
    OP_REQUIRES(ctx,
                ctx->input(0).shape() == ctx->input(3).shape() && ctx->input(1).shape() == plane &&
                    ctx->input(2).shape() == plane,
                absl::InvalidArgumentError(absl::StrCat(
                    "upstream gradients must be shaped like the outputs: ",
                    ctx->input(3).shape().DebugString(), " and ", plane.DebugString())));
    Tensor* grads[5];
    for (int i = 0; i < 5; ++i) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, ctx->input(3 + i).shape(), &grads[i]));
    }
    const T* dout = ctx->input(0).flat<T>().data();
    const T* dprobs = ctx->input(1).flat<T>().data();
    const T* dweights = ctx->input(2).flat<T>().data();
    const T* in[5];
    for (int i = 0; i < 5; ++i) in[i] = ctx->input(3 + i).flat<T>().data();
    const T* mask = p.mask_per_batch ? ctx->input(9).flat<T>().data() : nullptr;
    // Per-item position-table gradients [items, 2s, d], summed over b in order afterwards.
    std::vector<Acc> dpk(p.c2p ? items * 2 * s * d : 0), dpq(p.p2c ? items * 2 * s * d : 0);
    const Acc scale = static_cast<Acc>(p.scale);
    ParallelForDynamic(ctx, items, [&](int64_t item) {
      const int64_t b = item / p.heads, h = item % p.heads;
      DisentangleScratch<Acc>& sc = DisentangleScratch<Acc>::ForThread(s, d);
      // GemmBf16 must not find another kernel's registered operands in reused memory; the AMX
      // tiles are released at the item's end.
      const Bf16Item bf16_item(std::is_same_v<T, Eigen::bfloat16>);
      LoadItem<T, Acc>(p, in[0], in[1], in[2], in[3], in[4], b, h, sc);
      RECOPS_WITH_ISA((ScoresOf<T, Acc, I>(p, mask, b, sc)));
      // dO [s, d] into buf3; dP = dO·Vᵀ + d_probs into buf1 (via Vᵀ in buf2).
      Acc* d_o = sc.buf3.data();
      Load<T, Acc>(dout + item * s * d, s, d, d_o);
      TransposeTiles<Acc, Acc>(sc.v.data(), s, d, sc.buf2.data());
      RECOPS_WITH_ISA((InputMatmul<T, Acc, I>(s, s, d, d_o, sc.buf2.data(), sc.buf1.data())));
      // dV = Pᵀ·dO.
      sc.dq.resize(s * d);
      sc.dk.resize(s * d);
      sc.dv.resize(s * d);
      Acc *dq = sc.dq.data(), *dk = sc.dk.data(), *dv = sc.dv.data();
      RECOPS_WITH_ISA((Matmul<Acc, I>(s, d, s, sc.p.data(), d_o, dv, false, true)));
      // dW = P ⊙ (dP − rowsum(dP ⊙ P)) + d_weights; then dS = scale · dW (in sc.w).
      Acc* dp = sc.buf1.data();
      for (int64_t i = 0; i < s; ++i) {
        Acc* dpr = dp + i * s;
        const Acc* pr = sc.p.data() + i * s;
        const T* dpu = dprobs + (item * s + i) * s;
        const T* dwu = dweights + (item * s + i) * s;
        Acc dot = Acc(0);
        for (int64_t j = 0; j < s; ++j) {
          dpr[j] += ToAcc<T, Acc>(dpu[j]);
          dot += dpr[j] * pr[j];
        }
        Acc* ds = sc.w.data() + i * s;
        for (int64_t j = 0; j < s; ++j) {
          ds[j] = scale * (pr[j] * (dpr[j] - dot) + ToAcc<T, Acc>(dwu[j]));
        }
      }
      const Acc* ds = sc.w.data();
      // dQ = dS·K, dK = dSᵀ·Q.
      RECOPS_WITH_ISA((Matmul<Acc, I>(s, d, s, ds, sc.k.data(), dq)));
      RECOPS_WITH_ISA((Matmul<Acc, I>(s, d, s, ds, sc.q.data(), dk, false, true)));
      if (p.c2p) {
        // dQp[i, idx[i, j]] += dS[i, j]; dQ += dQp·PK; dPK_item = dQpᵀ·Q.
        Acc* dqp = sc.qp.data();
        std::fill(dqp, dqp + 2 * s * s, Acc(0));
        for (int64_t i = 0; i < s; ++i) {
          for (int64_t j = 0; j < s; ++j) dqp[i * 2 * s + p.idx[i * s + j]] += ds[i * s + j];
        }
        RECOPS_WITH_ISA((Matmul<Acc, I>(s, d, 2 * s, dqp, sc.pk.data(), dq, true)));
        RECOPS_WITH_ISA((Matmul<Acc, I>(2 * s, d, s, dqp, sc.q.data(),
                                        dpk.data() + item * 2 * s * d, false, true)));
      }
      if (p.p2c) {
        // dKp[j, idx[j, i]] += dS[i, j]; dK += dKp·PQ; dPQ_item = dKpᵀ·K.
        Acc* dkp = sc.kp.data();
        std::fill(dkp, dkp + 2 * s * s, Acc(0));
        for (int64_t i = 0; i < s; ++i) {
          for (int64_t j = 0; j < s; ++j) dkp[j * 2 * s + p.idx[j * s + i]] += ds[i * s + j];
        }
        RECOPS_WITH_ISA((Matmul<Acc, I>(s, d, 2 * s, dkp, sc.pq.data(), dk, true)));
        RECOPS_WITH_ISA((Matmul<Acc, I>(2 * s, d, s, dkp, sc.k.data(),
                                        dpq.data() + item * 2 * s * d, false, true)));
      }
      T* outs[3] = {grads[0]->flat<T>().data(), grads[1]->flat<T>().data(),
                    grads[2]->flat<T>().data()};
      const Acc* srcs[3] = {dq, dk, dv};
      for (int t = 0; t < 3; ++t) {
        for (int64_t e = 0; e < s * d; ++e) outs[t][item * s * d + e] = FromAcc<T, Acc>(srcs[t][e]);
      }
    });
    // Position tables [2s, n, d]: sum the items of each head over b in order.
    for (int t = 0; t < 2; ++t) {
      T* dst = grads[3 + t]->flat<T>().data();
      const std::vector<Acc>& part = t == 0 ? dpk : dpq;
      const bool used = t == 0 ? p.c2p : p.p2c;
      ParallelFor(ctx, 2 * s, p.heads * d * p.batch, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t h = 0; h < p.heads; ++h) {
            for (int64_t e = 0; e < d; ++e) {
              Acc sum = Acc(0);
              for (int64_t b = 0; used && b < p.batch; ++b) {
                sum += part[((b * p.heads + h) * 2 * s + r) * d + e];
              }
              dst[(r * p.heads + h) * d + e] = FromAcc<T, Acc>(sum);
            }
          }
        }
      });
    }
  }
};

#define REGISTER(T)                                                                              \
  REGISTER_KERNEL_BUILDER(                                                                       \
      Name("Recops>DisentangleAttention").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      DisentangleAttentionOp<T>);                                                                \
  REGISTER_KERNEL_BUILDER(Name("Recops>DisentangleAttentionGrad")                                \
                              .Device(tensorflow::DEVICE_CPU)                                    \
                              .TypeConstraint<T>("T"),                                           \
                          DisentangleAttentionGradOp<T>);
RECOPS_CALL_FLOAT_TYPES(REGISTER)
#undef REGISTER

}  // namespace

}  // namespace recops
