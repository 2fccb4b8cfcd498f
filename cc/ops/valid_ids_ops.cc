/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace fusedrec {
namespace {

using shape_inference::InferenceContext;

// ids: N x any shape -> valid: N x [?], positions: N x [?].
Status ValidIdsShape(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) {
    c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
    c->set_output(c->num_inputs() + i, c->Vector(InferenceContext::kUnknownDim));
  }
  return OkStatus();
}

// ids: N x any shape -> lows [N], highs [N].
Status IdExtremesShape(InferenceContext* c) {
  c->set_output(0, c->Vector(c->num_inputs()));
  c->set_output(1, c->Vector(c->num_inputs()));
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>ValidIds")
    .Input("ids: N * int64")
    .Attr("N: int >= 1")
    .Output("valid: N * int64")
    .Output("positions: N * int64")
    .SetShapeFn(ValidIdsShape)
    .Doc(R"doc(
The valid ids (>= 0; -1 marks padding) of N features, in one op: for each ids[i] (any shape, read flat in row-major
order) valid[i] = its ids >= 0 in order and positions[i] their flat positions. What a feature's
positions = Reshape(Where(ids >= 0), [-1]) and valid = GatherV2(ids, positions) gave, for all features at once.
)doc");

REGISTER_OP("FusedRec>IdExtremes")
    .Input("ids: N * int64")
    .Attr("N: int >= 1")
    .Output("lows: int64")
    .Output("highs: int64")
    .SetShapeFn(IdExtremesShape)
    .Doc(R"doc(
The smallest and the largest id of each of N features (any shape), in one op: lows[i] = Min(ids[i]) and
highs[i] = Max(ids[i]) over all its elements; an empty ids[i] gives int64's largest value as its low and its
smallest as its high (what Min and Max give). What the layer's value checks reduce (negative ids, ids too large).
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
