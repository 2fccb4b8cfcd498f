/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#ifndef CC_KERNELS_UPPER_TRIANGLE_OP_H_
#define CC_KERNELS_UPPER_TRIANGLE_OP_H_

#include <cstdint>

#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace fusedrec {

// Copies between the strict upper triangles of `batch` matrices [size, size] (square, row-major) and their packed
// rows [size (size - 1) / 2]: to_pairs true packs (forward), false unpacks into zeroed matrices (the gradient).
template <typename Device, typename T>
struct UpperTriangleFunctor {
  void operator()(OpKernelContext* ctx, int64_t batch, int64_t size, T* square, T* pairs, bool to_pairs);
};

}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_UPPER_TRIANGLE_OP_H_
