/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// DLRM's pairwise interactions keep the strict upper triangle of each example's [F, F] dot products. As
// boolean_mask, that was a Where over B F^2 flags, a gather of B F (F - 1) / 2 single floats by int64 index and, in
// the backward, a segment sum of them into B F^2 zeros: about a tenth of a 2-worker criteo step's CPU
// (docs/guide/performance.md, "The step"). Here each row of a triangle is one contiguous copy.
#include "cc/kernels/upper_triangle_op.h"

#include <algorithm>
#include <cstring>

#include "cc/kernels/kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace fusedrec {

using CPUDevice = Eigen::ThreadPoolDevice;

namespace {

// Examples per task below which one thread does them all.
constexpr int64_t kMinExamplesPerTask = 512;

}  // namespace

template <typename T>
struct UpperTriangleFunctor<CPUDevice, T> {
  void operator()(OpKernelContext* ctx, int64_t batch, int64_t size, T* square, T* pairs, bool to_pairs) {
    const int64_t num_pairs = size * (size - 1) / 2;
    auto examples = [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        T* m = square + b * size * size;
        T* p = pairs + b * num_pairs;
        if (!to_pairs) std::fill(m, m + size * size, T(0));
        for (int64_t i = 0; i + 1 < size; ++i) {
          const int64_t run = size - 1 - i;
          T* row = m + i * size + i + 1;
          if (to_pairs) {
            std::memcpy(p, row, run * sizeof(T));
          } else {
            std::memcpy(row, p, run * sizeof(T));
          }
          p += run;
        }
      }
    };
    ParallelRanges(ctx, batch, kMinExamplesPerTask, examples);
  }
};

template <typename Device, typename T>
class UpperTriangleOp : public OpKernel {
 public:
  explicit UpperTriangleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES(ctx, x.dims() == 3 && x.dim_size(1) == x.dim_size(2),
                errors::InvalidArgument("x must have shape [B, F, F], got ", x.shape().DebugString()));
    const int64_t batch = x.dim_size(0), size = x.dim_size(1);
    Tensor* pairs = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, size * (size - 1) / 2}), &pairs));
    UpperTriangleFunctor<Device, T>()(ctx, batch, size, const_cast<T*>(x.flat<T>().data()), pairs->flat<T>().data(),
                                      /*to_pairs=*/true);
  }
};

template <typename Device, typename T>
class UpperTriangleGradOp : public OpKernel {
 public:
  explicit UpperTriangleGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& size_tensor = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(size_tensor.shape()),
                errors::InvalidArgument("size must be a scalar, got shape ", size_tensor.shape().DebugString()));
    const int64_t size = size_tensor.scalar<int32>()();
    OP_REQUIRES(ctx, size >= 0, errors::InvalidArgument("size must be >= 0, got ", size));
    OP_REQUIRES(ctx, grad.dims() == 2 && grad.dim_size(1) == size * (size - 1) / 2,
                errors::InvalidArgument("grad must have shape [B, ", size * (size - 1) / 2, "] (size ", size,
                                        "), got ", grad.shape().DebugString()));
    const int64_t batch = grad.dim_size(0);
    Tensor* x_grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, size, size}), &x_grad));
    UpperTriangleFunctor<Device, T>()(ctx, batch, size, x_grad->flat<T>().data(),
                                      const_cast<T*>(grad.flat<T>().data()), /*to_pairs=*/false);
  }
};

#define REGISTER_CPU(T)                                                                                    \
  REGISTER_KERNEL_BUILDER(Name("FusedRec>UpperTriangle").Device(DEVICE_CPU).TypeConstraint<T>("T"),        \
                          UpperTriangleOp<CPUDevice, T>);                                                  \
  REGISTER_KERNEL_BUILDER(Name("FusedRec>UpperTriangleGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),    \
                          UpperTriangleGradOp<CPUDevice, T>);
REGISTER_CPU(Eigen::half);
REGISTER_CPU(bfloat16);
REGISTER_CPU(float);
REGISTER_CPU(double);
#undef REGISTER_CPU

}  // namespace fusedrec
}  // namespace tensorflow
