/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// The tiered table's store alone, against LMDB (issue 57): what a training step asks of the store, without
// TensorFlow. A store of N rows of B bytes (keys 0..N-1, int64), then S steps of: one batched read of K random keys in
// the store (the step's rows faulted in) and one batch writing K other random keys (the rows evicted), pinned to one
// core as a training worker is. Reports microseconds per row read and per row written over the timed steps (after
// W untimed ones), the store's bytes on disk and the process's resident memory (anonymous and file-backed).
//
// rocksdb: the op library's own store (cc/kernels/impl/disk_store.h, its settings and batched MultiGet, included
// here as the op library compiles it). lmdb: one LMDB environment (liblmdb), reads in one read transaction (sorted
// keys, mdb_get), writes in one write transaction (sorted puts), MDB_NOSYNC (no fsync: the store is scratch space,
// as the RocksDB one runs without its write-ahead log); lmdb-writemap adds MDB_WRITEMAP (pages written in the map).
//
//   g++ -O2 -std=c++17 -I. benchmarks/tier/store_bench.cc -o /tmp/store_bench -ldl -llmdb
//   taskset -c 0 /tmp/store_bench rocksdb /var/tmp/store_bench 17000000 120 8300 60 200
#include <lmdb.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cc/kernels/impl/disk_store.h"

namespace {

using tensorflow::fusedrec::impl::DiskStore;
using tensorflow::fusedrec::impl::EncodeDiskKey;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Fail(const std::string& what) {
  std::fprintf(stderr, "store_bench: %s\n", what.c_str());
  std::exit(1);
}

// One store's two operations, as the tiered table issues them.
struct Store {
  virtual ~Store() = default;
  virtual void Put(const std::vector<int64_t>& sorted_keys, const std::vector<char>& values, size_t bytes) = 0;
  virtual int64_t Read(const std::vector<int64_t>& keys, size_t bytes, std::vector<char>* out) = 0;  // -> found
};

struct Rocks : Store {
  std::unique_ptr<DiskStore> db;
  explicit Rocks(const std::string& path) {
    const std::string error = DiskStore::Open(path, "store_bench", &db);
    if (!error.empty()) Fail(error);
  }
  void Put(const std::vector<int64_t>& keys, const std::vector<char>& values, size_t bytes) override {
    DiskStore::Batch batch(*db);
    for (size_t i = 0; i < keys.size(); ++i) batch.Put(keys[i], &values[i * bytes], bytes);
    const std::string error = batch.Commit();
    if (!error.empty()) Fail(error);
  }
  int64_t Read(const std::vector<int64_t>& keys, size_t bytes, std::vector<char>* out) override {
    int64_t found = 0;
    const std::string error = db->MultiGet(keys.data(), keys.size(), [&](int64_t i, const char* v, size_t n) {
      if (n != bytes) return std::string("a value of another size");
      std::memcpy(&(*out)[i * bytes], v, n);
      ++found;
      return std::string();
    });
    if (!error.empty()) Fail(error);
    return found;
  }
};

struct Lmdb : Store {
  MDB_env* env = nullptr;
  MDB_dbi dbi = 0;
  Lmdb(const std::string& path, size_t map_bytes, bool writemap) {
    mkdir(path.c_str(), 0755);
    Check(mdb_env_create(&env), "env_create");
    Check(mdb_env_set_mapsize(env, map_bytes), "set_mapsize");
    Check(mdb_env_open(env, path.c_str(), MDB_NOSYNC | MDB_NOMETASYNC | MDB_NORDAHEAD | (writemap ? MDB_WRITEMAP : 0),
                       0644),
          "env_open");
    MDB_txn* txn;
    Check(mdb_txn_begin(env, nullptr, 0, &txn), "txn_begin");
    Check(mdb_dbi_open(txn, nullptr, 0, &dbi), "dbi_open");
    Check(mdb_txn_commit(txn), "commit");
  }
  ~Lmdb() override { mdb_env_close(env); }
  static void Check(int rc, const char* what) {
    if (rc != 0) Fail(std::string("lmdb ") + what + ": " + mdb_strerror(rc));
  }
  void Put(const std::vector<int64_t>& keys, const std::vector<char>& values, size_t bytes) override {
    MDB_txn* txn;
    Check(mdb_txn_begin(env, nullptr, 0, &txn), "txn_begin");
    char k[8];
    for (size_t i = 0; i < keys.size(); ++i) {
      EncodeDiskKey(keys[i], k);
      MDB_val key{8, k}, value{bytes, const_cast<char*>(&values[i * bytes])};
      Check(mdb_put(txn, dbi, &key, &value, 0), "put");
    }
    Check(mdb_txn_commit(txn), "commit");
  }
  int64_t Read(const std::vector<int64_t>& keys, size_t bytes, std::vector<char>* out) override {
    std::vector<std::pair<int64_t, int64_t>> order(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) order[i] = {keys[i], static_cast<int64_t>(i)};
    std::sort(order.begin(), order.end());
    MDB_txn* txn;
    Check(mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn), "txn_begin");
    int64_t found = 0;
    char k[8];
    for (const auto& [key_value, at] : order) {
      EncodeDiskKey(key_value, k);
      MDB_val key{8, k}, value;
      const int rc = mdb_get(txn, dbi, &key, &value);
      if (rc == MDB_NOTFOUND) continue;
      Check(rc, "get");
      if (value.mv_size != bytes) Fail("a value of another size");
      std::memcpy(&(*out)[at * bytes], value.mv_data, bytes);
      ++found;
    }
    mdb_txn_abort(txn);
    return found;
  }
};

// kB of VmRSS, RssAnon, RssFile from /proc/self/status.
std::string Memory() {
  std::ifstream in("/proc/self/status");
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS", 0) == 0 || line.rfind("RssAnon", 0) == 0 || line.rfind("RssFile", 0) == 0 ||
        line.rfind("VmHWM", 0) == 0) {
      out += (out.empty() ? "" : ", ") + line;
    }
  }
  return out;
}

int64_t DirectoryBytes(const std::string& path) {
  const std::string command = "du -sb " + path + " 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  long long bytes = 0;
  if (!pipe || std::fscanf(pipe.get(), "%lld", &bytes) != 1) return -1;
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s rocksdb|lmdb|lmdb-writemap PATH ROWS BYTES KEYS_PER_STEP WARMUP STEPS\n", argv[0]);
    return 2;
  }
  const std::string kind = argv[1], path = argv[2];
  const int64_t rows = std::atoll(argv[3]), warmup = std::atoll(argv[6]), steps = std::atoll(argv[7]);
  const size_t bytes = std::atoll(argv[4]);
  const int64_t per_step = std::atoll(argv[5]);
  if (std::system(("rm -rf " + path).c_str()) != 0) Fail("cannot clear " + path);
  std::unique_ptr<Store> store;
  if (kind == "rocksdb") {
    store.reset(new Rocks(path));
  } else if (kind == "lmdb" || kind == "lmdb-writemap") {
    store.reset(new Lmdb(path, static_cast<size_t>(rows) * (bytes + 64) * 3, kind == "lmdb-writemap"));
  } else {
    Fail("unknown store " + kind);
  }
  std::mt19937_64 rng(57);
  std::vector<char> values(static_cast<size_t>(std::max<int64_t>(per_step, 100000)) * bytes);
  for (auto& c : values) c = static_cast<char>(rng());
  double began = Now();
  for (int64_t start = 0; start < rows; start += 100000) {  // the fill: evictions of every row once, in key order
    std::vector<int64_t> keys;
    for (int64_t k = start; k < std::min(rows, start + 100000); ++k) keys.push_back(k);
    store->Put(keys, values, bytes);
  }
  std::printf("%s: filled %lld rows of %zu bytes in %.1f s; on disk %.2f GB\n", kind.c_str(),
              static_cast<long long>(rows), bytes, Now() - began, DirectoryBytes(path) / 1e9);
  std::fflush(stdout);
  std::uniform_int_distribution<int64_t> any(0, rows - 1);
  std::vector<char> out(per_step * bytes);
  double read_s = 0, write_s = 0;
  int64_t found = 0;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    std::vector<int64_t> reads(per_step), writes(per_step);
    for (auto& k : reads) k = any(rng);
    for (auto& k : writes) k = any(rng);
    std::sort(writes.begin(), writes.end());  // the table sorts its evictions
    writes.erase(std::unique(writes.begin(), writes.end()), writes.end());
    const double t0 = Now();
    const int64_t got = store->Read(reads, bytes, &out);
    const double t1 = Now();
    store->Put(writes, values, bytes);
    const double t2 = Now();
    if (step >= warmup) {
      read_s += t1 - t0;
      write_s += t2 - t1;
      found += got;
    }
  }
  std::printf("%s: %lld steps of %lld reads and writes: %.2f us a row read, %.2f us a row written, %.1f ms a step; "
              "%lld of %lld found; on disk %.2f GB; %s\n",
              kind.c_str(), static_cast<long long>(steps), static_cast<long long>(per_step),
              1e6 * read_s / (steps * per_step), 1e6 * write_s / (steps * per_step), 1e3 * (read_s + write_s) / steps,
              static_cast<long long>(found), static_cast<long long>(steps * per_step), DirectoryBytes(path) / 1e9,
              Memory().c_str());
  store.reset();
  if (std::system(("rm -rf " + path).c_str()) != 0) Fail("cannot remove " + path);
  return 0;
}
