/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// Standalone check of the FusedRec CUDA kernels (cc/kernels/impl/fusedrec_gpu.cu.cc) against the NumPy oracle,
// without TensorFlow. Cases come from tests/cuda/write_cases.py (format in tests/cuda/README.md).
//
//   harness CASES_DIR [--compile-only] [--bench] [--repeat N]
//
// Without a device it runs only the host checks (the shared hashes against the oracle) and exits 3 saying
// "no CUDA device: compiled only"; --compile-only asks for exactly that and exits 0. With a device it runs every
// case through every op `repeat` times and compares all outputs exactly; --bench also times segment unique against
// a sort-based baseline (CUB radix sort + unique by key) on the cases marked bench=1.
// Exit status: 0 all equal, 1 a mismatch, 2 bad usage or unreadable cases, 3 no CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
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
#include <vector>

#include "cc/kernels/impl/fusedrec_gpu.h"
#include "cc/kernels/impl/hashing.h"

namespace {

namespace impl = tensorflow::fusedrec::impl;
namespace gpu = tensorflow::fusedrec::impl::gpu;

constexpr int kExitMismatch = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNoDevice = 3;

int failures = 0;

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

// The baseline's unique pairs, sorted, must be the oracle's sorted; its inverse must rebuild the input.
void CheckBaseline(const Case& c, SortBaseline& b, const std::vector<int64_t>& keys,
                   const std::vector<int32_t>& segments) {
  Check(cudaDeviceSynchronize(), "baseline");
  const auto want_keys = ReadArray<int64_t>(c, "segment_unique.unique_keys");
  const auto want_segments = ReadArray<int32_t>(c, "segment_unique.unique_segment_ids");
  const auto want_counts = ReadArray<int32_t>(c, "segment_unique.counts");
  std::vector<std::tuple<int32_t, int64_t, int32_t>> want;
  for (size_t j = 0; j < want_keys.size(); ++j) want.emplace_back(want_segments[j], want_keys[j], want_counts[j]);
  std::sort(want.begin(), want.end());
  const auto got_keys = b.unique_keys.Download(b.num_unique);
  const auto got_segments = b.unique_segments.Download(b.num_unique);
  const auto got_counts = b.counts.Download(b.num_unique);
  const auto inverse = b.inverse.Download(b.n);
  std::vector<std::tuple<int32_t, int64_t, int32_t>> got;
  for (int32_t j = 0; j < b.num_unique; ++j) got.emplace_back(got_segments[j], got_keys[j], got_counts[j]);
  if (got != want) Fail(c.name + " baseline", "unique pairs or counts differ from the oracle's");
  for (int64_t i = 0; i < b.n; ++i) {
    if (got_keys[inverse[i]] != keys[i] || got_segments[inverse[i]] != segments[i]) {
      Fail(c.name + " baseline", "inverse does not rebuild position " + std::to_string(i));
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

void Bench(const Case& c) {
  if (c.Attr("dtype") != "int64") Die("bench case " + c.name + " must have int64 keys");
  const auto host_keys = ReadArray<int64_t>(c, "keys");
  const auto host_segments = ReadArray<int32_t>(c, "segment_ids");
  const int64_t n = static_cast<int64_t>(host_keys.size());
  int64_t max_key = 0;
  for (int64_t k : host_keys) {
    if (k < 0) Die("bench case " + c.name + " has a negative key; the packed sort baseline needs keys >= 0");
    max_key = std::max(max_key, k);
  }
  int key_bits = 1, segment_bits = 1;
  while (key_bits < 63 && (max_key >> key_bits) != 0) ++key_bits;
  while ((int64_t{1} << segment_bits) < c.Int("num_segments")) ++segment_bits;
  if (key_bits + segment_bits > 64) Die("bench case " + c.name + ": keys and segments do not fit in 64 bits");
  DeviceArray<int64_t> keys(host_keys);
  DeviceArray<int32_t> segments(host_segments);

  size_t bytes = 0;
  Check(gpu::PairDedupScratchBytes(n, &bytes), "PairDedupScratchBytes");
  DeviceArray<char> scratch(bytes);
  DeviceArray<int64_t> unique_keys(n);
  DeviceArray<int32_t> unique_segments(n), inverse(n), counts(n);
  gpu::DedupResult r;
  auto fused = [&] {
    Check(gpu::PairDedupFind<int64_t>(keys.ptr, segments.ptr, n, INT64_MAX, 0, scratch.ptr, nullptr, &r), "find");
    Check(gpu::SegmentUniqueEmit<int64_t>(keys.ptr, segments.ptr, n, scratch.ptr, unique_keys.ptr,
                                          unique_segments.ptr, inverse.ptr, counts.ptr, nullptr),
          "emit");
  };
  SortBaseline baseline(n, key_bits, key_bits + segment_bits);
  auto sorted = [&] { baseline.Run(keys.ptr, segments.ptr); };

  fused();
  Check(cudaDeviceSynchronize(), "segment_unique");
  CompareArray(c, "segment_unique.unique_keys", unique_keys.Download(r.num_unique));
  CompareArray(c, "segment_unique.inverse", inverse.Download(n));
  sorted();
  CheckBaseline(c, baseline, host_keys, host_segments);

  constexpr int kWarmup = 5, kRepeats = 31;
  double t_fused = 0, t_sorted = 0;
  for (int round = 0; round < 2; ++round) {  // alternate, keep the second round: clocks and caches settled
    t_fused = MedianMs(fused, kWarmup, kRepeats);
    t_sorted = MedianMs(sorted, kWarmup, kRepeats);
  }
  std::printf("  %-24s n=%9" PRId64 " unique=%8" PRId64 "  segment_unique %8.3f ms %9.1f Mkeys/s | sort+unique_by_key"
              " %8.3f ms %9.1f Mkeys/s | speedup %.2fx\n",
              c.name.c_str(), n, r.num_unique, t_fused, n / t_fused / 1e3, t_sorted, n / t_sorted / 1e3,
              t_sorted / t_fused);
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
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--compile-only") {
      compile_only = true;
    } else if (arg == "--bench") {
      bench = true;
    } else if (arg == "--repeat" && a + 1 < argc) {
      repeat = std::atoi(argv[++a]);
    } else if (!arg.empty() && arg[0] != '-' && dir.empty()) {
      dir = arg;
    } else {
      Die("usage: harness CASES_DIR [--compile-only] [--bench] [--repeat N]");
    }
  }
  if (dir.empty()) Die("usage: harness CASES_DIR [--compile-only] [--bench] [--repeat N]");
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
    std::printf("benchmark (median of %d, after warm-up):\n", 31);
    for (const Case& c : cases) {
      if (c.Attr("bench") == "1") Bench(c);
    }
  }
  return failures ? kExitMismatch : 0;
}
