/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// The fixed 64-bit hashes of tf_fusedrec. They are part of the on-wire and on-table contract: every worker must
// compute the same owner rank and the same unified key for the same input, so they never change silently.
#ifndef CC_KERNELS_IMPL_HASHING_H_
#define CC_KERNELS_IMPL_HASHING_H_

#include <cstdint>

// The hashes run on the host and, compiled by nvcc, in the CUDA kernels: one definition for both, so the GPU and CPU
// kernels cannot drift apart.
#if defined(__CUDACC__)
#define FUSEDREC_HOST_DEVICE __host__ __device__
#else
#define FUSEDREC_HOST_DEVICE
#endif

namespace tensorflow {
namespace fusedrec {
namespace impl {

constexpr uint64_t kGolden64 = 0x9E3779B97F4A7C15ull;

// The splitmix64 finalizer: a bijection on uint64 with full avalanche.
FUSEDREC_HOST_DEVICE inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Owner rank of a key: depends on the key only (int32 keys are sign-extended first), never on its category.
FUSEDREC_HOST_DEVICE inline int32_t OwnerOf(int64_t key, uint64_t num_ranks) {
  return static_cast<int32_t>(Mix64(static_cast<uint64_t>(key)) % num_ranks);
}

// Unified key of the "hashed" encoding. For a fixed segment it is a bijection of the key, so two keys of one
// category never collide; across categories a given pair collides with probability 2^-64.
FUSEDREC_HOST_DEVICE inline int64_t HashedUnifiedKey(int64_t key, int32_t segment) {
  const uint64_t salt = Mix64(static_cast<uint64_t>(static_cast<uint32_t>(segment)) + kGolden64);
  return static_cast<int64_t>(Mix64(static_cast<uint64_t>(key) ^ salt));
}

// Hash used for the dedup tables. Deliberately unrelated to Mix64(key): on the owner every received key has the
// same Mix64(key) % num_ranks, so reusing that hash for slots would leave most of the table unused.
FUSEDREC_HOST_DEVICE inline uint64_t PairSlotHash(int64_t key, int32_t segment) {
  return Mix64(static_cast<uint64_t>(key) +
               kGolden64 * (static_cast<uint64_t>(static_cast<uint32_t>(segment)) + 1));
}

// Segment bits b of the packed encoding: max(1, ceil(log2(num_segments))).
FUSEDREC_HOST_DEVICE inline int PackedSegmentBits(int64_t num_segments) {
  int b = 1;
  while ((int64_t{1} << b) < num_segments) ++b;
  return b;
}

// Unified key of the "packed" encoding, for a key in [0, 2^(63 - PackedSegmentBits(num_segments))).
FUSEDREC_HOST_DEVICE inline int64_t PackedUnifiedKey(int64_t key, int32_t segment, int key_bits) {
  return (static_cast<int64_t>(segment) << key_bits) | key;
}

}  // namespace impl
}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_IMPL_HASHING_H_
