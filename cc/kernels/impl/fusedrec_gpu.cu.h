/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// The FusedRec CUDA kernels (paper §3, Fig. 5). TF-free; only fusedrec_gpu.cu.cc includes this file.
//
// Segment unique over (segment, key) pairs, one pass per step whatever the number of categories:
//  1. InsertPairs: a block takes a tile of 256, 512 or 1024 positions (InsertTile) into shared memory and dedups it
//     there first: every position inserts its pair into the block's shared table and adds 1 to the pair's count
//     (shared atomics). Then one thread per distinct pair of the tile probes the global table of 2^k >= 1.5n slots
//     and adds the tile's count: a hot (Zipf) key costs one global atomic per tile, not one per occurrence. (The
//     first version elected one lane per pair and warp with __match_any_sync and probed the global table from
//     there: one global atomic per warp, 2x slower on 10M keys; benchmarks/results/cuda.) A slot holds a *position* of its pair
//     (the input arrays are the table's key store), claimed by atomicCAS from kEmpty and lowered by atomicMin, in
//     shared memory and in the global table alike, so once the pass ends every slot holds the first position of its
//     pair: the min-position pass that makes the output order independent of thread timing.
//  2. MarkFirsts (inputs of 2^20 positions and more): one thread per slot sets first[pos] for each claimed slot, so
//     later passes learn whether a position is a first occurrence from a sequential byte array instead of a random
//     read of a table too large for L2. Smaller inputs skip it and read the table (first iff its slot holds it).
//  3. CountFirsts: each 256-position tile counts its first occurrences with __ballot_sync + __popc; a device scan of
//     the tile counts gives each tile its output offset and the total U.
//  4. Emit*: the same ballot, plus popc of the lanes below, is a position's output index: the unique pairs come out
//     compacted in first-occurrence order, exactly as the CPU kernel and the NumPy oracle order them. The output
//     index replaces the count in the pair's slot.
//  5. WriteInverse: inverse[i] = output index stored in i's slot by step 4.
// The host reads U (and the first invalid position, if any) back between steps 3 and 4 to size the outputs.
#ifndef CC_KERNELS_IMPL_FUSEDREC_GPU_CU_H_
#define CC_KERNELS_IMPL_FUSEDREC_GPU_CU_H_

#include <cstdint>

#include "cc/kernels/impl/hashing.h"

namespace tensorflow {
namespace fusedrec {
namespace impl {
namespace gpu {

constexpr int kBlock = 256;  // threads per block = positions per tile (passes 3-5)
constexpr int kWarpsPerBlock = kBlock / 32;
// Pass 1 takes kItems positions a thread (a tile of kBlock * kItems positions a block) and dedups each tile in a
// shared table of 2 slots a position: kItems = 4 on large inputs (fewer global probes), 2 on middling and 1 on small
// ones (enough blocks to fill the device); InsertItems in fusedrec_gpu.cu.cc chooses.
template <int kItems>
struct InsertTile {
  static constexpr int kPositions = kBlock * kItems;
  static constexpr int kLocalBits = kItems == 1 ? 9 : kItems == 2 ? 10 : 11;
  static constexpr int kLocalSlots = 1 << kLocalBits;
  static_assert(kLocalSlots == 2 * kPositions, "the shared table must hold every pair of a tile at load <= 1/2");
};
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

// One slot of the global table, both fields in one 8-byte word so that a probe and its count touch one sector:
// pos = a position of the pair (kEmpty if free); value = its occurrences after pass 1, its output index after pass 4.
struct Slot {
  uint32_t pos;
  int32_t value;
};

// Open-addressing table over the input.
struct SlotTable {
  Slot* slots;
  uint64_t mask;  // capacity - 1
  int shift;      // 64 - log2(capacity): slots are indexed by the hash's high bits, like the CPU table
};

__device__ inline unsigned LanesBelow(int lane) { return (1u << lane) - 1u; }

// Returns the slot of (key, segment), claiming a free one for position i when the pair is new. Never loops forever:
// capacity > number of distinct pairs. Reads of pos may be stale; that is harmless: a stale kEmpty only makes the
// atomicCAS report the real holder, and a claimed slot only ever holds positions of one pair.
template <typename K>
__device__ uint32_t FindOrInsert(const SlotTable& table, const K* __restrict__ keys,
                                 const int32_t* __restrict__ segments, uint64_t hash, K key, int32_t segment,
                                 uint32_t i) {
  uint64_t slot = hash >> table.shift;
  for (;; slot = (slot + 1) & table.mask) {
    uint32_t* pos = &table.slots[slot].pos;
    uint32_t holder = *pos;
    if (holder == kEmpty) {
      holder = atomicCAS(pos, kEmpty, i);
      if (holder == kEmpty) return static_cast<uint32_t>(slot);
    }
    const K holder_key = keys[holder];  // both loads issued before either is compared
    const int32_t holder_segment = segments[holder];
    if (holder_key == key && holder_segment == segment) {
      if (i < holder) atomicMin(pos, i);
      return static_cast<uint32_t>(slot);
    }
  }
}

// The same in a block's shared table, whose holders are tile-local indices into the tile's keys and segments.
template <int kLocalBits, typename K>
__device__ uint32_t LocalFindOrInsert(uint32_t* local_pos, const K* tile_keys, const int32_t* tile_segments,
                                      uint64_t hash, K key, int32_t segment, uint32_t local) {
  uint32_t slot = static_cast<uint32_t>(hash >> (64 - kLocalBits));
  for (;; slot = (slot + 1) & ((1u << kLocalBits) - 1)) {
    uint32_t holder = local_pos[slot];
    if (holder == kEmpty) {
      holder = atomicCAS(&local_pos[slot], kEmpty, local);
      if (holder == kEmpty) return slot;
    }
    if (tile_keys[holder] == key && tile_segments[holder] == segment) {
      if (local < holder) atomicMin(&local_pos[slot], local);
      return slot;
    }
  }
}

// Pass 1 (and the input checks, which the host reads back with U). blockDim == kBlock, one tile a block.
template <typename K, int kInsertItems>
__global__ void __launch_bounds__(kBlock)
    InsertPairs(const K* __restrict__ keys, const int32_t* __restrict__ segments, int64_t n, int64_t segment_limit,
                int64_t packed_key_limit, SlotTable table, uint32_t* __restrict__ slot_of, DeviceStatus* status) {
  using Tile = InsertTile<kInsertItems>;
  constexpr int kInsertTile = Tile::kPositions;
  constexpr int kLocalSlots = Tile::kLocalSlots;
  __shared__ K tile_keys[kInsertTile];
  __shared__ int32_t tile_segments[kInsertTile];
  __shared__ uint32_t local_pos[kLocalSlots];
  __shared__ int32_t local_count[kLocalSlots];
  __shared__ uint32_t local_global[kLocalSlots];  // the global slot of each claimed local slot
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kInsertTile;
  for (int j = threadIdx.x; j < kLocalSlots; j += kBlock) {
    local_pos[j] = kEmpty;
    local_count[j] = 0;
  }
  K key[kInsertItems];
  int32_t segment[kInsertItems];
  uint64_t hash[kInsertItems];
  for (int it = 0; it < kInsertItems; ++it) {
    const int local = it * kBlock + threadIdx.x;
    const int64_t i = base + local;
    const bool active = i < n;
    key[it] = active ? keys[i] : K(0);
    segment[it] = active ? segments[i] : 0;
    hash[it] = PairSlotHash(static_cast<int64_t>(key[it]), segment[it]);
    tile_keys[local] = key[it];
    tile_segments[local] = segment[it];
    if (active) {
      if (segment[it] < 0 || segment[it] >= segment_limit) {
        atomicMin(&status->first_bad_segment, static_cast<uint32_t>(i));
      }
      if (packed_key_limit > 0 && (key[it] < 0 || static_cast<int64_t>(key[it]) >= packed_key_limit)) {
        atomicMin(&status->first_bad_key, static_cast<uint32_t>(i));
      }
    }
  }
  __syncthreads();
  // Every occurrence inserts itself into the shared table (shared atomics are cheap; a warp vote over 64-bit keys,
  // __match_any_sync, cost more than it saved here).
  uint32_t local_slot[kInsertItems];
  for (int it = 0; it < kInsertItems; ++it) {
    const int local = it * kBlock + threadIdx.x;
    if (base + local < n) {
      local_slot[it] = LocalFindOrInsert<Tile::kLocalBits>(local_pos, tile_keys, tile_segments, hash[it], key[it],
                                                           segment[it], static_cast<uint32_t>(local));
      atomicAdd(&local_count[local_slot[it]], 1);
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < kLocalSlots; j += kBlock) {
    const uint32_t holder = local_pos[j];
    if (holder == kEmpty) continue;
    const K k = tile_keys[holder];
    const int32_t s = tile_segments[holder];
    const uint32_t global = FindOrInsert(table, keys, segments, PairSlotHash(static_cast<int64_t>(k), s), k, s,
                                         static_cast<uint32_t>(base + holder));
    atomicAdd(&table.slots[global].value, local_count[j]);
    local_global[j] = global;
  }
  __syncthreads();
  for (int it = 0; it < kInsertItems; ++it) {
    const int64_t i = base + it * kBlock + threadIdx.x;
    if (i < n) slot_of[i] = local_global[local_slot[it]];
  }
}

// Fills the global table with free slots (pos = kEmpty, value = 0).
__global__ void InitSlots(Slot* __restrict__ slots, uint64_t capacity) {
  for (uint64_t s = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < capacity;
       s += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    slots[s] = Slot{kEmpty, 0};
  }
}

// Pass 2: first[p] = 1 for the position p each claimed slot holds (first is zeroed by the host).
__global__ void MarkFirsts(const Slot* __restrict__ slots, uint64_t capacity, uint8_t* __restrict__ first) {
  for (uint64_t s = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < capacity;
       s += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t pos = slots[s].pos;
    if (pos != kEmpty) first[pos] = 1;
  }
}

// Whether position i is its pair's first occurrence: from pass 2's flags on large inputs, else from the table itself
// (a random read, but of a table small enough to stay in L2, and one kernel and one memset fewer: see UseFirstFlags).
__device__ inline bool IsFirst(const uint8_t* __restrict__ first, const SlotTable& table,
                               const uint32_t* __restrict__ slot_of, int64_t i, int64_t n) {
  if (i >= n) return false;
  return first != nullptr ? first[i] != 0 : table.slots[slot_of[i]].pos == static_cast<uint32_t>(i);
}

// Pass 3: tile_counts[b] = first occurrences among positions [b * kBlock, (b + 1) * kBlock).
__global__ void __launch_bounds__(kBlock)
    CountFirsts(const uint8_t* __restrict__ first, SlotTable table, const uint32_t* __restrict__ slot_of, int64_t n,
                int32_t* __restrict__ tile_counts) {
  __shared__ int32_t warp_counts[kWarpsPerBlock];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const unsigned firsts = __ballot_sync(kFullMask, IsFirst(first, table, slot_of, i, n));
  if ((threadIdx.x & 31) == 0) warp_counts[threadIdx.x >> 5] = __popc(firsts);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t total = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) total += warp_counts[w];
    tile_counts[blockIdx.x] = total;
  }
}

// Pass 4: writes the unique pairs of this tile at tile_offsets[tile] + their rank among the tile's first occurrences.
// kKeys (segment_unique): OutKey = K, counts[u] = occurrences. kPacked/kHashed (category_unique): OutKey = int64,
// segment_counts[s] += unique pairs of segment s (one atomic per distinct segment of a warp).
template <typename K, typename OutKey, Encoding kEncoding>
__global__ void __launch_bounds__(kBlock)
    EmitUnique(const K* __restrict__ keys, const int32_t* __restrict__ segments, int64_t n, SlotTable table,
               const uint32_t* __restrict__ slot_of, const uint8_t* __restrict__ first_flags,
               const int32_t* __restrict__ tile_offsets, int key_bits, OutKey* __restrict__ unique_keys,
               int32_t* __restrict__ unique_segments, int32_t* __restrict__ counts,
               int32_t* __restrict__ segment_counts) {
  __shared__ int32_t warp_counts[kWarpsPerBlock];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const bool first = IsFirst(first_flags, table, slot_of, i, n);
  const unsigned firsts = __ballot_sync(kFullMask, first);
  if (lane == 0) warp_counts[warp] = __popc(firsts);
  __syncthreads();
  int32_t uid = tile_offsets[blockIdx.x] + __popc(firsts & LanesBelow(lane));
  for (int w = 0; w < warp; ++w) uid += warp_counts[w];
  const int32_t segment = first ? segments[i] : 0;
  if (first) {
    const K key = keys[i];
    Slot* slot = &table.slots[slot_of[i]];
    if constexpr (kEncoding == Encoding::kKeys) {
      unique_keys[uid] = key;
      counts[uid] = slot->value;
    } else if constexpr (kEncoding == Encoding::kPacked) {
      unique_keys[uid] = PackedUnifiedKey(static_cast<int64_t>(key), segment, key_bits);
    } else {
      unique_keys[uid] = HashedUnifiedKey(static_cast<int64_t>(key), segment);
    }
    slot->value = uid;  // only this thread touches the slot in this pass
    unique_segments[uid] = segment;
  }
  if constexpr (kEncoding != Encoding::kKeys) {
    const unsigned same_segment = __match_any_sync(kFullMask, segment) & firsts;
    if (first && lane == __ffs(same_segment) - 1) atomicAdd(&segment_counts[segment], __popc(same_segment));
  }
}

// Pass 5.
__global__ void WriteInverse(SlotTable table, const uint32_t* __restrict__ slot_of, int64_t n,
                             int32_t* __restrict__ inverse) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (i < n) inverse[i] = table.slots[slot_of[i]].value;
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
