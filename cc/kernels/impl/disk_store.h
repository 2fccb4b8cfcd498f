/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// The on-disk tier of a tiered native table (FusedRec>NativeTableCreate with tier_path): a RocksDB database of
// int64 key -> the bytes of one table entry, reached through RocksDB's C API loaded at run time (dlopen). So the op
// library neither needs RocksDB to build nor to load; only creating a tiered table does, and without RocksDB that is
// an error saying how to install it. TF-free.
//
// The database is the cold part of a table, not a copy of it: a key is either in the table's DRAM cache or here.
// It is scratch space, like TFRA's and DeepRec's SSD tiers: durability is the checkpoint's. A store is opened empty:
// a directory left by a crashed run of the same table is wiped, a directory of another table (its FUSEDREC_TABLE file
// names another) or not a store of ours is refused, and the store is deleted when its table is.
//
// Settings, chosen for a cache's write-back and batched point reads: no write-ahead log (nothing is recovered from
// it), no compression (float rows do not compress), a bloom filter (most keys a step misses in DRAM are new, and the
// filter answers them without a read); the block cache and the write buffers are bounded (kBlockCacheBytes +
// 2 x kWriteBufferBytes), the index and filter blocks take about 2 bytes per row on disk.
#ifndef CC_KERNELS_IMPL_DISK_STORE_H_
#define CC_KERNELS_IMPL_DISK_STORE_H_

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace tensorflow {
namespace fusedrec {
namespace impl {

// RocksDB's C API, the part used here (rocksdb/c.h; stable since RocksDB 6), resolved once from the shared library.
struct RocksApi {
  void* (*options_create)();
  void (*options_destroy)(void*);
  void (*options_set_create_if_missing)(void*, unsigned char);
  void (*options_set_error_if_exists)(void*, unsigned char);
  void (*options_set_compression)(void*, int);
  void (*options_set_write_buffer_size)(void*, size_t);
  void (*options_set_max_write_buffer_number)(void*, int);
  void (*options_set_max_background_jobs)(void*, int);
  void (*options_set_block_based_table_factory)(void*, void*);
  void (*options_set_memtable_prefix_bloom_size_ratio)(void*, double);
  void (*options_set_memtable_whole_key_filtering)(void*, unsigned char);
  void (*readoptions_set_fill_cache)(void*, unsigned char);
  void* (*block_based_options_create)();
  void (*block_based_options_destroy)(void*);
  void (*block_based_options_set_block_cache)(void*, void*);
  void (*block_based_options_set_filter_policy)(void*, void*);
  void (*block_based_options_set_cache_index_and_filter_blocks)(void*, unsigned char);
  void* (*cache_create_lru)(size_t);
  void (*cache_destroy)(void*);
  void* (*filterpolicy_create_bloom_full)(double);
  void* (*open_column_families)(const void*, const char*, int, const char* const*, const void* const*, void**,
                                char**);
  void (*column_family_handle_destroy)(void*);
  void (*close)(void*);
  void (*destroy_db)(const void*, const char*, char**);
  void* (*writeoptions_create)();
  void (*writeoptions_destroy)(void*);
  void (*writeoptions_disable_WAL)(void*, int);
  void* (*readoptions_create)();
  void (*readoptions_destroy)(void*);
  void* (*writebatch_create)();
  void (*writebatch_destroy)(void*);
  void (*writebatch_put)(void*, const char*, size_t, const char*, size_t);
  void (*writebatch_delete)(void*, const char*, size_t);
  void (*write)(void*, const void*, void*, char**);
  void (*batched_multi_get_cf)(void*, const void*, void*, size_t, const char* const*, const size_t*, void**, char**,
                               bool);
  const char* (*pinnableslice_value)(const void*, size_t*);
  void (*pinnableslice_destroy)(void*);
  void* (*create_iterator)(void*, const void*);
  void (*iter_destroy)(void*);
  void (*iter_seek_to_first)(void*);
  void (*iter_seek)(void*, const char*, size_t);
  unsigned char (*iter_valid)(const void*);
  void (*iter_next)(void*);
  const char* (*iter_key)(const void*, size_t*);
  const char* (*iter_value)(const void*, size_t*);
  void (*iter_get_error)(const void*, char**);
  void (*free)(void*);

  // The API, or null with *error saying why (RocksDB not installed, or a symbol missing).
  static const RocksApi* Get(std::string* error) {
    static std::string load_error;
    static const RocksApi* api = Load(&load_error);
    if (api == nullptr) *error = load_error;
    return api;
  }

 private:
  static const RocksApi* Load(std::string* error) {
    std::vector<std::string> names;
    if (const char* env = std::getenv("FUSEDREC_ROCKSDB_LIBRARY")) names.push_back(env);
    for (const char* n : {"librocksdb.so", "librocksdb.so.9", "librocksdb.so.8", "librocksdb.so.7.8",
                          "librocksdb.so.7", "librocksdb.so.6"}) {
      names.push_back(n);
    }
    void* lib = nullptr;
    for (const std::string& n : names) {
      if ((lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (lib == nullptr) {
      *error = "a tiered table needs RocksDB's shared library (librocksdb.so), which was not found: install it "
               "(Debian/Ubuntu: apt-get install librocksdb-dev; or set FUSEDREC_ROCKSDB_LIBRARY to its path)";
      return nullptr;
    }
    auto* a = new RocksApi();
    bool ok = true;
    auto sym = [&](auto* fn, const char* name) {
      void* p = dlsym(lib, name);
      if (p == nullptr) {
        ok = false;
        *error = std::string("RocksDB's library lacks ") + name + " (RocksDB >= 6 is needed)";
      }
      std::memcpy(fn, &p, sizeof(p));
    };
    sym(&a->options_create, "rocksdb_options_create");
    sym(&a->options_destroy, "rocksdb_options_destroy");
    sym(&a->options_set_create_if_missing, "rocksdb_options_set_create_if_missing");
    sym(&a->options_set_error_if_exists, "rocksdb_options_set_error_if_exists");
    sym(&a->options_set_compression, "rocksdb_options_set_compression");
    sym(&a->options_set_write_buffer_size, "rocksdb_options_set_write_buffer_size");
    sym(&a->options_set_max_write_buffer_number, "rocksdb_options_set_max_write_buffer_number");
    sym(&a->options_set_max_background_jobs, "rocksdb_options_set_max_background_jobs");
    sym(&a->options_set_block_based_table_factory, "rocksdb_options_set_block_based_table_factory");
    sym(&a->options_set_memtable_prefix_bloom_size_ratio, "rocksdb_options_set_memtable_prefix_bloom_size_ratio");
    sym(&a->options_set_memtable_whole_key_filtering, "rocksdb_options_set_memtable_whole_key_filtering");
    sym(&a->readoptions_set_fill_cache, "rocksdb_readoptions_set_fill_cache");
    sym(&a->block_based_options_create, "rocksdb_block_based_options_create");
    sym(&a->block_based_options_destroy, "rocksdb_block_based_options_destroy");
    sym(&a->block_based_options_set_block_cache, "rocksdb_block_based_options_set_block_cache");
    sym(&a->block_based_options_set_filter_policy, "rocksdb_block_based_options_set_filter_policy");
    sym(&a->block_based_options_set_cache_index_and_filter_blocks,
        "rocksdb_block_based_options_set_cache_index_and_filter_blocks");
    sym(&a->cache_create_lru, "rocksdb_cache_create_lru");
    sym(&a->cache_destroy, "rocksdb_cache_destroy");
    sym(&a->filterpolicy_create_bloom_full, "rocksdb_filterpolicy_create_bloom_full");
    sym(&a->open_column_families, "rocksdb_open_column_families");
    sym(&a->column_family_handle_destroy, "rocksdb_column_family_handle_destroy");
    sym(&a->close, "rocksdb_close");
    sym(&a->destroy_db, "rocksdb_destroy_db");
    sym(&a->writeoptions_create, "rocksdb_writeoptions_create");
    sym(&a->writeoptions_destroy, "rocksdb_writeoptions_destroy");
    sym(&a->writeoptions_disable_WAL, "rocksdb_writeoptions_disable_WAL");
    sym(&a->readoptions_create, "rocksdb_readoptions_create");
    sym(&a->readoptions_destroy, "rocksdb_readoptions_destroy");
    sym(&a->writebatch_create, "rocksdb_writebatch_create");
    sym(&a->writebatch_destroy, "rocksdb_writebatch_destroy");
    sym(&a->writebatch_put, "rocksdb_writebatch_put");
    sym(&a->writebatch_delete, "rocksdb_writebatch_delete");
    sym(&a->write, "rocksdb_write");
    sym(&a->batched_multi_get_cf, "rocksdb_batched_multi_get_cf");
    sym(&a->pinnableslice_value, "rocksdb_pinnableslice_value");
    sym(&a->pinnableslice_destroy, "rocksdb_pinnableslice_destroy");
    sym(&a->create_iterator, "rocksdb_create_iterator");
    sym(&a->iter_destroy, "rocksdb_iter_destroy");
    sym(&a->iter_seek_to_first, "rocksdb_iter_seek_to_first");
    sym(&a->iter_seek, "rocksdb_iter_seek");
    sym(&a->iter_valid, "rocksdb_iter_valid");
    sym(&a->iter_next, "rocksdb_iter_next");
    sym(&a->iter_key, "rocksdb_iter_key");
    sym(&a->iter_value, "rocksdb_iter_value");
    sym(&a->iter_get_error, "rocksdb_iter_get_error");
    sym(&a->free, "rocksdb_free");
    if (!ok) {
      delete a;
      return nullptr;
    }
    return a;
  }
};

// Keys are stored big-endian, so the store iterates in unsigned key order.
inline void EncodeDiskKey(int64_t key, char out[8]) {
  const uint64_t k = static_cast<uint64_t>(key);
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>(k >> (56 - 8 * b));
}

inline int64_t DecodeDiskKey(const char* in) {
  uint64_t k = 0;
  for (int b = 0; b < 8; ++b) k = (k << 8) | static_cast<unsigned char>(in[b]);
  return static_cast<int64_t>(k);
}

class DiskStore {
 public:
  static constexpr size_t kBlockCacheBytes = size_t{32} << 20;
  static constexpr size_t kWriteBufferBytes = size_t{32} << 20;
  static constexpr const char* kIdentityFile = "FUSEDREC_TABLE";

  // Opens an empty store in directory `path` for the table `identity` (one line naming the table and its layout).
  // Returns "" or the error.
  static std::string Open(const std::string& path, const std::string& identity, std::unique_ptr<DiskStore>* out) {
    std::string error;
    const RocksApi* api = RocksApi::Get(&error);
    if (api == nullptr) return error;
    std::unique_ptr<DiskStore> s(new DiskStore(api, path));
    const std::string id_file = path + "/" + kIdentityFile;
    struct stat st;
    if (stat(path.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return "tier path " + path + " exists and is not a directory";
      std::ifstream in(id_file);
      if (in) {
        std::string found;
        std::getline(in, found);
        if (found != identity) {
          return "tier path " + path + " holds the store of another table (" + id_file + " names '" + found +
                 "', this table is '" + identity + "'): give each table its own path";
        }
        // The same table's store, left by a run that did not close it (killed): its rows are stale (a resumed run
        // restores them from its checkpoint), so it starts empty.
        char* err = nullptr;
        api->destroy_db(s->options_, path.c_str(), &err);
        if (err != nullptr) return s->Take(err, "wiping the stale store " + path);
      } else if (!DirectoryEmpty(path)) {
        return "tier path " + path + " is a directory that is not empty and holds no " + kIdentityFile +
               " file: not a tf_fusedrec store, left alone (give an empty or new directory)";
      }
    } else if (!MakeDirectories(path)) {
      return "cannot create the tier directory " + path + ": " + std::strerror(errno);
    }
    {
      std::ofstream id(id_file, std::ios::trunc);
      id << identity << "\n";
      if (!id.good()) return "cannot write " + id_file;
    }
    char* err = nullptr;
    const char* names[1] = {"default"};
    const void* cf_options[1] = {s->options_};
    s->db_ = api->open_column_families(s->options_, path.c_str(), 1, names, cf_options, &s->default_cf_, &err);
    if (err != nullptr) return s->Take(err, "opening the store " + path);
    *out = std::move(s);
    return "";
  }

  ~DiskStore() {
    if (db_ != nullptr) {
      api_->column_family_handle_destroy(default_cf_);
      api_->close(db_);
      char* err = nullptr;
      api_->destroy_db(options_, path_.c_str(), &err);
      if (err != nullptr) api_->free(err);
      std::remove((path_ + "/" + kIdentityFile).c_str());
      rmdir(path_.c_str());  // only if empty: a directory the user filled stays
    }
    api_->writeoptions_destroy(write_options_);
    api_->readoptions_destroy(read_options_);
    api_->options_destroy(options_);
    api_->block_based_options_destroy(table_options_);
    api_->cache_destroy(cache_);
  }

  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  const std::string& path() const { return path_; }

  // Reads n keys in batches (RocksDB's batched MultiGet: each batch sorted, its blocks read once); calls
  // found(i, value, length) for each key held, in no particular order. Returns "" or the first error (of RocksDB,
  // or of found).
  template <typename F>
  std::string MultiGet(const int64_t* keys, int64_t n, F found) const {
    constexpr int64_t kChunk = 4096;
    std::vector<std::pair<uint64_t, int64_t>> order(n);  // (unsigned key: the store's order, position)
    for (int64_t i = 0; i < n; ++i) order[i] = {static_cast<uint64_t>(keys[i]), i};
    std::sort(order.begin(), order.end());
    std::vector<char> encoded(kChunk * 8);
    std::vector<const char*> key_ptrs(kChunk);
    std::vector<size_t> key_sizes(kChunk, 8);
    std::vector<void*> values(kChunk);
    std::vector<char*> errors(kChunk);
    std::string error;
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t m = std::min(kChunk, n - start);
      for (int64_t i = 0; i < m; ++i) {
        EncodeDiskKey(static_cast<int64_t>(order[start + i].first), &encoded[i * 8]);
        key_ptrs[i] = &encoded[i * 8];
      }
      api_->batched_multi_get_cf(db_, read_options_, default_cf_, m, key_ptrs.data(), key_sizes.data(),
                                 values.data(), errors.data(), /*sorted_input=*/true);
      for (int64_t i = 0; i < m; ++i) {
        if (errors[i] != nullptr) {
          if (error.empty()) error = std::string("reading ") + path_ + ": " + errors[i];
          api_->free(errors[i]);
        }
        if (values[i] != nullptr) {
          if (error.empty()) {
            size_t length = 0;
            const char* value = api_->pinnableslice_value(values[i], &length);
            error = found(order[start + i].second, value, length);
          }
          api_->pinnableslice_destroy(values[i]);
        }
      }
      if (!error.empty()) return error;
    }
    return "";
  }

  // Puts and deletes applied together (one write batch).
  class Batch {
   public:
    explicit Batch(const DiskStore& store) : store_(store), batch_(store.api_->writebatch_create()) {}
    ~Batch() { store_.api_->writebatch_destroy(batch_); }
    void Put(int64_t key, const char* value, size_t length) {
      char k[8];
      EncodeDiskKey(key, k);
      store_.api_->writebatch_put(batch_, k, 8, value, length);
      bytes_ += 8 + length;
    }
    void Delete(int64_t key) {
      char k[8];
      EncodeDiskKey(key, k);
      store_.api_->writebatch_delete(batch_, k, 8);
    }
    int64_t bytes() const { return bytes_; }
    std::string Commit() {
      char* err = nullptr;
      store_.api_->write(store_.db_, store_.write_options_, batch_, &err);
      return err == nullptr ? "" : store_.Take(err, "writing " + store_.path_);
    }

   private:
    const DiskStore& store_;
    void* batch_;
    int64_t bytes_ = 0;
  };

  // Calls f(key, value, length) for every key held, in unsigned key order; f returns "" or an error that stops the
  // walk. Returns "" or the error.
  template <typename F>
  std::string ForEach(F f) const {
    bool stop = false;
    return ForEachAfter(nullptr, [&](int64_t key, const char* value, size_t length) { return f(key, value, length); },
                        &stop);
  }

  // As ForEach, from the first key after *after in the store's order (from the first key when after is null), until
  // f sets *stop (after its call) or returns an error: a walk resumed call after call (a chunked export) from the
  // last key it visited, each call seeking once.
  template <typename F>
  std::string ForEachAfter(const int64_t* after, F f, bool* stop) const {
    void* it = api_->create_iterator(db_, read_options_);
    std::string error;
    char from[8];
    if (after == nullptr) {
      api_->iter_seek_to_first(it);
    } else {
      EncodeDiskKey(*after, from);
      api_->iter_seek(it, from, 8);
      size_t klen = 0;
      if (api_->iter_valid(it)) {
        const char* k = api_->iter_key(it, &klen);
        if (klen == 8 && std::memcmp(k, from, 8) == 0) api_->iter_next(it);
      }
    }
    for (; error.empty() && !*stop && api_->iter_valid(it); api_->iter_next(it)) {
      size_t klen = 0, vlen = 0;
      const char* k = api_->iter_key(it, &klen);
      const char* v = api_->iter_value(it, &vlen);
      if (klen != 8) {
        error = "the store " + path_ + " holds a key of " + std::to_string(klen) + " bytes (ours have 8): corrupted";
        break;
      }
      error = f(DecodeDiskKey(k), v, vlen);
    }
    if (error.empty()) {
      char* err = nullptr;
      api_->iter_get_error(it, &err);
      if (err != nullptr) error = Take(err, "reading " + path_);
    }
    api_->iter_destroy(it);
    return error;
  }

 private:
  DiskStore(const RocksApi* api, const std::string& path) : api_(api), path_(path) {
    options_ = api_->options_create();
    api_->options_set_create_if_missing(options_, 1);
    api_->options_set_error_if_exists(options_, 1);
    api_->options_set_compression(options_, 0);  // rocksdb_no_compression
    api_->options_set_write_buffer_size(options_, kWriteBufferBytes);
    api_->options_set_max_write_buffer_number(options_, 2);
    api_->options_set_max_background_jobs(options_, 2);
    // A bloom filter over the write buffer's keys (10% of its size): most reads are of keys not in it, and without
    // the filter each searched its skip list (perf: 40% of a tiered step in memtable compares).
    api_->options_set_memtable_prefix_bloom_size_ratio(options_, 0.1);
    api_->options_set_memtable_whole_key_filtering(options_, 1);
    table_options_ = api_->block_based_options_create();
    cache_ = api_->cache_create_lru(kBlockCacheBytes);
    api_->block_based_options_set_block_cache(table_options_, cache_);
    api_->block_based_options_set_filter_policy(table_options_, api_->filterpolicy_create_bloom_full(10));
    // Index and filter blocks stay in each file's reader (about 2 bytes per row on disk) rather than in the block
    // cache: cached there, a full filter block evicted by data blocks was read and checksummed again by the next
    // read (perf: 30% of a tiered step in pread and filter code).
    api_->block_based_options_set_cache_index_and_filter_blocks(table_options_, 0);
    api_->options_set_block_based_table_factory(options_, table_options_);
    write_options_ = api_->writeoptions_create();
    api_->writeoptions_disable_WAL(write_options_, 1);
    read_options_ = api_->readoptions_create();
    // A row read goes into DRAM and is not read from the store again until it is evicted: caching its block only
    // churned the block cache (its hash table and allocations were 5% of a step).
    api_->readoptions_set_fill_cache(read_options_, 0);
  }

  // RocksDB's error message, freed, after `what`.
  std::string Take(char* err, const std::string& what) const {
    std::string message = what + ": " + err;
    api_->free(err);
    return message;
  }

  static bool DirectoryEmpty(const std::string& path) {
    std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir(path.c_str()), closedir);
    if (!dir) return false;
    while (dirent* e = readdir(dir.get())) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) return false;
    }
    return true;
  }

  static bool MakeDirectories(const std::string& path) {
    for (size_t i = 1; i <= path.size(); ++i) {
      if (i == path.size() || path[i] == '/') {
        const std::string prefix = path.substr(0, i);
        if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return false;
      }
    }
    return true;
  }

  const RocksApi* api_;
  const std::string path_;
  void* options_ = nullptr;
  void* table_options_ = nullptr;
  void* cache_ = nullptr;
  void* write_options_ = nullptr;
  void* read_options_ = nullptr;
  void* db_ = nullptr;
  void* default_cf_ = nullptr;
};

}  // namespace impl
}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_IMPL_DISK_STORE_H_
