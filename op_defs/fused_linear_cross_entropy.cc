// Stem fused_linear_cross_entropy: softmax cross-entropy of each position's target among the
// logits of a whole item matrix, computed block by block without the [P x N] logits.
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

namespace {

// states [P, d], items [N, d], targets [P]; the per-position outputs are [P].
absl::Status FlceShapes(InferenceContext* c, int first, ShapeHandle* states, ShapeHandle* items) {
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first), 2, states));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first + 1), 2, items));
  DimensionHandle d;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(*states, 1), c->Dim(*items, 1), &d));
  ShapeHandle targets;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first + 2), 1, &targets));
  DimensionHandle p;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(*states, 0), c->Dim(targets, 0), &p));
  for (int i = first + 3; i < first + 8; ++i) {
    ShapeHandle vector;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &vector));
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Recops>FusedLinearCrossEntropy")
    .Input("states: T")
    .Input("items: T")
    .Input("targets: Tidx")
    .Input("bias: T")
    .Input("extra_positions: Tidx")
    .Input("extra_items: Tidx")
    .Input("extra_values: T")
    .Input("weights: T")
    .Output("loss: Tout")
    .Output("lse: Tout")
    .Attr("T: {float, bfloat16, double}")
    .Attr("Tout: {float, double}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .Attr("temperature: float = 1.0")
    .Attr("label_smoothing: float = 0.0")
    .Attr("normalize_items: bool = false")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle states, items;
      TF_RETURN_IF_ERROR(FlceShapes(c, 0, &states, &items));
      ShapeHandle p = c->Vector(c->Dim(states, 0));
      c->set_output(0, p);
      c->set_output(1, p);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Per position p of states [P, d]: z_pj = <states_p, items_j> / temperature + bias_j + the
extra logits (extra_positions, extra_items, extra_values triples, summed) for every item j of
items [N, d]; lse_p = logsumexp_j z_pj and loss_p = weight_p ((1 - label_smoothing)
(lse_p - z_{p, targets_p}) + label_smoothing (lse_p - mean_j z_pj)). bias [N] or [0] (none),
weights [P] or [0] (all 1); positions of weight 0 are skipped (loss and lse 0). With
normalize_items, items_j / max(|items_j|, 1e-6) replaces items_j (block by block: no copy). Computed in
blocks of items and positions with an online logsumexp: no [P, N] buffer. Tout is float32
for float32 and bfloat16 inputs, float64 for float64.
)doc");

REGISTER_OP("Recops>FusedLinearCrossEntropyGrad")
    .Input("dloss: Tout")
    .Input("dlse: Tout")
    .Input("states: T")
    .Input("items: T")
    .Input("targets: Tidx")
    .Input("bias: T")
    .Input("extra_positions: Tidx")
    .Input("extra_items: Tidx")
    .Input("extra_values: T")
    .Input("weights: T")
    .Input("lse: Tout")
    .Output("dstates: T")
    .Output("ditems: T")
    .Output("dbias: T")
    .Output("dextra_values: T")
    .Attr("T: {float, bfloat16, double}")
    .Attr("Tout: {float, double}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .Attr("temperature: float = 1.0")
    .Attr("label_smoothing: float = 0.0")
    .Attr("normalize_items: bool = false")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle states, items;
      TF_RETURN_IF_ERROR(FlceShapes(c, 2, &states, &items));
      c->set_output(0, states);
      c->set_output(1, items);
      c->set_output(2, c->input(5));
      c->set_output(3, c->input(8));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of FusedLinearCrossEntropy w.r.t. states, items, bias and extra_values from the
upstream gradients of loss and lse and the forward's lse: the logits recomputed block by
block, dz_pj = (dloss_p weight_p + dlse_p) softmax_pj - dloss_p weight_p ((1 -
label_smoothing) [j = target_p] + label_smoothing / N); no [P, N] buffer.
)doc");

REGISTER_OP("Recops>FusedLinearCrossEntropyWithGrad")
    .Input("states: T")
    .Input("items: T")
    .Input("targets: Tidx")
    .Input("bias: T")
    .Input("extra_positions: Tidx")
    .Input("extra_items: Tidx")
    .Input("extra_values: T")
    .Input("weights: T")
    .Output("loss: Tout")
    .Output("lse: Tout")
    .Output("unit_dstates: Tout")
    .Output("unit_ditems: Tout")
    .Output("unit_dbias: Tout")
    .Output("unit_dextra_values: Tout")
    .Attr("T: {float, bfloat16, double}")
    .Attr("Tout: {float, double}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .Attr("temperature: float = 1.0")
    .Attr("label_smoothing: float = 0.0")
    .Attr("normalize_items: bool = false")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle states, items;
      TF_RETURN_IF_ERROR(FlceShapes(c, 0, &states, &items));
      ShapeHandle p = c->Vector(c->Dim(states, 0));
      c->set_output(0, p);
      c->set_output(1, p);
      c->set_output(2, states);
      c->set_output(3, items);
      c->set_output(4, c->input(3));
      c->set_output(5, c->input(6));
      return absl::OkStatus();
    })
    .Doc(R"doc(
FusedLinearCrossEntropy's loss and lse, and the gradients of states, items, bias and
extra_values for dloss = 1 and dlse = 0, in one pass (a training step's loss is summed or
averaged over positions: its upstream gradient is one value, applied by
FusedLinearCrossEntropyApplyGrad). The unit gradients are Tout (float for bfloat16 inputs),
rounded to T once, after the upstream's factor. Per block of positions the logits over the whole catalogue
are made once (a panel per thread, bounded by RECOPS_FLCE_PANEL_MB, default 256 MiB; past it
the forward and then the backward run): three products instead of the four of forward +
backward. Never a [P, N] buffer.
)doc");

REGISTER_OP("Recops>FusedLinearCrossEntropyApplyGrad")
    .Input("dloss: Tout")
    .Input("dlse: Tout")
    .Input("unit_dstates: Tout")
    .Input("unit_ditems: Tout")
    .Input("unit_dbias: Tout")
    .Input("unit_dextra_values: Tout")
    .Input("states: T")
    .Input("items: T")
    .Input("targets: Tidx")
    .Input("bias: T")
    .Input("extra_positions: Tidx")
    .Input("extra_items: Tidx")
    .Input("extra_values: T")
    .Input("weights: T")
    .Input("lse: Tout")
    .Output("dstates: T")
    .Output("ditems: T")
    .Output("dbias: T")
    .Output("dextra_values: T")
    .Attr("T: {float, bfloat16, double}")
    .Attr("Tout: {float, double}")
    .Attr("Tidx: {int32, int64} = DT_INT64")
    .Attr("temperature: float = 1.0")
    .Attr("label_smoothing: float = 0.0")
    .Attr("normalize_items: bool = false")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle states, items;
      TF_RETURN_IF_ERROR(FlceShapes(c, 6, &states, &items));
      c->set_output(0, states);
      c->set_output(1, items);
      c->set_output(2, c->input(9));
      c->set_output(3, c->input(12));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of FusedLinearCrossEntropyWithGrad: where dlse is 0 and dloss one value g at every
position, g times the forward's unit gradients; otherwise FusedLinearCrossEntropyGrad's
backward from the inputs and lse.
)doc");

}  // namespace recops
