/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include "cc/kernels/partition_op.h"

#include <algorithm>
#include <vector>

#include "cc/kernels/impl/hashing.h"
#include "cc/kernels/kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"

namespace tensorflow {
namespace fusedrec {

using CPUDevice = Eigen::ThreadPoolDevice;

namespace {

// Elements per shard of the CPU pool; below this one thread does all the work.
constexpr int64_t kMinShard = 1 << 14;

int64_t NumShards(OpKernelContext* ctx, int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>(NumCpuThreads(ctx), n / kMinShard));
}

Status GetNumRanks(OpKernelConstruction* ctx, int64_t* num_ranks) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_ranks", num_ranks));
  if (*num_ranks < 1) return errors::InvalidArgument("num_ranks must be >= 1, got ", *num_ranks);
  return OkStatus();
}

}  // namespace

template <typename K>
struct OwnerOfFunctor<CPUDevice, K> {
  void operator()(OpKernelContext* ctx, const Tensor& keys, int64_t num_ranks, Tensor* owners) {
    const int64_t n = keys.NumElements();
    const K* k = keys.flat<K>().data();
    int32_t* o = owners->flat<int32>().data();
    const int64_t shards = NumShards(ctx, n);
    const int64_t len = (n + shards - 1) / std::max<int64_t>(shards, 1);
    CpuRunner(ctx)(shards, [&](int64_t s) {
      for (int64_t i = s * len, e = std::min(n, (s + 1) * len); i < e; ++i) {
        o[i] = impl::OwnerOf(static_cast<int64_t>(k[i]), static_cast<uint64_t>(num_ranks));
      }
    });
  }
};

template <typename K>
struct PartitionByOwnerFunctor<CPUDevice, K> {
  void operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor* segment_ids, int64_t num_ranks,
                  Tensor* out_keys, Tensor* out_segment_ids, Tensor* splits, Tensor* order) {
    const int64_t n = keys.NumElements();
    const K* k = keys.flat<K>().data();
    const int32_t* seg = segment_ids ? segment_ids->flat<int32>().data() : nullptr;
    K* ok = out_keys->flat<K>().data();
    int32_t* oseg = out_segment_ids ? out_segment_ids->flat<int32>().data() : nullptr;
    int32_t* ord = order->flat<int32>().data();
    const int64_t shards = NumShards(ctx, n);
    const int64_t len = (n + shards - 1) / std::max<int64_t>(shards, 1);
    auto runner = CpuRunner(ctx);

    // Pass 1: owner of every key and a histogram per shard.
    std::vector<int32_t> owner(n);
    std::vector<int64_t> offsets(shards * num_ranks, 0);
    runner(shards, [&](int64_t s) {
      int64_t* hist = &offsets[s * num_ranks];
      for (int64_t i = s * len, e = std::min(n, (s + 1) * len); i < e; ++i) {
        owner[i] = impl::OwnerOf(static_cast<int64_t>(k[i]), static_cast<uint64_t>(num_ranks));
        ++hist[owner[i]];
      }
    });
    // Exclusive prefix over (rank, shard): shard s writes rank r's keys after those of shards < s, which keeps the
    // reorder stable.
    auto split = splits->flat<int32>();
    int64_t running = 0;
    for (int64_t r = 0; r < num_ranks; ++r) {
      const int64_t rank_start = running;
      for (int64_t s = 0; s < shards; ++s) {
        const int64_t count = offsets[s * num_ranks + r];
        offsets[s * num_ranks + r] = running;
        running += count;
      }
      split(r) = static_cast<int32>(running - rank_start);
    }
    // Pass 2: scatter.
    runner(shards, [&](int64_t s) {
      int64_t* next = &offsets[s * num_ranks];
      for (int64_t i = s * len, e = std::min(n, (s + 1) * len); i < e; ++i) {
        const int64_t pos = next[owner[i]]++;
        ok[pos] = k[i];
        ord[pos] = static_cast<int32_t>(i);
        if (seg) oseg[pos] = seg[i];
      }
    });
  }
};

#if GOOGLE_CUDA
template <typename K>
struct OwnerOfFunctor<GPUDevice, K> {
  void operator()(OpKernelContext* ctx, const Tensor& keys, int64_t num_ranks, Tensor* owners) {
    OP_REQUIRES_OK(ctx, GpuStatus(impl::gpu::OwnerOfKeys<K>(keys.flat<K>().data(), keys.NumElements(), num_ranks,
                                                            owners->flat<int32>().data(), GpuStream(ctx)),
                                  "owner_of"));
  }
};

template <typename K>
struct PartitionByOwnerFunctor<GPUDevice, K> {
  void operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor* segment_ids, int64_t num_ranks,
                  Tensor* out_keys, Tensor* out_segment_ids, Tensor* splits, Tensor* order) {
    const int64_t n = keys.NumElements();
    size_t bytes = 0;
    OP_REQUIRES_OK(ctx, GpuStatus(impl::gpu::PartitionScratchBytes(n, num_ranks, &bytes), "sizing the partition scratch"));
    Tensor scratch;
    OP_REQUIRES_OK(ctx, AllocateGpuScratch(ctx, bytes, &scratch));
    OP_REQUIRES_OK(ctx, GpuStatus(impl::gpu::PartitionByOwner<K>(
                                      keys.flat<K>().data(), segment_ids ? segment_ids->flat<int32>().data() : nullptr,
                                      n, num_ranks, scratch.flat<int8>().data(), out_keys->flat<K>().data(),
                                      out_segment_ids ? out_segment_ids->flat<int32>().data() : nullptr,
                                      splits->flat<int32>().data(), order->flat<int32>().data(), GpuStream(ctx)),
                                  "partition_by_owner"));
  }
};
#endif  // GOOGLE_CUDA

template <typename Device, typename K>
class OwnerOfOp : public OpKernel {
 public:
  explicit OwnerOfOp(OpKernelConstruction* ctx) : OpKernel(ctx) { OP_REQUIRES_OK(ctx, GetNumRanks(ctx, &num_ranks_)); }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckVector(keys, "keys"));
    Tensor* owners = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &owners));
    OwnerOfFunctor<Device, K>()(ctx, keys, num_ranks_, owners);
  }

 private:
  int64_t num_ranks_;
};

template <typename Device, typename K>
class PartitionByOwnerOp : public OpKernel {
 public:
  explicit PartitionByOwnerOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetNumRanks(ctx, &num_ranks_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_segment_inputs", &num_segment_inputs_));
    OP_REQUIRES(ctx, num_segment_inputs_ <= 1,
                errors::InvalidArgument("at most one segment_ids tensor may be given, got ", num_segment_inputs_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor* segment_ids = num_segment_inputs_ ? &ctx->input(1) : nullptr;
    if (segment_ids) {
      OP_REQUIRES_OK(ctx, CheckKeysAndSegments(keys, *segment_ids));
    } else {
      OP_REQUIRES_OK(ctx, CheckVector(keys, "keys"));
      OP_REQUIRES(ctx, keys.NumElements() <= std::numeric_limits<int32_t>::max(),
                  errors::InvalidArgument("at most 2^31 - 1 keys per call, got ", keys.NumElements()));
    }
    const TensorShape shape = keys.shape();
    int out = 0;
    Tensor *out_keys = nullptr, *out_segment_ids = nullptr, *splits = nullptr, *order = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(out++, shape, &out_keys));
    if (segment_ids) OP_REQUIRES_OK(ctx, ctx->allocate_output(out++, shape, &out_segment_ids));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(out++, TensorShape({num_ranks_}), &splits));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(out++, shape, &order));
    PartitionByOwnerFunctor<Device, K>()(ctx, keys, segment_ids, num_ranks_, out_keys, out_segment_ids, splits,
                                         order);
  }

 private:
  int64_t num_ranks_;
  int64_t num_segment_inputs_;
};

#define REGISTER_CPU(K)                                                                      \
  REGISTER_KERNEL_BUILDER(Name("FusedRec>OwnerOf").Device(DEVICE_CPU).TypeConstraint<K>("T"), \
                          OwnerOfOp<CPUDevice, K>);                                          \
  REGISTER_KERNEL_BUILDER(                                                                   \
      Name("FusedRec>PartitionByOwner").Device(DEVICE_CPU).TypeConstraint<K>("T"),           \
      PartitionByOwnerOp<CPUDevice, K>);
REGISTER_CPU(int32);
REGISTER_CPU(int64_t);
#undef REGISTER_CPU

#if GOOGLE_CUDA
#define REGISTER_GPU(K)                                                                      \
  REGISTER_KERNEL_BUILDER(Name("FusedRec>OwnerOf").Device(DEVICE_GPU).TypeConstraint<K>("T"), \
                          OwnerOfOp<GPUDevice, K>);                                          \
  REGISTER_KERNEL_BUILDER(                                                                   \
      Name("FusedRec>PartitionByOwner").Device(DEVICE_GPU).TypeConstraint<K>("T"),           \
      PartitionByOwnerOp<GPUDevice, K>);
REGISTER_GPU(int32);
REGISTER_GPU(int64_t);
#undef REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace fusedrec
}  // namespace tensorflow
