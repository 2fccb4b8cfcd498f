/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// RowIds: the row of each flat position of a ragged layout (what tf.searchsorted(row_splits[1:], positions,
// side="right") computes with a binary search per position). The layer asks it for positions in order (a mask's true
// positions, or all of them), so the row only moves forward: it is advanced from the previous position's row, a few
// rows by stepping and farther by a binary search over the rows left; a position below the one before starts a
// binary search over all rows, so any order gives UpperBound's answer.
#include <algorithm>
#include <cstdint>

#include "cc/kernels/kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace fusedrec {
namespace {

// Rows stepped over one at a time before a binary search takes over the rest.
constexpr int64_t kMaxSteps = 8;

template <typename T>
void RowIds(const T* ends, int64_t num_rows, const T* positions, int64_t n, T* rows) {
  int64_t row = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T p = positions[i];
    if (i > 0 && p < positions[i - 1]) {
      row = std::upper_bound(ends, ends + num_rows, p) - ends;
    } else {
      int64_t steps = 0;
      while (row < num_rows && ends[row] <= p) {
        ++row;
        if (++steps == kMaxSteps) {
          row = std::upper_bound(ends + row, ends + num_rows, p) - ends;
          break;
        }
      }
    }
    rows[i] = static_cast<T>(row);
  }
}

}  // namespace

template <typename T>
class RowIdsOp : public OpKernel {
 public:
  explicit RowIdsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& splits = ctx->input(0);
    const Tensor& positions = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckVector(splits, "row_splits"));
    OP_REQUIRES_OK(ctx, CheckVector(positions, "positions"));
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, positions.shape(), &rows));
    const int64_t num_rows = std::max<int64_t>(0, splits.NumElements() - 1);
    RowIds(splits.flat<T>().data() + (num_rows > 0 ? 1 : 0), num_rows, positions.flat<T>().data(),
           positions.NumElements(), rows->flat<T>().data());
  }
};

#define REGISTER(T) \
  REGISTER_KERNEL_BUILDER(Name("FusedRec>RowIds").Device(DEVICE_CPU).TypeConstraint<T>("T"), RowIdsOp<T>);
REGISTER(int32)
REGISTER(int64_t)
#undef REGISTER

}  // namespace fusedrec
}  // namespace tensorflow
