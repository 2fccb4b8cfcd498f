/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// Input checks and CPU threading shared by the FusedRec kernels.
#ifndef CC_KERNELS_KERNEL_UTIL_H_
#define CC_KERNELS_KERNEL_UTIL_H_

#include <algorithm>
#include <functional>
#include <limits>

#include "cc/kernels/impl/pair_dedup.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/threadpool.h"

#if GOOGLE_CUDA
#include "cc/kernels/impl/fusedrec_gpu.h"
#include "xla/stream_executor/stream.h"
#endif

namespace tensorflow {
namespace fusedrec {

// Checks that `t` is a vector; `what` names it in the error.
inline Status CheckVector(const Tensor& t, const char* what) {
  if (!TensorShapeUtils::IsVector(t.shape())) {
    return errors::InvalidArgument(what, " must be a vector (rank 1), got shape ", t.shape().DebugString());
  }
  return OkStatus();
}

// Checks keys and segment_ids are vectors of one length that an int32 index can address.
inline Status CheckKeysAndSegments(const Tensor& keys, const Tensor& segment_ids) {
  TF_RETURN_IF_ERROR(CheckVector(keys, "keys"));
  TF_RETURN_IF_ERROR(CheckVector(segment_ids, "segment_ids"));
  if (keys.NumElements() != segment_ids.NumElements()) {
    return errors::InvalidArgument("keys and segment_ids must have the same length, got ", keys.NumElements(),
                                   " keys and ", segment_ids.NumElements(), " segment_ids");
  }
  if (keys.NumElements() > std::numeric_limits<int32_t>::max()) {
    return errors::InvalidArgument("at most 2^31 - 1 keys per call, got ", keys.NumElements());
  }
  return OkStatus();
}

// The error for segment id `segment` at `position` outside [0, num_segments) (num_segments < 0: no upper bound).
inline Status SegmentRangeError(int64_t num_segments, int32_t segment, int64_t position) {
  if (num_segments < 0) {
    return errors::InvalidArgument("segment_ids must be >= 0, got segment id ", segment, " at position ", position);
  }
  return errors::InvalidArgument("segment_ids must be in [0, ", num_segments, "), got segment id ", segment,
                                 " at position ", position);
}

// Checks 0 <= segment_ids[i] < num_segments (num_segments < 0: no upper bound); names the first offender.
// Host memory only: the GPU kernels check on the device (PairDedupFind).
inline Status CheckSegmentRange(const Tensor& segment_ids, int64_t num_segments) {
  const auto segs = segment_ids.flat<int32>();
  const int64_t upper = num_segments < 0 ? std::numeric_limits<int64_t>::max() : num_segments;
  for (int64_t i = 0; i < segs.size(); ++i) {
    if (segs(i) < 0 || segs(i) >= upper) return SegmentRangeError(num_segments, segs(i), i);
  }
  return OkStatus();
}

inline int NumCpuThreads(OpKernelContext* ctx) {
  return ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
}

// Runs tasks on the intra-op CPU pool, one task per shard.
inline impl::ParallelRunner CpuRunner(OpKernelContext* ctx) {
  thread::ThreadPool* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [pool](int64_t num_tasks, const std::function<void(int64_t)>& task) {
    pool->ParallelFor(num_tasks,
                      thread::ThreadPool::SchedulingParams(thread::ThreadPool::SchedulingStrategy::kFixedBlockSize,
                                                           absl::nullopt, 1),
                      [&task](int64_t begin, int64_t end) {
                        for (int64_t i = begin; i < end; ++i) task(i);
                      });
  };
}

// Runs range(begin, end) over [0, n) split into contiguous ranges of at least min_per_task items, at most one per
// intra-op thread; a single range runs inline on the calling thread.
inline void ParallelRanges(OpKernelContext* ctx, int64_t n, int64_t min_per_task,
                           const std::function<void(int64_t, int64_t)>& range) {
  const int64_t tasks =
      std::max<int64_t>(1, std::min<int64_t>(NumCpuThreads(ctx), n / std::max<int64_t>(1, min_per_task)));
  if (tasks == 1) {
    range(0, n);
    return;
  }
  const int64_t len = (n + tasks - 1) / tasks;
  CpuRunner(ctx)(tasks, [&](int64_t t) { range(t * len, std::min(n, (t + 1) * len)); });
}

// Deduplicates the (segment_ids[i], keys[i]) pairs, writes the inverse into output `inverse_index`, and hands the
// unique pairs to `use`. The PairSet is a per-thread buffer kept between calls (like the table's slots), released
// after use once it grew past kMaxRetainedSlots.
template <typename K, typename Use>
Status WithUniquePairs(OpKernelContext* ctx, const Tensor& keys, const Tensor& segment_ids, int inverse_index,
                       Use use) {
  const int64_t n = keys.NumElements();
  Tensor* inverse = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(inverse_index, TensorShape({n}), &inverse));
  static thread_local impl::PairSet<K> unique;
  unique.entries.clear();
  impl::PairDedup<K>(keys.flat<K>().data(), segment_ids.flat<int32>().data(), n, NumCpuThreads(ctx),
                     CpuRunner(ctx), inverse->flat<int32>().data(), &unique);
  const Status status = use(static_cast<const impl::PairSet<K>&>(unique));
  if (unique.entries.capacity() > impl::kMaxRetainedSlots) decltype(unique.entries)().swap(unique.entries);
  return status;
}

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;  // a tag here: the kernels are in cc/kernels/impl/fusedrec_gpu.cu.cc

// The CUDA stream of the op's GPU device, as the void* that the TF-free launchers take.
inline void* GpuStream(OpKernelContext* ctx) {
  return ctx->op_device_context()->stream()->platform_specific_handle().stream;
}

// A launcher's return value (a cudaError_t) as a Status.
inline Status GpuStatus(int cuda_error, const char* op) {
  if (cuda_error == 0) return OkStatus();
  return errors::Internal(op, " failed on the GPU: ", impl::gpu::ErrorString(cuda_error));
}

// Device scratch of `bytes` bytes, alive as long as `scratch`.
inline Status AllocateGpuScratch(OpKernelContext* ctx, size_t bytes, Tensor* scratch) {
  return ctx->allocate_temp(DT_INT8, TensorShape({static_cast<int64_t>(std::max<size_t>(bytes, 1))}), scratch);
}

// One element of a device array, copied to the host (error messages only).
template <typename T>
Status ReadDeviceElement(OpKernelContext* ctx, const T* device_array, int64_t i, T* value) {
  return GpuStatus(impl::gpu::CopyToHost(value, device_array + i, sizeof(T), GpuStream(ctx)), "reading an input");
}

// Pass 1 of the GPU dedup into `scratch`: checks segment ids against [0, num_segments) (num_segments < 0: >= 0 only)
// and, when packed_key_limit > 0, keys against [0, packed_key_limit); reads back the number of unique pairs, the one
// data-dependent value the host needs. A bad segment id becomes SegmentRangeError; a bad key is returned in
// result->first_bad_key for the caller to name.
template <typename K>
Status GpuFindUniquePairs(OpKernelContext* ctx, const Tensor& keys, const Tensor& segment_ids, int64_t num_segments,
                          int64_t packed_key_limit, Tensor* scratch, impl::gpu::DedupResult* result) {
  const int64_t n = keys.NumElements();
  size_t bytes = 0;
  TF_RETURN_IF_ERROR(GpuStatus(impl::gpu::PairDedupScratchBytes(n, &bytes), "sizing the dedup scratch"));
  TF_RETURN_IF_ERROR(AllocateGpuScratch(ctx, bytes, scratch));
  const int32_t* segments = segment_ids.flat<int32>().data();
  TF_RETURN_IF_ERROR(GpuStatus(
      impl::gpu::PairDedupFind<K>(keys.flat<K>().data(), segments, n,
                                  num_segments < 0 ? std::numeric_limits<int64_t>::max() : num_segments,
                                  packed_key_limit, scratch->flat<int8>().data(), GpuStream(ctx), result),
      "the pair dedup"));
  if (result->first_bad_segment >= 0) {
    int32_t segment = 0;
    TF_RETURN_IF_ERROR(ReadDeviceElement(ctx, segments, result->first_bad_segment, &segment));
    return SegmentRangeError(num_segments, segment, result->first_bad_segment);
  }
  return OkStatus();
}
#endif  // GOOGLE_CUDA

}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_KERNEL_UTIL_H_
