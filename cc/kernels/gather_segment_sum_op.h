/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#ifndef CC_KERNELS_GATHER_SEGMENT_SUM_OP_H_
#define CC_KERNELS_GATHER_SEGMENT_SUM_OP_H_

#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace fusedrec {

// One feature of a GatherSegmentSum: its n ids' positions in params (`index`, already offset to the feature's part),
// the output row of each (`segments`), and its [num_segments, dim] rows (the output forward, the gradient backward).
template <typename T, typename Rows>
struct SegmentSpan {
  const int32_t* index;
  const int64_t* segments;
  int64_t n;
  Rows* rows;
  int64_t num_segments;
};

// Forward: rows of every feature = the sums of its ids' params rows, each output row summed in id order from zero.
// The kernel has validated every index and segment id and allocated the outputs.
template <typename Device, typename T>
struct GatherSegmentSumFunctor {
  void operator()(OpKernelContext* ctx, const T* params, int64_t dim, const std::vector<SegmentSpan<T, T>>& features);
};

// Backward: params_grad [num_params, dim] = for each feature in order, for each id in order,
// params_grad[index[j]] += grad[segments[j]] (the chain's gradient: unsorted_segment_sum of the concatenated gathers).
template <typename Device, typename T>
struct GatherSegmentSumGradFunctor {
  void operator()(OpKernelContext* ctx, const std::vector<SegmentSpan<T, const T>>& features, int64_t dim,
                  T* params_grad, int64_t num_params);
};

}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_GATHER_SEGMENT_SUM_OP_H_
