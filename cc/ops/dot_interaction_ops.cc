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

// x [B, F, D] (feature_major: [F, B, D]) -> [B, F (F - 1) / 2].
Status DotInteractionShape(InferenceContext* c) {
  ShapeHandle x;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &x));
  bool feature_major = false;
  TF_RETURN_IF_ERROR(c->GetAttr("feature_major", &feature_major));
  DimensionHandle f = c->Dim(x, feature_major ? 0 : 1);
  DimensionHandle pairs = c->UnknownDim();
  if (c->ValueKnown(f)) pairs = c->MakeDim(c->Value(f) * (c->Value(f) - 1) / 2);
  c->set_output(0, c->Matrix(c->Dim(x, feature_major ? 1 : 0), pairs));
  return OkStatus();
}

// grad [B, P], x [B, F, D] (feature_major: [F, B, D]) -> x's shape.
Status DotInteractionGradShape(InferenceContext* c) {
  ShapeHandle grad, x;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &x));
  c->set_output(0, x);
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>DotInteraction")
    .Input("x: float")
    .Output("pairs: float")
    .Attr("feature_major: bool = false")
    .SetShapeFn(DotInteractionShape)
    .Doc(R"doc(
DLRM's pairwise interactions without the [F, F] products: pairs[b] holds dot(x[b, i], x[b, j]) for every i < j, row
by row (i = 0: j = 1 .. F - 1, then i = 1, ...), F (F - 1) / 2 values; equal, up to the order of each dot product's
additions, to UpperTriangle(matmul(x, x, transpose_b=True)). feature_major: x is [F, B, D] (x[i, b] is example b's
vector i), with values bit for bit those of the op on the transposed x.
)doc");

REGISTER_OP("FusedRec>DotInteractionGrad")
    .Input("grad: float")
    .Input("x: float")
    .Output("x_grad: float")
    .Attr("feature_major: bool = false")
    .SetShapeFn(DotInteractionGradShape)
    .Doc(R"doc(
The gradient of DotInteraction: x_grad[b, i] = sum over j != i of grad[b, pair(min(i, j), max(i, j))] * x[b, j]
(feature_major: x and x_grad [F, B, D]).
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
