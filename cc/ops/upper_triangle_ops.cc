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

// x [B, F, F] -> [B, F (F - 1) / 2].
Status UpperTriangleShape(InferenceContext* c) {
  ShapeHandle x = c->input(0);
  if (!c->RankKnown(x)) {
    c->set_output(0, c->UnknownShapeOfRank(2));
    return OkStatus();
  }
  DimensionHandle f;
  if (c->Rank(x) != 3 || !c->Merge(c->Dim(x, 1), c->Dim(x, 2), &f).ok()) {
    return errors::InvalidArgument("x must have shape [B, F, F], got ", c->DebugString(x));
  }
  DimensionHandle pairs = c->UnknownDim();
  if (c->ValueKnown(f)) pairs = c->MakeDim(c->Value(f) * (c->Value(f) - 1) / 2);
  c->set_output(0, c->Matrix(c->Dim(x, 0), pairs));
  return OkStatus();
}

// grad [B, P], size F -> [B, F, F].
Status UpperTriangleGradShape(InferenceContext* c) {
  ShapeHandle grad, unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
  DimensionHandle f;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(1, &f));
  c->set_output(0, c->MakeShape({c->Dim(grad, 0), f, f}));
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>UpperTriangle")
    .Input("x: T")
    .Output("pairs: T")
    .Attr("T: {half, bfloat16, float, double}")
    .SetShapeFn(UpperTriangleShape)
    .Doc(R"doc(
The strict upper triangle of each [F, F] matrix of x [B, F, F], row by row: pairs[b] = x[b, 0, 1:], x[b, 1, 2:], ...,
x[b, F - 2, F - 1], F (F - 1) / 2 values (DLRM's pairwise interactions). Equal to boolean_mask(x, i < j).
)doc");

REGISTER_OP("FusedRec>UpperTriangleGrad")
    .Input("grad: T")
    .Input("size: int32")
    .Output("x_grad: T")
    .Attr("T: {half, bfloat16, float, double}")
    .SetShapeFn(UpperTriangleGradShape)
    .Doc(R"doc(
The gradient of UpperTriangle: grad [B, F (F - 1) / 2] placed back into [B, F, F] (F = size), zeros on and below the
diagonal.
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
