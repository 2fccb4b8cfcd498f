/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include "cc/kernels/category_unique_op.h"

#include <type_traits>

#include "cc/kernels/impl/hashing.h"
#include "cc/kernels/impl/pair_dedup.h"
#include "cc/kernels/kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"

namespace tensorflow {
namespace fusedrec {

using CPUDevice = Eigen::ThreadPoolDevice;

namespace {

Status PackedKeyError(int64_t key, int32_t segment, int64_t num_segments, int key_bits) {
  return errors::InvalidArgument("key ", key, " of segment ", segment, " cannot be packed: with num_segments=",
                                 num_segments, " the packed encoding holds keys in [0, 2^", key_bits,
                                 "); use encoding='hashed' for ids that need more bits or are negative");
}

}  // namespace

template <typename K>
struct CategoryUniqueFunctor<CPUDevice, K> {
  Status operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor& segment_ids, int64_t num_segments,
                    KeyEncoding encoding) {
    return WithUniquePairs<K>(ctx, keys, segment_ids, /*inverse_index=*/1, [&](const impl::PairSet<K>& unique) {
      return EncodeUniquePairs(ctx, unique, num_segments, encoding);
    });
  }

  // Unique pairs are few next to N, so encoding and checking them here is cheaper than per input key.
  static Status EncodeUniquePairs(OpKernelContext* ctx, const impl::PairSet<K>& unique, int64_t num_segments,
                                  KeyEncoding encoding) {
    const int64_t u = unique.size();
    Tensor *unified_keys = nullptr, *unique_segment_ids = nullptr, *segment_counts = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({u}), &unified_keys));
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({u}), &unique_segment_ids));
    TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({num_segments}), &segment_counts));
    auto unified = unified_keys->flat<int64>();
    auto segments = unique_segment_ids->flat<int32>();
    auto counts = segment_counts->flat<int32>();
    counts.setZero();
    const int key_bits = 63 - impl::PackedSegmentBits(num_segments);
    const int64_t key_limit = int64_t{1} << key_bits;
    for (int64_t j = 0; j < u; ++j) {
      const int64_t key = static_cast<int64_t>(unique.entries[j].key);
      const int32_t segment = unique.entries[j].segment;
      if (encoding == KeyEncoding::kPacked) {
        if (key < 0 || key >= key_limit) return PackedKeyError(key, segment, num_segments, key_bits);
        unified(j) = impl::PackedUnifiedKey(key, segment, key_bits);
      } else {
        unified(j) = impl::HashedUnifiedKey(key, segment);
      }
      segments(j) = segment;
      ++counts(segment);
    }
    return OkStatus();
  }
};

#if GOOGLE_CUDA
// Dedup and input checks on the device, then outputs sized from the unique count read back in between. The first
// unpackable key by position is the first in first-occurrence order, the pair the CPU kernel names.
template <typename K>
struct CategoryUniqueFunctor<GPUDevice, K> {
  Status operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor& segment_ids, int64_t num_segments,
                    KeyEncoding encoding) {
    const int64_t n = keys.NumElements();
    const int key_bits = 63 - impl::PackedSegmentBits(num_segments);
    const bool hashed = encoding == KeyEncoding::kHashed;
    Tensor scratch;
    impl::gpu::DedupResult found;
    TF_RETURN_IF_ERROR(GpuFindUniquePairs<K>(ctx, keys, segment_ids, num_segments,
                                             hashed ? 0 : int64_t{1} << key_bits, &scratch, &found));
    if (found.first_bad_key >= 0) {
      K key;
      int32_t segment;
      TF_RETURN_IF_ERROR(ReadDeviceElement(ctx, keys.flat<K>().data(), found.first_bad_key, &key));
      TF_RETURN_IF_ERROR(ReadDeviceElement(ctx, segment_ids.flat<int32>().data(), found.first_bad_key, &segment));
      return PackedKeyError(static_cast<int64_t>(key), segment, num_segments, key_bits);
    }
    const TensorShape shape({found.num_unique});
    Tensor *unified_keys = nullptr, *inverse = nullptr, *unique_segment_ids = nullptr, *segment_counts = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, shape, &unified_keys));
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({n}), &inverse));
    TF_RETURN_IF_ERROR(ctx->allocate_output(2, shape, &unique_segment_ids));
    TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({num_segments}), &segment_counts));
    return GpuStatus(impl::gpu::CategoryUniqueEmit<K>(
                         keys.flat<K>().data(), segment_ids.flat<int32>().data(), n, scratch.flat<int8>().data(),
                         hashed, key_bits, unified_keys->flat<int64>().data(), inverse->flat<int32>().data(),
                         unique_segment_ids->flat<int32>().data(), segment_counts->flat<int32>().data(), num_segments,
                         GpuStream(ctx)),
                     "category_unique");
  }
};
#endif  // GOOGLE_CUDA

template <typename Device, typename K>
class CategoryUniqueOp : public OpKernel {
 public:
  explicit CategoryUniqueOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_segments", &num_segments_));
    OP_REQUIRES(ctx, num_segments_ >= 1,
                errors::InvalidArgument("num_segments must be >= 1, got ", num_segments_));
    std::string encoding;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("encoding", &encoding));
    if (encoding == "packed") {
      encoding_ = KeyEncoding::kPacked;
    } else if (encoding == "hashed") {
      encoding_ = KeyEncoding::kHashed;
    } else {
      ctx->CtxFailure(errors::InvalidArgument("encoding must be 'packed' or 'hashed', got '", encoding, "'"));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& segment_ids = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeysAndSegments(keys, segment_ids));
    // On a GPU the ids are in device memory: the functor checks them there.
    if (std::is_same<Device, CPUDevice>::value) OP_REQUIRES_OK(ctx, CheckSegmentRange(segment_ids, num_segments_));
    OP_REQUIRES_OK(ctx, (CategoryUniqueFunctor<Device, K>()(ctx, keys, segment_ids, num_segments_, encoding_)));
  }

 private:
  int64_t num_segments_;
  KeyEncoding encoding_ = KeyEncoding::kPacked;
};

#define REGISTER_CPU(K)                                                                  \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("FusedRec>CategoryUnique").Device(DEVICE_CPU).TypeConstraint<K>("T"),         \
      CategoryUniqueOp<CPUDevice, K>);
REGISTER_CPU(int32);
REGISTER_CPU(int64_t);
#undef REGISTER_CPU

#if GOOGLE_CUDA
#define REGISTER_GPU(K)                                                                  \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("FusedRec>CategoryUnique").Device(DEVICE_GPU).TypeConstraint<K>("T"),         \
      CategoryUniqueOp<GPUDevice, K>);
REGISTER_GPU(int32);
REGISTER_GPU(int64_t);
#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace fusedrec
}  // namespace tensorflow
