/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// Standalone check of the FusedRec CUDA kernels (cc/kernels/impl/fusedrec_gpu.cu.cc) against the NumPy oracle,
// without TensorFlow. Cases come from tests/cuda/write_cases.py (format in tests/cuda/README.md).
//
//   harness CASES_DIR [--compile-only] [--bench] [--bench-synthetic PER,...] [--bench-repeats N] [--repeat N]
//
// Without a device it runs only the host checks (the shared hashes against the oracle) and exits 3 saying
// "no CUDA device: compiled only"; --compile-only asks for exactly that and exits 0. With a device it runs every
// case through every op `repeat` times and compares all outputs exactly; --bench also times segment unique against
// a sort-based baseline (CUB radix sort + unique by key) on the cases marked bench=1.
// Exit status: 0 all equal, 1 a mismatch, 2 bad usage or unreadable cases, 3 no CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cc/kernels/impl/fusedrec_gpu.h"
#include "cc/kernels/impl/hashing.h"

namespace {

namespace impl = tensorflow::fusedrec::impl;
namespace gpu = tensorflow::fusedrec::impl::gpu;

constexpr int kExitMismatch = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNoDevice = 3;
constexpr const char* kUsage =
    "usage: harness CASES_DIR [--compile-only] [--bench] [--bench-synthetic PER,...] [--bench-repeats N] [--repeat N]";

int failures = 0;
int bench_repeats = 31;  // --bench-repeats: timed runs per variant and round (1 under compute-sanitizer)

[[noreturn]] void Die(const std::string& message, int code = kExitUsage) {
  std::fprintf(stderr, "harness: %s\n", message.c_str());
  std::exit(code);
}

void Check(int error, const char* what) {
  if (error != 0) Die(std::string(what) + ": " + gpu::ErrorString(error), kExitMismatch);
}

void Fail(const std::string& where, const std::string& message) {
  ++failures;
  std::printf("  MISMATCH %s: %s\n", where.c_str(), message.c_str());
}

// ---------------------------------------------------------------------------------------------------------------
// Cases on disk

struct Case {
  std::string name;
  std::string dir;
  std::map<std::string, std::string> attrs;
  const std::string& Attr(const std::string& key) const {
    auto it = attrs.find(key);
    if (it == attrs.end()) Die("case " + name + " has no " + key);
    return it->second;
  }
  int64_t Int(const std::string& key) const { return std::stoll(Attr(key)); }
};

std::vector<Case> ReadManifest(const std::string& dir) {
  std::ifstream in(dir + "/cases.txt");
  if (!in) Die("cannot read " + dir + "/cases.txt (write it with tests/cuda/write_cases.py)");
  std::vector<Case> cases;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    Case c;
    if (!(fields >> c.name)) continue;
    c.dir = dir + "/" + c.name;
    std::string field;
    while (fields >> field) {
      const size_t eq = field.find('=');
      if (eq == std::string::npos) Die("bad field '" + field + "' in case " + c.name);
      c.attrs[field.substr(0, eq)] = field.substr(eq + 1);
    }
    cases.push_back(c);
  }
  return cases;
}

template <typename T>
std::vector<T> ReadArray(const Case& c, const std::string& array) {
  const std::string path = c.dir + "/" + array + ".bin";
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) Die("cannot read " + path);
  const std::streamsize bytes = in.tellg();
  if (bytes % sizeof(T) != 0) Die(path + ": size is not a multiple of " + std::to_string(sizeof(T)));
  std::vector<T> out(bytes / sizeof(T));
  in.seekg(0);
  if (bytes > 0) in.read(reinterpret_cast<char*>(out.data()), bytes);
  return out;  // little-endian on disk; every CUDA host is little-endian
}

// "ok", or ("bad_segment" | "bad_key", position).
std::pair<std::string, int64_t> Expectation(const Case& c, const std::string& op) {
  const std::string& value = c.Attr(op);
  const size_t colon = value.find(':');
  if (colon == std::string::npos) return {value, -1};
  return {value.substr(0, colon), std::stoll(value.substr(colon + 1))};
}

template <typename T>
void Compare(const Case& c, const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  const std::string where = c.name + " " + what;
  if (got.size() != want.size()) {
    Fail(where, "length " + std::to_string(got.size()) + ", expected " + std::to_string(want.size()));
    return;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      Fail(where, "[" + std::to_string(i) + "] = " + std::to_string(got[i]) + ", expected " + std::to_string(want[i]));
      return;
    }
  }
}

template <typename T>
void CompareArray(const Case& c, const std::string& array, const std::vector<T>& got) {
  Compare(c, array, got, ReadArray<T>(c, array));
}

// ---------------------------------------------------------------------------------------------------------------
// Host checks: the hashes the kernels call, compiled from the same header, against the oracle. Run everywhere.

template <typename K>
void HostChecks(const Case& c) {
  const auto keys = ReadArray<K>(c, "keys");
  const int64_t num_ranks = c.Int("num_ranks");
  std::vector<int32_t> owners(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) owners[i] = impl::OwnerOf(keys[i], static_cast<uint64_t>(num_ranks));
  CompareArray(c, "owner_of", owners);
  for (const char* encoding : {"packed", "hashed"}) {
    const std::string op = std::string("category_") + encoding;
    if (Expectation(c, op).first != "ok" || Expectation(c, "segment_unique").first != "ok") continue;
    const auto unique_keys = ReadArray<K>(c, "segment_unique.unique_keys");
    const auto unique_segments = ReadArray<int32_t>(c, "segment_unique.unique_segment_ids");
    const int key_bits = 63 - impl::PackedSegmentBits(c.Int("num_segments"));
    std::vector<int64_t> unified(unique_keys.size());
    for (size_t j = 0; j < unique_keys.size(); ++j) {
      unified[j] = op == "category_packed" ? impl::PackedUnifiedKey(unique_keys[j], unique_segments[j], key_bits)
                                           : impl::HashedUnifiedKey(unique_keys[j], unique_segments[j]);
    }
    CompareArray(c, op + ".unified_keys", unified);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Device runs

template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t size = 0;
  explicit DeviceArray(size_t n) : size(n) { Check(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    Check(cudaMemcpy(ptr, host.data(), size * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> Download(size_t n) const {
    std::vector<T> host(n);
    Check(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }
};

// Checks an expected input error; returns true when the outputs are to be compared.
bool CheckFindResult(const Case& c, const std::string& op, const gpu::DedupResult& r) {
  const auto want = Expectation(c, op);
  if (want.first == "ok") {
    if (r.first_bad_segment >= 0 || r.first_bad_key >= 0) {
      Fail(c.name + " " + op, "reported bad segment at " + std::to_string(r.first_bad_segment) + ", bad key at " +
                                  std::to_string(r.first_bad_key) + " on valid input");
      return false;
    }
    return true;
  }
  // The CPU kernel checks segments before keys, so a bad segment is reported even when a key is bad too.
  const int64_t got = want.first == "bad_segment" ? r.first_bad_segment
                                                  : (r.first_bad_segment >= 0 ? -2 : r.first_bad_key);
  if (got != want.second) {
    Fail(c.name + " " + op, want.first + " at " + std::to_string(got) + ", expected at " + std::to_string(want.second));
  }
  return false;
}

template <typename K>
void RunSegmentUnique(const Case& c, const DeviceArray<K>& keys, const DeviceArray<int32_t>& segments, int64_t n) {
  size_t bytes = 0;
  Check(gpu::PairDedupScratchBytes(n, &bytes), "PairDedupScratchBytes");
  DeviceArray<char> scratch(bytes);
  gpu::DedupResult r;
  Check(gpu::PairDedupFind<K>(keys.ptr, segments.ptr, n, INT64_MAX, 0, scratch.ptr, nullptr, &r), "PairDedupFind");
  if (!CheckFindResult(c, "segment_unique", r)) return;
  const size_t u = r.num_unique;
  DeviceArray<K> unique_keys(u);
  DeviceArray<int32_t> unique_segments(u), inverse(n), counts(u);
  Check(gpu::SegmentUniqueEmit<K>(keys.ptr, segments.ptr, n, scratch.ptr, unique_keys.ptr, unique_segments.ptr,
                                  inverse.ptr, counts.ptr, nullptr),
        "SegmentUniqueEmit");
  Check(cudaDeviceSynchronize(), "segment_unique");
  CompareArray(c, "segment_unique.unique_keys", unique_keys.Download(u));
  CompareArray(c, "segment_unique.unique_segment_ids", unique_segments.Download(u));
  CompareArray(c, "segment_unique.inverse", inverse.Download(n));
  CompareArray(c, "segment_unique.counts", counts.Download(u));
}

template <typename K>
void RunCategoryUnique(const Case& c, const DeviceArray<K>& keys, const DeviceArray<int32_t>& segments, int64_t n,
                       bool hashed) {
  const std::string op = hashed ? "category_hashed" : "category_packed";
  const int64_t num_segments = c.Int("num_segments");
  const int key_bits = 63 - impl::PackedSegmentBits(num_segments);
  size_t bytes = 0;
  Check(gpu::PairDedupScratchBytes(n, &bytes), "PairDedupScratchBytes");
  DeviceArray<char> scratch(bytes);
  gpu::DedupResult r;
  Check(gpu::PairDedupFind<K>(keys.ptr, segments.ptr, n, num_segments, hashed ? 0 : int64_t{1} << key_bits,
                              scratch.ptr, nullptr, &r),
        "PairDedupFind");
  if (!CheckFindResult(c, op, r)) return;
  const size_t u = r.num_unique;
  DeviceArray<int64_t> unified(u);
  DeviceArray<int32_t> inverse(n), unique_segments(u), segment_counts(num_segments);
  Check(gpu::CategoryUniqueEmit<K>(keys.ptr, segments.ptr, n, scratch.ptr, hashed, key_bits, unified.ptr, inverse.ptr,
                                   unique_segments.ptr, segment_counts.ptr, num_segments, nullptr),
        "CategoryUniqueEmit");
  Check(cudaDeviceSynchronize(), op.c_str());
  CompareArray(c, op + ".unified_keys", unified.Download(u));
  CompareArray(c, op + ".inverse", inverse.Download(n));
  CompareArray(c, op + ".unique_segment_ids", unique_segments.Download(u));
  CompareArray(c, op + ".segment_counts", segment_counts.Download(num_segments));
}

template <typename K>
void RunPartition(const Case& c, const DeviceArray<K>& keys, const DeviceArray<int32_t>& segments, int64_t n) {
  const int64_t num_ranks = c.Int("num_ranks");
  DeviceArray<int32_t> owners(n);
  Check(gpu::OwnerOfKeys<K>(keys.ptr, n, num_ranks, owners.ptr, nullptr), "OwnerOfKeys");
  Check(cudaDeviceSynchronize(), "owner_of");
  CompareArray(c, "owner_of", owners.Download(n));
  size_t bytes = 0;
  Check(gpu::PartitionScratchBytes(n, num_ranks, &bytes), "PartitionScratchBytes");
  DeviceArray<char> scratch(bytes);
  for (const bool with_segments : {true, false}) {
    DeviceArray<K> out_keys(n);
    DeviceArray<int32_t> out_segments(n), splits(num_ranks), order(n);
    Check(gpu::PartitionByOwner<K>(keys.ptr, with_segments ? segments.ptr : nullptr, n, num_ranks, scratch.ptr,
                                   out_keys.ptr, with_segments ? out_segments.ptr : nullptr, splits.ptr, order.ptr,
                                   nullptr),
          "PartitionByOwner");
    Check(cudaDeviceSynchronize(), "partition_by_owner");
    const std::string tag = with_segments ? "" : " (no segment_ids)";
    Compare(c, "partition.keys" + tag, out_keys.Download(n), ReadArray<K>(c, "partition.keys"));
    if (with_segments) CompareArray(c, "partition.segment_ids", out_segments.Download(n));
    Compare(c, "partition.splits" + tag, splits.Download(num_ranks), ReadArray<int32_t>(c, "partition.splits"));
    Compare(c, "partition.order" + tag, order.Download(n), ReadArray<int32_t>(c, "partition.order"));
  }
}

template <typename K>
void RunCase(const Case& c) {
  const auto host_keys = ReadArray<K>(c, "keys");
  const auto host_segments = ReadArray<int32_t>(c, "segment_ids");
  const int64_t n = static_cast<int64_t>(host_keys.size());
  DeviceArray<K> keys(host_keys);
  DeviceArray<int32_t> segments(host_segments);
  RunSegmentUnique(c, keys, segments, n);
  RunPartition(c, keys, segments, n);
  RunCategoryUnique(c, keys, segments, n, /*hashed=*/false);
  RunCategoryUnique(c, keys, segments, n, /*hashed=*/true);
}

// ---------------------------------------------------------------------------------------------------------------
// Benchmark: segment unique against sort + unique by key on the same device-resident input. Both end with the
// device-to-host copy of the unique count that a TensorFlow op needs to size its outputs.

__global__ void PackPairs(const int64_t* keys, const int32_t* segments, int64_t n, int key_bits, uint64_t* packed,
                          int32_t* positions) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  packed[i] = (static_cast<uint64_t>(segments[i]) << key_bits) | static_cast<uint64_t>(keys[i]);
  positions[i] = static_cast<int32_t>(i);
}

__global__ void RunHeads(const uint64_t* sorted, int64_t n, int32_t* heads) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < n) heads[j] = (j == 0 || sorted[j] != sorted[j - 1]) ? 1 : 0;
}

// run_ids is the inclusive scan of the heads: the unique index of sorted element j is run_ids[j] - 1.
__global__ void ScatterRuns(const uint64_t* sorted, const int32_t* permutation, const int32_t* heads,
                            const int32_t* run_ids, int64_t n, int key_bits, int64_t* unique_keys,
                            int32_t* unique_segments, int32_t* run_starts, int32_t* inverse) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const int32_t u = run_ids[j] - 1;
  inverse[permutation[j]] = u;
  if (heads[j]) {
    unique_keys[u] = static_cast<int64_t>(sorted[j] & ((uint64_t{1} << key_bits) - 1));
    unique_segments[u] = static_cast<int32_t>(sorted[j] >> key_bits);
    run_starts[u] = static_cast<int32_t>(j);
  }
}

__global__ void RunCounts(const int32_t* run_starts, int32_t num_unique, int64_t n, int32_t* counts) {
  const int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u < num_unique) counts[u] = static_cast<int32_t>((u + 1 < num_unique ? run_starts[u + 1] : n) - run_starts[u]);
}

// Sort-based segment unique: one CUB radix sort of (segment << key_bits | key, position) over the significant bits,
// run heads, a scan, a scatter. Outputs are in (segment, key) order, which is all a sort gives without a second sort.
struct SortBaseline {
  int64_t n;
  int key_bits, sort_bits;
  DeviceArray<uint64_t> packed, sorted;
  DeviceArray<int32_t> positions, permutation, heads, run_ids, run_starts, unique_segments, inverse, counts;
  DeviceArray<int64_t> unique_keys;
  size_t sort_bytes = 0, scan_bytes = 0;
  DeviceArray<char>* temp = nullptr;
  int32_t num_unique = 0;

  SortBaseline(int64_t size, int kbits, int sbits)
      : n(size), key_bits(kbits), sort_bits(sbits), packed(size), sorted(size), positions(size), permutation(size),
        heads(size), run_ids(size), run_starts(size), unique_segments(size), inverse(size), counts(size),
        unique_keys(size) {
    Check(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, packed.ptr, sorted.ptr, positions.ptr, permutation.ptr,
                                          static_cast<int>(n), 0, sort_bits),
          "sort temp size");
    Check(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, heads.ptr, run_ids.ptr, static_cast<int>(n)),
          "scan temp size");
    temp = new DeviceArray<char>(std::max(sort_bytes, scan_bytes));
  }
  ~SortBaseline() { delete temp; }

  void Run(const int64_t* keys, const int32_t* segments) {
    const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
    PackPairs<<<blocks, 256>>>(keys, segments, n, key_bits, packed.ptr, positions.ptr);
    size_t bytes = sort_bytes;
    Check(cub::DeviceRadixSort::SortPairs(temp->ptr, bytes, packed.ptr, sorted.ptr, positions.ptr, permutation.ptr,
                                          static_cast<int>(n), 0, sort_bits),
          "baseline sort");
    RunHeads<<<blocks, 256>>>(sorted.ptr, n, heads.ptr);
    bytes = scan_bytes;
    Check(cub::DeviceScan::InclusiveSum(temp->ptr, bytes, heads.ptr, run_ids.ptr, static_cast<int>(n)),
          "baseline scan");
    Check(cudaMemcpy(&num_unique, run_ids.ptr + n - 1, sizeof(int32_t), cudaMemcpyDeviceToHost), "baseline count");
    ScatterRuns<<<blocks, 256>>>(sorted.ptr, permutation.ptr, heads.ptr, run_ids.ptr, n, key_bits, unique_keys.ptr,
                                 unique_segments.ptr, run_starts.ptr, inverse.ptr);
    RunCounts<<<static_cast<unsigned>((num_unique + 255) / 256), 256>>>(run_starts.ptr, num_unique, n, counts.ptr);
    Check(cudaGetLastError(), "baseline kernels");
  }
};

// The expected segment unique of a bench input: the oracle's files, or the host reference for synthetic inputs.
struct Expected {
  std::vector<int64_t> unique_keys;
  std::vector<int32_t> unique_segments, inverse, counts;
};

// First-occurrence segment unique on the host (the oracle's semantics), for inputs too large to carry as files.
Expected HostSegmentUnique(const std::vector<int64_t>& keys, const std::vector<int32_t>& segments) {
  Expected e;
  std::unordered_map<uint64_t, int32_t> uid;  // keys < 2^40 and segments < 2^23 here: (segment << 40 | key)
  uid.reserve(keys.size());
  e.inverse.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t pair = (static_cast<uint64_t>(segments[i]) << 40) | static_cast<uint64_t>(keys[i]);
    auto inserted = uid.emplace(pair, static_cast<int32_t>(e.unique_keys.size()));
    if (inserted.second) {
      e.unique_keys.push_back(keys[i]);
      e.unique_segments.push_back(segments[i]);
      e.counts.push_back(0);
    }
    e.inverse[i] = inserted.first->second;
    ++e.counts[inserted.first->second];
  }
  return e;
}

// The baseline's unique pairs, sorted, must be the expected ones sorted; its inverse must rebuild the input.
void CheckBaseline(const std::string& name, SortBaseline& b, const std::vector<int64_t>& keys,
                   const std::vector<int32_t>& segments, const Expected& e) {
  Check(cudaDeviceSynchronize(), "baseline");
  std::vector<std::tuple<int32_t, int64_t, int32_t>> want;
  for (size_t j = 0; j < e.unique_keys.size(); ++j) {
    want.emplace_back(e.unique_segments[j], e.unique_keys[j], e.counts[j]);
  }
  std::sort(want.begin(), want.end());
  const auto got_keys = b.unique_keys.Download(b.num_unique);
  const auto got_segments = b.unique_segments.Download(b.num_unique);
  const auto got_counts = b.counts.Download(b.num_unique);
  const auto inverse = b.inverse.Download(b.n);
  std::vector<std::tuple<int32_t, int64_t, int32_t>> got;
  for (int32_t j = 0; j < b.num_unique; ++j) got.emplace_back(got_segments[j], got_keys[j], got_counts[j]);
  if (got != want) Fail(name + " baseline", "unique pairs or counts differ from the expected ones");
  for (int64_t i = 0; i < b.n; ++i) {
    if (got_keys[inverse[i]] != keys[i] || got_segments[inverse[i]] != segments[i]) {
      Fail(name + " baseline", "inverse does not rebuild position " + std::to_string(i));
      break;
    }
  }
}

template <typename F>
double MedianMs(F run, int warmup, int repeats) {
  for (int r = 0; r < warmup; ++r) run();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms(repeats);
  for (int r = 0; r < repeats; ++r) {
    cudaEventRecord(start);
    run();
    cudaEventRecord(stop);
    Check(cudaEventSynchronize(stop), "timing");
    cudaEventElapsedTime(&ms[r], start, stop);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[repeats / 2];
}

// Times segment unique against the sort baseline on one input (keys >= 0), after checking both outputs: segment
// unique exactly against `e`, the baseline as sets. Also times category unique (packed) and the partition over 8
// ranks on the same keys, which have no baseline of their own (the partition is a CUB sort by owner).
void BenchArrays(const std::string& name, const std::vector<int64_t>& host_keys,
                 const std::vector<int32_t>& host_segments, int64_t num_segments, const Expected& e) {
  const int64_t n = static_cast<int64_t>(host_keys.size());
  int64_t max_key = 0;
  for (int64_t k : host_keys) {
    if (k < 0) Die("bench case " + name + " has a negative key; the packed sort baseline needs keys >= 0");
    max_key = std::max(max_key, k);
  }
  int key_bits = 1, segment_bits = 1;
  while (key_bits < 63 && (max_key >> key_bits) != 0) ++key_bits;
  while ((int64_t{1} << segment_bits) < num_segments) ++segment_bits;
  if (key_bits + segment_bits > 64) Die("bench case " + name + ": keys and segments do not fit in 64 bits");
  DeviceArray<int64_t> keys(host_keys);
  DeviceArray<int32_t> segments(host_segments);

  size_t bytes = 0;
  Check(gpu::PairDedupScratchBytes(n, &bytes), "PairDedupScratchBytes");
  DeviceArray<char> scratch(bytes);
  DeviceArray<int64_t> unique_keys(n), unified(n);
  DeviceArray<int32_t> unique_segments(n), inverse(n), counts(n), segment_counts(num_segments);
  gpu::DedupResult r;
  auto fused = [&] {
    Check(gpu::PairDedupFind<int64_t>(keys.ptr, segments.ptr, n, INT64_MAX, 0, scratch.ptr, nullptr, &r), "find");
    Check(gpu::SegmentUniqueEmit<int64_t>(keys.ptr, segments.ptr, n, scratch.ptr, unique_keys.ptr,
                                          unique_segments.ptr, inverse.ptr, counts.ptr, nullptr),
          "emit");
  };
  const int packed_key_bits = 63 - impl::PackedSegmentBits(num_segments);
  auto category = [&] {
    Check(gpu::PairDedupFind<int64_t>(keys.ptr, segments.ptr, n, num_segments, int64_t{1} << packed_key_bits,
                                      scratch.ptr, nullptr, &r),
          "category find");
    Check(gpu::CategoryUniqueEmit<int64_t>(keys.ptr, segments.ptr, n, scratch.ptr, /*hashed=*/false, packed_key_bits,
                                           unified.ptr, inverse.ptr, unique_segments.ptr, segment_counts.ptr,
                                           num_segments, nullptr),
          "category emit");
  };
  constexpr int64_t kRanks = 8;
  size_t partition_bytes = 0;
  Check(gpu::PartitionScratchBytes(n, kRanks, &partition_bytes), "PartitionScratchBytes");
  DeviceArray<char> partition_scratch(partition_bytes);
  DeviceArray<int64_t> out_keys(n);
  DeviceArray<int32_t> out_segments(n), splits(kRanks), order(n);
  auto partition = [&] {
    Check(gpu::PartitionByOwner<int64_t>(keys.ptr, segments.ptr, n, kRanks, partition_scratch.ptr, out_keys.ptr,
                                         out_segments.ptr, splits.ptr, order.ptr, nullptr),
          "partition");
  };
  SortBaseline baseline(n, key_bits, key_bits + segment_bits);
  auto sorted = [&] { baseline.Run(keys.ptr, segments.ptr); };

  fused();
  Check(cudaDeviceSynchronize(), "segment_unique");
  const int before = failures;
  const Case as_case{name, "", {}};
  Compare(as_case, "segment_unique.unique_keys", unique_keys.Download(r.num_unique), e.unique_keys);
  Compare(as_case, "segment_unique.unique_segment_ids", unique_segments.Download(r.num_unique), e.unique_segments);
  Compare(as_case, "segment_unique.counts", counts.Download(r.num_unique), e.counts);
  Compare(as_case, "segment_unique.inverse", inverse.Download(n), e.inverse);
  sorted();
  CheckBaseline(name, baseline, host_keys, host_segments, e);
  std::printf("  %-24s outputs: %s\n", name.c_str(), failures == before ? "segment unique equal, baseline equal as sets"
                                                                         : "MISMATCH");

  const int kWarmup = bench_repeats > 1 ? 5 : 0, kRepeats = bench_repeats;
  double t_fused = 0, t_sorted = 0, t_category = 0, t_partition = 0;
  for (int round = 0; round < 2; ++round) {  // alternate, keep the second round: clocks and caches settled
    t_fused = MedianMs(fused, kWarmup, kRepeats);
    t_sorted = MedianMs(sorted, kWarmup, kRepeats);
    t_category = MedianMs(category, kWarmup, kRepeats);
    t_partition = MedianMs(partition, kWarmup, kRepeats);
  }
  std::printf("  %-24s n=%9" PRId64 " unique=%8" PRId64 "  segment_unique %8.3f ms %9.1f Mkeys/s | sort+unique_by_key"
              " %8.3f ms %9.1f Mkeys/s | speedup %.2fx | category_unique(packed) %8.3f ms"
              " | partition(8 ranks) %8.3f ms\n",
              name.c_str(), n, r.num_unique, t_fused, n / t_fused / 1e3, t_sorted, n / t_sorted / 1e3,
              t_sorted / t_fused, t_category, t_partition);
}

void Bench(const Case& c) {
  if (c.Attr("dtype") != "int64") Die("bench case " + c.name + " must have int64 keys");
  Expected e;
  e.unique_keys = ReadArray<int64_t>(c, "segment_unique.unique_keys");
  e.unique_segments = ReadArray<int32_t>(c, "segment_unique.unique_segment_ids");
  e.inverse = ReadArray<int32_t>(c, "segment_unique.inverse");
  e.counts = ReadArray<int32_t>(c, "segment_unique.counts");
  BenchArrays(c.name, ReadArray<int64_t>(c, "keys"), ReadArray<int32_t>(c, "segment_ids"), c.Int("num_segments"), e);
}

// A fused group like tf_fusedrec.bench.ops.make_group's (not bit-identical: another generator): per category,
// ranks Zipf(1.1) clipped at the 10^6-id vocabulary (the clipped tail, about a quarter of the mass, lands on the last
// rank, as np.minimum(rng.zipf(...), vocab) does), spread over [0, 2^40) by rank * 2654435761 + a per-category salt.
void SyntheticGroup(int num_categories, int64_t per_category, uint64_t seed, std::vector<int64_t>* keys,
                    std::vector<int32_t>* segments) {
  constexpr int64_t kVocab = 1000000;
  constexpr double kExponent = 1.1;
  std::vector<double> cdf(kVocab);
  double total = 0;
  for (int64_t k = 1; k < kVocab; ++k) cdf[k - 1] = (total += std::pow(static_cast<double>(k), -kExponent));
  // sum over k >= vocab of k^-a, by Euler-Maclaurin: V^(1-a) / (a - 1) + V^-a / 2.
  const double v = static_cast<double>(kVocab);
  total += std::pow(v, 1 - kExponent) / (kExponent - 1) + std::pow(v, -kExponent) / 2;
  cdf[kVocab - 1] = total;
  uint64_t state = seed;
  auto next = [&state] {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  keys->clear();
  segments->clear();
  for (int c = 0; c < num_categories; ++c) {
    const uint64_t salt = 1 + next() % ((uint64_t{1} << 40) - 1);
    for (int64_t i = 0; i < per_category; ++i) {
      const double u = (next() >> 11) * 0x1.0p-53 * total;
      const int64_t rank = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();  // 0-based, <= vocab - 1
      const int64_t r = std::min(rank, kVocab - 1);
      keys->push_back(static_cast<int64_t>((static_cast<uint64_t>(r) * 2654435761ull + salt) % (uint64_t{1} << 40)));
      segments->push_back(c);
    }
  }
}

void BenchSynthetic(int64_t per_category) {
  constexpr int kCategories = 26;
  std::vector<int64_t> keys;
  std::vector<int32_t> segments;
  SyntheticGroup(kCategories, per_category, /*seed=*/per_category, &keys, &segments);
  BenchArrays("synthetic_26x" + std::to_string(per_category), keys, segments, kCategories,
              HostSegmentUnique(keys, segments));
}

bool HasDevice() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    std::printf("cudaGetDeviceCount: %s\n", cudaGetErrorString(e));
    return false;
  }
  return count > 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  bool compile_only = false, bench = false;
  int repeat = 2;
  std::vector<int64_t> synthetic;  // --bench-synthetic PER[,PER...]: 26 x PER generated keys (sizes too big to carry)
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--compile-only") {
      compile_only = true;
    } else if (arg == "--bench") {
      bench = true;
    } else if (arg == "--bench-synthetic" && a + 1 < argc) {
      std::stringstream list(argv[++a]);
      std::string item;
      while (std::getline(list, item, ',')) {
        const int64_t per = std::atoll(item.c_str());
        if (per <= 0 || per * 26 >= (int64_t{1} << 31) - 1) Die("--bench-synthetic: bad size '" + item + "'");
        synthetic.push_back(per);
      }
    } else if (arg == "--bench-repeats" && a + 1 < argc) {
      bench_repeats = std::max(1, std::atoi(argv[++a]));
    } else if (arg == "--repeat" && a + 1 < argc) {
      repeat = std::atoi(argv[++a]);
    } else if (!arg.empty() && arg[0] != '-' && dir.empty()) {
      dir = arg;
    } else {
      Die(kUsage);
    }
  }
  if (dir.empty()) Die(kUsage);
  const std::vector<Case> cases = ReadManifest(dir);

  for (const Case& c : cases) {
    if (c.Attr("dtype") == "int32") {
      HostChecks<int32_t>(c);
    } else {
      HostChecks<int64_t>(c);
    }
  }
  std::printf("host checks (hashes and encodings of the kernels vs the oracle): %zu cases, %s\n", cases.size(),
              failures ? "MISMATCH" : "all equal");
  if (failures) return kExitMismatch;

  if (compile_only || !HasDevice()) {
    std::printf("no CUDA device: compiled only; the kernels did not run\n");
    return compile_only ? 0 : kExitNoDevice;
  }
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);

  for (int r = 0; r < repeat; ++r) {
    for (const Case& c : cases) {
      const int before = failures;
      if (c.Attr("dtype") == "int32") {
        RunCase<int32_t>(c);
      } else {
        RunCase<int64_t>(c);
      }
      if (r == 0) std::printf("%-32s %s\n", c.name.c_str(), failures == before ? "equal" : "MISMATCH");
    }
  }
  std::printf("kernels vs oracle: %zu cases x %d runs, %s\n", cases.size(), repeat,
              failures ? "MISMATCH" : "all equal");
  if (bench) {
    std::printf("benchmark (median of %d, after warm-up):\n", bench_repeats);
    for (const Case& c : cases) {
      if (c.Attr("bench") == "1") Bench(c);
    }
  }
  if (!synthetic.empty()) {
    std::printf("benchmark, generated 26-category Zipf groups (median of %d, after warm-up):\n", bench_repeats);
    for (int64_t per : synthetic) BenchSynthetic(per);
  }
  return failures ? kExitMismatch : 0;
}
