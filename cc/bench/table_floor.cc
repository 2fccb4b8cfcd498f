/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// The floor of a native table's training step: lookup-or-init + Adagrad update of each batch's unique keys in one
// pass over the same hash map the ops use (cc/kernels/impl/native_table.h), one thread, no TensorFlow. The ops do
// the same work in two passes (the lookup writes the rows out, the update probes again) plus TF's per-call costs.
//
// Workload (that of tf_fusedrec/bench/table.py's native and tfra variants): dim 16, keys 0..prefill-1 pre-filled with
// rows 0.01 and accumulators 0.1, new keys initialised to the same constants, gradient 0.01, lr 0.05. Batches are read
// from a file written by tf_fusedrec.bench.table (so all three measurements run the same keys), or drawn here:
// 16k keys 1.5M * r^3 (skewed, about 1/3 beyond the pre-filled range over time), deduplicated.
//
// Not part of the op library (cc/bench is outside the setup.py and Bazel globs). Build and run:
//   g++ -O2 -march=native -std=c++17 -I. cc/bench/table_floor.cc -o /tmp/table_floor
//   /tmp/table_floor [--dim 16] [--prefill 1000000] [--warmup 5] [--batches FILE | --num-batches 50]
// FILE: per batch an int64 n, then n int64 keys. Prints one JSON line: {"keys_per_s": ..., ...}.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cc/kernels/impl/native_table.h"

namespace {

using tensorflow::fusedrec::impl::AdagradRule;
using tensorflow::fusedrec::impl::NativeHashMap;
using tensorflow::fusedrec::impl::OptimizerHyper;
using tensorflow::fusedrec::impl::PipelinedProbe;
using tensorflow::fusedrec::impl::TableStatus;

constexpr float kRow = 0.01f;
constexpr float kAccumulator = 0.1f;

std::vector<std::vector<int64_t>> ReadBatches(const char* path) {
  std::vector<std::vector<int64_t>> batches;
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) {
    std::fprintf(stderr, "table_floor: cannot open %s\n", path);
    std::exit(1);
  }
  int64_t n;
  while (std::fread(&n, sizeof(n), 1, f) == 1) {
    std::vector<int64_t> keys(n);
    if (n < 0 || std::fread(keys.data(), sizeof(int64_t), n, f) != static_cast<size_t>(n)) {
      std::fprintf(stderr, "table_floor: %s is truncated\n", path);
      std::exit(1);
    }
    batches.push_back(std::move(keys));
  }
  std::fclose(f);
  return batches;
}

std::vector<std::vector<int64_t>> DrawBatches(int num_batches) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::vector<int64_t>> batches(num_batches);
  for (auto& keys : batches) {
    keys.resize(16000);
    for (auto& k : keys) k = static_cast<int64_t>(1500000 * std::pow(u(rng), 3.0));
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  }
  return batches;
}

// One training step's table work: every key found or inserted (row and accumulator at their initial constants),
// then updated in place.
void Step(NativeHashMap<float>* map, const std::vector<int64_t>& keys, const std::vector<float>& grad,
          const OptimizerHyper& hyper) {
  const int64_t dim = map->dim();
  if (map->Reserve(map->size() + static_cast<int64_t>(keys.size())) != TableStatus::kOk) {
    std::fprintf(stderr, "table_floor: cannot grow the table\n");
    std::exit(1);
  }
  PipelinedProbe(
      *map, keys.data(), static_cast<int64_t>(keys.size()),
      [&](int64_t i) {
        bool inserted;
        const int64_t index = map->FindOrInsert(keys[i], &inserted);
        if (inserted) {
          std::fill(map->row(index), map->row(index) + dim, kRow);
          std::fill(map->slots(index), map->slots(index) + dim, kAccumulator);
        }
        return index;
      },
      [&](int64_t, int64_t index) { AdagradRule::Apply(hyper, grad.data(), dim, map->row(index), map->slots(index)); });
}

}  // namespace

int main(int argc, char** argv) {
  int dim = 16, warmup = 5, num_batches = 50;
  int64_t prefill = 1000000;
  const char* batches_path = nullptr;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string flag = argv[a];
    if (flag == "--dim") {
      dim = std::atoi(argv[a + 1]);
    } else if (flag == "--prefill") {
      prefill = std::atoll(argv[a + 1]);
    } else if (flag == "--warmup") {
      warmup = std::atoi(argv[a + 1]);
    } else if (flag == "--batches") {
      batches_path = argv[a + 1];
    } else if (flag == "--num-batches") {
      num_batches = std::atoi(argv[a + 1]);
    } else {
      std::fprintf(stderr, "table_floor: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const auto batches = batches_path != nullptr ? ReadBatches(batches_path) : DrawBatches(num_batches);

  NativeHashMap<float> map(dim, AdagradRule::kSlots, /*track_access=*/false);
  std::vector<int64_t> prefill_keys(prefill);
  for (int64_t k = 0; k < prefill; ++k) prefill_keys[k] = k;
  const std::vector<float> grad(dim, 0.01f);
  OptimizerHyper hyper;  // Adagrad with lr 0.05 and epsilon 0, as the table benchmark's native run
  hyper.lr = 0.05f;
  hyper.epsilon = 0.0f;
  if (map.Reserve(prefill) != TableStatus::kOk) return 1;
  for (int64_t k : prefill_keys) {
    bool inserted;
    const int64_t index = map.FindOrInsert(k, &inserted);
    std::fill(map.row(index), map.row(index) + dim, kRow);
    std::fill(map.slots(index), map.slots(index) + dim, kAccumulator);
  }

  for (int b = 0; b < std::min<int>(warmup, batches.size()); ++b) Step(&map, batches[b], grad, hyper);
  int64_t keys = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& batch : batches) {
    Step(&map, batch, grad, hyper);
    keys += static_cast<int64_t>(batch.size());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"keys_per_s\": %.1f, \"keys\": %lld, \"seconds\": %.6f, \"batches\": %zu, \"table_size\": %lld}\n",
              keys / seconds, static_cast<long long>(keys), seconds, batches.size(),
              static_cast<long long>(map.size()));
  return 0;
}
