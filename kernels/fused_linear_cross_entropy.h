// Fused linear cross-entropy (stem fused_linear_cross_entropy): the softmax cross-entropy of
// P positions' targets among the logits of N items, z = S·Eᵀ / temperature + bias + sparse
// extra logits, computed in tiles of kFlceItems items x kFlcePositions positions without ever
// holding the [P x N] logits (Cut Cross-Entropy's scheme, on CPU threads):
//
//  - forward: each thread (a "lane") takes blocks of items in ascending order from a shared
//    share (every lanes-th block); per block, a tile of logits for every block of positions (one
//    GEMM, the block's items as A so the tile is [items x positions] and its reductions run across
//    vectors of positions), then an online logsumexp per position (a running max and sum for the
//    lane); the lanes' partial sums are merged at the end;
//  - backward: the same tiles recomputed, G = c_p exp(z - lse_p) (the softmax scaled by the
//    upstream gradient), dE[block] += Gᵀ-side GEMM with the positions' states (rows of E are
//    the lane's own, written once), dS += G·E[block] into the lane's own [P x d] buffer (summed
//    over lanes at the end). The one-hot and label-smoothing terms of dz are rank-one and
//    sparse corrections applied outside the tiles.
//
// Memory: O((P + N) d) besides the inputs and outputs (the lanes' dS buffers, P x d each), and
// O(kFlceItems x kFlcePositions) per lane for the tile. bfloat16 inputs are multiplied exactly
// (products of bfloat16 numbers summed in float32: AVX512-BF16 or AMX tiles where the CPU has
// them, float32 FMAs elsewhere); G is rounded to bfloat16 before its two GEMMs, and dS, dE are
// rounded once at the end (the rounding points of the tolerance table).
#ifndef RECOPS_KERNELS_FUSED_LINEAR_CROSS_ENTROPY_H_
#define RECOPS_KERNELS_FUSED_LINEAR_CROSS_ENTROPY_H_

#include <cstdint>
#include <vector>

namespace tensorflow {
class OpKernelContext;
}  // namespace tensorflow

namespace recops {

// Positions per tile (the tile's columns: whole vectors on every path) and items per tile.
constexpr int64_t kFlcePositions = 64;
constexpr int64_t kFlceItems = 256;

// The op's inputs, read-only, indices already checked and widened to int64.
template <typename T>
struct FlceInputs {
  const T* states = nullptr;  // [P, d]
  const T* items = nullptr;   // [N, d]
  int64_t P = 0, N = 0, d = 0;
  std::vector<int64_t> targets;                       // [P]
  const T* bias = nullptr;                            // [N], or nullptr
  std::vector<int64_t> extra_positions, extra_items;  // [K]
  const T* extra_values = nullptr;                    // [K]
  const T* weights = nullptr;                         // [P], or nullptr: all 1
  float temperature = 1.0f, label_smoothing = 0.0f;
  bool normalize_items = false;  // l2-normalise the item rows block by block (no [N, d] copy)
};

// Forward: loss [P] and lse [P] (Acc: float for float / bfloat16, double for double).
template <typename T, typename Acc>
void FlceForward(tensorflow::OpKernelContext* ctx, const FlceInputs<T>& in, Acc* loss, Acc* lse);

// Backward: from dloss, dlse and lse [P], the gradients of states [P, d], items [N, d] (ditems
// may be in.items' own buffer: every row is read before its gradient is written), bias
// [N] (dbias nullptr: none) and extra_values [K], as O (T, or Acc for FlceForwardBackward).
template <typename T, typename Acc, typename O = T>
void FlceBackward(tensorflow::OpKernelContext* ctx, const FlceInputs<T>& in, const Acc* dloss,
                  const Acc* dlse, const Acc* lse, O* dstates, O* ditems, O* dbias,
                  O* dextra_values);

// Forward and the gradients for dloss = 1 and dlse = 0 in one pass (the training step's
// case: a loss summed or averaged over positions has a uniform upstream gradient, which the
// gradient op applies as a factor; the unit gradients are Acc, so that bfloat16's are rounded
// once, after that factor): per block of positions, its logits over the whole
// catalogue are made once into a panel [N x kPb] per thread, exp'd once, and turned into the
// softmax gradient in place: 3 products (S·Eᵀ, G·S, Eᵀ·G) where forward + backward make 4.
// Memory: per thread N x (kPb + dp) values besides an [N x dp] copy of the items (and its
// bfloat16 pairs for bfloat16 inputs); past RECOPS_FLCE_PANEL_MB (default 256 MiB), past
// 50,000 items (where the panels spill from the caches and one pass is no longer faster), and
// for bfloat16 inputs on a CPU without bfloat16 dot products, it runs FlceForward and then
// FlceBackward.
template <typename T, typename Acc>
void FlceForwardBackward(tensorflow::OpKernelContext* ctx, const FlceInputs<T>& in, Acc* loss,
                         Acc* lse, Acc* dstates, Acc* ditems, Acc* dbias, Acc* dextra_values);

}  // namespace recops

#endif  // RECOPS_KERNELS_FUSED_LINEAR_CROSS_ENTROPY_H_
