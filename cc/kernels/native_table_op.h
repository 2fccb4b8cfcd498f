/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// The native embedding table as a TF resource: one NativeTable per table, holding the hash map of
// cc/kernels/impl/native_table.h (rows, optimizer slots beside them, optional access stats) and its config.
#ifndef CC_KERNELS_NATIVE_TABLE_OP_H_
#define CC_KERNELS_NATIVE_TABLE_OP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cc/kernels/impl/native_table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/thread_annotations.h"

namespace tensorflow {
namespace fusedrec {

enum class TableOptimizer { kSgd, kAdagrad, kAdam, kAdamW, kFtrl, kRmsprop };
enum class RowStorage { kFloat32, kFloat16 };
enum class RowRounding { kNearest, kStochastic };

// The attributes of FusedRec>NativeTableCreate, validated once by FromAttrs.
struct NativeTableConfig {
  std::string name;       // names the table in every error message
  int64_t dim = 0;        // row width, >= 1
  std::string optimizer;  // "sgd" | "adagrad" | "adam" | "adamw" | "ftrl" | "rmsprop"
  TableOptimizer optimizer_kind = TableOptimizer::kSgd;
  // The optimizer's hyperparameters other than the learning rate, static per table, with Keras 3's names: float64 as
  // the Python floats Keras computes its constants from (an attribute each; the optimizer's own are checked, the
  // others are ignored). sgd: momentum, nesterov; adagrad: epsilon; adam: beta_1, beta_2, epsilon; adamw: those and
  // weight_decay; ftrl: learning_rate_power, l1, l2, l2_shrinkage (the *_regularization_strength attributes), beta;
  // rmsprop: rho, momentum, epsilon, centered. An initial_accumulator_value is slot_init.
  double momentum = 0, epsilon = 0, beta_1 = 0, beta_2 = 0, weight_decay = 0, learning_rate_power = 0, l1 = 0,
         l2 = 0, l2_shrinkage = 0, beta = 0, rho = 0;
  bool nesterov = false, centered = false;
  // The float32 constants the update rules take, derived from the above (lr and adam_lr are the step's: zero here).
  impl::OptimizerHyper hyper;
  std::vector<float> slot_init;  // initial value of each slot of a new key; one per slot (ExpectedSlots)
  std::string storage;           // "float32" | "float16" (slots are always float32)
  RowStorage storage_kind = RowStorage::kFloat32;
  // How an update's float32 row becomes float16: "nearest" | "stochastic" (float16 storage only; impl::
  // StochasticFloat16Bits). A row written by upsert or a new key's initial row is always rounded to nearest.
  std::string rounding;
  RowRounding rounding_kind = RowRounding::kNearest;
  std::string init;  // "hashed" | "constant" | "normal" | "uniform" | "truncated_normal"
  int64_t seed = 0;
  // float64: the hashed initializer multiplies by stddev in double, and a float32 attr would change its last bit.
  double mean = 0, stddev = 0, minval = 0, maxval = 0, value = 0;
  std::vector<int64_t> salts;  // salt of each category (feature_salt(seed, feature))
  bool track_access = false;
  // Tiered storage (impl/disk_store.h): with a tier_path, at most tier_dram_bytes of entries (keys, rows, slots,
  // access stats) stay in DRAM and the rest go to a RocksDB store in that directory. "" and 0: all in DRAM.
  std::string tier_path;
  int64_t tier_dram_bytes = 0;
  bool tiered() const { return !tier_path.empty(); }

  int num_slots() const { return static_cast<int>(slot_init.size()); }
  // The slots the optimizer keeps with these hyperparameters: sgd 1 with momentum > 0 (else 0), adagrad 1, adam and
  // adamw 2, ftrl 2, rmsprop 1 + (momentum > 0) + centered.
  int ExpectedSlots() const;
  // The checks Keras 3's optimizers make of these hyperparameters (finite; sgd momentum in [0, 1]; ftrl
  // learning_rate_power <= 0 and strengths >= 0; rmsprop momentum >= 0).
  Status CheckHyperparameters() const;
  // The float32 constants of the update rule (impl::OptimizerHyper, its lr and adam_lr left zero).
  impl::OptimizerHyper RuleConstants() const;
  std::unique_ptr<impl::RowInitializer> MakeInitializer() const;
  std::string DebugString() const;
  bool operator==(const NativeTableConfig& other) const;

  static Status FromAttrs(OpKernelConstruction* ctx, NativeTableConfig* config);
};

// Rows, slots and access stats of one storage type; defined in native_table_op.cc.
class TableStore;

// One chunk of an export (NativeTable::ExportChunk): keys [k], rows [k, dim], slots [k, S, dim], the keys' access
// stats (count, last) [k] (zeros where the table keeps none) and the table's clock (its training lookups so far).
struct ExportedChunk {
  std::vector<int64_t> keys;
  std::vector<float> rows, slots;
  std::vector<int64_t> counts, lasts;
  int64_t clock = 0;
};

// Where a chunked export goes on: (kDramEntries, slot index) the DRAM map's entries from that slot on,
// (kStoreFirst, 0) a tiered table's store from its first key, (kStoreAfter, key) the store after that key,
// (kExportDone, 0) nothing left.
enum ExportPhase : int64_t { kDramEntries = 0, kStoreFirst = 1, kStoreAfter = 2, kExportDone = 3 };

// Outputs sized from the table's contents, allocated by the kernel while the table is locked: (num_keys, outputs).
using AllocateOutputs = std::function<Status(int64_t num_keys, std::vector<Tensor*>* outputs)>;

// One embedding table. Ops that may insert or that update take the mutex exclusively; pure reads share it. Inputs
// reach these methods with their shapes checked by the kernels; what depends on the table is checked here.
class NativeTable : public ResourceBase {
 public:
  explicit NativeTable(const NativeTableConfig& config);
  ~NativeTable() override;
  // Builds the storage (opens a tiered table's store); called once, right after construction.
  Status Open();

  const NativeTableConfig& config() const { return config_; }
  std::string DebugString() const override;
  int64_t MemoryUsed() const override;

  // An InvalidArgument error that names the table.
  template <typename... Args>
  Status Error(Args... args) const {
    return errors::InvalidArgument("native table '", config_.name, "': ", args...);
  }

  // Checks 0 <= categories[i] < len(salts).
  Status CheckCategories(const Tensor& categories) const;

  // rows[i] = row of keys[i]; a missing key gets its initial row from (categories[i], ids[i]) and, when `insert`,
  // is inserted with its slots at slot_init (and, with track_access, counted). rows: float32 [U, dim], allocated.
  Status LookupOrInit(const Tensor& keys, const Tensor& categories, const Tensor& ids, bool insert, Tensor* rows);

  // One optimizer update per distinct key, with the grads of repeated keys summed first, with this step's learning
  // rate `lr` and, for adam and adamw, its bias-corrected `adam_lr`. update_count (the optimizer's 1-based update
  // number) picks the random bits of stochastic rounding. distinct_keys: the caller vouches that no key repeats (a
  // lookup's keys), and the deduplication pass is skipped; a repeated key is then updated once per occurrence.
  Status ApplySparse(const Tensor& keys, const Tensor& grads, const Tensor& categories, const Tensor& ids, float lr,
                     float adam_lr, int64_t update_count, bool distinct_keys = false);

  // part 0: rows, part p >= 1: slot p - 1. values: float32 [K, dim], exists: bool [K], allocated.
  Status Find(const Tensor& keys, int part, Tensor* values, Tensor* exists);
  Status Upsert(const Tensor& keys, const Tensor& values, int part);
  Status Remove(const Tensor& keys);
  int64_t Size() const;
  // The tiers' counters, int64 [kTierStats] (see TableStore::TierStats for their order and meaning).
  static constexpr int kTierStats = 12;
  void TierStats(int64_t* out) const;

  // Outputs keys [K], rows [K, dim], slots [K, S, dim].
  Status Export(const AllocateOutputs& allocate) const;
  // Up to max_rows entries from `cursor` (phase, position: ExportPhase) on, and where the next chunk starts (next):
  // an export of a table larger than memory, chunk by chunk, every entry once while the table does not change in
  // between (the caller checks the count against Size()). An unknown phase is an InvalidArgument error.
  Status ExportChunk(const int64_t cursor[2], int64_t max_rows, ExportedChunk* out, int64_t next[2]) const;
  // Change tracking, for publishing only what changed: the entries inserted or written (lookup with insert, update,
  // upsert) since the last ClearChanges, output as Export does (keys [C], rows [C, dim], slots [C, S, dim]), then
  // the distinct keys removed since then and not held now (removed [R], ascending). FailedPrecondition before the
  // first ClearChanges (removals are logged from then on only).
  Status Changes(const AllocateOutputs& allocate_changed, const AllocateOutputs& allocate_removed) const;
  // Forgets the changes so far and starts logging removals.
  void ClearChanges();
  // Outputs keys [K], counts [K], last [K], clock [].
  Status AccessStatus(const AllocateOutputs& allocate) const;
  // Sets the access stats of keys [K] to (counts[i], last[i]) and the clock to `clock` (a checkpoint's restore).
  // Every key must be held already (its row restored first): otherwise, or when a count < 0, a last outside
  // [0, clock] or a clock < 0 is given, nothing is set. A repeated key takes its last entry; other keys keep theirs.
  // Inputs: keys, counts, last int64 [K] (their lengths checked by the kernel).
  Status SetAccessStatus(const Tensor& keys, const Tensor& counts, const Tensor& last, int64_t clock);

 private:
  Status CheckPart(int part) const;

  const NativeTableConfig config_;
  mutable mutex mu_;
  std::unique_ptr<TableStore> store_ TF_GUARDED_BY(mu_);
  int64_t clock_ TF_GUARDED_BY(mu_) = 0;  // training lookups so far
};

}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_NATIVE_TABLE_OP_H_
