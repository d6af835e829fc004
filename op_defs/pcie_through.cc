// Stem pcie_through: the Rec SDK's host swap of table rows (RmaSwapMultiTables) and the bounded
// host channel it moves rows through.
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

namespace {

absl::Status ScalarChannel(InferenceContext* c) {
  ShapeHandle unused;
  return c->WithRank(c->input(0), 0, &unused);
}

}  // namespace

REGISTER_OP("Recops>HostChannel")
    .Output("channel: resource")
    .Attr("capacity: int >= 1 = 50")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
A bounded FIFO of tensors in host memory. With a shared_name, every op of the process
naming it gets the same channel (its capacity must match); without one, a new channel
that lives as long as its handles.
)doc");

REGISTER_OP("Recops>HostChannelPush")
    .Input("channel: resource")
    .Input("value: T")
    .Attr("T: type")
    .Attr("timeout_seconds: float = 10.0")
    .SetIsStateful()
    .SetShapeFn(ScalarChannel)
    .Doc("Appends value, waiting up to timeout_seconds for room (DeadlineExceeded).");

REGISTER_OP("Recops>HostChannelPop")
    .Input("channel: resource")
    .Output("value: dtype")
    .Attr("dtype: type")
    .Attr("timeout_seconds: float = 10.0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(ScalarChannel(c));
      c->set_output(0, c->UnknownShape());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Removes and returns the oldest item, waiting up to timeout_seconds for one
(DeadlineExceeded); an item of another dtype stays and is an InvalidArgument.
)doc");

REGISTER_OP("Recops>HostChannelSize")
    .Input("channel: resource")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(ScalarChannel(c));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("Number of items in the channel.");

REGISTER_OP("Recops>HostChannelClose")
    .Input("channel: resource")
    .SetIsStateful()
    .SetShapeFn(ScalarChannel)
    .Doc(R"doc(
Closes the channel: waiting and later pushes fail (Cancelled); pops drain the items left,
then fail (OutOfRange).
)doc");

REGISTER_OP("Recops>RmaSwapMultiTables")
    .Input("tables: N * resource")
    .Input("swap_in_index: int64")
    .Input("swap_out_index: int64")
    .Input("channel_in: resource")
    .Input("channel_out: resource")
    .Output("status: int64")
    .Attr("N: int >= 1")
    .Attr("timeout_seconds: float = 10.0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      const int n = c->num_inputs() - 4;
      TF_RETURN_IF_ERROR(RequireVector(c, n));
      TF_RETURN_IF_ERROR(RequireVector(c, n + 1));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
The Rec SDK's host swap on N (1..6) float32 [V, D] tables: pushes one item
[N_out, N*D] = the rows swap_out_index of every table side by side to channel_out, then
pops one item [N_in, N*D] from channel_in and writes its pieces to rows swap_in_index of
the tables (all reads before any write). status: 0 done, 1 channel_out stayed full,
2 channel_in stayed empty, 3 a channel was closed (nothing written in cases 1-3).
)doc");

}  // namespace recops
