// Kernels of stem hstu_dense: the dense, relative-bias, paged and cached forward and the backward
// (validation in kernels/hstu_dense_kernels.h; the work items, compiled per instruction set, in
// kernels/hstu_dense_<isa>.cc).
#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/parallel.h"
#include "kernels/common/validation.h"
#include "kernels/hstu_dense.h"
#include "kernels/hstu_dense_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

// run(item) for every item (most expensive first) on the intra-op pool. Where
// HstuGroupBySequence groups them (many short sequences), a sequence's items run in turn on one
// thread, after HstuPrefetchSequence (the output rows too with `out`: the forward).
template <typename T, typename Run>
void RunItems(OpKernelContext* ctx, const HstuProblem& p, const HstuTensors<T>& t,
              std::vector<HstuItem> items, bool kv_side, bool out, const Run& run) {
  const std::vector<int64_t> starts = HstuGroupBySequence(p, kv_side, NumThreads(ctx), &items);
  if (starts.empty()) {
    ParallelForDynamic(ctx, items.size(), [&](int64_t i) { run(items[i]); });
    return;
  }
  ParallelForDynamic(ctx, static_cast<int64_t>(starts.size()) - 1, [&](int64_t g) {
    HstuPrefetchSequence(p, t, items[starts[g]].b, out);
    for (int64_t i = starts[g]; i < starts[g + 1]; ++i) run(items[i]);
  });
}

// The tiled forward over validated inputs: q, k, v, the custom mask and the bias.
template <typename T>
void RunForward(OpKernelContext* ctx, const HstuProblem& p, const Tensor& q, const Tensor& k,
                const Tensor& v, const Tensor* mask, const Tensor* bias, Tensor* out,
                const Tensor* ts_bias, const Tensor* pos_bias, HstuTensors<T> t) {
  if (p.fuxi_bias) {
    t.ts_bias = ts_bias->flat<T>().data();
    t.pos_bias = pos_bias->flat<T>().data();
  }
  t.q = q.flat<T>().data();
  t.k = k.flat<T>().data();
  t.v = v.flat<T>().data();
  t.mask = mask && mask->NumElements() ? mask->flat<T>().data() : nullptr;
  t.bias = bias && bias->NumElements() ? bias->flat<T>().data() : nullptr;
  t.out = out->flat<T>().data();
  const auto forward = HstuBestEntries<T>().forward;
  RunItems(ctx, p, t, HstuWorkItems(p, /*kv_side=*/false, NumThreads(ctx)), /*kv_side=*/false,
           /*out=*/true, [&](const HstuItem& item) { forward(p, t, item); });
}

// The backward over validated inputs (t filled, dq / dk / dv allocated; the bias gradient
// zeroed by the caller when there is a bias).
template <typename T>
void RunBackward(OpKernelContext* ctx, const HstuProblem& p, const HstuTensors<T>& t) {
  // Every row of dq, dk, dv is written by the items below (with zeros where nothing is
  // visible), except in the one-pass path the rows of sequences without keys or queries,
  // zeroed here. The bias gradient is written only on visible tiles.
  const HstuEntries<T>& entries = HstuBestEntries<T>();
  // One pass per (sequence, kv head) when those items alone keep the threads busy;
  // otherwise (few, long sequences) two passes over 64-row blocks. Same bits either way.
  // The relative bias's gradient histograms are per (sequence, kv head): one pass only.
  std::vector<HstuItem> seq_items = HstuSequenceItems(p);
  if (p.rel_bias() || static_cast<int64_t>(seq_items.size()) >= 4 * NumThreads(ctx)) {
    for (int64_t b = 0; b < p.batch; ++b) {
      if (p.off_q[b + 1] > p.off_q[b] && p.off_k[b + 1] > p.off_k[b]) continue;
      const auto zero_rows = [](T* x, int64_t r0, int64_t r1, int64_t row) {
        std::fill(x + r0 * row, x + r1 * row, T(0));
      };
      zero_rows(t.dq, p.off_q[b], p.off_q[b + 1], p.heads_q * p.dim_qk);
      zero_rows(t.dk, p.off_k[b], p.off_k[b + 1], p.heads_k * p.dim_qk);
      zero_rows(t.dv, p.off_k[b], p.off_k[b + 1], p.heads_k * p.dim_v);
    }
    RunItems(ctx, p, t, std::move(seq_items), /*kv_side=*/true, /*out=*/false,
             [&](const HstuItem& item) { entries.backward_seq(p, t, item); });
    return;
  }
  const std::vector<HstuItem> kv_items = HstuWorkItems(p, /*kv_side=*/true, NumThreads(ctx));
  ParallelForDynamic(ctx, kv_items.size(),
                     [&](int64_t i) { entries.backward_kv(p, t, kv_items[i]); });
  const std::vector<HstuItem> q_items = HstuWorkItems(p, /*kv_side=*/false, NumThreads(ctx));
  ParallelForDynamic(ctx, q_items.size(), [&](int64_t i) { entries.backward_q(p, t, q_items[i]); });
}

#define INSTANTIATE(T)                                                                             \
  template void RunForward<T>(OpKernelContext*, const HstuProblem&, const Tensor&, const Tensor&,  \
                              const Tensor&, const Tensor*, const Tensor*, Tensor*, const Tensor*, \
                              const Tensor*, HstuTensors<T>);                                      \
  template void RunBackward<T>(OpKernelContext*, const HstuProblem&, const HstuTensors<T>&);
RECOPS_CALL_FLOAT_TYPES(INSTANTIATE)
#undef INSTANTIATE

namespace {

template <typename T>
class HstuDenseForwardOp : public HstuBase {
 public:
  using HstuBase::HstuBase;

  void Compute(OpKernelContext* ctx) override {
    HstuCall call;
    OP_REQUIRES_OK(ctx, Prepare(ctx, 0, &call));
    HstuTensors<T> rel;
    OP_REQUIRES_OK(ctx, PrepareRelBias<T>(ctx, 9, &call, &rel));
    const HstuProblem& p = call.p;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({ctx->input(0).dim_size(0), p.heads_q, p.dim_v}), &out));
    RunForward<T>(ctx, p, ctx->input(0), ctx->input(1), ctx->input(2), &ctx->input(7),
                  &ctx->input(8), out, nullptr, nullptr, rel);
  }
};

// Paged KV-cache forward (spec §2.4): the keys of sequence b are its cached pages (all but the
// last full, the last holding last_page_len rows) followed by the fresh k/v rows of its
// num_target[b] target tokens (the last rows of the sequence); then the causal HSTU forward
// with the target-group rule. A decode step (at most kDecodeRows query rows per kv head in
// every sequence) reads the pages in place (HstuPagedDecodeItem, one item per sequence);
// otherwise the effective keys are gathered once (O(T·N·D)) and the shared tiled forward runs
// on them.
template <typename T>
class HstuPagedForwardOp : public HstuBase {
 public:
  using HstuBase::HstuBase;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& q = ctx->input(0);
    const Tensor& k = ctx->input(1);
    const Tensor& v = ctx->input(2);
    const Tensor& cache = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckRank(q, "q", 3));
    OP_REQUIRES_OK(ctx, CheckRank(k, "k", 3));
    OP_REQUIRES_OK(ctx, CheckRank(v, "v", 3));
    OP_REQUIRES_OK(ctx, CheckRank(cache, "kv_cache", 5));
    const int64_t heads_k = k.dim_size(1), dim = k.dim_size(2);
    const int64_t num_pages = cache.dim_size(0), page_size = cache.dim_size(2);
    OP_REQUIRES(ctx, k.dim_size(0) == q.dim_size(0) && v.shape() == k.shape(),
                absl::InvalidArgumentError(
                    absl::StrCat("k and v must be [Tq, Nk, D] rows of the same tokens as q, got q ",
                                 q.shape().DebugString(), ", k ", k.shape().DebugString(), ", v ",
                                 v.shape().DebugString())));
    OP_REQUIRES(ctx,
                cache.dim_size(1) == 2 && cache.dim_size(3) == heads_k &&
                    cache.dim_size(4) == dim && page_size >= 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "kv_cache must have shape [num_pages, 2, page_size, Nk, D] = [*, 2, *, ",
                    heads_k, ", ", dim, "], got ", cache.shape().DebugString())));
    std::vector<int64_t> off_q, page_off, page_ids, last_len, targets;
    OP_REQUIRES_OK(ctx, ReadOffsets(ctx->input(4), "seq_offsets", q.dim_size(0), &off_q));
    OP_REQUIRES_OK(ctx, ReadInt64Vector(ctx->input(6), "page_ids", &page_ids));
    OP_REQUIRES_OK(ctx, ReadOffsets(ctx->input(5), "page_offsets",
                                    static_cast<int64_t>(page_ids.size()), &page_off));
    OP_REQUIRES_OK(ctx, ReadInt64Vector(ctx->input(7), "last_page_len", &last_len));
    OP_REQUIRES_OK(ctx, ReadInt64Vector(ctx->input(8), "num_target", &targets));
    const int64_t batch = static_cast<int64_t>(off_q.size()) - 1;
    OP_REQUIRES(
        ctx,
        static_cast<int64_t>(page_off.size()) == batch + 1 &&
            static_cast<int64_t>(last_len.size()) == batch &&
            static_cast<int64_t>(targets.size()) == batch,
        absl::InvalidArgumentError(absl::StrCat("page_offsets must have ", batch + 1,
                                                " entries and last_page_len and "
                                                "num_target ",
                                                batch, " (one per sequence), got ", page_off.size(),
                                                ", ", last_len.size(), " and ", targets.size())));
    for (size_t i = 0; i < page_ids.size(); ++i) {
      OP_REQUIRES(
          ctx, page_ids[i] >= 0 && page_ids[i] < num_pages,
          absl::InvalidArgumentError(absl::StrCat("page_ids[", i, "] = ", page_ids[i],
                                                  " is out of range [0, ", num_pages, ")")));
    }
    // Key offsets: cache length + targets per sequence.
    Tensor off_k_t;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_temp(tensorflow::DT_INT64, TensorShape({batch + 1}), &off_k_t));
    auto off_k = off_k_t.flat<int64_t>();
    off_k(0) = 0;
    std::vector<int64_t> cache_len(batch);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t pages = page_off[b + 1] - page_off[b], lq = off_q[b + 1] - off_q[b];
      OP_REQUIRES(ctx, pages == 0 || (last_len[b] >= 1 && last_len[b] <= page_size),
                  absl::InvalidArgumentError(
                      absl::StrCat("last_page_len[", b, "] = ", last_len[b],
                                   " must lie in [1, page_size = ", page_size, "]")));
      OP_REQUIRES(ctx, targets[b] >= 0 && targets[b] <= lq,
                  absl::InvalidArgumentError(absl::StrCat("num_target[", b, "] = ", targets[b],
                                                          " must lie in [0, ", lq,
                                                          "] (the sequence length)")));
      cache_len[b] = pages == 0 ? 0 : (pages - 1) * page_size + last_len[b];
      off_k(b + 1) = off_k(b) + cache_len[b] + targets[b];
    }
    const int64_t rows_k = off_k(batch), row = heads_k * dim;
    const Tensor empty(tensorflow::DT_INT64, TensorShape({0}));
    const Tensor empty_t(q.dtype(), TensorShape({0}));
    const int64_t group = q.dim_size(1) / std::max<int64_t>(heads_k, 1);
    bool decode = true;
    for (int64_t b = 0; b < batch; ++b)
      decode = decode && group * (off_q[b + 1] - off_q[b]) <= kDecodeRows;
    if (decode) {
      const TensorShape kv_shape({rows_k, heads_k, dim});
      HstuCall call;
      OP_REQUIRES_OK(ctx, Prepare({&q, nullptr, nullptr, &ctx->input(4), &off_k_t, &empty,
                                   &ctx->input(8), &empty_t, &empty_t},
                                  &call, &kv_shape));
      Tensor* out = nullptr;
      OP_REQUIRES_OK(
          ctx, ctx->allocate_output(0, TensorShape({q.dim_size(0), call.p.heads_q, dim}), &out));
      HstuTensors<T> t;
      t.q = q.flat<T>().data();
      t.k = k.flat<T>().data();
      t.v = v.flat<T>().data();
      t.out = out->flat<T>().data();
      t.kv_cache = cache.flat<T>().data();
      t.page_ids = page_ids.data();
      t.page_offsets = page_off.data();
      t.last_page_len = last_len.data();
      t.page_size = page_size;
      std::vector<HstuItem> items;
      for (int64_t b = 0; b < batch; ++b) {
        if (off_q[b + 1] > off_q[b]) items.push_back({b, 0, 0, 0, off_k(b + 1) - off_k(b)});
      }
      std::stable_sort(items.begin(), items.end(),
                       [](const HstuItem& a, const HstuItem& b) { return a.cost > b.cost; });
      const auto item = HstuBestEntries<T>().paged_decode;
      ParallelForDynamic(ctx, items.size(), [&](int64_t i) { item(call.p, t, items[i]); });
      return;
    }
    // The effective keys and values.
    Tensor k_eff, v_eff;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(k.dtype(), TensorShape({rows_k, heads_k, dim}), &k_eff));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(k.dtype(), TensorShape({rows_k, heads_k, dim}), &v_eff));
    const T* cache_p = cache.flat<T>().data();
    const T* k_p = k.flat<T>().data();
    const T* v_p = v.flat<T>().data();
    T* ke = k_eff.flat<T>().data();
    T* ve = v_eff.flat<T>().data();
    ParallelFor(ctx, batch, 64 * row, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t dst = off_k(b);
        for (int64_t pg = page_off[b]; pg < page_off[b + 1]; ++pg) {
          const int64_t rows = pg + 1 < page_off[b + 1] ? page_size : last_len[b];
          const T* page = cache_p + page_ids[pg] * 2 * page_size * row;
          std::copy(page, page + rows * row, ke + dst * row);
          std::copy(page + page_size * row, page + (page_size + rows) * row, ve + dst * row);
          dst += rows;
        }
        const int64_t first = off_q[b + 1] - targets[b];
        std::copy(k_p + first * row, k_p + off_q[b + 1] * row, ke + dst * row);
        std::copy(v_p + first * row, v_p + off_q[b + 1] * row, ve + dst * row);
      }
    });
    HstuCall call;
    OP_REQUIRES_OK(ctx, Prepare({&q, &k_eff, &v_eff, &ctx->input(4), &off_k_t, &empty,
                                 &ctx->input(8), &empty_t, &empty_t},
                                &call));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(0, TensorShape({q.dim_size(0), call.p.heads_q, dim}), &out));
    RunForward<T>(ctx, call.p, q, k_eff, v_eff, nullptr, nullptr, out);
  }
};

template <typename T>
class HstuDenseBackwardOp : public HstuBase {
 public:
  using HstuBase::HstuBase;

  void Compute(OpKernelContext* ctx) override {
    using Acc = AccumT<T>;
    HstuCall call;
    OP_REQUIRES_OK(ctx, Prepare(ctx, 1, &call));
    HstuTensors<T> t;
    OP_REQUIRES_OK(ctx, PrepareRelBias<T>(ctx, 10, &call, &t));
    const HstuProblem& p = call.p;
    const Tensor& grad = ctx->input(0);
    const Tensor& q = ctx->input(1);
    OP_REQUIRES(ctx, grad.shape() == TensorShape({q.dim_size(0), p.heads_q, p.dim_v}),
                absl::InvalidArgumentError(
                    absl::StrCat("grad must have shape [Tq, Nq, Dv] = ",
                                 TensorShape({q.dim_size(0), p.heads_q, p.dim_v}).DebugString(),
                                 ", got ", grad.shape().DebugString())));
    Tensor *dq = nullptr, *dk = nullptr, *dv = nullptr, *dbias = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, q.shape(), &dq));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ctx->input(2).shape(), &dk));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(3).shape(), &dv));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ctx->input(9).shape(), &dbias));
    Tensor *d_time_w = nullptr, *d_pos_w = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, ctx->input(11).shape(), &d_time_w));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, ctx->input(12).shape(), &d_pos_w));
    t.grad = Ptr<T>(grad);
    t.q = Ptr<T>(q);
    t.k = Ptr<T>(ctx->input(2));
    t.v = Ptr<T>(ctx->input(3));
    t.mask = Ptr<T>(ctx->input(8));
    t.bias = Ptr<T>(ctx->input(9));
    t.dq = dq->flat<T>().data();
    t.dk = dk->flat<T>().data();
    t.dv = dv->flat<T>().data();
    t.dbias = dbias->flat<T>().data();
    if (p.has_bias) dbias->flat<T>().setZero();
    std::vector<Acc> rel_acc;
    if (p.rel_bias()) {
      rel_acc.assign(p.batch * p.heads_k * p.rel_hist_size(), Acc(0));
      t.rel_grad_acc = rel_acc.data();
    }
    RunBackward<T>(ctx, p, t);
    if (!p.rel_bias()) return;
    // Each weight's gradient: the items' histograms summed in (sequence, kv head) order
    // (deterministic); time buckets past the reachable ones get zero.
    const int64_t items = p.batch * p.heads_k, size = p.rel_hist_size();
    const auto reduce = [&](int64_t begin, int64_t n, int64_t valid, T* out) {
      ParallelFor(ctx, n, 4 * items, [&](int64_t e0, int64_t e1) {
        for (int64_t e = e0; e < e1; ++e) {
          Acc sum = Acc(0);
          for (int64_t it = 0; e < valid && it < items; ++it) sum += rel_acc[it * size + begin + e];
          out[e] = FromAcc<T, Acc>(sum);
        }
      });
    };
    if (p.time_bias) {
      reduce(0, d_time_w->NumElements(), p.hist_buckets, d_time_w->flat<T>().data());
    }
    if (p.pos_bias) {
      reduce(p.hist_buckets, 2 * max_k_ - 1, 2 * max_k_ - 1, d_pos_w->flat<T>().data());
    }
  }
};

#define REGISTER(T)                                                                           \
  REGISTER_KERNEL_BUILDER(                                                                    \
      Name("Recops>HstuDenseForward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),  \
      HstuDenseForwardOp<T>);                                                                 \
  REGISTER_KERNEL_BUILDER(                                                                    \
      Name("Recops>HstuDenseBackward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      HstuDenseBackwardOp<T>);                                                                \
  REGISTER_KERNEL_BUILDER(                                                                    \
      Name("Recops>HstuPagedForward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),  \
      HstuPagedForwardOp<T>);
RECOPS_CALL_FLOAT_TYPES(REGISTER)
#undef REGISTER

}  // namespace

// Cached forward (HstuCachedForward): the attention of a few new tokens over a sequence's
// cached keys and values, read in place (incremental inference: a user's next events against
// the rows an earlier call returned). One work item per (new token, head): its scores over the
// P + i + 1 visible keys, the relative bias, alpha, SiLU and scale rounded where the tiled
// forward (kernels/hstu_dense.h) rounds them, then the weighted sum of the values. No tiles: a
// few queries against the cache are memory-bound; a whole history goes through the tiled
// forward (HSTUBlock.extend picks).
namespace {

template <typename T>
const T* CachedData(const Tensor& t) {
  return reinterpret_cast<const T*>(t.tensor_data().data());
}

// One call's inputs of HstuCachedForward (pointers into validated tensors).
template <typename T>
struct CachedArgs {
  using Acc = AccumT<T>;
  const T *q, *k, *v, *past_k, *past_v, *time_w, *pos_w;
  const int64_t* ts;
  const BucketTable* table;
  const Bucketizer* exact;
  int64_t heads, dk, dv, past, wk, wv, key_column, value_column, max_len;
  bool time_bias, pos_bias;
  Acc alpha, scale;
  T* out;
};

// Work items [begin, end) of (new token i, head h): token i (position past + i) over keys
// 0..past + i; inlined into the per-ISA clones below.
template <typename T>
RECOPS_INLINE void CachedItems(const CachedArgs<T>& a, int64_t begin, int64_t end) {
  using Acc = AccumT<T>;
  constexpr int64_t kLanes = 16;  // independent partial sums: the dot product vectorises
  Acc acc[512], qa[512];          // dk, dv <= 512 (checked by the op)
  for (int64_t item = begin; item < end; ++item) {
    const int64_t i = item / a.heads, h = item % a.heads, pos_i = a.past + i;
    const T* qi = a.q + item * a.dk;
    for (int64_t d = 0; d < a.dk; ++d) qa[d] = ToAcc<T, Acc>(qi[d]);
    for (int64_t d = 0; d < a.dv; ++d) acc[d] = Acc(0);
    for (int64_t j = 0; j <= pos_i; ++j) {
      const T* kj = j < a.past ? a.past_k + j * a.wk + a.key_column + h * a.dk
                               : a.k + ((j - a.past) * a.heads + h) * a.dk;
      Acc part[kLanes] = {};
      int64_t d = 0;
      for (; d + kLanes <= a.dk; d += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) part[l] += qa[d + l] * ToAcc<T, Acc>(kj[d + l]);
      }
      for (int64_t l = 0; d < a.dk; ++d, ++l) part[l] += qa[d] * ToAcc<T, Acc>(kj[d]);
      Acc s = 0;
      for (int64_t l = 0; l < kLanes; ++l) s += part[l];
      Acc z = RoundTo<T, Acc>(s);
      if (a.time_bias || a.pos_bias) {
        Acc rel;
        if (a.time_bias) {
          const uint64_t gap = TimeGap(a.ts[j], a.ts[pos_i]);
          rel = ToAcc<T, Acc>(a.time_w[a.table != nullptr ? (*a.table)(gap) : (*a.exact)(gap)]);
          if (a.pos_bias) {
            rel = RoundTo<T, Acc>(rel + ToAcc<T, Acc>(a.pos_w[a.max_len - 1 + j - pos_i]));
          }
        } else {
          rel = ToAcc<T, Acc>(a.pos_w[a.max_len - 1 + j - pos_i]);
        }
        z += rel;
      }
      z *= a.alpha;
      const Acc p = RoundTo<T, Acc>(z / (Acc(1) + std::exp(-z)) * a.scale);
      const T* vj = j < a.past ? a.past_v + j * a.wv + a.value_column + h * a.dv
                               : a.v + ((j - a.past) * a.heads + h) * a.dv;
      for (int64_t d = 0; d < a.dv; ++d) acc[d] += p * ToAcc<T, Acc>(vj[d]);
    }
    T* oi = a.out + item * a.dv;
    for (int64_t d = 0; d < a.dv; ++d) oi[d] = static_cast<T>(acc[d]);
  }
}

// The float32 and bfloat16 items (the serving dtypes) compiled for AVX-512, AVX2 and baseline
// x86-64, picked at load time; the other dtypes at the baseline.
RECOPS_MULTIVERSION void CachedItemsFloat(const CachedArgs<float>& a, int64_t b, int64_t e) {
  CachedItems<float>(a, b, e);
}
RECOPS_MULTIVERSION void CachedItemsBfloat16(const CachedArgs<Eigen::bfloat16>& a, int64_t b,
                                             int64_t e) {
  CachedItems<Eigen::bfloat16>(a, b, e);
}
template <typename T>
void CachedItemsBest(const CachedArgs<T>& a, int64_t b, int64_t e) {
  if constexpr (std::is_same_v<T, float>) {
    CachedItemsFloat(a, b, e);
  } else if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
    CachedItemsBfloat16(a, b, e);
  } else {
    CachedItems<T>(a, b, e);
  }
}

template <typename T>
class HstuCachedForwardOp : public OpKernel {
 public:
  using Acc = AccumT<T>;

  explicit HstuCachedForwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key_column", &key_column_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("value_column", &value_column_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_seq_len", &max_len_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("alpha", &alpha_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("silu_scale", &silu_scale_));
    OP_REQUIRES_OK(ctx, buckets_.Init(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor &q = ctx->input(0), &k = ctx->input(1), &v = ctx->input(2);
    const Tensor &past_k = ctx->input(3), &past_v = ctx->input(4);
    const Tensor &ts = ctx->input(5), &time_w = ctx->input(6), &pos_w = ctx->input(7);
    OP_REQUIRES_OK(ctx, CheckRank(q, "q", 3));
    OP_REQUIRES_OK(ctx, CheckRank(k, "k", 3));
    OP_REQUIRES_OK(ctx, CheckRank(v, "v", 3));
    OP_REQUIRES_OK(ctx, CheckRank(past_k, "past_keys", 2));
    OP_REQUIRES_OK(ctx, CheckRank(past_v, "past_values", 2));
    OP_REQUIRES_OK(ctx, CheckRank(ts, "timestamps", 1));
    OP_REQUIRES_OK(ctx, CheckRank(time_w, "time_bias_weights", 1));
    OP_REQUIRES_OK(ctx, CheckRank(pos_w, "position_bias_weights", 1));
    const int64_t n = q.dim_size(0), heads = q.dim_size(1), dk = q.dim_size(2);
    const int64_t dv = v.dim_size(2), past = past_k.dim_size(0);
    OP_REQUIRES(
        ctx, k.shape() == q.shape(),
        absl::InvalidArgumentError(absl::StrCat("k must have q's shape ", q.shape().DebugString(),
                                                ", got ", k.shape().DebugString())));
    OP_REQUIRES(ctx, v.dim_size(0) == n && v.dim_size(1) == heads,
                absl::InvalidArgumentError(absl::StrCat(
                    "v must be [", n, ", ", heads, ", Dv] like q, got ", v.shape().DebugString())));
    OP_REQUIRES(ctx, dk <= 512 && dv <= 512,
                absl::InvalidArgumentError(
                    absl::StrCat("head dims must be at most 512, got Dqk ", dk, " and Dv ", dv)));
    OP_REQUIRES(ctx, past_v.dim_size(0) == past,
                absl::InvalidArgumentError(
                    absl::StrCat("past_keys and past_values must have the same rows, got ", past,
                                 " and ", past_v.dim_size(0))));
    OP_REQUIRES(ctx, key_column_ + heads * dk <= past_k.dim_size(1),
                absl::InvalidArgumentError(
                    absl::StrCat("past_keys has ", past_k.dim_size(1), " columns: key_column ",
                                 key_column_, " + heads x Dqk (", heads * dk, ") do not fit")));
    OP_REQUIRES(ctx, value_column_ + heads * dv <= past_v.dim_size(1),
                absl::InvalidArgumentError(
                    absl::StrCat("past_values has ", past_v.dim_size(1), " columns: value_column ",
                                 value_column_, " + heads x Dv (", heads * dv, ") do not fit")));
    const int64_t total = past + n;
    OP_REQUIRES(ctx, total <= max_len_,
                absl::InvalidArgumentError(
                    absl::StrCat("the sequence has ", total, " tokens (", past, " cached + ", n,
                                 " new), more than max_seq_len ", max_len_)));
    const bool time_bias = time_w.NumElements() > 0, pos_bias = pos_w.NumElements() > 0;
    OP_REQUIRES(
        ctx, !time_bias || ts.dim_size(0) == total,
        absl::InvalidArgumentError(absl::StrCat("timestamps must have one entry per token (", total,
                                                "), got shape ", ts.shape().DebugString())));
    OP_REQUIRES(ctx, !pos_bias || pos_w.dim_size(0) == 2 * max_len_ - 1,
                absl::InvalidArgumentError(
                    absl::StrCat("position_bias_weights must have shape [", 2 * max_len_ - 1,
                                 "] [2 * max_seq_len - 1], got ", pos_w.shape().DebugString())));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, heads, dv}), &out));
    if (out->NumElements() == 0) return;

    std::shared_ptr<const HstuBuckets> buckets;  // held by this call
    if (time_bias) buckets = buckets_.Get(time_w.dim_size(0));
    const BucketTable* table =
        buckets != nullptr && buckets->table.usable() ? &buckets->table : nullptr;
    const Bucketizer* exact_ptr = buckets != nullptr ? &buckets->exact : nullptr;
    const T *qp = CachedData<T>(q), *kp = CachedData<T>(k), *vp = CachedData<T>(v);
    const T *pkp = CachedData<T>(past_k), *pvp = CachedData<T>(past_v);
    const T* twp = time_bias ? CachedData<T>(time_w) : nullptr;
    const T* pwp = pos_bias ? CachedData<T>(pos_w) : nullptr;
    const int64_t* tsp = time_bias ? ts.flat<int64_t>().data() : nullptr;
    const int64_t wk = past_k.dim_size(1), wv = past_v.dim_size(1);
    const Acc alpha = static_cast<Acc>(alpha_);
    const Acc scale =
        static_cast<Acc>(silu_scale_ == 0.0f ? 1.0f / static_cast<float>(max_len_) : silu_scale_);
    T* op = reinterpret_cast<T*>(const_cast<char*>(out->tensor_data().data()));
    const int64_t cost = (total + 1) * (dk + dv + 8);
    const CachedArgs<T> args{qp,       kp,        vp,       pkp,       pvp,         twp,
                             pwp,      tsp,       table,    exact_ptr, heads,       dk,
                             dv,       past,      wk,       wv,        key_column_, value_column_,
                             max_len_, time_bias, pos_bias, alpha,     scale,       op};
    ParallelFor(ctx, n * heads, cost,
                [&](int64_t begin, int64_t end) { CachedItemsBest(args, begin, end); });
  }

 private:
  HstuBucketCache buckets_;
  int64_t key_column_ = 0, value_column_ = 0, max_len_ = 1;
  float alpha_ = 1.0f, silu_scale_ = 0.0f;
};

}  // namespace

#define REGISTER(T)                                                                           \
  REGISTER_KERNEL_BUILDER(                                                                    \
      Name("Recops>HstuCachedForward").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      HstuCachedForwardOp<T>);
RECOPS_CALL_FLOAT_TYPES(REGISTER)
#undef REGISTER

}  // namespace recops
