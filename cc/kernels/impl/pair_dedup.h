/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// One-pass unique over (segment, key) pairs (FusedRec Fig. 5): a pre-sized open-addressing table, first-occurrence
// order, no rehash while inserting. Shared by SegmentUnique (sender side) and CategoryUnique (owner side).
// TF-free so it can be unit-tested and reused by other kernels.
#ifndef CC_KERNELS_IMPL_PAIR_DEDUP_H_
#define CC_KERNELS_IMPL_PAIR_DEDUP_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "cc/kernels/impl/hashing.h"

namespace tensorflow {
namespace fusedrec {
namespace impl {

// Runs task(i) for i in [0, num_tasks), possibly concurrently, and returns when all are done.
using ParallelRunner = std::function<void(int64_t num_tasks, const std::function<void(int64_t)>& task)>;

// The sharded path needs both a large input and enough pool threads. Measured on 2 cores (bench/ops.py and
// 0.4M-6.8M key groups), two shards were never faster than one thread: each shard pays its own table, scratch
// vectors and page faults. Below these bounds the calling thread does all the work.
constexpr int64_t kParallelDedupMinSize = 1 << 18;
constexpr int kParallelDedupMinThreads = 4;

// Unique pairs in first-occurrence order, with their counts. One array of structs: a probe that hits reads key,
// segment and count from one cache line.
template <typename K>
struct PairSet {
  struct Entry {
    K key;
    int32_t segment;
    int32_t count;
  };
  std::vector<Entry> entries;

  int64_t size() const { return static_cast<int64_t>(entries.size()); }
};

// Per-thread buffers larger than this many elements are released after use rather than kept for the next call.
constexpr size_t kMaxRetainedSlots = size_t{1} << 22;

// Linear-probing table of ids into a PairSet, pre-sized from the input length and never resized: the capacity is
// a power of two >= 2 * expected, so the load factor stays <= 0.5 when at most `expected` pairs are inserted.
// Slots hold only id + 1 (0 = empty), 4 bytes, so the table of a 100k-key batch fits in L2 next to the entries.
template <typename K>
class PairTable {
 public:
  // The slots live in a per-thread buffer that is kept between calls: a fresh megabyte per call costs more in page
  // faults than the dedup itself on small batches. At most one table may be alive per thread.
  explicit PairTable(int64_t expected) : slots_(ThreadSlots()) {
    int log2 = 4;
    while ((int64_t{1} << log2) < 2 * expected) ++log2;
    mask_ = (uint64_t{1} << log2) - 1;
    shift_ = 64 - log2;
    slots_.assign(mask_ + 1, 0);
  }
  ~PairTable() {
    if (slots_.capacity() > kMaxRetainedSlots) std::vector<int32_t>().swap(slots_);
  }
  PairTable(const PairTable&) = delete;
  PairTable& operator=(const PairTable&) = delete;

  uint64_t HomeSlot(K key, int32_t segment) const {
    return PairSlotHash(static_cast<int64_t>(key), segment) >> shift_;
  }
  void Prefetch(uint64_t slot) const { __builtin_prefetch(&slots_[slot]); }

  // Returns the id of (key, segment) in `set`, appending the pair with a zero count when it is new.
  int32_t FindOrInsert(K key, int32_t segment, uint64_t slot, PairSet<K>* set) {
    for (;; slot = (slot + 1) & mask_) {
      const int32_t id_plus_one = slots_[slot];
      if (id_plus_one == 0) {
        const int32_t id = static_cast<int32_t>(set->size());
        slots_[slot] = id + 1;
        set->entries.push_back({key, segment, 0});
        return id;
      }
      const auto& e = set->entries[id_plus_one - 1];
      if (e.key == key && e.segment == segment) return id_plus_one - 1;
    }
  }
  int32_t FindOrInsert(K key, int32_t segment, PairSet<K>* set) {
    return FindOrInsert(key, segment, HomeSlot(key, segment), set);
  }

 private:
  static std::vector<int32_t>& ThreadSlots() {
    static thread_local std::vector<int32_t> slots;
    return slots;
  }

  std::vector<int32_t>& slots_;
  uint64_t mask_ = 0;
  int shift_ = 0;
};

// Deduplicates the pairs at positions pos(0), ..., pos(m - 1) into `set` through `table`: ids[j] = id of the pair at
// pos(j), and first[id] = the position where a new pair was first seen (when `first` is given). The home slot of the
// pair kPrefetch places ahead is prefetched, so the table's cache misses overlap instead of adding up.
template <typename K, typename Pos>
void DedupPositions(const K* keys, const int32_t* segments, int64_t m, Pos pos, PairTable<K>* table,
                    PairSet<K>* set, int32_t* ids, std::vector<int32_t>* first) {
  constexpr int64_t kPrefetch = 8;
  uint64_t ring[kPrefetch];
  auto stage = [&](int64_t j) {
    const int64_t p = pos(j);
    ring[j % kPrefetch] = table->HomeSlot(keys[p], segments[p]);
    table->Prefetch(ring[j % kPrefetch]);
  };
  for (int64_t j = 0; j < std::min(m, kPrefetch); ++j) stage(j);
  for (int64_t j = 0; j < m; ++j) {
    const uint64_t slot = ring[j % kPrefetch];
    if (j + kPrefetch < m) stage(j + kPrefetch);
    const int64_t p = pos(j);
    const int64_t size_before = set->size();
    const int32_t id = table->FindOrInsert(keys[p], segments[p], slot, set);
    if (first != nullptr && set->size() != size_before) first->push_back(static_cast<int32_t>(p));
    ++set->entries[id].count;
    ids[j] = id;
  }
}

// Unique over (segments[i], keys[i]) for i in [0, n), in first-occurrence order. Writes inverse[i] (the index of
// pair i in `out`) and fills `out` with the unique pairs and their counts. The result depends on the input only,
// never on num_threads.
//
// Large inputs are split by hash, not by position: pair shard = a hash bit range, so every distinct pair belongs to
// exactly one shard and the shards are deduplicated concurrently with private tables and nothing to merge but the
// order. Each shard's uniques come out in first-occurrence order, so one merge of the shard lists by first position
// gives the global order. (Splitting by position would leave the categories of a fused group in different chunks
// and make the merge as expensive as the dedup.)
template <typename K>
void PairDedup(const K* keys, const int32_t* segments, int64_t n, int num_threads, const ParallelRunner& run,
               int32_t* inverse, PairSet<K>* out) {
  const int64_t num_shards = std::min<int64_t>(std::min(num_threads, 64), n / (kParallelDedupMinSize / 8));
  if (num_threads < kParallelDedupMinThreads || n < kParallelDedupMinSize || num_shards <= 1) {
    PairTable<K> table(n);
    DedupPositions(keys, segments, n, [](int64_t j) { return j; }, &table, out, inverse, nullptr);
    return;
  }

  // 1. Shard of every pair, and per position chunk the number of pairs of each shard.
  const int64_t chunk_len = (n + num_shards - 1) / num_shards;
  auto chunk_begin = [&](int64_t c) { return std::min(n, c * chunk_len); };
  std::unique_ptr<uint8_t[]> shard_of(new uint8_t[n]);
  std::vector<int64_t> chunk_shard_count(num_shards * num_shards, 0);
  run(num_shards, [&](int64_t c) {
    std::vector<int64_t> count(num_shards, 0);  // private: the shared rows of neighbouring chunks share a cache line
    for (int64_t i = chunk_begin(c), e = chunk_begin(c + 1); i < e; ++i) {
      const uint64_t h = PairSlotHash(static_cast<int64_t>(keys[i]), segments[i]);
      // Low hash bits pick the shard; the tables index slots by the high bits, so the two stay independent.
      const uint8_t shard = static_cast<uint8_t>((static_cast<uint64_t>(static_cast<uint32_t>(h)) * num_shards) >> 32);
      shard_of[i] = shard;
      ++count[shard];
    }
    std::copy(count.begin(), count.end(), chunk_shard_count.begin() + c * num_shards);
  });

  // 2. Each shard deduplicates its pairs in position order. Working vectors are private to the task and moved out
  // at the end: vector headers of neighbouring shards share cache lines, and every push_back would bounce them.
  std::vector<PairSet<K>> sets(num_shards);
  std::vector<std::vector<int32_t>> local_ids(num_shards), first(num_shards);
  run(num_shards, [&](int64_t t) {
    int64_t size = 0;
    for (int64_t c = 0; c < num_shards; ++c) size += chunk_shard_count[c * num_shards + t];
    std::vector<int32_t> pos(size);
    for (int64_t i = 0, j = 0; i < n; ++i) {
      if (shard_of[i] == t) pos[j++] = static_cast<int32_t>(i);
    }
    PairTable<K> table(size);
    PairSet<K> set;
    set.entries.reserve(size);
    std::vector<int32_t> ids(size), firsts;
    firsts.reserve(size);
    DedupPositions(keys, segments, size, [&pos](int64_t j) { return pos[j]; }, &table, &set, ids.data(), &firsts);
    sets[t] = std::move(set);
    local_ids[t] = std::move(ids);
    first[t] = std::move(firsts);
  });

  // 3. Merge the shards' unique lists by first position.
  int64_t total = 0;
  for (const auto& s : sets) total += s.size();
  out->entries.resize(total);
  std::vector<std::vector<int32_t>> remap(num_shards);
  std::vector<int64_t> head(num_shards, 0);
  for (int64_t t = 0; t < num_shards; ++t) remap[t].resize(sets[t].size());
  for (int64_t g = 0; g < total; ++g) {
    int64_t best = -1;
    for (int64_t t = 0; t < num_shards; ++t) {
      if (head[t] < sets[t].size() && (best < 0 || first[t][head[t]] < first[best][head[best]])) best = t;
    }
    out->entries[g] = sets[best].entries[head[best]];
    remap[best][head[best]++] = static_cast<int32_t>(g);
  }

  // 4. inverse, by position chunk: chunk c reads each shard's local ids from where the earlier chunks stopped.
  run(num_shards, [&](int64_t c) {
    std::vector<int64_t> cursor(num_shards, 0);
    for (int64_t prev = 0; prev < c; ++prev) {
      for (int64_t t = 0; t < num_shards; ++t) cursor[t] += chunk_shard_count[prev * num_shards + t];
    }
    for (int64_t i = chunk_begin(c), e = chunk_begin(c + 1); i < e; ++i) {
      const uint8_t t = shard_of[i];
      inverse[i] = remap[t][local_ids[t][cursor[t]++]];
    }
  });
}

}  // namespace impl
}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_IMPL_PAIR_DEDUP_H_
