// Shape functions shared by the op definitions.
#ifndef RECOPS_OP_DEFS_SHAPE_FNS_H_
#define RECOPS_OP_DEFS_SHAPE_FNS_H_

#include "absl/status/status.h"

namespace tensorflow {
namespace shape_inference {
class InferenceContext;
}  // namespace shape_inference
}  // namespace tensorflow

namespace recops {

// Output 0 has the shape of input 0.
absl::Status UnchangedShape(tensorflow::shape_inference::InferenceContext* c);

// Checks that input `input` is a vector (rank 1) and returns OK.
absl::Status RequireVector(tensorflow::shape_inference::InferenceContext* c, int input);

}  // namespace recops

#endif  // RECOPS_OP_DEFS_SHAPE_FNS_H_
