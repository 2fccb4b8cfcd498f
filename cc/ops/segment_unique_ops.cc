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

// keys [N], segment_ids [N] -> unique_keys [U], unique_segment_ids [U], inverse [N], counts [U].
Status SegmentUniqueShape(InferenceContext* c) {
  ShapeHandle keys, segment_ids;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &segment_ids));
  DimensionHandle n;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(segment_ids, 0), &n));
  const ShapeHandle unique = c->Vector(InferenceContext::kUnknownDim);
  c->set_output(0, unique);
  c->set_output(1, unique);
  c->set_output(2, c->Vector(n));
  c->set_output(3, unique);
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>SegmentUnique")
    .Input("keys: T")
    .Input("segment_ids: int32")
    .Output("unique_keys: T")
    .Output("unique_segment_ids: int32")
    .Output("inverse: int32")
    .Output("counts: int32")
    .Attr("T: {int32, int64}")
    .SetShapeFn(SegmentUniqueShape)
    .Doc(R"doc(
Unique over (segment_id, key) pairs of a fused group, in first-occurrence order. The same key in two segments is
kept twice. unique_keys[inverse[i]] == keys[i] and unique_segment_ids[inverse[i]] == segment_ids[i];
counts[u] is the number of occurrences of pair u.
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
