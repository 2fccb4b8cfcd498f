/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace fusedrec {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// row_splits [B + 1], positions [n] -> [n].
Status RowIdsShape(InferenceContext* c) {
  ShapeHandle splits, positions;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &splits));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &positions));
  c->set_output(0, positions);
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>RowIds")
    .Input("row_splits: T")
    .Input("positions: T")
    .Output("rows: T")
    .Attr("T: {int32, int64}")
    .SetShapeFn(RowIdsShape)
    .Doc(R"doc(
The row of each flat position of a ragged layout: rows[i] = the number of row ends row_splits[1:] that are <= positions[i]
(the row b with row_splits[b] <= positions[i] < row_splits[b + 1] for a position inside the values), exactly
UpperBound(row_splits[1:], positions) for non-decreasing row_splits, for any positions. Positions in non-decreasing
order (a mask's true positions, or every position) cost one pass over both inputs instead of a binary search each.
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
