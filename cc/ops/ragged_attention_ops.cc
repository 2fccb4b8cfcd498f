/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace fusedrec {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// q, k, v [T, H, D] (one shape), row_splits [B + 1], bias [NB, H] -> [T, H, D] (first_q: the index of q).
Status QkvShape(InferenceContext* c, int first_q, ShapeHandle* qkv) {
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first_q), 3, qkv));
  for (int i = first_q + 1; i < first_q + 3; ++i) {
    ShapeHandle other;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 3, &other));
    TF_RETURN_IF_ERROR(c->Merge(*qkv, other, qkv));
  }
  ShapeHandle splits, bias;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first_q + 3), 1, &splits));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first_q + 4), 2, &bias));
  return OkStatus();
}

Status RaggedCausalAttentionShape(InferenceContext* c) {
  ShapeHandle qkv;
  TF_RETURN_IF_ERROR(QkvShape(c, 0, &qkv));
  c->set_output(0, qkv);
  return OkStatus();
}

// dout [T, H, D], q, k, v, row_splits, bias -> dq, dk, dv [T, H, D], dbias [NB, H].
Status RaggedCausalAttentionGradShape(InferenceContext* c) {
  ShapeHandle qkv, dout;
  TF_RETURN_IF_ERROR(QkvShape(c, 1, &qkv));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &dout));
  TF_RETURN_IF_ERROR(c->Merge(qkv, dout, &qkv));
  for (int i = 0; i < 3; ++i) c->set_output(i, qkv);
  c->set_output(3, c->input(5));
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>RaggedCausalAttention")
    .Input("q: float")
    .Input("k: float")
    .Input("v: float")
    .Input("row_splits: int64")
    .Input("bias: float")
    .Attr("fixed_norm: int = 0")
    .Output("out: float")
    .SetShapeFn(RaggedCausalAttentionShape)
    .Doc(R"doc(
HSTU's pointwise causal attention over the flat tokens of a ragged batch, without listing the (i, j <= i) pairs:
out[i, h] = sum_{j <= i, same sequence} SiLU(<q[i, h], k[j, h]> + bias[bucket(i - j), h]) / n_i * v[j, h], with
bucket(d) = min(floor(log2(d + 1)), NB - 1) (no bias when NB = 0) and n_i = i + 1 (i the position in its sequence)
or fixed_norm when it is > 0.
)doc");

REGISTER_OP("FusedRec>RaggedCausalAttentionGrad")
    .Input("dout: float")
    .Input("q: float")
    .Input("k: float")
    .Input("v: float")
    .Input("row_splits: int64")
    .Input("bias: float")
    .Attr("fixed_norm: int = 0")
    .Output("dq: float")
    .Output("dk: float")
    .Output("dv: float")
    .Output("dbias: float")
    .SetShapeFn(RaggedCausalAttentionGradShape)
    .Doc("The gradients of RaggedCausalAttention's q, k, v and bias, its scores recomputed.");

}  // namespace fusedrec
}  // namespace tensorflow
