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

// keys [N], segment_ids [N] -> unified_keys [U], inverse [N], unique_segment_ids [U], segment_counts [S].
Status CategoryUniqueShape(InferenceContext* c) {
  int64_t num_segments;
  TF_RETURN_IF_ERROR(c->GetAttr("num_segments", &num_segments));
  if (num_segments < 1) {
    return errors::InvalidArgument("num_segments must be >= 1, got ", num_segments);
  }
  ShapeHandle keys, segment_ids;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &segment_ids));
  DimensionHandle n;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(segment_ids, 0), &n));
  const ShapeHandle unique = c->Vector(InferenceContext::kUnknownDim);
  c->set_output(0, unique);
  c->set_output(1, c->Vector(n));
  c->set_output(2, unique);
  c->set_output(3, c->Vector(num_segments));
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>CategoryUnique")
    .Input("keys: T")
    .Input("segment_ids: int32")
    .Output("unified_keys: int64")
    .Output("inverse: int32")
    .Output("unique_segment_ids: int32")
    .Output("segment_counts: int32")
    .Attr("T: {int32, int64}")
    .Attr("num_segments: int")
    .Attr("encoding: {'packed', 'hashed'} = 'packed'")
    .SetShapeFn(CategoryUniqueShape)
    .Doc(R"doc(
Owner-side unique over received (segment_id, key) pairs in first-occurrence order, producing one unified int64
key per pair for the group's table. encoding 'packed': (segment << (63 - b)) | key with
b = max(1, ceil(log2(num_segments))), lossless, keys must lie in [0, 2^(63-b)). encoding 'hashed': a 64-bit hash
of (segment, key), collision-free within a segment. segment_counts[s] = unique pairs of segment s.
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
