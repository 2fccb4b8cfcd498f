/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#ifndef CC_KERNELS_SEGMENT_UNIQUE_OP_H_
#define CC_KERNELS_SEGMENT_UNIQUE_OP_H_

#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace fusedrec {

// Unique over (segment_ids[i], keys[i]) pairs; allocates the four outputs of FusedRec>SegmentUnique.
// Inputs are validated by the caller.
template <typename Device, typename K>
struct SegmentUniqueFunctor {
  Status operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor& segment_ids);
};

}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_SEGMENT_UNIQUE_OP_H_
