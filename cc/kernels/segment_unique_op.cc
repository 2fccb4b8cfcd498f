/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include "cc/kernels/segment_unique_op.h"

#include "cc/kernels/impl/pair_dedup.h"
#include "cc/kernels/kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"

namespace tensorflow {
namespace fusedrec {

using CPUDevice = Eigen::ThreadPoolDevice;

template <typename K>
struct SegmentUniqueFunctor<CPUDevice, K> {
  Status operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor& segment_ids) {
    const int64_t n = keys.NumElements();
    Tensor* inverse = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({n}), &inverse));
    impl::PairSet<K> unique;
    impl::PairDedup<K>(keys.flat<K>().data(), segment_ids.flat<int32>().data(), n, NumCpuThreads(ctx),
                       CpuRunner(ctx), inverse->flat<int32>().data(), &unique);
    TF_RETURN_IF_ERROR(OutputVector(ctx, 0, unique.keys));
    TF_RETURN_IF_ERROR(OutputVector(ctx, 1, unique.segments));
    return OutputVector(ctx, 3, unique.counts);
  }
};

template <typename Device, typename K>
class SegmentUniqueOp : public OpKernel {
 public:
  explicit SegmentUniqueOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& segment_ids = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeysAndSegments(keys, segment_ids));
    OP_REQUIRES_OK(ctx, CheckSegmentRange(segment_ids, /*num_segments=*/-1));
    OP_REQUIRES_OK(ctx, (SegmentUniqueFunctor<Device, K>()(ctx, keys, segment_ids)));
  }
};

#define REGISTER_CPU(K)                                                                  \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("FusedRec>SegmentUnique").Device(DEVICE_CPU).TypeConstraint<K>("T"),          \
      SegmentUniqueOp<CPUDevice, K>);
REGISTER_CPU(int32);
REGISTER_CPU(int64_t);
#undef REGISTER_CPU

}  // namespace fusedrec
}  // namespace tensorflow
