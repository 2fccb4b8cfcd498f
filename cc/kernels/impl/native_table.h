/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// The core of the native embedding table (FusedRec>NativeTable*): an int64 -> [row | optimizer slots | access]
// hash map, the initializers of new rows and the sparse optimizer rules. TF-free, so the benchmark floor
// (cc/bench/table_floor.cc) runs exactly this code without TensorFlow.
//
// Why not TFRA's cuckoo table: a training step there costs two finds and two upserts per key (rows and accumulator
// are separate tables). Here one probe finds (or inserts and initialises) a key for the lookup, and one probe finds
// it again for the update, which is applied in place to the row and the slots stored beside it.
#ifndef CC_KERNELS_IMPL_NATIVE_TABLE_H_
#define CC_KERNELS_IMPL_NATIVE_TABLE_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/kernels/impl/hashing.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace tensorflow {
namespace fusedrec {
namespace impl {

// Result of an operation that may allocate.
enum class TableStatus {
  kOk,
  kTooLarge,  // the capacity would exceed 2^kMaxTableCapacityLog2 slots
  kNoMemory,  // allocation failed (or its byte size does not fit in size_t)
};

constexpr int kMaxTableCapacityLog2 = 40;
constexpr int kMinTableCapacityLog2 = 6;  // one whole occupancy word

// Slot hash of a table key. Not Mix64(key) itself: on an owner rank every key has the same Mix64(key) % num_ranks
// (hashing.h: OwnerOf), so indexing by those bits would use a fraction of the slots. Mix64 of the key plus an odd
// constant is unrelated to Mix64(key); the slot is taken from its high bits.
inline uint64_t TableSlotHash(int64_t key) { return Mix64(static_cast<uint64_t>(key) + 0xD6E8FEB86659FD93ull); }

// Per key access statistics, for LFU / LRU eviction.
struct AccessStats {
  int64_t count;
  int64_t last;
};

// Open addressing with linear probing over a power-of-two capacity. Every int64 is a valid key (no sentinel), so
// occupancy is a bitmap: 1 bit per slot keeps it cache resident (256 KiB for 2M slots) where a byte array would
// not. Keys, rows (stride dim, element V: float, or the bits of a float16), slots (float, stride num_slots * dim)
// and access stats live in separate arrays, so a probe walks only the dense key array and an update touches one
// row and one slot block. Growth doubles (as often as needed) and rehashes once the load would pass 3/4; removal
// shifts the following entries of the cluster back (no tombstones, so probe lengths never degrade with churn).
//
// Change tracking (what a publish to serving reads instead of every row): a second bitmap marks the entries inserted
// or written since the last ClearChanges (the owner marks its writes with MarkChanged; FindOrInsert marks what it
// inserts), moving with its entry on growth and removal. Once ClearChanges has been called, Remove also logs the
// keys it removes until the next ClearChanges (before, nothing consumes them: the log stays empty).
//
// Entry indices are stable until the next Reserve that grows, or Remove.
// Not thread-safe: the owner locks.
template <typename V>
class NativeHashMap {
 public:
  NativeHashMap(int64_t dim, int num_slots, bool track_access)
      : dim_(dim), num_slots_(num_slots), track_access_(track_access) {}
  NativeHashMap(const NativeHashMap&) = delete;
  NativeHashMap& operator=(const NativeHashMap&) = delete;

  int64_t size() const { return size_; }
  int64_t capacity() const { return capacity_; }
  int64_t dim() const { return dim_; }
  int num_slots() const { return num_slots_; }
  bool track_access() const { return track_access_; }

  int64_t key(int64_t i) const { return keys_[i]; }
  V* row(int64_t i) { return rows_.get() + i * dim_; }
  const V* row(int64_t i) const { return rows_.get() + i * dim_; }
  float* slots(int64_t i) { return slots_.get() + i * slot_stride(); }
  const float* slots(int64_t i) const { return slots_.get() + i * slot_stride(); }
  AccessStats& access(int64_t i) { return access_[i]; }
  const AccessStats& access(int64_t i) const { return access_[i]; }
  bool occupied(int64_t i) const { return (used_[i >> 6] >> (i & 63)) & 1; }
  bool changed(int64_t i) const { return (changed_[i >> 6] >> (i & 63)) & 1; }
  void MarkChanged(int64_t i) { changed_[i >> 6] |= uint64_t{1} << (i & 63); }
  void ClearChanged(int64_t i) { changed_[i >> 6] &= ~(uint64_t{1} << (i & 63)); }
  // A third bitmap, for the owner's use (a tiered table: the entry has a copy in the store), cleared on insertion and
  // moving with its entry.
  bool aux(int64_t i) const { return (aux_[i >> 6] >> (i & 63)) & 1; }
  void SetAux(int64_t i, bool on) {
    const uint64_t bit = uint64_t{1} << (i & 63);
    aux_[i >> 6] = on ? (aux_[i >> 6] | bit) : (aux_[i >> 6] & ~bit);
  }

  // Forgets the marks and the removed keys logged; from now on removals are logged.
  void ClearChanges() {
    if (capacity_ > 0) std::memset(changed_.get(), 0, (capacity_ >> 6) * sizeof(uint64_t));
    removed_.clear();
    removed_.shrink_to_fit();
    log_removed_ = true;
  }
  // Whether ClearChanges was ever called (the removed keys are logged since then).
  bool tracking_changes() const { return log_removed_; }
  // Keys removed since the last ClearChanges, in removal order, repeats included (a key may be removed, inserted
  // and removed again); some may be held again.
  const std::vector<int64_t>& removed() const { return removed_; }
  // Entries marked since the last ClearChanges.
  int64_t num_changed() const {
    int64_t n = 0;
    for (int64_t w = 0; w < (capacity_ >> 6); ++w) n += __builtin_popcountll(changed_[w]);
    return n;
  }

  // Bytes held by the arrays.
  int64_t MemoryUsed() const { return capacity_ == 0 ? 0 : static_cast<int64_t>(BytesFor(capacity_)); }

  // Bytes the arrays of `capacity` slots take; 0 if that does not fit in size_t.
  size_t BytesFor(int64_t capacity) const {
    const size_t per_entry = sizeof(int64_t) + dim_ * sizeof(V) + slot_stride() * sizeof(float) +
                             (track_access_ ? sizeof(AccessStats) : 0);
    const size_t cap = static_cast<size_t>(capacity);
    if (cap > (std::numeric_limits<size_t>::max() - cap / 8 * 3) / per_entry) return 0;
    return cap * per_entry + cap / 8 * 3;  // + the occupancy, change and aux bitmaps
  }

  // Makes room for `n` entries at load <= 3/4, so that inserting up to n - size() keys neither grows the table nor
  // moves entries. The ops reserve size() + (keys in the call) before they know how many keys are new, so a table
  // may double up to one call's worth of keys early. On failure the table is unchanged.
  TableStatus Reserve(int64_t n) {
    if (n <= MaxLoad(capacity_)) return TableStatus::kOk;
    int log2 = capacity_log2_ == 0 ? kMinTableCapacityLog2 : capacity_log2_ + 1;
    while (log2 <= kMaxTableCapacityLog2 && n > MaxLoad(int64_t{1} << log2)) ++log2;
    if (log2 > kMaxTableCapacityLog2) return TableStatus::kTooLarge;
    return Rehash(log2);
  }

  // Index of `key`, or -1.
  int64_t Find(int64_t key) const {
    if (size_ == 0) return -1;
    for (uint64_t slot = Home(key);; slot = (slot + 1) & mask_) {
      if (!occupied(slot)) return -1;
      if (keys_[slot] == key) return static_cast<int64_t>(slot);
    }
  }

  // Index of `key`, inserting it when absent (*inserted = true): its row and slots are then uninitialised and its
  // access stats zero. Needs room: Reserve(size() + 1) must have succeeded. The batch loops reserve once for all
  // their keys, so no insert inside a batch moves entries and the probe loop has no growth branch.
  int64_t FindOrInsert(int64_t key, bool* inserted) {
    for (uint64_t slot = Home(key);; slot = (slot + 1) & mask_) {
      if (!occupied(slot)) {
        used_[slot >> 6] |= uint64_t{1} << (slot & 63);
        changed_[slot >> 6] |= uint64_t{1} << (slot & 63);
        aux_[slot >> 6] &= ~(uint64_t{1} << (slot & 63));
        keys_[slot] = key;
        if (track_access_) access_[slot] = AccessStats{0, 0};
        ++size_;
        *inserted = true;
        return static_cast<int64_t>(slot);
      }
      if (keys_[slot] == key) {
        *inserted = false;
        return static_cast<int64_t>(slot);
      }
    }
  }

  // Removes `key` with its row, slots, access stats and change mark (logging it unless `log` is false: see
  // ClearChanges; a tiered table's eviction moves a key to disk, which is no removal); false if it was absent.
  // Backward-shift deletion: each later
  // entry of the cluster whose home is not cyclically in (hole, entry] moves into the hole, so every remaining key
  // stays reachable from its home without tombstones.
  bool Remove(int64_t key, bool log = true) {
    const int64_t found = Find(key);
    if (found < 0) return false;
    if (log && log_removed_) removed_.push_back(key);
    uint64_t hole = static_cast<uint64_t>(found);
    for (uint64_t j = (hole + 1) & mask_; occupied(j); j = (j + 1) & mask_) {
      const uint64_t home = Home(keys_[j]);
      const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (stays) continue;
      MoveEntry(j, hole);
      hole = j;
    }
    used_[hole >> 6] &= ~(uint64_t{1} << (hole & 63));
    changed_[hole >> 6] &= ~(uint64_t{1} << (hole & 63));
    aux_[hole >> 6] &= ~(uint64_t{1} << (hole & 63));
    --size_;
    return true;
  }

  // Prefetches what probing `key` reads first: its home slot's key and occupancy word.
  void PrefetchKey(int64_t key) const {
    if (capacity_ == 0) return;
    const uint64_t slot = Home(key);
    __builtin_prefetch(&keys_[slot]);
    __builtin_prefetch(&used_[slot >> 6]);
  }

  // Prefetches the row, slots and access stats of entry i, for writing.
  void PrefetchEntry(int64_t i) const {
    __builtin_prefetch(row(i), 1);
    if (num_slots_ > 0) __builtin_prefetch(slots(i), 1);
    if (track_access_) __builtin_prefetch(&access_[i], 1);
  }

  // Calls f(index) for each occupied entry, in slot order.
  template <typename F>
  void ForEach(F f) const {
    const int64_t words = capacity_ >> 6;
    for (int64_t w = 0; w < words; ++w) {
      for (uint64_t bits = used_[w]; bits != 0; bits &= bits - 1) f(w * 64 + __builtin_ctzll(bits));
    }
  }

  // Calls f(index) for each entry marked changed, in slot order.
  template <typename F>
  void ForEachChanged(F f) const {
    const int64_t words = capacity_ >> 6;
    for (int64_t w = 0; w < words; ++w) {
      for (uint64_t bits = changed_[w]; bits != 0; bits &= bits - 1) f(w * 64 + __builtin_ctzll(bits));
    }
  }

  // The most entries `capacity` slots hold (load 3/4).
  static int64_t MaxLoad(int64_t capacity) { return capacity - capacity / 4; }

 private:
  int64_t slot_stride() const { return num_slots_ * dim_; }
  uint64_t Home(int64_t key) const { return TableSlotHash(key) >> shift_; }

  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  template <typename T>
  using Array = std::unique_ptr<T[], Free>;

  // Uninitialised, cache-line aligned: a 16-float row is then one cache line, not two (measured on the floor loop,
  // cc/bench/table_floor.cc: 30% more keys/s than 16-byte aligned arrays).
  // Null when the allocation fails.
  template <typename T>
  static Array<T> Allocate(int64_t n) {
    static_assert(std::is_trivially_copyable<T>::value, "entries are moved with memcpy");
    constexpr size_t kLine = 64;
    const size_t bytes = (static_cast<size_t>(n) * sizeof(T) + kLine - 1) / kLine * kLine;
    return Array<T>(static_cast<T*>(std::aligned_alloc(kLine, bytes == 0 ? kLine : bytes)));
  }

  TableStatus Rehash(int log2) {
    const int64_t cap = int64_t{1} << log2;
    if (BytesFor(cap) == 0) return TableStatus::kNoMemory;
    auto used = Allocate<uint64_t>(cap >> 6);
    auto marks = Allocate<uint64_t>(cap >> 6);
    auto aux = Allocate<uint64_t>(cap >> 6);
    auto keys = Allocate<int64_t>(cap);
    auto rows = Allocate<V>(cap * dim_);
    Array<float> slots = num_slots_ > 0 ? Allocate<float>(cap * slot_stride()) : nullptr;
    Array<AccessStats> access = track_access_ ? Allocate<AccessStats>(cap) : nullptr;
    if (!used || !marks || !aux || !keys || !rows || (num_slots_ > 0 && !slots) || (track_access_ && !access)) {
      return TableStatus::kNoMemory;
    }
    std::memset(used.get(), 0, (cap >> 6) * sizeof(uint64_t));
    std::memset(marks.get(), 0, (cap >> 6) * sizeof(uint64_t));
    std::memset(aux.get(), 0, (cap >> 6) * sizeof(uint64_t));
    const int shift = 64 - log2;
    const uint64_t mask = static_cast<uint64_t>(cap) - 1;
    ForEach([&](int64_t from) {
      uint64_t to = TableSlotHash(keys_[from]) >> shift;
      while ((used[to >> 6] >> (to & 63)) & 1) to = (to + 1) & mask;
      used[to >> 6] |= uint64_t{1} << (to & 63);
      if (changed(from)) marks[to >> 6] |= uint64_t{1} << (to & 63);
      if (this->aux(from)) aux[to >> 6] |= uint64_t{1} << (to & 63);
      keys[to] = keys_[from];
      std::memcpy(rows.get() + to * dim_, row(from), dim_ * sizeof(V));
      if (num_slots_ > 0) {
        std::memcpy(slots.get() + to * slot_stride(), this->slots(from), slot_stride() * sizeof(float));
      }
      if (track_access_) access[to] = access_[from];
    });
    used_ = std::move(used);
    changed_ = std::move(marks);
    aux_ = std::move(aux);
    keys_ = std::move(keys);
    rows_ = std::move(rows);
    slots_ = std::move(slots);
    access_ = std::move(access);
    capacity_ = cap;
    capacity_log2_ = log2;
    shift_ = shift;
    mask_ = mask;
    return TableStatus::kOk;
  }

  void MoveEntry(uint64_t from, uint64_t to) {
    const uint64_t bit = uint64_t{1} << (to & 63);
    changed_[to >> 6] = changed(from) ? (changed_[to >> 6] | bit) : (changed_[to >> 6] & ~bit);
    aux_[to >> 6] = aux(from) ? (aux_[to >> 6] | bit) : (aux_[to >> 6] & ~bit);
    keys_[to] = keys_[from];
    std::memcpy(row(to), row(from), dim_ * sizeof(V));
    if (num_slots_ > 0) std::memcpy(slots(to), slots(from), slot_stride() * sizeof(float));
    if (track_access_) access_[to] = access_[from];
  }

  const int64_t dim_;
  const int num_slots_;
  const bool track_access_;
  int64_t size_ = 0;
  int64_t capacity_ = 0;
  int capacity_log2_ = 0;
  int shift_ = 64;
  uint64_t mask_ = 0;
  Array<uint64_t> used_;
  Array<uint64_t> changed_;  // change marks (ClearChanges)
  Array<uint64_t> aux_;      // the owner's marks (SetAux)
  Array<int64_t> keys_;
  Array<V> rows_;
  Array<float> slots_;
  Array<AccessStats> access_;
  bool log_removed_ = false;
  std::vector<int64_t> removed_;
};

// Runs probe(i) -> entry index for i = 0, 1, ..., n - 1 in order and visit(i, index) after it, also in order. The
// home slot of the key kKeyAhead places ahead and the row and slots of the entry kEntryAhead places ahead are
// prefetched, so the table's three cache misses per key overlap across keys instead of adding up. probe(j) runs
// before visit(i) for i < j <= i + kEntryAhead: when keys repeat within that window the later probe finds the
// entry the earlier one inserted, and its visit sees what the earlier visit wrote.
template <typename V, typename Probe, typename Visit>
void PipelinedProbe(const NativeHashMap<V>& map, const int64_t* keys, int64_t n, Probe probe, Visit visit) {
  constexpr int64_t kKeyAhead = 16;
  constexpr int64_t kEntryAhead = 8;
  int64_t ring[kEntryAhead];
  for (int64_t j = 0; j < std::min(n, kKeyAhead); ++j) map.PrefetchKey(keys[j]);
  auto stage = [&](int64_t j) {
    if (j + kKeyAhead < n) map.PrefetchKey(keys[j + kKeyAhead]);
    const int64_t index = probe(j);
    if (index >= 0) map.PrefetchEntry(index);
    ring[j % kEntryAhead] = index;
  };
  for (int64_t j = 0; j < std::min(n, kEntryAhead); ++j) stage(j);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t index = ring[i % kEntryAhead];
    if (i + kEntryAhead < n) stage(i + kEntryAhead);
    visit(i, index);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Initial rows of new keys: a function of (category salt, id) only, never of batch order or worker count.
// ---------------------------------------------------------------------------------------------------------------

// A standard normal from the two 24-bit halves of one 64-bit word (Box-Muller, cosine branch, in double): the
// recipe of tf_fusedrec.initializers.Hashed.
inline double BoxMullerNormal(uint64_t bits) {
  const double u1 = (static_cast<double>(bits >> 40) + 0.5) / 16777216.0;
  const double u2 = (static_cast<double>(bits & 0xFFFFFF) + 0.5) / 16777216.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// Word j >= 1 of the stream that starts at `base`: the Hashed initializer's column word for column j - 1.
inline uint64_t StreamWord(uint64_t base, uint64_t j) { return Mix64(base + j * kGolden64); }

class RowInitializer {
 public:
  virtual ~RowInitializer() = default;
  // Writes the initial row of id `id` of the category whose salt is `salt`.
  virtual void Fill(int64_t id, int64_t salt, int64_t dim, float* row) const = 0;
};

// Exactly tf_fusedrec.initializers.Hashed(seed, stddev).rows(id, salt, dim): the seed is already in the salt
// (feature_salt(seed, feature)). stddev is a double because Hashed multiplies in double before the float32 cast.
class HashedInitializer : public RowInitializer {
 public:
  explicit HashedInitializer(double stddev) : stddev_(stddev) {}
  void Fill(int64_t id, int64_t salt, int64_t dim, float* row) const override {
    const uint64_t base = Mix64(static_cast<uint64_t>(id) ^ static_cast<uint64_t>(salt));
    for (int64_t d = 0; d < dim; ++d) row[d] = static_cast<float>(stddev_ * BoxMullerNormal(StreamWord(base, d + 1)));
  }

 private:
  const double stddev_;
};

class ConstantInitializer : public RowInitializer {
 public:
  explicit ConstantInitializer(double value) : value_(static_cast<float>(value)) {}
  void Fill(int64_t, int64_t, int64_t dim, float* row) const override {
    for (int64_t d = 0; d < dim; ++d) row[d] = value_;
  }

 private:
  const float value_;
};

// The random initializers draw from a per-(seed, salt, id) stream, so a key's first row does not depend on when it
// is first seen. They have TFRA's distributions, not its values (TFRA draws from a per-call random op).
inline uint64_t RandomStreamBase(int64_t seed, int64_t id, int64_t salt) {
  return Mix64(Mix64(static_cast<uint64_t>(id) ^ static_cast<uint64_t>(salt)) ^
               Mix64(static_cast<uint64_t>(seed) + kGolden64));
}

// mean + stddev * N(0, 1); column d uses word d + 1.
class NormalInitializer : public RowInitializer {
 public:
  NormalInitializer(int64_t seed, double mean, double stddev) : seed_(seed), mean_(mean), stddev_(stddev) {}
  void Fill(int64_t id, int64_t salt, int64_t dim, float* row) const override {
    const uint64_t base = RandomStreamBase(seed_, id, salt);
    for (int64_t d = 0; d < dim; ++d) {
      row[d] = static_cast<float>(mean_ + stddev_ * BoxMullerNormal(StreamWord(base, d + 1)));
    }
  }

 private:
  const int64_t seed_;
  const double mean_, stddev_;
};

// mean + stddev * z with z ~ N(0, 1) restricted to [-2, 2] (TF's truncated normal): column d draws words
// d + 1, d + 1 + dim, d + 1 + 2 dim, ... until one is inside.
class TruncatedNormalInitializer : public RowInitializer {
 public:
  TruncatedNormalInitializer(int64_t seed, double mean, double stddev) : seed_(seed), mean_(mean), stddev_(stddev) {}
  void Fill(int64_t id, int64_t salt, int64_t dim, float* row) const override {
    const uint64_t base = RandomStreamBase(seed_, id, salt);
    for (int64_t d = 0; d < dim; ++d) {
      double z;
      uint64_t j = d + 1;
      do {
        z = BoxMullerNormal(StreamWord(base, j));
        j += dim;
      } while (std::fabs(z) > 2.0);
      row[d] = static_cast<float>(mean_ + stddev_ * z);
    }
  }

 private:
  const int64_t seed_;
  const double mean_, stddev_;
};

// minval + (maxval - minval) * u with u in (0, 1) from the top 52 bits of word d + 1 (52, so that + 0.5 is exact), in
// [float32(minval), float32(maxval)) as Keras' RandomUniform promises: a value that rounds up to float32(maxval) (u
// within 2^-25 or so of 1) takes the float below it.
class UniformInitializer : public RowInitializer {
 public:
  UniformInitializer(int64_t seed, double minval, double maxval)
      : seed_(seed),
        minval_(minval),
        maxval_(maxval),
        below_max_(std::max(static_cast<float>(minval),
                            std::nextafter(static_cast<float>(maxval), -std::numeric_limits<float>::infinity()))) {}
  void Fill(int64_t id, int64_t salt, int64_t dim, float* row) const override {
    const uint64_t base = RandomStreamBase(seed_, id, salt);
    for (int64_t d = 0; d < dim; ++d) {
      const double u = (static_cast<double>(StreamWord(base, d + 1) >> 12) + 0.5) / 4503599627370496.0;
      row[d] = std::min(static_cast<float>(minval_ + (maxval_ - minval_) * u), below_max_);
    }
  }

 private:
  const int64_t seed_;
  const double minval_, maxval_;
  const float below_max_;  // the largest float32 below float32(maxval) (float32(minval) if that is larger)
};

// ---------------------------------------------------------------------------------------------------------------
// Stochastic rounding of an updated row to float16 storage (rounding="stochastic"; "nearest" is Eigen::half's round
// to nearest even). Round to nearest loses every update smaller than half a float16 step; stochastic rounding keeps
// it on average: |x| goes to the float16 magnitude above it with probability (|x| - below) / (above - below).
//
// Integer operations on the float32 bits only, so that the TF-op twin (tf_fusedrec/distributed/rounding.py) and the
// NumPy reference (tf_fusedrec.ops.reference.stochastic_float16) give the same bits. The random bits are a function
// of (the table's salt, key, update count, column) only, never of the worker or of batch order, so N workers round
// as one does.
// ---------------------------------------------------------------------------------------------------------------

// Keeps the rounding stream apart from the random initializers' streams, which start from a category's salt.
constexpr uint64_t kFloat16RoundingSalt = 0x5851F42D4C957F2Dull;

// The stream of key `key`'s row at update `update_count` (1-based) of a table whose first category salt is `salt`.
inline uint64_t Float16RoundingStream(int64_t salt, int64_t key, int64_t update_count) {
  return RandomStreamBase(update_count, key, static_cast<int64_t>(static_cast<uint64_t>(salt) ^ kFloat16RoundingSalt));
}

// The 32 random bits of column d: the high half of the stream's word d + 1.
inline uint32_t Float16RoundingBits(uint64_t stream, int64_t d) {
  return static_cast<uint32_t>(StreamWord(stream, static_cast<uint64_t>(d) + 1) >> 32);
}

// The float16 bits of float32 bits `x` rounded stochastically with the 32 random bits `r`. With F = |x| / s * 2^32
// in fixed point (s: the float16 step at |x|), the magnitude is s * floor((F + r) / 2^32): the step above is taken
// with probability frac(|x| / s), exactly for |x| >= 2^-33 (F's bits below 2^-56 are dropped, smaller values round
// to zero or 2^-24 with a probability short of theirs by < 2^-32). The sign is kept (-0 stays -0). Past the largest
// float16, 65504, the step above is inf: |x| in (65504, 65536) becomes inf with probability (|x| - 65504) / 32,
// |x| >= 65536 always (round to nearest: from 65520). NaN becomes the quiet NaN 0x7E00 with x's sign.
inline uint16_t StochasticFloat16Bits(uint32_t x, uint32_t r) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t m = x & 0x7FFFFFFFu;
  if (m > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  uint64_t h;
  if (m >= 0x38800000u) {  // |x| >= 2^-14, float16's normal range: drop 13 of float32's 23 mantissa bits
    // (m << 19) + r carries into bit 32 with probability (m & 0x1FFF) / 2^13; a carry out of the mantissa raises
    // the exponent, as it should. Then rebias the exponent (127 - 15 = 112) and stop at inf.
    h = (((static_cast<uint64_t>(m) << 19) + r) >> 32) - (112u << 10);
    if (h > 0x7C00u) h = 0x7C00u;
  } else {  // float16's subnormal range (step 2^-24), zero and float32 subnormals: F = floor(|x| * 2^56)
    const uint32_t e = m >> 23;
    const uint64_t significand = (m & 0x7FFFFFu) | (e != 0 ? 0x800000u : 0u);  // |x| = significand * 2^(e' - 150)
    const int shift = static_cast<int>(e != 0 ? e : 1) - 94;                        // e' = max(e, 1)
    const uint64_t f = shift >= 0 ? significand << shift : significand >> std::min(-shift, 63);
    h = (f + r) >> 32;  // at most 0x400: 2^-14, float16's smallest normal
  }
  return static_cast<uint16_t>(sign | h);
}

// ---------------------------------------------------------------------------------------------------------------
// Sparse optimizer rules, applied in place to one float32 row `w` and its slots `s` (slot k at s + k * dim). The
// arithmetic is TensorFlow's: float32, each product and sum rounded on its own, in the order TF evaluates the update
// (the library is built with -ffp-contract=off and no -march: no fused multiply-adds), so a row updated every step
// ends bit for bit where the same optimizer leaves a dense float32 tf.Variable:
//
// * sgd, adagrad, adam: TF's training kernels as Keras 2's (legacy) optimizers run them, which is what the TFRA backend
//   runs on a step's rows (kept bit-equal to it);
// * sgd with momentum, ftrl: Keras 3's update_step, whose arithmetic is also that of the kernels Keras 2 runs
//   (ResourceApplyKerasMomentum; ResourceApplyFtrl(V2), where x^0.5 is a square root);
// * rmsprop, adamw: Keras 3's update_step (Keras 2's differ: see each rule).
//
// Keras 3 writes hyperparameters as Python floats, so `1 - rho` is taken in float64 and rounded to float32 once, where
// TF's kernels take 1 - float32(rho) in float32 (0.1f against 0.100000024f for rho = 0.9): OptimizerHyper holds each
// constant as its rule's model rounds it (NativeTableConfig::FromAttrs derives them from the float64 attributes).
//
// Adagrad and Adam go four lanes at a time with SSE, then one at a time: the same IEEE operations either way, written
// out because the compiler will not vectorize std::sqrt without -fno-math-errno (the scalar loop cost Adagrad 2x per
// key). The other rules are scalar loops.
// ---------------------------------------------------------------------------------------------------------------

// The operands of an update: the step's learning rates and the table's hyperparameters as the float32 constants the
// rules take (each rule reads its own).
struct OptimizerHyper {
  float lr = 0;       // this step's learning rate
  float adam_lr = 0;  // adam, adamw: lr * sqrt(1 - beta2^t) / (1 - beta1^t), computed by the caller as TF computes it
  float epsilon = 0;  // adagrad, adam, adamw, rmsprop
  float beta1 = 0, beta2 = 0;                      // adam: float32(beta), the kernel takes 1 - beta in float32
  float one_minus_beta1 = 0, one_minus_beta2 = 0;  // adamw: float32(1 - beta), 1 - beta in float64 (Keras 3)
  float weight_decay = 0;                          // adamw
  float momentum = 0;                              // sgd (momentum rules), rmsprop
  float rho = 0, one_minus_rho = 0;                // rmsprop: float32(rho), float32(1 - rho) (1 - rho in float64)
  // ftrl: the power -learning_rate_power (a square root when it is 0.5), the l1 bound, l2 and beta (which with the
  // step's lr make the quadratic term's 2 * (l2 + beta / (2 lr))) and float32(2 * l2_shrinkage) (2 * in float64).
  float ftrl_power = 0.5f;
  bool ftrl_sqrt = true;
  float l1 = 0, l2 = 0, ftrl_beta = 0, two_l2_shrinkage = 0;
};

// w -= lr * g (TF's ResourceApplyGradientDescent; Keras 3's w -= g * lr is the same product).
struct SgdRule {
  static constexpr int kSlots = 0;
  static void Apply(const OptimizerHyper& h, const float* __restrict g, int64_t dim, float* __restrict w, float*) {
    for (int64_t d = 0; d < dim; ++d) w[d] -= h.lr * g[d];
  }
};

// SGD with momentum > 0 (Keras 3's SGD; TF's ResourceApplyKerasMomentum, Keras 2's): m = m * momentum - g * lr; then
// w += m, or with Nesterov w += m * momentum - g * lr. Slot: momentum.
template <bool kNesterov>
struct MomentumRule {
  static constexpr int kSlots = 1;
  static void Apply(const OptimizerHyper& h, const float* __restrict g, int64_t dim, float* __restrict w,
                    float* __restrict m) {
    for (int64_t d = 0; d < dim; ++d) {
      m[d] = m[d] * h.momentum - g[d] * h.lr;
      w[d] += kNesterov ? m[d] * h.momentum - g[d] * h.lr : m[d];
    }
  }
};

// TF's ResourceSparseApplyAdagradV2: acc += g * g; w -= lr * g / (sqrt(acc) + epsilon).
struct AdagradRule {
  static constexpr int kSlots = 1;
  static void Apply(const OptimizerHyper& h, const float* __restrict g, int64_t dim, float* __restrict w,
                    float* __restrict acc) {
    int64_t d = 0;
#if defined(__SSE2__)
    const __m128 lr = _mm_set1_ps(h.lr), eps = _mm_set1_ps(h.epsilon);
    for (; d + 4 <= dim; d += 4) {
      const __m128 gv = _mm_loadu_ps(g + d);
      const __m128 a = _mm_add_ps(_mm_loadu_ps(acc + d), _mm_mul_ps(gv, gv));
      _mm_storeu_ps(acc + d, a);
      const __m128 step = _mm_div_ps(_mm_mul_ps(lr, gv), _mm_add_ps(_mm_sqrt_ps(a), eps));
      _mm_storeu_ps(w + d, _mm_sub_ps(_mm_loadu_ps(w + d), step));
    }
#endif
    for (; d < dim; ++d) {
      acc[d] += g[d] * g[d];
      w[d] -= h.lr * g[d] / (std::sqrt(acc[d]) + h.epsilon);
    }
  }
};

// Adam's moments and step on one row, in the order of TF's ResourceApplyAdam kernel and of Keras 3's Adam:
// m += (g - m) * c1; v += (g * g - v) * c2; w -= (m * alpha) / (sqrt(v) + epsilon), with c1, c2 the 1 - beta constants
// and alpha the bias-corrected learning rate.
inline void AdamStep(float alpha, float c1, float c2, float epsilon, const float* __restrict g, int64_t dim,
                     float* __restrict w, float* __restrict m, float* __restrict v) {
  int64_t d = 0;
#if defined(__SSE2__)
  const __m128 alpha4 = _mm_set1_ps(alpha), eps = _mm_set1_ps(epsilon);
  const __m128 c1v = _mm_set1_ps(c1), c2v = _mm_set1_ps(c2);
  for (; d + 4 <= dim; d += 4) {
    const __m128 gv = _mm_loadu_ps(g + d);
    const __m128 m0 = _mm_loadu_ps(m + d), v0 = _mm_loadu_ps(v + d);
    const __m128 mv = _mm_add_ps(m0, _mm_mul_ps(_mm_sub_ps(gv, m0), c1v));
    const __m128 vv = _mm_add_ps(v0, _mm_mul_ps(_mm_sub_ps(_mm_mul_ps(gv, gv), v0), c2v));
    _mm_storeu_ps(m + d, mv);
    _mm_storeu_ps(v + d, vv);
    const __m128 step = _mm_div_ps(_mm_mul_ps(mv, alpha4), _mm_add_ps(_mm_sqrt_ps(vv), eps));
    _mm_storeu_ps(w + d, _mm_sub_ps(_mm_loadu_ps(w + d), step));
  }
#endif
  for (; d < dim; ++d) {
    m[d] = m[d] + (g[d] - m[d]) * c1;
    v[d] = v[d] + (g[d] * g[d] - v[d]) * c2;
    w[d] -= (m[d] * alpha) / (std::sqrt(v[d]) + epsilon);
  }
}

// Adam on the touched rows only (lazy Adam, TFRA's semantics), with the arithmetic of TensorFlow's ResourceApplyAdam
// kernel, which is what TFRA runs on a step's rows (a TFRA shadow variable's gradient is dense over them): the kernel
// takes 1 - beta in float32. Slots: m, then v. (Keras 2's sparse Adam, m * beta1 + g * (1 - beta1), rounds
// differently: 1-ulp differences that Adam's normalisation grows over steps.)
struct AdamRule {
  static constexpr int kSlots = 2;
  static void Apply(const OptimizerHyper& h, const float* __restrict g, int64_t dim, float* __restrict w,
                    float* __restrict s) {
    AdamStep(h.adam_lr, 1.0f - h.beta1, 1.0f - h.beta2, h.epsilon, g, dim, w, s, s + dim);
  }
};

// AdamW (Keras 3): the decoupled weight decay w -= (w * weight_decay) * lr (Keras 3's _apply_weight_decay on the
// TensorFlow backend, before the step), then Adam with 1 - beta taken in float64 (Keras 3's Python floats; TF's Adam
// kernel, AdamRule, takes it in float32). Slots: m, then v. Lazy like every rule here: a row decays when its key is
// updated, where a dense AdamW decays every row every step.
struct AdamWRule {
  static constexpr int kSlots = 2;
  static void Apply(const OptimizerHyper& h, const float* __restrict g, int64_t dim, float* __restrict w,
                    float* __restrict s) {
    for (int64_t d = 0; d < dim; ++d) w[d] = w[d] - (w[d] * h.weight_decay) * h.lr;
    AdamStep(h.adam_lr, h.one_minus_beta1, h.one_minus_beta2, h.epsilon, g, dim, w, s, s + dim);
  }
};

// FTRL-proximal (Keras 3's Ftrl update_step, in its order, which is also that of TF's ResourceApplyFtrlV2 kernel,
// Keras 2's): with p = -learning_rate_power, n the accumulator and z the linear slot,
//   g' = g + (2 l2_shrinkage) * w;  n' = n + g * g;  z += g' - ((n'^p - n^p) / lr) * w;
//   w = (clip(z, -l1, l1) - z) / (n'^p / lr + 2 (l2 + beta / (2 lr)));  n = n'.
// x^0.5 is sqrt(x), as TF's kernel takes it and as Grappler rewrites Keras 3's pow(x, 0.5) in a tf.function; other
// powers are std::pow, which TF's eager pow matches on its scalar path only (its vectorized pow differs from it in the
// last bit for some x). Slots: accumulator, then linear.
struct FtrlRule {
  static constexpr int kSlots = 2;
  static float Power(const OptimizerHyper& h, float x) {
    return h.ftrl_sqrt ? std::sqrt(x) : std::pow(x, h.ftrl_power);
  }
  static void Apply(const OptimizerHyper& h, const float* __restrict g, int64_t dim, float* __restrict w,
                    float* __restrict s) {
    float* __restrict n = s;
    float* __restrict z = s + dim;
    const float two_l2 = 2.0f * (h.l2 + h.ftrl_beta / (2.0f * h.lr));
    for (int64_t d = 0; d < dim; ++d) {
      const float shrunk = g[d] + h.two_l2_shrinkage * w[d];
      const float n_new = n[d] + g[d] * g[d];
      const float power_new = Power(h, n_new);
      z[d] += shrunk - ((power_new - Power(h, n[d])) / h.lr) * w[d];
      const float quadratic = power_new / h.lr + two_l2;
      const float clipped = std::max(std::min(z[d], h.l1), -h.l1);  // tf.clip_by_value: max(min(z, l1), -l1)
      w[d] = (clipped - z[d]) / quadratic;
      n[d] = n_new;
    }
  }
};

// RMSprop (Keras 3's update_step, in its order): v = rho * v + (1 - rho) * (g * g); centered: mg = rho * mg +
// (1 - rho) * g and d = (v - mg * mg) + epsilon, else d = v + epsilon; step = (lr * g) / sqrt(d); with momentum > 0:
// mom = momentum * mom + step, w -= mom; else w -= step. Slots: rms (v), momentum (momentum > 0 only), mg (centered
// only): Keras 2's names, which the TFRA backend's checkpoints use. Keras 2 differs: 1 - rho in float32; without
// momentum epsilon outside the root, w -= lr * g / (sqrt(d) + epsilon); with momentum TF's kernel order,
// v += (g * g - v) * (1 - rho).
template <bool kMomentum, bool kCentered>
struct RmspropRule {
  static constexpr int kSlots = 1 + (kMomentum ? 1 : 0) + (kCentered ? 1 : 0);
  static void Apply(const OptimizerHyper& h, const float* __restrict g, int64_t dim, float* __restrict w,
                    float* __restrict s) {
    float* __restrict v = s;
    float* __restrict mom = s + dim;
    float* __restrict mg = s + (kMomentum ? 2 : 1) * dim;
    for (int64_t d = 0; d < dim; ++d) {
      v[d] = h.rho * v[d] + h.one_minus_rho * (g[d] * g[d]);
      float denominator;
      if (kCentered) {
        mg[d] = h.rho * mg[d] + h.one_minus_rho * g[d];
        denominator = (v[d] - mg[d] * mg[d]) + h.epsilon;
      } else {
        denominator = v[d] + h.epsilon;
      }
      const float step = (h.lr * g[d]) / std::sqrt(denominator);
      if (kMomentum) {
        mom[d] = h.momentum * mom[d] + step;
        w[d] -= mom[d];
      } else {
        w[d] -= step;
      }
    }
  }
};

}  // namespace impl
}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_IMPL_NATIVE_TABLE_H_
