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

// xs: N x [B, D] of one shape -> [B, N (N - 1) / 2].
Status DotInteractionNShape(InferenceContext* c) {
  ShapeHandle x;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
  for (int i = 1; i < c->num_inputs(); ++i) {
    ShapeHandle xi;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &xi));
    TF_RETURN_IF_ERROR(c->Merge(x, xi, &x));
  }
  const int64_t f = c->num_inputs();
  c->set_output(0, c->Matrix(c->Dim(x, 0), f * (f - 1) / 2));
  return OkStatus();
}

// grad [B, P], xs: N x [B, D] -> [N, B, D].
Status DotInteractionNGradShape(InferenceContext* c) {
  ShapeHandle grad, x;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &x));
  for (int i = 2; i < c->num_inputs(); ++i) {
    ShapeHandle xi;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &xi));
    TF_RETURN_IF_ERROR(c->Merge(x, xi, &x));
  }
  c->set_output(0, c->MakeShape({c->MakeDim(c->num_inputs() - 1), c->Dim(x, 0), c->Dim(x, 1)}));
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

REGISTER_OP("FusedRec>DotInteractionN")
    .Input("xs: N * float")
    .Attr("N: int >= 1")
    .Output("pairs: float")
    .SetShapeFn(DotInteractionNShape)
    .Doc(R"doc(
DotInteraction of the N vectors of each example given as N tensors [B, D] (example b's vector i: xs[i][b]): bit for
bit DotInteraction(stack(xs, axis=1)), without building the stack.
)doc");

REGISTER_OP("FusedRec>DotInteractionNGrad")
    .Input("grad: float")
    .Input("xs: N * float")
    .Attr("N: int >= 1")
    .Output("xs_grad: float")
    .SetShapeFn(DotInteractionNGradShape)
    .Doc(R"doc(
The gradient of DotInteractionN, the N tensors' gradients stacked feature-major [N, B, D] (unstacked along axis 0
without a copy): bit for bit DotInteractionGrad(grad, stack(xs, axis=0), feature_major=true).
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
