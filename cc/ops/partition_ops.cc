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

Status GetNumRanks(InferenceContext* c, int64_t* num_ranks) {
  TF_RETURN_IF_ERROR(c->GetAttr("num_ranks", num_ranks));
  if (*num_ranks < 1) {
    return errors::InvalidArgument("num_ranks must be >= 1, got ", *num_ranks);
  }
  return OkStatus();
}

// keys [N] -> owners [N].
Status OwnerOfShape(InferenceContext* c) {
  int64_t num_ranks;
  TF_RETURN_IF_ERROR(GetNumRanks(c, &num_ranks));
  ShapeHandle keys;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
  c->set_output(0, keys);
  return OkStatus();
}

// keys [N], segment_ids: 0 or 1 x [N] -> keys [N], segment_ids: 0 or 1 x [N], splits [num_ranks], order [N].
Status PartitionByOwnerShape(InferenceContext* c) {
  int64_t num_ranks;
  TF_RETURN_IF_ERROR(GetNumRanks(c, &num_ranks));
  int64_t num_segment_inputs;
  TF_RETURN_IF_ERROR(c->GetAttr("num_segment_inputs", &num_segment_inputs));
  if (num_segment_inputs > 1) {
    return errors::InvalidArgument("at most one segment_ids tensor may be given, got ", num_segment_inputs);
  }
  ShapeHandle keys;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
  DimensionHandle n = c->Dim(keys, 0);
  for (int64_t i = 0; i < num_segment_inputs; ++i) {
    ShapeHandle segment_ids;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(1 + i), 1, &segment_ids));
    TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(segment_ids, 0), &n));
  }
  int out = 0;
  c->set_output(out++, c->Vector(n));
  for (int64_t i = 0; i < num_segment_inputs; ++i) c->set_output(out++, c->Vector(n));
  c->set_output(out++, c->Vector(num_ranks));
  c->set_output(out++, c->Vector(n));
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>OwnerOf")
    .Input("keys: T")
    .Output("owners: int32")
    .Attr("T: {int32, int64}")
    .Attr("num_ranks: int")
    .SetShapeFn(OwnerOfShape)
    .Doc(R"doc(
Owner rank of each key: Mix64(uint64(int64(key))) mod num_ranks, Mix64 being the splitmix64 finalizer.
Depends on the key only, so the same id of two categories has the same owner.
)doc");

REGISTER_OP("FusedRec>PartitionByOwner")
    .Input("keys: T")
    .Input("segment_ids: num_segment_inputs * int32")
    .Output("out_keys: T")
    .Output("out_segment_ids: num_segment_inputs * int32")
    .Output("splits: int32")
    .Output("order: int32")
    .Attr("T: {int32, int64}")
    .Attr("num_ranks: int")
    .Attr("num_segment_inputs: int >= 0")
    .SetShapeFn(PartitionByOwnerShape)
    .Doc(R"doc(
Stable reorder of keys (and their segment ids) by owner rank: rank 0's keys first, then rank 1's, ...
splits[r] is the number of keys owned by rank r; out_keys[j] == keys[order[j]].
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
