/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include <string>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace fusedrec {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// keys [N], segment_ids [N] -> message [U] (packed) or [U, 2] (pair), splits [num_ranks], recover_index [N],
// segment_counts [num_segments].
Status FusedSenderShape(InferenceContext* c) {
  int64_t num_ranks, num_segments;
  TF_RETURN_IF_ERROR(c->GetAttr("num_ranks", &num_ranks));
  if (num_ranks < 1) return errors::InvalidArgument("num_ranks must be >= 1, got ", num_ranks);
  TF_RETURN_IF_ERROR(c->GetAttr("num_segments", &num_segments));
  if (num_segments < 1) return errors::InvalidArgument("num_segments must be >= 1, got ", num_segments);
  std::string wire;
  TF_RETURN_IF_ERROR(c->GetAttr("wire", &wire));
  ShapeHandle keys, segment_ids;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &segment_ids));
  DimensionHandle n;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(segment_ids, 0), &n));
  const DimensionHandle unique = c->UnknownDim();
  c->set_output(0, wire == "packed" ? c->Vector(unique) : c->Matrix(unique, 2));
  c->set_output(1, c->Vector(num_ranks));
  c->set_output(2, c->Vector(n));
  c->set_output(3, c->Vector(num_segments));
  return OkStatus();
}

// As FusedSenderShape, with hot_keys [T] and feature_sizes [F] -> hot_position [h], hot_hits [F].
Status FusedSenderHotShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(FusedSenderShape(c));
  ShapeHandle hot_keys, feature_sizes;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &hot_keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &feature_sizes));
  c->set_output(4, c->Vector(c->UnknownDim()));
  c->set_output(5, c->Vector(c->Dim(feature_sizes, 0)));
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>FusedSender")
    .Input("keys: T")
    .Input("segment_ids: int32")
    .Output("message: int64")
    .Output("splits: int32")
    .Output("recover_index: int32")
    .Output("segment_counts: int64")
    .Attr("T: {int32, int64}")
    .Attr("num_ranks: int")
    .Attr("num_segments: int")
    .Attr("wire: {'packed', 'pair'} = 'packed'")
    .SetShapeFn(FusedSenderShape)
    .Doc(R"doc(
The sender side of a fused group lookup in one op, equal to the chain SegmentUnique, PartitionByOwner, then the
wire's encoding. The unique (segment_id, key) pairs, in first-occurrence order, are stably reordered by owner rank
(Mix64(uint64(int64(key))) mod num_ranks, as OwnerOf) and encoded for the keys all-to-all. With wire 'packed',
message[j] = (segment << (63 - b)) | key with b = max(1, ceil(log2(num_segments))), for keys in [0, 2^(63-b));
with wire 'pair', message[j] = [key, segment]. splits[r] is the number of pairs owned by rank r; recover_index[i]
is the position in message of the pair at fused position i; segment_counts[s] is the number of unique pairs of
segment s. segment_ids must lie in [0, num_segments).
)doc");

REGISTER_OP("FusedRec>FusedSenderHot")
    .Input("keys: T")
    .Input("segment_ids: int32")
    .Input("hot_keys: int64")
    .Input("feature_sizes: int32")
    .Output("message: int64")
    .Output("splits: int32")
    .Output("recover_index: int32")
    .Output("segment_counts: int64")
    .Output("hot_position: int32")
    .Output("hot_hits: int64")
    .Attr("T: {int32, int64}")
    .Attr("num_ranks: int")
    .Attr("num_segments: int")
    .Attr("wire: {'packed', 'pair'} = 'packed'")
    .SetShapeFn(FusedSenderHotShape)
    .Doc(R"doc(
FusedSender for a group with a replicated hot set: hot_keys holds the set's unified keys, sorted ascending without
repeats (the packed word for wire 'packed', HashedUnifiedKey(key, segment) for wire 'pair', as CategoryUnique forms
them). A unique pair whose unified key is in hot_keys is not sent: message, splits and segment_counts hold the other
(cold) pairs only, as FusedSender of the cold pairs would; the h hot pairs, in first-occurrence order, get
recover_index values C, C + 1, ..., C + h - 1 past the message's C pairs, and hot_position[k] is the k-th hot
pair's position in hot_keys. feature_sizes (non-negative, summing to N) splits the fused positions into features in
order; hot_hits[f] counts feature f's positions whose pair is hot. Equal to the chain SegmentUnique, a searchsorted
of the unified keys in hot_keys, then FusedSender's partition and encoding of the cold pairs.
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
