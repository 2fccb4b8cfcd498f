/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace fusedrec {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// Checks N vectors of segment ids and N scalar sizes (inputs first, first + N); sets *dims to the sizes where they are
// constants.
Status SegmentsAndSizes(InferenceContext* c, int first, int n, std::vector<DimensionHandle>* dims) {
  for (int f = 0; f < n; ++f) {
    ShapeHandle unused;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(first + f), 1, &unused));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(first + n + f), 0, &unused));
    const Tensor* known = c->input_tensor(first + n + f);
    if (known != nullptr && known->scalar<int64_t>()() < 0) {
      return errors::InvalidArgument("num_segments[", f, "] must be >= 0, got ", known->scalar<int64_t>()());
    }
    DimensionHandle size;
    TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(first + n + f, &size));
    dims->push_back(size);
  }
  return OkStatus();
}

// params [S, d], index [n], N x segment_ids [n_f], N x num_segments [] -> N x [num_segments_f, d].
Status GatherSegmentSumShape(InferenceContext* c) {
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  ShapeHandle params, index;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &params));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &index));
  std::vector<DimensionHandle> sizes;
  TF_RETURN_IF_ERROR(SegmentsAndSizes(c, 2, n, &sizes));
  for (int f = 0; f < n; ++f) c->set_output(f, c->Matrix(sizes[f], c->Dim(params, 1)));
  return OkStatus();
}

// N x grads [num_segments_f, d], index [n], N x segment_ids [n_f], N x num_segments [], num_params [] -> [S, d].
Status GatherSegmentSumGradShape(InferenceContext* c) {
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  DimensionHandle dim = c->UnknownDim();
  for (int f = 0; f < n; ++f) {
    ShapeHandle grad;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(f), 2, &grad));
    TF_RETURN_IF_ERROR(c->Merge(dim, c->Dim(grad, 1), &dim));
  }
  ShapeHandle index, unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(n), 1, &index));
  std::vector<DimensionHandle> sizes;
  TF_RETURN_IF_ERROR(SegmentsAndSizes(c, n + 1, n, &sizes));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3 * n + 1), 0, &unused));
  DimensionHandle rows;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(3 * n + 1, &rows));
  c->set_output(0, c->Matrix(rows, dim));
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>GatherSegmentSum")
    .Input("params: T")
    .Input("index: int32")
    .Input("segment_ids: N * int64")
    .Input("num_segments: N * int64")
    .Output("outputs: N * T")
    .Attr("T: {half, float, double}")
    .Attr("N: int >= 1")
    .SetShapeFn(GatherSegmentSumShape)
    .Doc(R"doc(
The recover step of a fused group lookup and each feature's combiner sum in one pass: for feature f, whose ids are
index[o_f : o_f + n_f] with o_f the sum of the earlier features' n, outputs[f][segment_ids[f][j]] sums
params[index[o_f + j]] over j in increasing order (zeros where no id lands). It equals, bit for bit,
unsorted_segment_sum(gather(params, index)[o_f : o_f + n_f], segment_ids[f], num_segments[f]) for every f.
index must lie in [0, S) and have sum(n_f) entries; segment_ids[f] in [0, num_segments[f]).
)doc");

REGISTER_OP("FusedRec>GatherSegmentSumGrad")
    .Input("grads: N * T")
    .Input("index: int32")
    .Input("segment_ids: N * int64")
    .Input("num_segments: N * int64")
    .Input("num_params: int32")
    .Output("params_grad: T")
    .Attr("T: {half, float, double}")
    .Attr("N: int >= 1")
    .SetShapeFn(GatherSegmentSumGradShape)
    .Doc(R"doc(
The gradient of GatherSegmentSum with respect to params: params_grad[index[o_f + j]] sums grads[f][segment_ids[f][j]]
over f, then j, in increasing order: bit for bit what unsorted_segment_sum of the concatenated per-feature gathers over
index gives (the chain's gradient).
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
