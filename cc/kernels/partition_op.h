/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#ifndef CC_KERNELS_PARTITION_OP_H_
#define CC_KERNELS_PARTITION_OP_H_

#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace fusedrec {

// owners[i] = OwnerOf(keys[i], num_ranks).
template <typename Device, typename K>
struct OwnerOfFunctor {
  void operator()(OpKernelContext* ctx, const Tensor& keys, int64_t num_ranks, Tensor* owners);
};

// Stable counting sort of keys (and segment_ids when given) by owner rank. Inputs are validated by the caller;
// segment_ids/out_segment_ids are null when the op has no segment input.
template <typename Device, typename K>
struct PartitionByOwnerFunctor {
  void operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor* segment_ids, int64_t num_ranks,
                  Tensor* out_keys, Tensor* out_segment_ids, Tensor* splits, Tensor* order);
};

}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_PARTITION_OP_H_
