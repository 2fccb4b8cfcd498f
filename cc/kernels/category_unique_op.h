/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#ifndef CC_KERNELS_CATEGORY_UNIQUE_OP_H_
#define CC_KERNELS_CATEGORY_UNIQUE_OP_H_

#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace fusedrec {

enum class KeyEncoding { kPacked, kHashed };

// Owner-side unique over (segment, key) pairs; allocates the four outputs of FusedRec>CategoryUnique, or returns
// InvalidArgument (naming segment and key) when a key cannot be packed. Inputs are validated by the caller.
template <typename Device, typename K>
struct CategoryUniqueFunctor {
  Status operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor& segment_ids, int64_t num_segments,
                    KeyEncoding encoding);
};

}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_CATEGORY_UNIQUE_OP_H_
