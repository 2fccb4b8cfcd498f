/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace fusedrec {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// ids: N x [n_i] -> keys [sum n_i], segments [sum n_i], feature_sizes [N].
Status FuseIdsShape(InferenceContext* c) {
  DimensionHandle total = c->MakeDim(0);
  for (int i = 0; i < c->num_inputs(); ++i) {
    ShapeHandle ids;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &ids));
    TF_RETURN_IF_ERROR(c->Add(total, c->Dim(ids, 0), &total));
  }
  c->set_output(0, c->Vector(total));
  c->set_output(1, c->Vector(total));
  c->set_output(2, c->Vector(c->num_inputs()));
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>FuseIds")
    .Input("ids: N * int64")
    .Attr("N: int >= 1")
    .Attr("categories: list(int)")
    .Output("keys: int64")
    .Output("segments: int32")
    .Output("feature_sizes: int32")
    .SetShapeFn(FuseIdsShape)
    .Doc(R"doc(
A group's ids fused into one key list in one pass: keys = concat(ids), segments[j] = categories[i] for each key of
ids[i], feature_sizes[i] = len(ids[i]). What concat, a size per feature, stack and repeat(categories, sizes) gave.
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
