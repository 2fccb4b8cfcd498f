/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// Host API of the FusedRec CUDA kernels (fusedrec_gpu.cu.h, compiled by nvcc in fusedrec_gpu.cu.cc). TF-free and
// CUDA-free: callers (the TF GPU kernels, tests/cuda/harness.cu) need no CUDA headers. A stream is passed as the
// void* of a cudaStream_t (nullptr: the default stream) and every call returns the cudaError_t value (0 = success).
// All pointers are device pointers unless a comment says host. Semantics and order are those of the CPU kernels
// (cc/kernels/*_op.cc) and of tf_fusedrec/ops/reference.py.
#ifndef CC_KERNELS_IMPL_FUSEDREC_GPU_H_
#define CC_KERNELS_IMPL_FUSEDREC_GPU_H_

#include <cstddef>
#include <cstdint>

namespace tensorflow {
namespace fusedrec {
namespace impl {
namespace gpu {

// cudaGetErrorString of a value returned here.
const char* ErrorString(int error);

// Blocking copy of `bytes` from device to host on `stream` (for output sizes and error messages).
int CopyToHost(void* host_dst, const void* device_src, size_t bytes, void* stream);

// What the host must know after the dedup pass, before it can size the outputs.
struct DedupResult {
  int64_t num_unique = 0;
  int64_t first_bad_segment = -1;  // first position whose segment id is outside [0, segment_limit), or -1
  int64_t first_bad_key = -1;      // first position whose key cannot be packed (when checked), or -1
};

// Device scratch of one pair dedup over n pairs (depends on the device: call with the device current).
int PairDedupScratchBytes(int64_t n, size_t* bytes);

// Pass 1 of segment_unique / category_unique: validates segment ids (segment_limit: exclusive upper bound) and keys
// (packed_key_limit > 0: keys must lie in [0, packed_key_limit)), inserts the (segment, key) pairs into a hash table
// in `scratch`, counts the unique pairs, and copies *result back to the host (blocks on the stream). n < 2^31.
// When result->first_bad_segment or first_bad_key is set, the outputs must not be written.
template <typename K>
int PairDedupFind(const K* keys, const int32_t* segments, int64_t n, int64_t segment_limit, int64_t packed_key_limit,
                  void* scratch, void* stream, DedupResult* result);

// Pass 2 of segment_unique: unique_keys, unique_segments and counts hold result.num_unique elements, inverse n.
template <typename K>
int SegmentUniqueEmit(const K* keys, const int32_t* segments, int64_t n, void* scratch, K* unique_keys,
                      int32_t* unique_segments, int32_t* inverse, int32_t* counts, void* stream);

// Pass 2 of category_unique: unified keys in the packed (key_bits = 63 - PackedSegmentBits) or hashed encoding,
// segment_counts[num_segments] = unique pairs per segment (zeroed here).
template <typename K>
int CategoryUniqueEmit(const K* keys, const int32_t* segments, int64_t n, void* scratch, bool hashed, int key_bits,
                       int64_t* unified_keys, int32_t* inverse, int32_t* unique_segments, int32_t* segment_counts,
                       int64_t num_segments, void* stream);

// owners[i] = OwnerOf(keys[i], num_ranks).
template <typename K>
int OwnerOfKeys(const K* keys, int64_t n, int64_t num_ranks, int32_t* owners, void* stream);

// Device scratch of one partition of n keys over num_ranks ranks.
int PartitionScratchBytes(int64_t n, int64_t num_ranks, size_t* bytes);

// Stable reorder by owner rank (segments/out_segments may be null); splits[num_ranks], order[n] as the CPU kernel.
template <typename K>
int PartitionByOwner(const K* keys, const int32_t* segments, int64_t n, int64_t num_ranks, void* scratch,
                     K* out_keys, int32_t* out_segments, int32_t* splits, int32_t* order, void* stream);

}  // namespace gpu
}  // namespace impl
}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_IMPL_FUSEDREC_GPU_H_
