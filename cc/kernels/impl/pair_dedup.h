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

// Inputs below this size are deduplicated on the calling thread: splitting costs more than it saves.
constexpr int64_t kParallelDedupMinSize = 1 << 16;

template <typename K>
struct PairSet {
  std::vector<K> keys;
  std::vector<int32_t> segments;
  std::vector<int32_t> counts;

  int64_t size() const { return static_cast<int64_t>(keys.size()); }
  void Reserve(int64_t n) {
    keys.reserve(n);
    segments.reserve(n);
    counts.reserve(n);
  }
};

// Linear-probing table of ids into a PairSet. Capacity is a power of two >= 2 * expected, so the load factor stays
// <= 0.5 when at most `expected` pairs are inserted. A slot holds a 32-bit tag of the hash and id + 1 (0 = empty).
template <typename K>
class PairTable {
 public:
  explicit PairTable(int64_t expected) {
    int log2 = 4;
    while ((int64_t{1} << log2) < 2 * expected) ++log2;
    mask_ = (uint64_t{1} << log2) - 1;
    shift_ = 64 - log2;
    slots_.reset(new Slot[mask_ + 1]);
    std::memset(slots_.get(), 0, sizeof(Slot) * (mask_ + 1));
  }

  // Returns the id of (key, segment) in `set`, appending the pair with a zero count when it is new.
  int32_t FindOrInsert(K key, int32_t segment, PairSet<K>* set) {
    const uint64_t h = PairSlotHash(static_cast<int64_t>(key), segment);
    const uint32_t tag = static_cast<uint32_t>(h);
    for (uint64_t i = h >> shift_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id_plus_one == 0) {
        const int32_t id = static_cast<int32_t>(set->size());
        s.tag = tag;
        s.id_plus_one = id + 1;
        set->keys.push_back(key);
        set->segments.push_back(segment);
        set->counts.push_back(0);
        return id;
      }
      const int32_t id = s.id_plus_one - 1;
      if (s.tag == tag && set->keys[id] == key && set->segments[id] == segment) return id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;
    int32_t id_plus_one;
  };
  std::unique_ptr<Slot[]> slots_;
  uint64_t mask_ = 0;
  int shift_ = 0;
};

// Deduplicates pairs [begin, end) into `set` through `table`; ids[i - begin] = id of pair i.
template <typename K>
void DedupRange(const K* keys, const int32_t* segments, int64_t begin, int64_t end, PairTable<K>* table,
                PairSet<K>* set, int32_t* ids) {
  for (int64_t i = begin; i < end; ++i) {
    const int32_t id = table->FindOrInsert(keys[i], segments[i], set);
    ++set->counts[id];
    ids[i - begin] = id;
  }
}

// Unique over (segments[i], keys[i]) for i in [0, n), in first-occurrence order. Writes inverse[i] (the index of
// pair i in `out`) and fills `out` with the unique pairs and their counts. The result depends on the input only,
// never on num_threads.
//
// Large inputs: a prefix (n / 8) is deduplicated serially first. If it is mostly unique, splitting will not pay
// (merging costs as much as inserting), so the rest continues serially. Otherwise the remainder is cut into
// num_threads chunks deduplicated concurrently with private tables, and the small per-chunk results are merged in
// chunk order, which keeps the global first-occurrence order.
template <typename K>
void PairDedup(const K* keys, const int32_t* segments, int64_t n, int num_threads, const ParallelRunner& run,
               int32_t* inverse, PairSet<K>* out) {
  if (num_threads <= 1 || n < kParallelDedupMinSize) {
    PairTable<K> table(n);
    out->Reserve(n);
    DedupRange(keys, segments, 0, n, &table, out, inverse);
    return;
  }

  const int64_t prefix = n / 8;
  PairSet<K> head;
  {
    PairTable<K> head_table(prefix);
    head.Reserve(prefix);
    DedupRange(keys, segments, 0, prefix, &head_table, &head, inverse);
  }

  const bool mostly_unique = head.size() * 2 > prefix;
  if (mostly_unique) {
    PairTable<K> table(n);
    out->Reserve(n);
    for (int64_t id = 0; id < head.size(); ++id) table.FindOrInsert(head.keys[id], head.segments[id], out);
    out->counts = head.counts;
    DedupRange(keys, segments, prefix, n, &table, out, inverse + prefix);
    return;
  }

  const int64_t rest = n - prefix;
  const int64_t num_chunks = std::min<int64_t>(num_threads, rest / (kParallelDedupMinSize / 8));
  const int64_t chunk_len = (rest + num_chunks - 1) / num_chunks;
  std::vector<PairSet<K>> chunk_sets(num_chunks);
  auto chunk_begin = [&](int64_t c) { return std::min(n, prefix + c * chunk_len); };
  run(num_chunks, [&](int64_t c) {
    const int64_t b = chunk_begin(c), e = chunk_begin(c + 1);
    PairTable<K> table(e - b);
    chunk_sets[c].Reserve(e - b);
    DedupRange(keys, segments, b, e, &table, &chunk_sets[c], inverse + b);
  });

  int64_t upper_bound = head.size();
  for (const auto& s : chunk_sets) upper_bound += s.size();
  PairTable<K> table(upper_bound);
  out->Reserve(upper_bound);
  for (int64_t id = 0; id < head.size(); ++id) table.FindOrInsert(head.keys[id], head.segments[id], out);
  out->counts = head.counts;
  std::vector<std::vector<int32_t>> remap(num_chunks);
  for (int64_t c = 0; c < num_chunks; ++c) {
    const PairSet<K>& s = chunk_sets[c];
    remap[c].resize(s.size());
    for (int64_t j = 0; j < s.size(); ++j) {
      const int32_t id = table.FindOrInsert(s.keys[j], s.segments[j], out);
      out->counts[id] += s.counts[j];
      remap[c][j] = id;
    }
  }
  run(num_chunks, [&](int64_t c) {
    const int32_t* map = remap[c].data();
    for (int64_t i = chunk_begin(c), e = chunk_begin(c + 1); i < e; ++i) inverse[i] = map[inverse[i]];
  });
}

}  // namespace impl
}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_IMPL_PAIR_DEDUP_H_
