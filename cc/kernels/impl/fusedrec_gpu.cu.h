/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// The FusedRec CUDA kernels (paper §3, Fig. 5). TF-free; only fusedrec_gpu.cu.cc includes this file.
//
// Segment unique over (segment, key) pairs, one pass per step whatever the number of categories:
//  1. InsertPairs: one thread per position. The lanes of a warp holding the same pair elect their lowest lane
//     (__match_any_sync), which alone probes a table of 2^k >= 2n slots and adds the group's size to the slot's
//     count: hot (Zipf) keys cost one atomic per warp, not one per occurrence. A slot holds a *position* of its pair
//     (the input arrays are the table's key store), claimed by atomicCAS from kEmpty and lowered by atomicMin, so
//     once the pass ends every slot holds the first position of its pair: the min-position pass that makes the
//     output order independent of thread timing.
//  2. CountFirsts: position i is a first occurrence iff its slot holds i; each 256-position tile counts them with
//     __ballot_sync + __popc; a device scan of the tile counts gives each tile its output offset and the total U.
//  3. Emit*: the same ballot, plus popc of the lanes below, is a position's output index: the unique pairs come out
//     compacted in first-occurrence order, exactly as the CPU kernel and the NumPy oracle order them.
//  4. WriteInverse: inverse[i] = output index stored in i's slot by step 3.
// The host reads U (and the first invalid position, if any) back between steps 2 and 3 to size the outputs.
#ifndef CC_KERNELS_IMPL_FUSEDREC_GPU_CU_H_
#define CC_KERNELS_IMPL_FUSEDREC_GPU_CU_H_

#include <cstdint>

#include "cc/kernels/impl/hashing.h"

namespace tensorflow {
namespace fusedrec {
namespace impl {
namespace gpu {

constexpr int kBlock = 256;  // threads per block = positions per tile
constexpr int kWarpsPerBlock = kBlock / 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Slot and position sentinel: positions are < 2^31 - 1, so the largest uint32 is never one, and atomicMin on a
// claimed slot can never bring it back to empty.
constexpr uint32_t kEmpty = 0xffffffffu;

enum class Encoding { kKeys, kPacked, kHashed };

// Written by the kernels, read back by the host. kEmpty = no such position.
struct DeviceStatus {
  uint32_t num_unique;
  uint32_t first_bad_segment;
  uint32_t first_bad_key;
};

// Open-addressing table over the input: pos[s] = a position of the pair in slot s (kEmpty if free), count[s] = its
// occurrences, uid[s] = its output index (written in step 3).
struct SlotTable {
  uint32_t* pos;
  int32_t* count;
  int32_t* uid;
  uint64_t mask;  // capacity - 1
  int shift;      // 64 - log2(capacity): slots are indexed by the hash's high bits, like the CPU table
};

__device__ inline unsigned LanesBelow(int lane) { return (1u << lane) - 1u; }

// Returns the slot of (key, segment), claiming a free one for position i when the pair is new. Never loops forever:
// capacity >= 2n > number of distinct pairs. Reads of pos may be stale; that is harmless: a stale kEmpty only makes
// the atomicCAS report the real holder, and a claimed slot only ever holds positions of one pair.
template <typename K>
__device__ uint32_t FindOrInsert(const SlotTable& table, const K* __restrict__ keys,
                                 const int32_t* __restrict__ segments, K key, int32_t segment, uint32_t i) {
  uint64_t slot = PairSlotHash(static_cast<int64_t>(key), segment) >> table.shift;
  for (;; slot = (slot + 1) & table.mask) {
    uint32_t holder = table.pos[slot];
    if (holder == kEmpty) {
      holder = atomicCAS(&table.pos[slot], kEmpty, i);
      if (holder == kEmpty) return static_cast<uint32_t>(slot);
    }
    if (keys[holder] == key && segments[holder] == segment) {
      if (i < holder) atomicMin(&table.pos[slot], i);
      return static_cast<uint32_t>(slot);
    }
  }
}

// Step 1 (and the input checks, which the host reads back with U). One thread per position; blockDim == kBlock.
template <typename K>
__global__ void __launch_bounds__(kBlock)
    InsertPairs(const K* __restrict__ keys, const int32_t* __restrict__ segments, int64_t n, int64_t segment_limit,
                int64_t packed_key_limit, SlotTable table, uint32_t* __restrict__ slot_of, DeviceStatus* status) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const int lane = threadIdx.x & 31;
  const bool active = i < n;
  const K key = active ? keys[i] : K(0);
  const int32_t segment = active ? segments[i] : 0;
  if (active) {
    if (segment < 0 || segment >= segment_limit) atomicMin(&status->first_bad_segment, static_cast<uint32_t>(i));
    if (packed_key_limit > 0 && (key < 0 || static_cast<int64_t>(key) >= packed_key_limit)) {
      atomicMin(&status->first_bad_key, static_cast<uint32_t>(i));
    }
  }
  // Every lane takes part in the warp votes (inactive lanes of the last tile included), so the masks are full.
  const unsigned active_lanes = __ballot_sync(kFullMask, active);
  const unsigned same_pair = __match_any_sync(kFullMask, key) & __match_any_sync(kFullMask, segment) & active_lanes;
  const int leader = active ? __ffs(same_pair) - 1 : lane;  // the group's lowest lane = its first position
  uint32_t slot = 0;
  if (active && lane == leader) {
    slot = FindOrInsert(table, keys, segments, key, segment, static_cast<uint32_t>(i));
    atomicAdd(&table.count[slot], __popc(same_pair));
  }
  slot = __shfl_sync(kFullMask, slot, leader);
  if (active) slot_of[i] = slot;
}

// Whether position i (< n) is the first occurrence of its pair; valid once InsertPairs has finished.
__device__ inline bool IsFirst(const SlotTable& table, const uint32_t* __restrict__ slot_of, int64_t i, int64_t n,
                               uint32_t* slot) {
  if (i >= n) return false;
  *slot = slot_of[i];
  return table.pos[*slot] == static_cast<uint32_t>(i);
}

// Step 2: tile_counts[b] = first occurrences among positions [b * kBlock, (b + 1) * kBlock).
__global__ void __launch_bounds__(kBlock)
    CountFirsts(SlotTable table, const uint32_t* __restrict__ slot_of, int64_t n, int32_t* __restrict__ tile_counts) {
  __shared__ int32_t warp_counts[kWarpsPerBlock];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  uint32_t slot = 0;
  const unsigned firsts = __ballot_sync(kFullMask, IsFirst(table, slot_of, i, n, &slot));
  if ((threadIdx.x & 31) == 0) warp_counts[threadIdx.x >> 5] = __popc(firsts);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t total = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) total += warp_counts[w];
    tile_counts[blockIdx.x] = total;
  }
}

// Step 3: writes the unique pairs of this tile at tile_offsets[tile] + their rank among the tile's first occurrences.
// kKeys (segment_unique): OutKey = K, counts[u] = occurrences. kPacked/kHashed (category_unique): OutKey = int64,
// segment_counts[s] += unique pairs of segment s (one atomic per distinct segment of a warp).
template <typename K, typename OutKey, Encoding kEncoding>
__global__ void __launch_bounds__(kBlock)
    EmitUnique(const K* __restrict__ keys, const int32_t* __restrict__ segments, int64_t n, SlotTable table,
               const uint32_t* __restrict__ slot_of, const int32_t* __restrict__ tile_offsets, int key_bits,
               OutKey* __restrict__ unique_keys, int32_t* __restrict__ unique_segments, int32_t* __restrict__ counts,
               int32_t* __restrict__ segment_counts) {
  __shared__ int32_t warp_counts[kWarpsPerBlock];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  uint32_t slot = 0;
  const bool first = IsFirst(table, slot_of, i, n, &slot);
  const unsigned firsts = __ballot_sync(kFullMask, first);
  if (lane == 0) warp_counts[warp] = __popc(firsts);
  __syncthreads();
  int32_t uid = tile_offsets[blockIdx.x] + __popc(firsts & LanesBelow(lane));
  for (int w = 0; w < warp; ++w) uid += warp_counts[w];
  const int32_t segment = first ? segments[i] : 0;
  if (first) {
    const K key = keys[i];
    table.uid[slot] = uid;
    unique_segments[uid] = segment;
    if constexpr (kEncoding == Encoding::kKeys) {
      unique_keys[uid] = key;
      counts[uid] = table.count[slot];
    } else if constexpr (kEncoding == Encoding::kPacked) {
      unique_keys[uid] = PackedUnifiedKey(static_cast<int64_t>(key), segment, key_bits);
    } else {
      unique_keys[uid] = HashedUnifiedKey(static_cast<int64_t>(key), segment);
    }
  }
  if constexpr (kEncoding != Encoding::kKeys) {
    const unsigned same_segment = __match_any_sync(kFullMask, segment) & firsts;
    if (first && lane == __ffs(same_segment) - 1) atomicAdd(&segment_counts[segment], __popc(same_segment));
  }
}

// Step 4.
__global__ void WriteInverse(SlotTable table, const uint32_t* __restrict__ slot_of, int64_t n,
                             int32_t* __restrict__ inverse) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (i < n) inverse[i] = table.uid[slot_of[i]];
}

// owners[i] = OwnerOf(keys[i]); positions[i] = i when given (the values the partition's stable sort carries).
template <typename K>
__global__ void ComputeOwners(const K* __restrict__ keys, int64_t n, uint64_t num_ranks, int32_t* __restrict__ owners,
                              int32_t* __restrict__ positions) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (i >= n) return;
  owners[i] = impl::OwnerOf(static_cast<int64_t>(keys[i]), num_ranks);
  if (positions != nullptr) positions[i] = static_cast<int32_t>(i);
}

// splits[r] += keys owned by r; owners are sorted here, so a warp mostly adds once per rank it spans.
__global__ void __launch_bounds__(kBlock)
    CountOwners(const int32_t* __restrict__ owners, int64_t n, int32_t* __restrict__ splits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const int lane = threadIdx.x & 31;
  const bool active = i < n;
  const int32_t owner = active ? owners[i] : 0;
  const unsigned same = __match_any_sync(kFullMask, owner) & __ballot_sync(kFullMask, active);
  if (active && lane == __ffs(same) - 1) atomicAdd(&splits[owner], __popc(same));
}

// out_keys[j] = keys[order[j]] (and the segments alike when given).
template <typename K>
__global__ void GatherByOrder(const K* __restrict__ keys, const int32_t* __restrict__ segments,
                              const int32_t* __restrict__ order, int64_t n, K* __restrict__ out_keys,
                              int32_t* __restrict__ out_segments) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (j >= n) return;
  const int32_t source = order[j];
  out_keys[j] = keys[source];
  if (segments != nullptr) out_segments[j] = segments[source];
}

}  // namespace gpu
}  // namespace impl
}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_IMPL_FUSEDREC_GPU_CU_H_
