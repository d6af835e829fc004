// Stem embedding_by_address: the growing embedding table resource and the Rec SDK's
// by-address lookup and update (cust_op_by_addr).
#include "op_defs/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recops {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

namespace {

absl::Status ScalarTable(InferenceContext* c) {
  ShapeHandle unused;
  return c->WithRank(c->input(0), 0, &unused);
}

}  // namespace

REGISTER_OP("Recops>DynamicEmbeddingTable")
    .Output("table: resource")
    .Attr("dim: int >= 1")
    .Attr("num_slots: int >= 0 = 0")
    .Attr("block_rows: int >= 1 = 65536")
    .Attr("initializer: string = 'uniform'")
    .Attr("init_a: float = -0.05")
    .Attr("init_b: float = 0.05")
    .Attr("seed: int = 0")
    .Attr("has_padding_key: bool = false")
    .Attr("padding_key: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Creates an empty growing embedding table: int64 keys -> float32 rows of
dim * (1 + num_slots) columns ([embedding | slots]), allocated block_rows at a time. The
returned handle owns the table (it is freed with the last handle). initializer fills the
embedding columns of a new row as a function of (seed, key, column): zeros, constant (init_a),
uniform [init_a, init_b), normal or truncated_normal (mean init_a, stddev init_b).
)doc");

REGISTER_OP("Recops>DynamicEmbeddingLookupAddresses")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("training: bool")
    .Output("addresses: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(ScalarTable(c));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The address of each key's row: the padding key -> 0; an unknown key -> a new row when
training, else 0 (nothing is allocated).
)doc");

REGISTER_OP("Recops>DynamicEmbeddingTableSize")
    .Input("table: resource")
    .Output("size: int64")
    .Output("capacity: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(ScalarTable(c));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("Rows in use and rows allocated.");

REGISTER_OP("Recops>DynamicEmbeddingTableExport")
    .Input("table: resource")
    .Output("keys: int64")
    .Output("rows: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(ScalarTable(c));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc("Every key and its full row (embedding and slots), in row order.");

REGISTER_OP("Recops>DynamicEmbeddingTableImport")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("rows: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(ScalarTable(c));
      TF_RETURN_IF_ERROR(RequireVector(c, 1));
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &rows));
      DimensionHandle unused;
      return c->Merge(c->Dim(c->input(1), 0), c->Dim(rows, 0), &unused);
    })
    .Doc(R"doc(
Replaces the table's contents with keys -> rows (full rows). Addresses handed out before
are no longer valid.
)doc");

REGISTER_OP("Recops>EmbeddingLookupByAddress")
    .Input("table: resource")
    .Input("address: int64")
    .Output("y: float")
    .Attr("embedding_dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(ScalarTable(c));
      TF_RETURN_IF_ERROR(RequireVector(c, 1));
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("embedding_dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(c->input(1), 0), dim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
y[i, :] = the first embedding_dim columns of the row at address[i]; zeros for address 0.
Every other address must be one of this table's.
)doc");

REGISTER_OP("Recops>EmbeddingUpdateByAddress")
    .Input("table: resource")
    .Input("address: int64")
    .Input("embedding: float")
    .Output("y: float")
    .Attr("update_type: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(ScalarTable(c));
      TF_RETURN_IF_ERROR(RequireVector(c, 1));
      ShapeHandle embedding;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &embedding));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(c->input(1), 0), c->Dim(embedding, 0), &unused));
      c->set_output(0, embedding);
      return absl::OkStatus();
    })
    .Doc(R"doc(
For each address[i] != 0: update_type 0 adds embedding[i, :] to the first D columns of the
row (duplicates sum), 1 assigns it (the last duplicate wins). y is embedding unchanged.
)doc");

}  // namespace recops
