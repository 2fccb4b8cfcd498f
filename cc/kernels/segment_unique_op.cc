/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include "cc/kernels/segment_unique_op.h"

#include <type_traits>

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
    return WithUniquePairs<K>(ctx, keys, segment_ids, /*inverse_index=*/2, [ctx](const impl::PairSet<K>& unique) {
      const TensorShape shape({unique.size()});
      Tensor *unique_keys = nullptr, *unique_segment_ids = nullptr, *counts = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(0, shape, &unique_keys));
      TF_RETURN_IF_ERROR(ctx->allocate_output(1, shape, &unique_segment_ids));
      TF_RETURN_IF_ERROR(ctx->allocate_output(3, shape, &counts));
      auto k = unique_keys->flat<K>();
      auto s = unique_segment_ids->flat<int32>();
      auto c = counts->flat<int32>();
      for (int64_t j = 0; j < unique.size(); ++j) {
        const auto& e = unique.entries[j];
        k(j) = e.key;
        s(j) = e.segment;
        c(j) = e.count;
      }
      return OkStatus();
    });
  }
};

#if GOOGLE_CUDA
// Dedup on the device, then outputs sized from the unique count read back in between.
template <typename K>
struct SegmentUniqueFunctor<GPUDevice, K> {
  Status operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor& segment_ids) {
    const int64_t n = keys.NumElements();
    Tensor scratch;
    impl::gpu::DedupResult found;
    TF_RETURN_IF_ERROR(GpuFindUniquePairs<K>(ctx, keys, segment_ids, /*num_segments=*/-1, /*packed_key_limit=*/0,
                                             &scratch, &found));
    const TensorShape shape({found.num_unique});
    Tensor *unique_keys = nullptr, *unique_segment_ids = nullptr, *inverse = nullptr, *counts = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, shape, &unique_keys));
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, shape, &unique_segment_ids));
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({n}), &inverse));
    TF_RETURN_IF_ERROR(ctx->allocate_output(3, shape, &counts));
    return GpuStatus(impl::gpu::SegmentUniqueEmit<K>(keys.flat<K>().data(), segment_ids.flat<int32>().data(), n,
                                                     scratch.flat<int8>().data(), unique_keys->flat<K>().data(),
                                                     unique_segment_ids->flat<int32>().data(),
                                                     inverse->flat<int32>().data(), counts->flat<int32>().data(),
                                                     GpuStream(ctx)),
                     "segment_unique");
  }
};
#endif  // GOOGLE_CUDA

template <typename Device, typename K>
class SegmentUniqueOp : public OpKernel {
 public:
  explicit SegmentUniqueOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& segment_ids = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeysAndSegments(keys, segment_ids));
    // On a GPU the ids are in device memory: the functor checks them there.
    if (std::is_same<Device, CPUDevice>::value) {
      OP_REQUIRES_OK(ctx, CheckSegmentRange(segment_ids, /*num_segments=*/-1));
    }
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

#if GOOGLE_CUDA
#define REGISTER_GPU(K)                                                                  \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("FusedRec>SegmentUnique").Device(DEVICE_GPU).TypeConstraint<K>("T"),          \
      SegmentUniqueOp<GPUDevice, K>);
REGISTER_GPU(int32);
REGISTER_GPU(int64_t);
#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace fusedrec
}  // namespace tensorflow
