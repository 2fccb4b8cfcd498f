/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// Launchers of the FusedRec CUDA kernels (the host API in fusedrec_gpu.h). TF-free: the op library and the
// standalone harness (tests/cuda/) compile this same file with nvcc.
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "cc/kernels/impl/fusedrec_gpu.cu.h"
#include "cc/kernels/impl/fusedrec_gpu.h"
#include "cc/kernels/impl/hashing.h"

namespace tensorflow {
namespace fusedrec {
namespace impl {
namespace gpu {
namespace {

// Returns the error of a CUDA call (a cudaError_t, or the int of this file's API) from the enclosing function.
#define FUSEDREC_CUDA_RETURN_IF_ERROR(expr)                                  \
  do {                                                                       \
    const cudaError_t fusedrec_error_ = static_cast<cudaError_t>(expr);      \
    if (fusedrec_error_ != cudaSuccess) return fusedrec_error_;              \
  } while (0)

constexpr size_t kAlign = 256;

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

unsigned NumTiles(int64_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

// Positions a thread of pass 1 takes: more on larger inputs, where the grid is large anyway and each tile's shared
// dedup saves global probes; 1 below 2^19 positions, so that a step's batch (26 x 4096) still fills the device.
int InsertItems(int64_t n) { return n < (int64_t{1} << 19) ? 1 : n < (int64_t{1} << 21) ? 2 : 4; }

// Whether passes 3-4 read first-occurrence flags (pass 2) rather than the table: from 2^20 positions, where the
// table (>= 16 MiB of 8-byte slots) leaves L2 and a random read per position costs more than a pass over the table.
bool UseFirstFlags(int64_t n) { return n >= (int64_t{1} << 20); }

// Blocks of a grid-stride pass over the table: enough to fill the device a few times over, no more.
unsigned TableBlocks(uint64_t capacity) {
  return static_cast<unsigned>(std::min<uint64_t>((capacity + kBlock - 1) / kBlock, 4096));
}

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Carves consecutive aligned arrays out of one scratch allocation; with base == nullptr it only adds up the sizes.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* Take(size_t count) {
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += AlignUp(count * sizeof(T));
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

// The arrays of one pair dedup in its scratch; the same function sizes (base == nullptr) and places them.
struct DedupScratch {
  SlotTable table;
  uint64_t capacity;
  unsigned num_tiles;
  uint32_t* slot_of;
  uint8_t* first;         // n: whether each position is its pair's first occurrence (pass 2)
  int32_t* tile_counts;   // num_tiles + 1; the extra zero makes the exclusive scan end with the total
  int32_t* tile_offsets;  // num_tiles + 1
  DeviceStatus* status;
  void* scan_temp;
  size_t scan_temp_bytes;
  size_t total_bytes;
};

cudaError_t LayOutDedup(int64_t n, void* base, DedupScratch* s) {
  // At least 1.5 slots a position (load <= 2/3 when every pair is distinct; far less on skewed keys), at least 64.
  int log2 = 6;
  while ((uint64_t{1} << log2) < static_cast<uint64_t>(n) + static_cast<uint64_t>(n) / 2) ++log2;
  s->capacity = uint64_t{1} << log2;
  s->table.mask = s->capacity - 1;
  s->table.shift = 64 - log2;
  s->num_tiles = NumTiles(n);
  s->scan_temp_bytes = 0;
  FUSEDREC_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(nullptr, s->scan_temp_bytes, static_cast<int32_t*>(nullptr),
                                                              static_cast<int32_t*>(nullptr),
                                                              static_cast<int>(s->num_tiles) + 1));
  Carver carve(base);
  s->table.slots = carve.Take<Slot>(s->capacity);
  s->slot_of = carve.Take<uint32_t>(std::max<int64_t>(n, 1));
  s->first = carve.Take<uint8_t>(std::max<int64_t>(n, 1));
  s->tile_counts = carve.Take<int32_t>(s->num_tiles + 1);
  s->tile_offsets = carve.Take<int32_t>(s->num_tiles + 1);
  s->status = carve.Take<DeviceStatus>(1);
  s->scan_temp = carve.Take<char>(std::max<size_t>(s->scan_temp_bytes, 1));
  s->total_bytes = carve.used();
  return cudaSuccess;
}

}  // namespace

const char* ErrorString(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

int CopyToHost(void* host_dst, const void* device_src, size_t bytes, void* stream) {
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, AsStream(stream)));
  return cudaStreamSynchronize(AsStream(stream));
}

int PairDedupScratchBytes(int64_t n, size_t* bytes) {
  DedupScratch s;
  FUSEDREC_CUDA_RETURN_IF_ERROR(LayOutDedup(n, nullptr, &s));
  *bytes = s.total_bytes;
  return cudaSuccess;
}

template <typename K>
int PairDedupFind(const K* keys, const int32_t* segments, int64_t n, int64_t segment_limit, int64_t packed_key_limit,
                  void* scratch, void* stream, DedupResult* result) {
  *result = DedupResult();
  if (n == 0) return cudaSuccess;
  const cudaStream_t s = AsStream(stream);
  DedupScratch d;
  FUSEDREC_CUDA_RETURN_IF_ERROR(LayOutDedup(n, scratch, &d));
  InitSlots<<<TableBlocks(d.capacity), kBlock, 0, s>>>(d.table.slots, d.capacity);
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const bool flags = UseFirstFlags(n);
  if (flags) FUSEDREC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d.first, 0, n, s));
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d.tile_counts, 0, (d.num_tiles + 1) * sizeof(int32_t), s));
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d.status, 0xff, sizeof(DeviceStatus), s));
  const int items = InsertItems(n);
  const unsigned insert_blocks = static_cast<unsigned>((n + kBlock * items - 1) / (kBlock * items));
  if (items == 1) {
    InsertPairs<K, 1><<<insert_blocks, kBlock, 0, s>>>(keys, segments, n, segment_limit, packed_key_limit, d.table,
                                                        d.slot_of, d.status);
  } else if (items == 2) {
    InsertPairs<K, 2><<<insert_blocks, kBlock, 0, s>>>(keys, segments, n, segment_limit, packed_key_limit, d.table,
                                                        d.slot_of, d.status);
  } else {
    InsertPairs<K, 4><<<insert_blocks, kBlock, 0, s>>>(keys, segments, n, segment_limit, packed_key_limit, d.table,
                                                        d.slot_of, d.status);
  }
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (flags) {
    MarkFirsts<<<TableBlocks(d.capacity), kBlock, 0, s>>>(d.table.slots, d.capacity, d.first);
    FUSEDREC_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  CountFirsts<<<d.num_tiles, kBlock, 0, s>>>(flags ? d.first : nullptr, d.table, d.slot_of, n, d.tile_counts);
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  FUSEDREC_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(d.scan_temp, d.scan_temp_bytes, d.tile_counts,
                                                              d.tile_offsets, static_cast<int>(d.num_tiles) + 1, s));
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&d.status->num_unique, d.tile_offsets + d.num_tiles, sizeof(int32_t),
                                                cudaMemcpyDeviceToDevice, s));
  DeviceStatus host;
  FUSEDREC_CUDA_RETURN_IF_ERROR(CopyToHost(&host, d.status, sizeof(host), stream));
  result->num_unique = host.num_unique;
  result->first_bad_segment = host.first_bad_segment == kEmpty ? -1 : static_cast<int64_t>(host.first_bad_segment);
  result->first_bad_key = host.first_bad_key == kEmpty ? -1 : static_cast<int64_t>(host.first_bad_key);
  return cudaSuccess;
}

namespace {

template <typename K, typename OutKey, Encoding kEncoding>
cudaError_t Emit(const K* keys, const int32_t* segments, int64_t n, void* scratch, int key_bits, OutKey* unique_keys,
                 int32_t* unique_segments, int32_t* counts, int32_t* segment_counts, int32_t* inverse,
                 cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  DedupScratch d;
  FUSEDREC_CUDA_RETURN_IF_ERROR(LayOutDedup(n, scratch, &d));
  EmitUnique<K, OutKey, kEncoding><<<d.num_tiles, kBlock, 0, s>>>(keys, segments, n, d.table, d.slot_of,
                                                                   UseFirstFlags(n) ? d.first : nullptr,
                                                                   d.tile_offsets, key_bits, unique_keys,
                                                                   unique_segments, counts, segment_counts);
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  WriteInverse<<<d.num_tiles, kBlock, 0, s>>>(d.table, d.slot_of, n, inverse);
  return cudaGetLastError();
}

}  // namespace

template <typename K>
int SegmentUniqueEmit(const K* keys, const int32_t* segments, int64_t n, void* scratch, K* unique_keys,
                      int32_t* unique_segments, int32_t* inverse, int32_t* counts, void* stream) {
  return Emit<K, K, Encoding::kKeys>(keys, segments, n, scratch, /*key_bits=*/0, unique_keys, unique_segments, counts,
                                     /*segment_counts=*/nullptr, inverse, AsStream(stream));
}

template <typename K>
int CategoryUniqueEmit(const K* keys, const int32_t* segments, int64_t n, void* scratch, bool hashed, int key_bits,
                       int64_t* unified_keys, int32_t* inverse, int32_t* unique_segments, int32_t* segment_counts,
                       int64_t num_segments, void* stream) {
  const cudaStream_t s = AsStream(stream);
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(segment_counts, 0, num_segments * sizeof(int32_t), s));
  if (hashed) {
    return Emit<K, int64_t, Encoding::kHashed>(keys, segments, n, scratch, key_bits, unified_keys, unique_segments,
                                               /*counts=*/nullptr, segment_counts, inverse, s);
  }
  return Emit<K, int64_t, Encoding::kPacked>(keys, segments, n, scratch, key_bits, unified_keys, unique_segments,
                                             /*counts=*/nullptr, segment_counts, inverse, s);
}

template <typename K>
int OwnerOfKeys(const K* keys, int64_t n, int64_t num_ranks, int32_t* owners, void* stream) {
  if (n == 0) return cudaSuccess;
  ComputeOwners<K><<<NumTiles(n), kBlock, 0, AsStream(stream)>>>(keys, n, static_cast<uint64_t>(num_ranks), owners,
                                                                   /*positions=*/nullptr);
  return cudaGetLastError();
}

namespace {

// The partition sorts (owner, position) pairs with CUB's stable radix sort over the owner's significant bits.
struct PartitionScratch {
  int32_t* owners;
  int32_t* sorted_owners;
  int32_t* positions;
  void* sort_temp;
  size_t sort_temp_bytes;
  int end_bit;
  size_t total_bytes;
};

// Owners are in [0, num_ranks): sorting their low bits as unsigned is enough, and CUB's radix sort is stable.
int OwnerBits(int64_t num_ranks) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < num_ranks) ++bits;
  return bits;
}

// Sized with the same bit range as the sort itself: CUB's scratch depends on the number of passes.
cudaError_t LayOutPartition(int64_t n, int64_t num_ranks, void* base, PartitionScratch* s) {
  s->end_bit = OwnerBits(num_ranks);
  s->sort_temp_bytes = 0;
  FUSEDREC_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
      nullptr, s->sort_temp_bytes, static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(n), 0, s->end_bit));
  Carver carve(base);
  const size_t count = std::max<int64_t>(n, 1);
  s->owners = carve.Take<int32_t>(count);
  s->sorted_owners = carve.Take<int32_t>(count);
  s->positions = carve.Take<int32_t>(count);
  s->sort_temp = carve.Take<char>(std::max<size_t>(s->sort_temp_bytes, 1));
  s->total_bytes = carve.used();
  return cudaSuccess;
}

}  // namespace

int PartitionScratchBytes(int64_t n, int64_t num_ranks, size_t* bytes) {
  PartitionScratch s;
  FUSEDREC_CUDA_RETURN_IF_ERROR(LayOutPartition(n, num_ranks, nullptr, &s));
  *bytes = s.total_bytes;
  return cudaSuccess;
}

template <typename K>
int PartitionByOwner(const K* keys, const int32_t* segments, int64_t n, int64_t num_ranks, void* scratch,
                     K* out_keys, int32_t* out_segments, int32_t* splits, int32_t* order, void* stream) {
  const cudaStream_t s = AsStream(stream);
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(splits, 0, num_ranks * sizeof(int32_t), s));
  if (n == 0) return cudaSuccess;
  PartitionScratch p;
  FUSEDREC_CUDA_RETURN_IF_ERROR(LayOutPartition(n, num_ranks, scratch, &p));
  ComputeOwners<K><<<NumTiles(n), kBlock, 0, s>>>(keys, n, static_cast<uint64_t>(num_ranks), p.owners, p.positions);
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  FUSEDREC_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
      p.sort_temp, p.sort_temp_bytes, reinterpret_cast<const uint32_t*>(p.owners),
      reinterpret_cast<uint32_t*>(p.sorted_owners), p.positions, order, static_cast<int>(n), 0, p.end_bit, s));
  CountOwners<<<NumTiles(n), kBlock, 0, s>>>(p.sorted_owners, n, splits);
  FUSEDREC_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  GatherByOrder<K><<<NumTiles(n), kBlock, 0, s>>>(keys, segments, order, n, out_keys, out_segments);
  return cudaGetLastError();
}

#define FUSEDREC_INSTANTIATE(K)                                                                                    \
  template int PairDedupFind<K>(const K*, const int32_t*, int64_t, int64_t, int64_t, void*, void*, DedupResult*); \
  template int SegmentUniqueEmit<K>(const K*, const int32_t*, int64_t, void*, K*, int32_t*, int32_t*, int32_t*,   \
                                    void*);                                                                       \
  template int CategoryUniqueEmit<K>(const K*, const int32_t*, int64_t, void*, bool, int, int64_t*, int32_t*,     \
                                     int32_t*, int32_t*, int64_t, void*);                                         \
  template int OwnerOfKeys<K>(const K*, int64_t, int64_t, int32_t*, void*);                                           \
  template int PartitionByOwner<K>(const K*, const int32_t*, int64_t, int64_t, void*, K*, int32_t*, int32_t*,     \
                                   int32_t*, void*);
FUSEDREC_INSTANTIATE(int32_t)
FUSEDREC_INSTANTIATE(int64_t)
#undef FUSEDREC_INSTANTIATE

}  // namespace gpu
}  // namespace impl
}  // namespace fusedrec
}  // namespace tensorflow
