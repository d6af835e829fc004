#include "op_defs/shape_fns.h"

#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

absl::Status UnchangedShape(InferenceContext* c) {
  c->set_output(0, c->input(0));
  return absl::OkStatus();
}

absl::Status RequireVector(InferenceContext* c, int input) {
  ShapeHandle unused;
  return c->WithRank(c->input(input), 1, &unused);
}

}  // namespace recops
