/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include "cc/kernels/native_table_op.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>
#include <utility>

#include "absl/strings/numbers.h"
#include "cc/kernels/impl/disk_store.h"
#include "cc/kernels/impl/pair_dedup.h"
#include "cc/kernels/kernel_util.h"
#include "tensorflow/core/framework/numeric_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tensorflow {
namespace fusedrec {

using impl::TableStatus;

// ---------------------------------------------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------------------------------------------

namespace {

// A float64 attr, passed as the decimal string of a Python float (see NativeTableConfig: why float64). The string
// round-trips: repr(x) parses back to exactly x.
Status GetDoubleAttr(OpKernelConstruction* ctx, const char* attr, double* out) {
  std::string text;
  TF_RETURN_IF_ERROR(ctx->GetAttr(attr, &text));
  if (!absl::SimpleAtod(text, out)) {
    return errors::InvalidArgument("attr ", attr, " must be the decimal string of a float64, got '", text, "'");
  }
  return OkStatus();
}

}  // namespace

Status NativeTableConfig::FromAttrs(OpKernelConstruction* ctx, NativeTableConfig* c) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_name", &c->name));
  TF_RETURN_IF_ERROR(ctx->GetAttr("dim", &c->dim));
  TF_RETURN_IF_ERROR(ctx->GetAttr("optimizer", &c->optimizer));
  TF_RETURN_IF_ERROR(ctx->GetAttr("slot_init", &c->slot_init));
  TF_RETURN_IF_ERROR(ctx->GetAttr("storage", &c->storage));
  TF_RETURN_IF_ERROR(ctx->GetAttr("rounding", &c->rounding));
  TF_RETURN_IF_ERROR(ctx->GetAttr("init", &c->init));
  TF_RETURN_IF_ERROR(ctx->GetAttr("seed", &c->seed));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "mean", &c->mean));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "stddev", &c->stddev));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "minval", &c->minval));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "maxval", &c->maxval));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "value", &c->value));
  TF_RETURN_IF_ERROR(ctx->GetAttr("salts", &c->salts));
  TF_RETURN_IF_ERROR(ctx->GetAttr("track_access", &c->track_access));
  TF_RETURN_IF_ERROR(ctx->GetAttr("tier_path", &c->tier_path));
  TF_RETURN_IF_ERROR(ctx->GetAttr("tier_dram_bytes", &c->tier_dram_bytes));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "momentum", &c->momentum));
  TF_RETURN_IF_ERROR(ctx->GetAttr("nesterov", &c->nesterov));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "rho", &c->rho));
  TF_RETURN_IF_ERROR(ctx->GetAttr("centered", &c->centered));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "epsilon", &c->epsilon));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "beta_1", &c->beta_1));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "beta_2", &c->beta_2));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "weight_decay", &c->weight_decay));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "learning_rate_power", &c->learning_rate_power));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "l1_regularization_strength", &c->l1));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "l2_regularization_strength", &c->l2));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "l2_shrinkage_regularization_strength", &c->l2_shrinkage));
  TF_RETURN_IF_ERROR(GetDoubleAttr(ctx, "beta", &c->beta));

  auto error = [&](auto... args) { return errors::InvalidArgument("native table '", c->name, "': ", args...); };
  if (c->dim < 1) return error("dim must be >= 1, got ", c->dim);
  if (c->optimizer == "sgd") {
    c->optimizer_kind = TableOptimizer::kSgd;
  } else if (c->optimizer == "adagrad") {
    c->optimizer_kind = TableOptimizer::kAdagrad;
  } else if (c->optimizer == "adam") {
    c->optimizer_kind = TableOptimizer::kAdam;
  } else if (c->optimizer == "adamw") {
    c->optimizer_kind = TableOptimizer::kAdamW;
  } else if (c->optimizer == "ftrl") {
    c->optimizer_kind = TableOptimizer::kFtrl;
  } else if (c->optimizer == "rmsprop") {
    c->optimizer_kind = TableOptimizer::kRmsprop;
  } else {
    return error("optimizer must be sgd, adagrad, adam, adamw, ftrl or rmsprop, got '", c->optimizer, "'");
  }
  TF_RETURN_IF_ERROR(c->CheckHyperparameters());
  const int expected_slots = c->ExpectedSlots();
  if (c->num_slots() != expected_slots) {
    return error("optimizer ", c->optimizer, " has ", expected_slots, " slots with these hyperparameters, so ",
                 "slot_init must have ", expected_slots, " values, got ", c->slot_init.size());
  }
  if (c->optimizer_kind == TableOptimizer::kFtrl && !(c->slot_init[0] >= 0)) {
    return error("ftrl's initial_accumulator_value (slot_init[0]) must be >= 0, got ", c->slot_init[0]);
  }
  c->hyper = c->RuleConstants();
  if (c->storage == "float32") {
    c->storage_kind = RowStorage::kFloat32;
  } else if (c->storage == "float16") {
    c->storage_kind = RowStorage::kFloat16;
  } else {
    return error("storage must be float32 or float16, got '", c->storage, "'");
  }
  if (c->rounding == "nearest") {
    c->rounding_kind = RowRounding::kNearest;
  } else if (c->rounding == "stochastic") {
    c->rounding_kind = RowRounding::kStochastic;
    if (c->storage_kind != RowStorage::kFloat16) {
      return error("rounding stochastic needs storage float16 (float32 rows are not rounded), got storage ",
                   c->storage);
    }
  } else {
    return error("rounding must be nearest or stochastic, got '", c->rounding, "'");
  }
  if (c->init == "hashed" || c->init == "normal" || c->init == "truncated_normal") {
    if (!(c->stddev > 0)) return error("init ", c->init, " needs stddev > 0, got ", c->stddev);
  } else if (c->init == "uniform") {
    if (!(c->minval < c->maxval)) {
      return error("init uniform needs minval < maxval, got ", c->minval, " and ", c->maxval);
    }
  } else if (c->init != "constant") {
    return error("init must be hashed, constant, normal, uniform or truncated_normal, got '", c->init, "'");
  }
  if (c->salts.empty()) return error("salts must name at least one category");
  if (c->tiered() && c->tier_dram_bytes <= 0) {
    return error("a tiered table (tier_path '", c->tier_path, "') needs tier_dram_bytes > 0, got ", c->tier_dram_bytes);
  }
  return OkStatus();
}

Status NativeTableConfig::CheckHyperparameters() const {
  auto error = [&](auto... args) {
    return errors::InvalidArgument("native table '", name, "': optimizer ", optimizer, ": ", args...);
  };
  const std::pair<const char*, double> values[] = {
      {"momentum", momentum},
      {"epsilon", epsilon},
      {"beta_1", beta_1},
      {"beta_2", beta_2},
      {"weight_decay", weight_decay},
      {"learning_rate_power", learning_rate_power},
      {"l1_regularization_strength", l1},
      {"l2_regularization_strength", l2},
      {"l2_shrinkage_regularization_strength", l2_shrinkage},
      {"beta", beta},
      {"rho", rho}};
  for (const auto& [attr, value] : values) {
    if (!std::isfinite(value)) return error(attr, " must be finite, got ", value);
  }
  // The checks Keras 3 makes in the optimizers' constructors.
  switch (optimizer_kind) {
    case TableOptimizer::kSgd:
      if (momentum < 0 || momentum > 1) return error("momentum must be in [0, 1], got ", momentum);
      break;
    case TableOptimizer::kRmsprop:
      if (momentum < 0) return error("momentum must be >= 0, got ", momentum);
      break;
    case TableOptimizer::kFtrl:
      if (learning_rate_power > 0) return error("learning_rate_power must be <= 0, got ", learning_rate_power);
      if (l1 < 0 || l2 < 0 || l2_shrinkage < 0) {
        return error("the regularization strengths must be >= 0, got l1 ", l1, ", l2 ", l2, ", l2_shrinkage ",
                     l2_shrinkage);
      }
      break;
    default:
      break;
  }
  return OkStatus();
}

int NativeTableConfig::ExpectedSlots() const {
  switch (optimizer_kind) {
    case TableOptimizer::kSgd:
      return momentum > 0 ? 1 : 0;
    case TableOptimizer::kAdagrad:
      return impl::AdagradRule::kSlots;
    case TableOptimizer::kAdam:
      return impl::AdamRule::kSlots;
    case TableOptimizer::kAdamW:
      return impl::AdamWRule::kSlots;
    case TableOptimizer::kFtrl:
      return impl::FtrlRule::kSlots;
    case TableOptimizer::kRmsprop:
      return 1 + (momentum > 0 ? 1 : 0) + (centered ? 1 : 0);
  }
  return 0;
}

impl::OptimizerHyper NativeTableConfig::RuleConstants() const {
  // float32 of a float64 (Keras: a Python float converted to a float32 tensor), and of `1 - x` taken in float64
  // (Keras 3: `1 - self.rho` in Python). AdamRule takes its 1 - beta in float32, from beta1 and beta2, as TF's kernel.
  auto f32 = [](double x) { return static_cast<float>(x); };
  impl::OptimizerHyper h;
  h.epsilon = f32(epsilon);
  h.beta1 = f32(beta_1);
  h.beta2 = f32(beta_2);
  h.one_minus_beta1 = f32(1.0 - beta_1);
  h.one_minus_beta2 = f32(1.0 - beta_2);
  h.weight_decay = f32(weight_decay);
  h.momentum = f32(momentum);
  h.rho = f32(rho);
  h.one_minus_rho = f32(1.0 - rho);
  h.ftrl_sqrt = learning_rate_power == -0.5;
  h.ftrl_power = f32(-learning_rate_power);
  h.l1 = f32(l1);
  h.l2 = f32(l2);
  h.ftrl_beta = f32(beta);
  h.two_l2_shrinkage = f32(2.0 * l2_shrinkage);
  return h;
}

std::unique_ptr<impl::RowInitializer> NativeTableConfig::MakeInitializer() const {
  if (init == "hashed") return std::make_unique<impl::HashedInitializer>(stddev);
  if (init == "normal") return std::make_unique<impl::NormalInitializer>(seed, mean, stddev);
  if (init == "truncated_normal") return std::make_unique<impl::TruncatedNormalInitializer>(seed, mean, stddev);
  if (init == "uniform") return std::make_unique<impl::UniformInitializer>(seed, minval, maxval);
  return std::make_unique<impl::ConstantInitializer>(value);
}

std::string NativeTableConfig::DebugString() const {
  auto join = [](const auto& values) {
    std::string s;
    for (const auto& v : values) strings::StrAppend(&s, s.empty() ? "" : ",", v);
    return s;
  };
  return strings::StrCat(
      "name=", name, " dim=", dim, " optimizer=", optimizer, " momentum=", momentum, " nesterov=", nesterov,
      " rho=", rho, " centered=", centered, " epsilon=", epsilon, " beta_1=", beta_1, " beta_2=", beta_2,
      " weight_decay=", weight_decay, " learning_rate_power=", learning_rate_power, " l1=", l1, " l2=", l2,
      " l2_shrinkage=", l2_shrinkage, " beta=", beta, " slot_init=[", join(slot_init), "] storage=", storage,
      " rounding=", rounding, " init=", init, " seed=", seed, " mean=", mean, " stddev=", stddev, " minval=", minval,
      " maxval=", maxval, " value=", value, " salts=[", join(salts), "] track_access=", track_access,
      " tier_path=", tier_path, " tier_dram_bytes=", tier_dram_bytes);
}

bool NativeTableConfig::operator==(const NativeTableConfig& o) const {
  return name == o.name && dim == o.dim && optimizer == o.optimizer && momentum == o.momentum &&
         nesterov == o.nesterov && rho == o.rho && centered == o.centered && epsilon == o.epsilon &&
         beta_1 == o.beta_1 && beta_2 == o.beta_2 && weight_decay == o.weight_decay &&
         learning_rate_power == o.learning_rate_power && l1 == o.l1 && l2 == o.l2 && l2_shrinkage == o.l2_shrinkage &&
         beta == o.beta && slot_init == o.slot_init &&
         storage == o.storage && rounding == o.rounding && init == o.init && seed == o.seed && mean == o.mean &&
         stddev == o.stddev && minval == o.minval && maxval == o.maxval && value == o.value && salts == o.salts &&
         track_access == o.track_access && tier_path == o.tier_path && tier_dram_bytes == o.tier_dram_bytes;
}

// ---------------------------------------------------------------------------------------------------------------
// Storage
// ---------------------------------------------------------------------------------------------------------------

namespace {

// Rows held as float32: read and updated in place.
struct Float32Rows {
  using Stored = float;
  static constexpr bool kInPlace = true;
  static float Load(float v) { return v; }
  static float Store(float v) { return v; }
};

// Rows held as float16 bits: converted to float32 on read; an update computes the new row in float32 and rounds it
// to float16 once, when storing (Store: to nearest; TypedStore::StoreUpdated: the table's rounding).
struct Float16Rows {
  using Stored = uint16_t;
  static constexpr bool kInPlace = false;
  static float Load(uint16_t v) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(v)); }
  static uint16_t Store(float v) { return Eigen::numext::bit_cast<uint16_t>(Eigen::half(v)); }
};

}  // namespace

class TableStore {
 public:
  explicit TableStore(const NativeTableConfig& config) : config_(config) {}
  virtual ~TableStore() = default;
  // Keys held (in DRAM and, tiered, on disk).
  virtual int64_t size() const = 0;
  virtual int64_t MemoryUsed() const = 0;
  // Readies the table for a call that may insert or update these n keys (repeats allowed): room for all of them in
  // DRAM without growth during the call, and, tiered, every one of them held on disk brought into DRAM. lookup: a
  // training lookup's keys (what the tiers' hit counters count).
  virtual Status Prepare(const int64_t* keys, int64_t n, bool lookup) = 0;
  // Training lookup, after Prepare: inserts missing keys; with access tracking, each key's count += 1 and
  // last = clock.
  virtual void LookupOrInsert(const int64_t* keys, const int32* categories, const int64_t* ids, int64_t n,
                              int64_t clock, float* rows) = 0;
  // Inference lookup: missing keys get their initial rows; the table is not changed.
  virtual Status LookupOrInitial(const int64_t* keys, const int32* categories, const int64_t* ids, int64_t n,
                                 float* rows) const = 0;
  // Distinct keys only, after Prepare.
  virtual void ApplySparse(const int64_t* keys, const float* grads, const int32* categories, const int64_t* ids,
                           int64_t n, const impl::OptimizerHyper& hyper, int64_t update_count) = 0;
  virtual Status Find(const int64_t* keys, int64_t n, int part, float* values, bool* exists) const = 0;
  // After Prepare.
  virtual void Upsert(const int64_t* keys, const float* values, int64_t n, int part) = 0;
  virtual Status Remove(const int64_t* keys, int64_t n) = 0;
  // Writes all size() entries.
  virtual Status Export(int64_t* keys, float* rows, float* slots) const = 0;
  // NativeTable::ExportChunk, the cursor's phase checked.
  virtual Status ExportChunk(const int64_t cursor[2], int64_t max_rows, ExportedChunk* out, int64_t next[2]) const = 0;
  // Change tracking (impl::NativeHashMap::ClearChanges): entries inserted or written since the last ClearChanges.
  virtual int64_t NumChanged() const = 0;
  // The changed entries as Export writes them (num_changed of them).
  virtual Status ExportChanged(int64_t* keys, float* rows, float* slots) const = 0;
  // The distinct keys removed since the last ClearChanges and not held now, ascending.
  virtual Status RemovedKeys(std::vector<int64_t>* removed) const = 0;
  virtual bool TrackingChanges() const = 0;
  virtual void ClearChanges() = 0;
  virtual Status AccessStatus(int64_t* keys, int64_t* counts, int64_t* last) const = 0;
  // Sets the access stats of n keys when every one is held (*missing = -1); otherwise changes nothing and sets
  // *missing to the position of the first key not held.
  virtual Status SetAccessStatus(const int64_t* keys, const int64_t* counts, const int64_t* last, int64_t n,
                                 int64_t* missing) = 0;
  // The tiers' counters: rows in DRAM, rows on disk, the most rows DRAM holds (-1: unbounded), bytes the DRAM
  // arrays take; then, since creation: keys of training calls found in DRAM, found on disk (read into DRAM), found in
  // neither (new keys), rows evicted to disk, bytes read from disk, bytes written to it, and the microseconds the
  // training calls spent evicting and reading from the store.
  virtual void TierStats(int64_t* out) const {
    std::fill(out, out + NativeTable::kTierStats, 0);
    out[0] = size();
    out[2] = -1;
    out[3] = MemoryUsed();
  }

 protected:
  // The error of a failed Reserve(wanted) of a table holding `held` keys in `bytes`, naming the table.
  Status ReserveError(TableStatus status, int64_t wanted, int64_t held, int64_t bytes) const {
    switch (status) {
      case TableStatus::kOk:
        return OkStatus();
      case TableStatus::kTooLarge:
        return errors::ResourceExhausted("native table '", config_.name, "': cannot hold ", wanted,
                                         " keys (it has ", held, "): the capacity would exceed 2^",
                                         impl::kMaxTableCapacityLog2, " slots");
      case TableStatus::kNoMemory:
        return errors::ResourceExhausted("native table '", config_.name, "': out of memory growing to hold ", wanted,
                                         " keys (it has ", held, " keys in ", bytes, " bytes)");
    }
    return OkStatus();
  }

  const NativeTableConfig& config_;
};

namespace {

template <typename Rows>
class TypedStore : public TableStore {
 public:
  // track_access: whether the map keeps access stats (the config's, or always for a tiered table's cache).
  TypedStore(const NativeTableConfig& config, bool track_access)
      : TableStore(config),
        dim_(config.dim),
        num_slots_(config.num_slots()),
        map_(config.dim, config.num_slots(), track_access),
        init_(config.MakeInitializer()) {}

  int64_t size() const override { return map_.size(); }
  int64_t MemoryUsed() const override { return map_.MemoryUsed(); }
  Status Prepare(const int64_t*, int64_t n, bool) override {
    return ReserveError(map_.Reserve(map_.size() + n), map_.size() + n, map_.size(), map_.MemoryUsed());
  }

  void LookupOrInsert(const int64_t* keys, const int32* categories, const int64_t* ids, int64_t n, int64_t clock,
                      float* rows) override {
    const bool track = map_.track_access();
    impl::PipelinedProbe(
        map_, keys, n,
        [&](int64_t i) {
          bool inserted;
          const int64_t index = map_.FindOrInsert(keys[i], &inserted);
          if (inserted) InitEntry(index, categories[i], ids[i]);
          return index;
        },
        [&](int64_t i, int64_t index) {
          LoadRow(index, rows + i * dim_);
          if (track) {
            impl::AccessStats& a = map_.access(index);
            ++a.count;
            a.last = clock;
          }
        });
  }

  Status LookupOrInitial(const int64_t* keys, const int32* categories, const int64_t* ids, int64_t n,
                         float* rows) const override {
    impl::PipelinedProbe(
        map_, keys, n, [&](int64_t i) { return map_.Find(keys[i]); },
        [&](int64_t i, int64_t index) {
          float* out = rows + i * dim_;
          if (index >= 0) {
            LoadRow(index, out);
          } else {  // the float32 initial row, unrounded: what the TFRA backend and the embedding servers give
            init_->Fill(ids[i], config_.salts[categories[i]], dim_, out);  // an id never trained (export, serving)
          }
        });
    return OkStatus();
  }

  void ApplySparse(const int64_t* keys, const float* grads, const int32* categories, const int64_t* ids, int64_t n,
                   const impl::OptimizerHyper& hyper, int64_t update_count) override {
    auto apply = [&](auto rule) {
      using Rule = decltype(rule);
      Apply<Rule>(keys, grads, categories, ids, n, hyper, update_count);
    };
    const bool momentum = config_.momentum > 0;
    switch (config_.optimizer_kind) {
      case TableOptimizer::kSgd:
        if (!momentum) return apply(impl::SgdRule());
        return config_.nesterov ? apply(impl::MomentumRule<true>()) : apply(impl::MomentumRule<false>());
      case TableOptimizer::kAdagrad:
        return apply(impl::AdagradRule());
      case TableOptimizer::kAdam:
        return apply(impl::AdamRule());
      case TableOptimizer::kAdamW:
        return apply(impl::AdamWRule());
      case TableOptimizer::kFtrl:
        return apply(impl::FtrlRule());
      case TableOptimizer::kRmsprop:
        if (momentum) {
          return config_.centered ? apply(impl::RmspropRule<true, true>()) : apply(impl::RmspropRule<true, false>());
        }
        return config_.centered ? apply(impl::RmspropRule<false, true>()) : apply(impl::RmspropRule<false, false>());
    }
  }

  Status Find(const int64_t* keys, int64_t n, int part, float* values, bool* exists) const override {
    impl::PipelinedProbe(
        map_, keys, n, [&](int64_t i) { return map_.Find(keys[i]); },
        [&](int64_t i, int64_t index) {
          float* out = values + i * dim_;
          exists[i] = index >= 0;
          if (index < 0) {
            std::fill(out, out + dim_, 0.0f);
          } else if (part == 0) {
            LoadRow(index, out);
          } else {
            std::memcpy(out, map_.slots(index) + (part - 1) * dim_, dim_ * sizeof(float));
          }
        });
    return OkStatus();
  }

  void Upsert(const int64_t* keys, const float* values, int64_t n, int part) override {
    impl::PipelinedProbe(
        map_, keys, n,
        [&](int64_t i) {
          bool inserted;
          const int64_t index = map_.FindOrInsert(keys[i], &inserted);
          if (inserted) {
            if (part != 0) std::fill(map_.row(index), map_.row(index) + dim_, Rows::Store(0.0f));
            InitSlots(index);
          }
          return index;
        },
        [&](int64_t i, int64_t index) {
          const float* in = values + i * dim_;
          map_.MarkChanged(index);
          if (part == 0) {
            typename Rows::Stored* row = map_.row(index);
            for (int64_t d = 0; d < dim_; ++d) row[d] = Rows::Store(in[d]);
          } else {
            std::memcpy(map_.slots(index) + (part - 1) * dim_, in, dim_ * sizeof(float));
          }
        });
  }

  Status Remove(const int64_t* keys, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) map_.Remove(keys[i]);
    return OkStatus();
  }

  Status Export(int64_t* keys, float* rows, float* slots) const override {
    int64_t j = 0;
    map_.ForEach([&](int64_t index) { ExportEntry(index, j++, keys, rows, slots); });
    return OkStatus();
  }

  // The DRAM entries from position cursor[1] of the slots' walk on (any other phase: none), then kExportDone. The
  // walk visits slot (i x an odd constant) mod capacity at position i (capacity is a power of two: a permutation), so
  // a chunk's keys are spread over the whole table rather than one range of slots. In slot order, a chunk's keys all
  // had their homes in one range of the table, and a restore that upserted such a chunk into a full tiered cache
  // (its evictions spread over the whole table) overloaded that range into long probe clusters: 38 us a key upserted
  // (a delta's first parts took 150 s to apply, the whole full checkpoint before them 41 s).
  Status ExportChunk(const int64_t cursor[2], int64_t max_rows, ExportedChunk* out, int64_t next[2]) const override {
    next[0] = kExportDone;
    next[1] = 0;
    if (cursor[0] != kDramEntries) return OkStatus();
    constexpr uint64_t kStride = 0x9E3779B97F4A7C15ull;  // odd
    const int64_t capacity = map_.capacity();
    const uint64_t mask = static_cast<uint64_t>(capacity) - 1;
    int64_t i = std::max<int64_t>(cursor[1], 0);
    for (; i < capacity && static_cast<int64_t>(out->keys.size()) < max_rows; ++i) {
      const int64_t slot = static_cast<int64_t>((static_cast<uint64_t>(i) * kStride) & mask);
      if (map_.occupied(slot)) AppendEntry(slot, out);
    }
    if (i < capacity) {
      next[0] = kDramEntries;
      next[1] = i;
    }
    return OkStatus();
  }

  int64_t NumChanged() const override { return map_.num_changed(); }

  Status ExportChanged(int64_t* keys, float* rows, float* slots) const override {
    int64_t j = 0;
    map_.ForEachChanged([&](int64_t index) { ExportEntry(index, j++, keys, rows, slots); });
    return OkStatus();
  }

  Status RemovedKeys(std::vector<int64_t>* removed) const override {
    *removed = map_.removed();
    SortedNotHeld(removed);
    return OkStatus();
  }

  bool TrackingChanges() const override { return map_.tracking_changes(); }
  void ClearChanges() override { map_.ClearChanges(); }

  Status AccessStatus(int64_t* keys, int64_t* counts, int64_t* last) const override {
    int64_t j = 0;
    map_.ForEach([&](int64_t index) {
      keys[j] = map_.key(index);
      counts[j] = map_.access(index).count;
      last[j] = map_.access(index).last;
      ++j;
    });
    return OkStatus();
  }

  Status SetAccessStatus(const int64_t* keys, const int64_t* counts, const int64_t* last, int64_t n,
                         int64_t* missing) override {
    std::vector<int64_t> at(n);  // entry indices stay valid: nothing is inserted or removed in between
    *missing = -1;
    for (int64_t i = 0; i < n; ++i) {
      at[i] = map_.Find(keys[i]);
      if (at[i] < 0) {
        *missing = i;
        return OkStatus();
      }
    }
    for (int64_t i = 0; i < n; ++i) map_.access(at[i]) = impl::AccessStats{counts[i], last[i]};
    return OkStatus();
  }

 protected:
  // Sorts the keys, drops repeats and the keys held in DRAM.
  void SortedNotHeld(std::vector<int64_t>* keys) const {
    std::sort(keys->begin(), keys->end());
    keys->erase(std::unique(keys->begin(), keys->end()), keys->end());
    keys->erase(std::remove_if(keys->begin(), keys->end(), [&](int64_t k) { return map_.Find(k) >= 0; }),
                keys->end());
  }

  // Entry `index` as the j-th of an export: its key, its row as float32 and its slots.
  void ExportEntry(int64_t index, int64_t j, int64_t* keys, float* rows, float* slots) const {
    const int64_t slot_stride = num_slots_ * dim_;
    keys[j] = map_.key(index);
    LoadRow(index, rows + j * dim_);
    if (slot_stride > 0) std::memcpy(slots + j * slot_stride, map_.slots(index), slot_stride * sizeof(float));
  }

  // Room for one more entry's key, row and slots in a chunk (its counts and lasts are pushed by the caller); -> the
  // entry's position, where ExportEntry / ExportDiskEntry write it. Call it before taking the arrays' data(): it may
  // reallocate them.
  int64_t AddToChunk(ExportedChunk* out) const {
    const int64_t j = static_cast<int64_t>(out->keys.size());
    out->keys.resize(j + 1);
    out->rows.resize((j + 1) * dim_);
    out->slots.resize((j + 1) * num_slots_ * dim_);
    return j;
  }

  // Entry `index` appended to a chunk, with its access stats where the map keeps them.
  void AppendEntry(int64_t index, ExportedChunk* out) const {
    const int64_t j = AddToChunk(out);
    ExportEntry(index, j, out->keys.data(), out->rows.data(), out->slots.data());
    const bool tracked = map_.track_access();
    out->counts.push_back(tracked ? map_.access(index).count : 0);
    out->lasts.push_back(tracked ? map_.access(index).last : 0);
  }

  void LoadRow(int64_t index, float* out) const {
    const typename Rows::Stored* row = map_.row(index);
    for (int64_t d = 0; d < dim_; ++d) out[d] = Rows::Load(row[d]);
  }

  void InitSlots(int64_t index) {
    float* slots = map_.slots(index);
    for (int s = 0; s < num_slots_; ++s) std::fill(slots + s * dim_, slots + (s + 1) * dim_, config_.slot_init[s]);
  }

  // Initial row and slots of a key just inserted.
  void InitEntry(int64_t index, int32 category, int64_t id) {
    typename Rows::Stored* row = map_.row(index);
    if constexpr (Rows::kInPlace) {
      init_->Fill(id, config_.salts[category], dim_, row);
    } else {
      float* scratch = Scratch();
      init_->Fill(id, config_.salts[category], dim_, scratch);
      for (int64_t d = 0; d < dim_; ++d) row[d] = Rows::Store(scratch[d]);
    }
    InitSlots(index);
  }

  // The updated float32 row w of `key` into its float16 row, rounded the table's way.
  void StoreUpdated(int64_t key, int64_t update_count, const float* w, typename Rows::Stored* row) const {
    if (config_.rounding_kind == RowRounding::kStochastic) {
      const uint64_t stream = impl::Float16RoundingStream(config_.salts[0], key, update_count);
      for (int64_t d = 0; d < dim_; ++d) {
        uint32_t bits;
        std::memcpy(&bits, &w[d], sizeof(bits));
        row[d] = impl::StochasticFloat16Bits(bits, impl::Float16RoundingBits(stream, d));
      }
    } else {
      for (int64_t d = 0; d < dim_; ++d) row[d] = Rows::Store(w[d]);
    }
  }

  template <typename Rule>
  void Apply(const int64_t* keys, const float* grads, const int32* categories, const int64_t* ids, int64_t n,
             const impl::OptimizerHyper& hyper, int64_t update_count) {
    float* scratch = Scratch();
    impl::PipelinedProbe(
        map_, keys, n,
        [&](int64_t i) {
          bool inserted;
          const int64_t index = map_.FindOrInsert(keys[i], &inserted);
          if (inserted) InitEntry(index, categories[i], ids[i]);
          return index;
        },
        [&](int64_t i, int64_t index) {
          const float* g = grads + i * dim_;
          typename Rows::Stored* row = map_.row(index);
          map_.MarkChanged(index);
          if constexpr (Rows::kInPlace) {
            Rule::Apply(hyper, g, dim_, row, map_.slots(index));
          } else {
            float* w = scratch + dim_;  // the first dim_ floats belong to InitEntry
            for (int64_t d = 0; d < dim_; ++d) w[d] = Rows::Load(row[d]);
            Rule::Apply(hyper, g, dim_, w, map_.slots(index));
            StoreUpdated(keys[i], update_count, w, row);
          }
        });
  }

  // 2 * dim floats for float16 rows in float32 (callers hold the table's lock exclusively).
  float* Scratch() {
    scratch_.resize(2 * dim_);
    return scratch_.data();
  }

  const int64_t dim_;
  const int num_slots_;
  impl::NativeHashMap<typename Rows::Stored> map_;
  const std::unique_ptr<impl::RowInitializer> init_;
  std::vector<float> scratch_;
};

// A tiered table (config.tier_path): the hash map above as a cache of at most config.tier_dram_bytes, sized once
// (no growth), over a RocksDB store on disk (impl::DiskStore) holding the other keys, each in exactly one tier. Every
// call that may insert or update (Prepare) first brings the call's keys held on disk into DRAM in one batched read,
// after evicting, when the cache would overflow, the least frequently used eighth of the cache not used by the call,
// written back in one batch. The update itself is the all-DRAM table's, in place, so a tiered table trains bit for bit
// as an all-DRAM one. Reads that change nothing (inference lookups, Find, exports) read the disk tier in place.
// Change marks follow an evicted key (cold_changed_, kept while changes are tracked), and so do removals of keys on
// disk (cold_removed_). An entry on disk: its access stats, its stored row, its slots.
template <typename Rows>
class TieredStore : public TypedStore<Rows> {
  using Base = TypedStore<Rows>;
  using Stored = typename Rows::Stored;
  using Base::config_;
  using Base::dim_;
  using Base::init_;
  using Base::map_;
  using Base::num_slots_;
  static constexpr int64_t kPinned = std::numeric_limits<int64_t>::max();

 public:
  explicit TieredStore(const NativeTableConfig& config) : Base(config, /*track_access=*/true) {}

  // Sizes the cache and opens the store; an error names the table.
  Status Open() {
    auto error = [&](auto... args) { return errors::FailedPrecondition("native table '", config_.name, "': ", args...); };
    int log2 = impl::kMinTableCapacityLog2;
    const auto fits = [&](int l) {
      const size_t bytes = map_.BytesFor(int64_t{1} << l);
      return bytes != 0 && bytes <= static_cast<size_t>(config_.tier_dram_bytes);
    };
    if (!fits(log2)) {
      return error("tier dram_bytes ", config_.tier_dram_bytes, " holds no rows: the DRAM cache needs at least ",
                   map_.BytesFor(int64_t{1} << log2), " bytes");
    }
    while (log2 < impl::kMaxTableCapacityLog2 && fits(log2 + 1)) ++log2;
    max_cached_ = impl::NativeHashMap<Stored>::MaxLoad(int64_t{1} << log2);
    // Allocated once: the cache never grows, so it never holds two copies of its arrays.
    TF_RETURN_IF_ERROR(this->ReserveError(map_.Reserve(max_cached_), max_cached_, 0, 0));
    const std::string identity =
        strings::StrCat("table=", config_.name, " dim=", dim_, " optimizer=", config_.optimizer, " slots=", num_slots_,
                        " storage=", config_.storage);
    const std::string message = impl::DiskStore::Open(config_.tier_path, identity, &disk_);
    if (!message.empty()) return error(message);
    return OkStatus();
  }

  int64_t size() const override { return map_.size() + disk_rows_; }
  // The DRAM arrays, and the keys of the change marks that followed rows to disk.
  int64_t MemoryUsed() const override {
    return map_.MemoryUsed() + static_cast<int64_t>(cold_changed_.size() * 32 + cold_removed_.capacity() * 8);
  }

  Status Prepare(const int64_t* keys, int64_t n, bool lookup) override {
    std::vector<int64_t> cold;  // the call's keys not in DRAM, each once
    int64_t hits = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (map_.Find(keys[i]) < 0) {
        cold.push_back(keys[i]);
      } else {
        ++hits;
      }
    }
    std::sort(cold.begin(), cold.end());
    cold.erase(std::unique(cold.begin(), cold.end()), cold.end());
    const int64_t cold_n = static_cast<int64_t>(cold.size());
    const int64_t t0 = NowMicros();
    if (map_.size() + cold_n > max_cached_) {
      TF_RETURN_IF_ERROR(Evict(keys, n, map_.size() + cold_n - max_cached_, cold_n));
    }
    const int64_t t1 = NowMicros();
    int64_t moved = 0;
    TF_RETURN_IF_ERROR(FaultIn(cold, &moved));
    evict_micros_ += t1 - t0;
    read_micros_ += NowMicros() - t1;
    if (lookup) {
      hits_ += hits;
      disk_hits_ += moved;
      new_keys_ += cold_n - moved;
    }
    return OkStatus();
  }

  Status LookupOrInitial(const int64_t* keys, const int32* categories, const int64_t* ids, int64_t n,
                         float* rows) const override {
    return ReadThrough(keys, n, [&](int64_t i, const char* entry) {
      float* out = rows + i * dim_;
      if (entry != nullptr) {
        DecodeRow(entry, out);
      } else {
        init_->Fill(ids[i], config_.salts[categories[i]], dim_, out);
      }
    });
  }

  Status Find(const int64_t* keys, int64_t n, int part, float* values, bool* exists) const override {
    return ReadThrough(keys, n, [&](int64_t i, const char* entry) {
      float* out = values + i * dim_;
      exists[i] = entry != nullptr;
      if (entry == nullptr) {
        std::fill(out, out + dim_, 0.0f);
      } else if (part == 0) {
        DecodeRow(entry, out);
      } else {
        std::memcpy(out, entry + SlotsOffset() + (part - 1) * dim_ * sizeof(float), dim_ * sizeof(float));
      }
    });
  }

  Status Remove(const int64_t* keys, int64_t n) override {
    std::vector<int64_t> cold, stale;  // keys not in DRAM; keys in DRAM whose old copy is in the store
    for (int64_t i = 0; i < n; ++i) {
      const int64_t index = map_.Find(keys[i]);
      if (index < 0) {
        cold.push_back(keys[i]);
        continue;
      }
      if (map_.aux(index)) stale.push_back(keys[i]);
      map_.Remove(keys[i]);
    }
    std::sort(cold.begin(), cold.end());
    cold.erase(std::unique(cold.begin(), cold.end()), cold.end());
    std::vector<int64_t> held;
    TF_RETURN_IF_ERROR(Check(disk_->MultiGet(cold.data(), cold.size(), [&](int64_t i, const char*, size_t) {
      held.push_back(cold[i]);
      return std::string();
    })));
    if (held.empty() && stale.empty()) return OkStatus();
    impl::DiskStore::Batch batch(*disk_);
    for (int64_t k : held) batch.Delete(k);
    for (int64_t k : stale) batch.Delete(k);
    TF_RETURN_IF_ERROR(Check(batch.Commit()));
    disk_rows_ -= static_cast<int64_t>(held.size());
    for (int64_t k : held) {
      cold_changed_.erase(k);
      if (map_.tracking_changes()) cold_removed_.push_back(k);
    }
    return OkStatus();
  }

  Status Export(int64_t* keys, float* rows, float* slots) const override {
    TF_RETURN_IF_ERROR(Base::Export(keys, rows, slots));
    return ForEachStored([&](int64_t j, int64_t key, const char* entry) {
      ExportDiskEntry(key, entry, map_.size() + j, keys, rows, slots);
    });
  }

  // The DRAM entries, then the rows held only in the store (an old copy of a row now in DRAM is skipped), in the
  // store's key order from the key after cursor[1].
  Status ExportChunk(const int64_t cursor[2], int64_t max_rows, ExportedChunk* out, int64_t next[2]) const override {
    if (cursor[0] == kDramEntries) {
      TF_RETURN_IF_ERROR(Base::ExportChunk(cursor, max_rows, out, next));
      if (next[0] == kExportDone) next[0] = kStoreFirst;  // the store comes after DRAM
      return OkStatus();
    }
    next[0] = kExportDone;
    next[1] = 0;
    if (cursor[0] != kStoreFirst && cursor[0] != kStoreAfter) return OkStatus();
    bool full = static_cast<int64_t>(out->keys.size()) >= max_rows;
    TF_RETURN_IF_ERROR(Check(disk_->ForEachAfter(
        cursor[0] == kStoreAfter ? &cursor[1] : nullptr,
        [&](int64_t key, const char* entry, size_t length) {
          std::string e = CheckEntry(key, length);
          if (!e.empty() || map_.Find(key) >= 0) return e;
          const int64_t j = this->AddToChunk(out);  // before taking the arrays' pointers: it may reallocate them
          ExportDiskEntry(key, entry, j, out->keys.data(), out->rows.data(), out->slots.data());
          impl::AccessStats a;
          std::memcpy(&a, entry, sizeof(a));
          out->counts.push_back(a.count);
          out->lasts.push_back(a.last);
          if (static_cast<int64_t>(out->keys.size()) >= max_rows) {
            full = true;
            next[0] = kStoreAfter;
            next[1] = key;
          }
          return std::string();
        },
        &full)));
    return OkStatus();
  }

  int64_t NumChanged() const override { return map_.num_changed() + static_cast<int64_t>(cold_changed_.size()); }

  Status ExportChanged(int64_t* keys, float* rows, float* slots) const override {
    TF_RETURN_IF_ERROR(Base::ExportChanged(keys, rows, slots));
    std::vector<int64_t> cold(cold_changed_.begin(), cold_changed_.end());
    std::sort(cold.begin(), cold.end());
    const int64_t start = map_.num_changed();
    int64_t found = 0;
    TF_RETURN_IF_ERROR(Check(disk_->MultiGet(cold.data(), cold.size(), [&](int64_t i, const char* entry, size_t n) {
      std::string e = CheckEntry(cold[i], n);
      if (!e.empty()) return e;
      ExportDiskEntry(cold[i], entry, start + found++, keys, rows, slots);
      return std::string();
    })));
    if (found != static_cast<int64_t>(cold.size())) {
      return Check(strings::StrCat("the store ", disk_->path(), " lost ", cold.size() - found, " changed rows"));
    }
    return OkStatus();
  }

  Status RemovedKeys(std::vector<int64_t>* removed) const override {
    *removed = map_.removed();
    removed->insert(removed->end(), cold_removed_.begin(), cold_removed_.end());
    this->SortedNotHeld(removed);
    std::vector<char> held(removed->size(), 0);
    TF_RETURN_IF_ERROR(Check(disk_->MultiGet(removed->data(), removed->size(), [&](int64_t i, const char*, size_t) {
      held[i] = 1;
      return std::string();
    })));
    int64_t j = 0;
    for (size_t i = 0; i < removed->size(); ++i) {
      if (!held[i]) (*removed)[j++] = (*removed)[i];
    }
    removed->resize(j);
    return OkStatus();
  }

  void ClearChanges() override {
    Base::ClearChanges();
    cold_changed_.clear();
    cold_removed_.clear();
    cold_removed_.shrink_to_fit();
  }

  Status AccessStatus(int64_t* keys, int64_t* counts, int64_t* last) const override {
    TF_RETURN_IF_ERROR(Base::AccessStatus(keys, counts, last));
    return ForEachStored([&](int64_t j, int64_t key, const char* entry) {
      impl::AccessStats a;
      std::memcpy(&a, entry, sizeof(a));
      keys[map_.size() + j] = key;
      counts[map_.size() + j] = a.count;
      last[map_.size() + j] = a.last;
    });
  }

  Status SetAccessStatus(const int64_t* keys, const int64_t* counts, const int64_t* last, int64_t n,
                         int64_t* missing) override {
    std::vector<int64_t> cold_at;  // positions of the keys not in DRAM
    for (int64_t i = 0; i < n; ++i) {
      if (map_.Find(keys[i]) < 0) cold_at.push_back(i);
    }
    std::vector<int64_t> cold(cold_at.size());
    for (size_t c = 0; c < cold_at.size(); ++c) cold[c] = keys[cold_at[c]];
    std::vector<std::string> entries(cold.size());
    TF_RETURN_IF_ERROR(Check(disk_->MultiGet(cold.data(), cold.size(), [&](int64_t c, const char* entry, size_t len) {
      std::string e = CheckEntry(cold[c], len);
      if (e.empty()) entries[c].assign(entry, len);
      return e;
    })));
    *missing = -1;
    for (size_t c = 0; c < cold.size(); ++c) {
      if (entries[c].empty()) {
        *missing = cold_at[c];
        return OkStatus();
      }
    }
    impl::DiskStore::Batch batch(*disk_);
    for (size_t c = 0; c < cold.size(); ++c) {  // a repeated key takes its last entry, as in DRAM
      const int64_t i = cold_at[c];
      const impl::AccessStats a{counts[i], last[i]};
      std::memcpy(&entries[c][0], &a, sizeof(a));
    }
    for (size_t c = 0; c < cold.size(); ++c) batch.Put(cold[c], entries[c].data(), entries[c].size());
    TF_RETURN_IF_ERROR(Check(batch.Commit()));
    bytes_written_ += batch.bytes();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t index = map_.Find(keys[i]);
      if (index >= 0) map_.access(index) = impl::AccessStats{counts[i], last[i]};
    }
    return OkStatus();
  }

  void TierStats(int64_t* out) const override {
    out[0] = map_.size();
    out[1] = disk_rows_;
    out[2] = max_cached_;
    out[3] = map_.MemoryUsed();
    out[4] = hits_;
    out[5] = disk_hits_;
    out[6] = new_keys_;
    out[7] = evicted_;
    out[8] = bytes_read_;
    out[9] = bytes_written_;
    out[10] = evict_micros_;
    out[11] = read_micros_;
  }

 private:
  size_t RowBytes() const { return dim_ * sizeof(Stored); }
  size_t SlotsOffset() const { return sizeof(impl::AccessStats) + RowBytes(); }
  size_t EntryBytes() const { return SlotsOffset() + num_slots_ * dim_ * sizeof(float); }

  Status Check(const std::string& message) const {
    if (message.empty()) return OkStatus();
    return errors::DataLoss("native table '", config_.name, "': ", message);
  }

  std::string CheckEntry(int64_t key, size_t length) const {
    if (length == EntryBytes()) return "";
    return strings::StrCat("the store ", disk_->path(), " holds ", length, " bytes for key ", key, ", this table's ",
                           "entries have ", EntryBytes(), ": a store of another table, or corrupted");
  }

  void EncodeEntry(int64_t index, char* out) const {
    std::memcpy(out, &map_.access(index), sizeof(impl::AccessStats));
    std::memcpy(out + sizeof(impl::AccessStats), map_.row(index), RowBytes());
    if (num_slots_ > 0) std::memcpy(out + SlotsOffset(), map_.slots(index), num_slots_ * dim_ * sizeof(float));
  }

  void DecodeEntry(const char* in, int64_t index) {
    std::memcpy(&map_.access(index), in, sizeof(impl::AccessStats));
    std::memcpy(map_.row(index), in + sizeof(impl::AccessStats), RowBytes());
    if (num_slots_ > 0) std::memcpy(map_.slots(index), in + SlotsOffset(), num_slots_ * dim_ * sizeof(float));
  }

  void DecodeRow(const char* entry, float* out) const {
    for (int64_t d = 0; d < dim_; ++d) {
      Stored v;
      std::memcpy(&v, entry + sizeof(impl::AccessStats) + d * sizeof(Stored), sizeof(Stored));
      out[d] = Rows::Load(v);
    }
  }

  void ExportDiskEntry(int64_t key, const char* entry, int64_t j, int64_t* keys, float* rows, float* slots) const {
    keys[j] = key;
    DecodeRow(entry, rows + j * dim_);
    const int64_t stride = num_slots_ * dim_;
    if (stride > 0) std::memcpy(slots + j * stride, entry + SlotsOffset(), stride * sizeof(float));
  }

  // visit(j, key, entry) for the j-th of the disk_rows_ keys whose only copy is in the store (an old copy of a row now
  // in DRAM is skipped), in the store's order; an error when the store holds another count of them.
  template <typename Visit>
  Status ForEachStored(Visit visit) const {
    int64_t j = 0;
    TF_RETURN_IF_ERROR(Check(disk_->ForEach([&](int64_t key, const char* entry, size_t length) {
      std::string e = CheckEntry(key, length);
      if (!e.empty() || map_.Find(key) >= 0) return e;
      if (j >= disk_rows_) return strings::StrCat("the store ", disk_->path(), " holds more rows than the table "
                                                  "counts (", disk_rows_, "): corrupted or shared");
      visit(j++, key, entry);
      return std::string();
    })));
    if (j != disk_rows_) {
      return Check(strings::StrCat("the store ", disk_->path(), " holds ", j, " rows, the table counts ", disk_rows_,
                                   ": corrupted"));
    }
    return OkStatus();
  }

  // visit(i, entry) for each key: its entry's bytes (from DRAM, encoded, or from disk), or null when not held.
  template <typename Visit>
  Status ReadThrough(const int64_t* keys, int64_t n, Visit visit) const {
    std::vector<char> buffer(EntryBytes());
    std::vector<int64_t> cold_at, cold;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t index = map_.Find(keys[i]);
      if (index >= 0) {
        EncodeEntry(index, buffer.data());
        visit(i, buffer.data());
      } else {
        cold_at.push_back(i);
        cold.push_back(keys[i]);
      }
    }
    std::vector<char> found(cold.size(), 0);
    TF_RETURN_IF_ERROR(Check(disk_->MultiGet(cold.data(), cold.size(), [&](int64_t c, const char* entry, size_t len) {
      std::string e = CheckEntry(cold[c], len);
      if (!e.empty()) return e;
      found[c] = 1;
      visit(cold_at[c], entry);
      return std::string();
    })));
    for (size_t c = 0; c < cold.size(); ++c) {
      if (!found[c]) visit(cold_at[c], nullptr);
    }
    return OkStatus();
  }

  // Makes room for `needed` more keys: writes the least frequently used cached entries not among the call's keys (at
  // least `needed`, an eighth of the cache when there are that many, so evictions come in batches) to disk in one
  // batch, then drops them from DRAM.
  // cold_n: the call's keys about to come into DRAM (for the error when they cannot).
  Status Evict(const int64_t* keys, int64_t n, int64_t needed, int64_t cold_n) {
    std::vector<std::pair<int64_t, int64_t>> pinned;  // (key, its last) for the call's keys in DRAM
    for (int64_t i = 0; i < n; ++i) {
      const int64_t index = map_.Find(keys[i]);
      if (index >= 0 && map_.access(index).last != kPinned) {
        pinned.emplace_back(keys[i], map_.access(index).last);
        map_.access(index).last = kPinned;
      }
    }
    auto unpin = [&] {
      for (const auto& p : pinned) map_.access(map_.Find(p.first)).last = p.second;
    };
    const int64_t unpinned = map_.size() - static_cast<int64_t>(pinned.size());
    if (needed > unpinned) {
      unpin();
      return errors::ResourceExhausted(
          "native table '", config_.name, "': one call needs ", static_cast<int64_t>(pinned.size()) + cold_n,
          " keys in DRAM, but tier dram_bytes ", config_.tier_dram_bytes, " holds at most ", max_cached_,
          " rows: raise dram_bytes (or make the batch smaller)");
    }
    const int64_t count = std::min(unpinned, std::max(needed, max_cached_ / 8));
    // Least frequently read first (training lookups so far), the least recently read among equals: under Zipf traffic
    // the most read rows stay. A candidate: (count, last, key) and its entry (valid until the first removal below).
    struct Candidate {
      int64_t count, last, key, index;
      bool operator<(const Candidate& o) const {
        return count != o.count ? count < o.count : last != o.last ? last < o.last : key < o.key;
      }
    };
    std::vector<Candidate> lru;
    lru.reserve(unpinned);
    map_.ForEach([&](int64_t index) {
      const impl::AccessStats& a = map_.access(index);
      if (a.last != kPinned) lru.push_back({a.count, a.last, map_.key(index), index});
    });
    std::nth_element(lru.begin(), lru.begin() + (count - 1), lru.end());
    lru.resize(count);
    // In the store's key order: RocksDB's write buffer (a skip list) inserts a sorted batch far faster than a random
    // one (perf: random-order inserts were 12% of a tiered step).
    std::sort(lru.begin(), lru.end(), [](const Candidate& a, const Candidate& b) {
      return static_cast<uint64_t>(a.key) < static_cast<uint64_t>(b.key);
    });
    impl::DiskStore::Batch batch(*disk_);
    std::vector<char> buffer(EntryBytes());
    const bool tracking = map_.tracking_changes();
    std::vector<int64_t> changed;  // victims marked changed: their marks follow them to disk
    for (const auto& v : lru) {
      EncodeEntry(v.index, buffer.data());
      batch.Put(v.key, buffer.data(), buffer.size());
      if (tracking && map_.changed(v.index)) changed.push_back(v.key);
    }
    const std::string message = batch.Commit();
    if (!message.empty()) {
      unpin();
      return Check(message);  // nothing was dropped from DRAM
    }
    cold_changed_.insert(changed.begin(), changed.end());
    for (const auto& v : lru) map_.Remove(v.key, /*log=*/false);
    unpin();
    disk_rows_ += count;
    evicted_ += count;
    bytes_written_ += batch.bytes();
    return OkStatus();
  }

  // Brings the keys (distinct, none in DRAM) held on disk into DRAM, with their change marks; each keeps its copy in
  // the store (marked by the map's aux bit), which its eviction overwrites and its removal deletes.
  Status FaultIn(const std::vector<int64_t>& cold, int64_t* moved_count) {
    std::vector<int64_t> moved;
    TF_RETURN_IF_ERROR(Check(disk_->MultiGet(cold.data(), cold.size(), [&](int64_t c, const char* entry, size_t len) {
      std::string e = CheckEntry(cold[c], len);
      if (!e.empty()) return e;
      bool inserted;
      const int64_t index = map_.FindOrInsert(cold[c], &inserted);
      DecodeEntry(entry, index);
      map_.SetAux(index, true);  // its copy stays in the store until eviction overwrites it
      if (cold_changed_.erase(cold[c]) > 0) {
        map_.MarkChanged(index);
      } else {
        map_.ClearChanged(index);
      }
      moved.push_back(cold[c]);
      return std::string();
    })));
    const int64_t m = static_cast<int64_t>(moved.size());
    *moved_count = m;
    bytes_read_ += m * static_cast<int64_t>(8 + EntryBytes());
    // Not deleted from the store: the eviction that takes the row out of DRAM again overwrites the copy (deleting it
    // here cost a tombstone per row read, which the store's compactions then carried: 2x the writes).
    disk_rows_ -= m;
    return OkStatus();
  }

  std::unique_ptr<impl::DiskStore> disk_;
  int64_t max_cached_ = 0;
  int64_t disk_rows_ = 0;  // keys whose only copy is in the store (a key in DRAM may keep an older copy there)
  std::unordered_set<int64_t> cold_changed_;  // keys on disk marked changed (while changes are tracked)
  std::vector<int64_t> cold_removed_;         // keys removed from disk since the last ClearChanges
  // Counters (TierStats).
  int64_t hits_ = 0, disk_hits_ = 0, new_keys_ = 0, evicted_ = 0, bytes_read_ = 0;
  int64_t bytes_written_ = 0;
  int64_t evict_micros_ = 0, read_micros_ = 0;  // in Prepare (training calls)
  static int64_t NowMicros() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// NativeTable
// ---------------------------------------------------------------------------------------------------------------

NativeTable::NativeTable(const NativeTableConfig& config) : config_(config) {}

Status NativeTable::Open() {
  mutex_lock lock(mu_);
  const bool f16 = config_.storage_kind == RowStorage::kFloat16;
  if (config_.tiered()) {
    if (f16) {
      auto store = std::make_unique<TieredStore<Float16Rows>>(config_);
      TF_RETURN_IF_ERROR(store->Open());
      store_ = std::move(store);
    } else {
      auto store = std::make_unique<TieredStore<Float32Rows>>(config_);
      TF_RETURN_IF_ERROR(store->Open());
      store_ = std::move(store);
    }
  } else if (f16) {
    store_ = std::make_unique<TypedStore<Float16Rows>>(config_, config_.track_access);
  } else {
    store_ = std::make_unique<TypedStore<Float32Rows>>(config_, config_.track_access);
  }
  return OkStatus();
}

NativeTable::~NativeTable() = default;

std::string NativeTable::DebugString() const { return strings::StrCat("NativeTable(", config_.DebugString(), ")"); }

int64_t NativeTable::MemoryUsed() const {
  tf_shared_lock lock(mu_);
  return store_->MemoryUsed();
}

Status NativeTable::CheckCategories(const Tensor& categories) const {
  const auto c = categories.flat<int32>();
  const int64_t num = static_cast<int64_t>(config_.salts.size());
  for (int64_t i = 0; i < c.size(); ++i) {
    if (c(i) < 0 || c(i) >= num) {
      return Error("category must be in [0, ", num, ") (one per salt), got category ", c(i), " at position ", i);
    }
  }
  return OkStatus();
}

Status NativeTable::CheckPart(int part) const {
  if (part < 0 || part > config_.num_slots()) {
    return Error("part must be 0 (rows) or a slot 1..", config_.num_slots(), " of optimizer ", config_.optimizer,
                 ", got ", part);
  }
  return OkStatus();
}

Status NativeTable::LookupOrInit(const Tensor& keys, const Tensor& categories, const Tensor& ids, bool insert,
                                 Tensor* rows) {
  TF_RETURN_IF_ERROR(CheckCategories(categories));
  const int64_t n = keys.NumElements();
  const int64_t* k = keys.flat<int64_t>().data();
  const int32* c = categories.flat<int32>().data();
  const int64_t* i = ids.flat<int64_t>().data();
  float* out = rows->flat<float>().data();
  if (!insert) {
    tf_shared_lock lock(mu_);
    return store_->LookupOrInitial(k, c, i, n, out);
  }
  mutex_lock lock(mu_);
  TF_RETURN_IF_ERROR(store_->Prepare(k, n, /*lookup=*/true));
  store_->LookupOrInsert(k, c, i, n, ++clock_, out);
  return OkStatus();
}

Status NativeTable::ApplySparse(const Tensor& keys, const Tensor& grads, const Tensor& categories, const Tensor& ids,
                                float lr, float adam_lr, int64_t update_count, bool distinct_keys) {
  TF_RETURN_IF_ERROR(CheckCategories(categories));
  const int64_t n = keys.NumElements();
  const int64_t dim = config_.dim;
  const int64_t* k = keys.flat<int64_t>().data();
  const float* g = grads.flat<float>().data();
  const int32* c = categories.flat<int32>().data();
  const int64_t* i = ids.flat<int64_t>().data();

  // Repeated keys: their grads are summed (in input order) and the key updated once, TF's sparse-apply semantics
  // after deduplication. The usual input (the keys of a lookup) is already unique and goes through untouched; with
  // distinct_keys the caller vouches for that, and the hash pass that would find it out is skipped.
  int64_t u = n;
  std::vector<int64_t> unique_keys, unique_ids;
  std::vector<int32> unique_categories;
  std::vector<float> summed;
  if (!distinct_keys) {
    impl::PairSet<int64_t> unique;
    std::vector<int32_t> inverse(n);
    {
      impl::PairTable<int64_t> dedup(n);
      unique.entries.reserve(n);
      for (int64_t j = 0; j < n; ++j) inverse[j] = dedup.FindOrInsert(k[j], 0, &unique);
    }
    u = unique.size();
    if (u < n) {
      unique_keys.resize(u);
      unique_ids.resize(u);
      unique_categories.resize(u);
      summed.assign(u * dim, 0.0f);
      int64_t next = 0;
      for (int64_t j = 0; j < n; ++j) {
        const int32_t id = inverse[j];
        if (id == next) {  // first occurrence: unique ids come in first-occurrence order
          unique_keys[id] = k[j];
          unique_ids[id] = i[j];
          unique_categories[id] = c[j];
          ++next;
        }
        float* sum = summed.data() + id * dim;
        const float* gj = g + j * dim;
        for (int64_t d = 0; d < dim; ++d) sum[d] += gj[d];
      }
      k = unique_keys.data();
      i = unique_ids.data();
      c = unique_categories.data();
      g = summed.data();
    }
  }

  impl::OptimizerHyper hyper = config_.hyper;
  hyper.lr = lr;
  hyper.adam_lr = adam_lr;
  mutex_lock lock(mu_);
  TF_RETURN_IF_ERROR(store_->Prepare(k, u, /*lookup=*/false));
  store_->ApplySparse(k, g, c, i, u, hyper, update_count);
  return OkStatus();
}

Status NativeTable::Find(const Tensor& keys, int part, Tensor* values, Tensor* exists) {
  TF_RETURN_IF_ERROR(CheckPart(part));
  tf_shared_lock lock(mu_);
  return store_->Find(keys.flat<int64_t>().data(), keys.NumElements(), part, values->flat<float>().data(),
                      exists->flat<bool>().data());
}

Status NativeTable::Upsert(const Tensor& keys, const Tensor& values, int part) {
  TF_RETURN_IF_ERROR(CheckPart(part));
  const int64_t n = keys.NumElements();
  mutex_lock lock(mu_);
  TF_RETURN_IF_ERROR(store_->Prepare(keys.flat<int64_t>().data(), n, /*lookup=*/false));
  store_->Upsert(keys.flat<int64_t>().data(), values.flat<float>().data(), n, part);
  return OkStatus();
}

Status NativeTable::Remove(const Tensor& keys) {
  mutex_lock lock(mu_);
  return store_->Remove(keys.flat<int64_t>().data(), keys.NumElements());
}

void NativeTable::TierStats(int64_t* out) const {
  tf_shared_lock lock(mu_);
  store_->TierStats(out);
}

int64_t NativeTable::Size() const {
  tf_shared_lock lock(mu_);
  return store_->size();
}

Status NativeTable::Export(const AllocateOutputs& allocate) const {
  tf_shared_lock lock(mu_);
  std::vector<Tensor*> out;
  TF_RETURN_IF_ERROR(allocate(store_->size(), &out));
  return store_->Export(out[0]->flat<int64_t>().data(), out[1]->flat<float>().data(), out[2]->flat<float>().data());
}

Status NativeTable::ExportChunk(const int64_t cursor[2], int64_t max_rows, ExportedChunk* out, int64_t next[2]) const {
  if (cursor[0] < kDramEntries || cursor[0] > kExportDone) {
    return Error("an export chunk's cursor has the phase ", cursor[0], " (0 to 3: from an export chunk's next)");
  }
  if (max_rows < 1) return Error("an export chunk needs max_rows >= 1, got ", max_rows);
  tf_shared_lock lock(mu_);
  out->clock = clock_;
  return store_->ExportChunk(cursor, max_rows, out, next);
}

Status NativeTable::Changes(const AllocateOutputs& allocate_changed, const AllocateOutputs& allocate_removed) const {
  tf_shared_lock lock(mu_);
  if (!store_->TrackingChanges()) {
    return errors::FailedPrecondition("native table '", config_.name, "': no changes are tracked yet: clear them "
                                      "once (native_table_clear_changes) after reading the whole table");
  }
  std::vector<Tensor*> out;
  TF_RETURN_IF_ERROR(allocate_changed(store_->NumChanged(), &out));
  TF_RETURN_IF_ERROR(store_->ExportChanged(out[0]->flat<int64_t>().data(), out[1]->flat<float>().data(),
                                           out[2]->flat<float>().data()));
  std::vector<int64_t> removed;
  TF_RETURN_IF_ERROR(store_->RemovedKeys(&removed));
  TF_RETURN_IF_ERROR(allocate_removed(static_cast<int64_t>(removed.size()), &out));
  std::copy(removed.begin(), removed.end(), out[0]->flat<int64_t>().data());
  return OkStatus();
}

void NativeTable::ClearChanges() {
  mutex_lock lock(mu_);
  store_->ClearChanges();
}

Status NativeTable::AccessStatus(const AllocateOutputs& allocate) const {
  if (!config_.track_access) {
    return Error("access status needs a table created with track_access=True");
  }
  tf_shared_lock lock(mu_);
  std::vector<Tensor*> out;
  TF_RETURN_IF_ERROR(allocate(store_->size(), &out));
  TF_RETURN_IF_ERROR(store_->AccessStatus(out[0]->flat<int64_t>().data(), out[1]->flat<int64_t>().data(),
                                          out[2]->flat<int64_t>().data()));
  out[3]->scalar<int64_t>()() = clock_;
  return OkStatus();
}

Status NativeTable::SetAccessStatus(const Tensor& keys, const Tensor& counts, const Tensor& last, int64_t clock) {
  if (!config_.track_access) {
    return Error("setting the access status needs a table created with track_access=True");
  }
  if (clock < 0) return Error("clock must be >= 0 (training lookups so far), got ", clock);
  const int64_t n = keys.NumElements();
  const int64_t* k = keys.flat<int64_t>().data();
  const int64_t* c = counts.flat<int64_t>().data();
  const int64_t* l = last.flat<int64_t>().data();
  for (int64_t i = 0; i < n; ++i) {
    if (c[i] < 0) return Error("counts must be >= 0, got ", c[i], " for key ", k[i], " at position ", i);
    if (l[i] < 0 || l[i] > clock) {
      return Error("last must be in [0, clock] = [0, ", clock, "] (the clock of a key's last training lookup), got ",
                   l[i], " for key ", k[i], " at position ", i);
    }
  }
  mutex_lock lock(mu_);
  int64_t missing = -1;
  TF_RETURN_IF_ERROR(store_->SetAccessStatus(k, c, l, n, &missing));
  if (missing >= 0) {
    return Error("key ", k[missing], " at position ", missing, " is not in the table, so it has no access status to ",
                 "set (restore its row first); nothing was set");
  }
  clock_ = clock;
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------------------------

namespace {

// Returns the table of input 0.
Status GetTable(OpKernelContext* ctx, core::RefCountPtr<NativeTable>* table) {
  return LookupResource(ctx, HandleFromInput(ctx, 0), table);
}

// Checks that `t` is a vector of `n` elements; `what` names it, the table names the error.
Status CheckLength(const NativeTable& table, const Tensor& t, const char* what, int64_t n, const char* of) {
  if (!TensorShapeUtils::IsVector(t.shape())) {
    return table.Error(what, " must be a vector (rank 1), got shape ", t.shape().DebugString());
  }
  if (t.NumElements() != n) {
    return table.Error(what, " must have one entry per key: ", n, " ", of, ", got ", t.NumElements(), " ", what);
  }
  return OkStatus();
}

Status CheckKeys(const NativeTable& table, const Tensor& keys) {
  if (!TensorShapeUtils::IsVector(keys.shape())) {
    return table.Error("keys must be a vector (rank 1), got shape ", keys.shape().DebugString());
  }
  if (keys.NumElements() > std::numeric_limits<int32_t>::max()) {
    return table.Error("at most 2^31 - 1 keys per call, got ", keys.NumElements());
  }
  return OkStatus();
}

// Checks that `t` is a [n, dim] matrix.
Status CheckRows(const NativeTable& table, const Tensor& t, const char* what, int64_t n) {
  const int64_t dim = table.config().dim;
  if (!TensorShapeUtils::IsMatrix(t.shape()) || t.dim_size(0) != n || t.dim_size(1) != dim) {
    return table.Error(what, " must have shape [", n, ", ", dim, "] (keys, dim), got ", t.shape().DebugString());
  }
  return OkStatus();
}

Status ScalarInput(OpKernelContext* ctx, const NativeTable& table, int index, const char* what, float* out) {
  const Tensor& t = ctx->input(index);
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return table.Error(what, " must be a scalar, got shape ", t.shape().DebugString());
  }
  *out = t.scalar<float>()();
  return OkStatus();
}

class NativeTableCreateOp : public OpKernel {
 public:
  explicit NativeTableCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
    OP_REQUIRES_OK(ctx, NativeTableConfig::FromAttrs(ctx, &config_));
    // Like TF's tables with use_node_name_sharing: without a shared name the node name identifies the table.
    if (shared_name_.empty()) shared_name_ = name();
  }

  void Compute(OpKernelContext* ctx) override {
    const ResourceHandle handle = MakeResourceHandle<NativeTable>(ctx, container_, shared_name_);
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, LookupOrCreateResource<NativeTable>(ctx, handle, &table, [this](NativeTable** created) {
                     auto* table = new NativeTable(config_);
                     const Status opened = table->Open();
                     if (!opened.ok()) {
                       table->Unref();
                       return opened;
                     }
                     *created = table;
                     return OkStatus();
                   }));
    OP_REQUIRES(ctx, table->config() == config_,
                errors::InvalidArgument("native table '", config_.name, "': shared_name '", shared_name_,
                                        "' already holds a table with another config: ", table->DebugString(),
                                        " (wanted ", config_.DebugString(), ")"));
    Tensor* out = nullptr;
    AllocatorAttributes attr;
    attr.set_on_host(true);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out, attr));
    out->scalar<ResourceHandle>()() = handle;
  }

 private:
  std::string container_;
  std::string shared_name_;
  NativeTableConfig config_;
};

class NativeTableLookupOrInitOp : public OpKernel {
 public:
  explicit NativeTableLookupOrInitOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("insert", &insert_));
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    const Tensor& keys = ctx->input(1);
    const Tensor& categories = ctx->input(2);
    const Tensor& ids = ctx->input(3);
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, CheckKeys(*table, keys));
    OP_REQUIRES_OK(ctx, CheckLength(*table, categories, "categories", n, "keys"));
    OP_REQUIRES_OK(ctx, CheckLength(*table, ids, "ids", n, "keys"));
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, table->config().dim}), &rows));
    OP_REQUIRES_OK(ctx, table->LookupOrInit(keys, categories, ids, insert_, rows));
  }

 private:
  bool insert_;
};

class NativeTableApplySparseOp : public OpKernel {
 public:
  explicit NativeTableApplySparseOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("distinct_keys", &distinct_keys_));
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    const Tensor& keys = ctx->input(1);
    const Tensor& grads = ctx->input(2);
    const Tensor& categories = ctx->input(3);
    const Tensor& ids = ctx->input(4);
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, CheckKeys(*table, keys));
    OP_REQUIRES_OK(ctx, CheckRows(*table, grads, "grads", n));
    OP_REQUIRES_OK(ctx, CheckLength(*table, categories, "categories", n, "keys"));
    OP_REQUIRES_OK(ctx, CheckLength(*table, ids, "ids", n, "keys"));
    float lr, adam_lr;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, *table, 5, "lr", &lr));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, *table, 6, "adam_lr", &adam_lr));
    const Tensor& update_count = ctx->input(7);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(update_count.shape()),
                table->Error("update_count must be a scalar, got shape ", update_count.shape().DebugString()));
    OP_REQUIRES_OK(ctx, table->ApplySparse(keys, grads, categories, ids, lr, adam_lr,
                                           update_count.scalar<int64_t>()(), distinct_keys_));
  }

 private:
  bool distinct_keys_ = false;
};

class NativeTableFindOp : public OpKernel {
 public:
  explicit NativeTableFindOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("part", &part_));
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeys(*table, keys));
    const int64_t n = keys.NumElements();
    Tensor *values = nullptr, *exists = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, table->config().dim}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &exists));
    OP_REQUIRES_OK(ctx, table->Find(keys, part_, values, exists));
  }

 private:
  int part_;
};

class NativeTableUpsertOp : public OpKernel {
 public:
  explicit NativeTableUpsertOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("part", &part_));
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckKeys(*table, keys));
    OP_REQUIRES_OK(ctx, CheckRows(*table, values, "values", keys.NumElements()));
    OP_REQUIRES_OK(ctx, table->Upsert(keys, values, part_));
  }

 private:
  int part_;
};

class NativeTableRemoveOp : public OpKernel {
 public:
  explicit NativeTableRemoveOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    OP_REQUIRES_OK(ctx, CheckKeys(*table, ctx->input(1)));
    OP_REQUIRES_OK(ctx, table->Remove(ctx->input(1)));
  }
};

class NativeTableSizeOp : public OpKernel {
 public:
  explicit NativeTableSizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = table->Size();
  }
};

class NativeTableTierStatsOp : public OpKernel {
 public:
  explicit NativeTableTierStatsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({NativeTable::kTierStats}), &out));
    table->TierStats(out->flat<int64_t>().data());
  }
};

// Allocates outputs 0-2 as an export's: keys [k], rows [k, dim], slots [k, S, dim].
AllocateOutputs ExportOutputs(OpKernelContext* ctx, const NativeTable& table) {
  const int64_t dim = table.config().dim;
  const int64_t num_slots = table.config().num_slots();
  return [ctx, dim, num_slots](int64_t k, std::vector<Tensor*>* out) {
    out->assign(3, nullptr);
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({k}), &(*out)[0]));
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({k, dim}), &(*out)[1]));
    return ctx->allocate_output(2, TensorShape({k, num_slots, dim}), &(*out)[2]);
  };
}

class NativeTableExportOp : public OpKernel {
 public:
  explicit NativeTableExportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    OP_REQUIRES_OK(ctx, table->Export(ExportOutputs(ctx, *table)));
  }
};

class NativeTableExportChunkOp : public OpKernel {
 public:
  explicit NativeTableExportChunkOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    const Tensor& cursor = ctx->input(1);
    const Tensor& max_rows = ctx->input(2);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(cursor.shape()) && cursor.NumElements() == 2,
                table->Error("an export chunk's cursor must be int64 [2], got shape ", cursor.shape().DebugString()));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(max_rows.shape()),
                table->Error("an export chunk's max_rows must be a scalar, got shape ",
                             max_rows.shape().DebugString()));
    const int64_t at[2] = {cursor.flat<int64_t>()(0), cursor.flat<int64_t>()(1)};
    ExportedChunk chunk;
    int64_t next[2];
    OP_REQUIRES_OK(ctx, table->ExportChunk(at, max_rows.scalar<int64_t>()(), &chunk, next));
    const int64_t k = static_cast<int64_t>(chunk.keys.size());
    const int64_t dim = table->config().dim, num_slots = table->config().num_slots();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k}), &out));
    std::copy(chunk.keys.begin(), chunk.keys.end(), out->flat<int64_t>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({k, dim}), &out));
    std::copy(chunk.rows.begin(), chunk.rows.end(), out->flat<float>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({k, num_slots, dim}), &out));
    std::copy(chunk.slots.begin(), chunk.slots.end(), out->flat<float>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({k}), &out));
    std::copy(chunk.counts.begin(), chunk.counts.end(), out->flat<int64_t>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({k}), &out));
    std::copy(chunk.lasts.begin(), chunk.lasts.end(), out->flat<int64_t>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({2}), &out));
    out->flat<int64_t>()(0) = next[0];
    out->flat<int64_t>()(1) = next[1];
    OP_REQUIRES_OK(ctx, ctx->allocate_output(6, TensorShape({}), &out));
    out->scalar<int64_t>()() = chunk.clock;
  }
};

class NativeTableChangesOp : public OpKernel {
 public:
  explicit NativeTableChangesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    OP_REQUIRES_OK(ctx, table->Changes(ExportOutputs(ctx, *table), [&](int64_t k, std::vector<Tensor*>* out) {
      out->assign(1, nullptr);
      return ctx->allocate_output(3, TensorShape({k}), &(*out)[0]);
    }));
  }
};

class NativeTableClearChangesOp : public OpKernel {
 public:
  explicit NativeTableClearChangesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    table->ClearChanges();
  }
};

class NativeTableAccessStatusOp : public OpKernel {
 public:
  explicit NativeTableAccessStatusOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    OP_REQUIRES_OK(ctx, table->AccessStatus([&](int64_t k, std::vector<Tensor*>* out) {
      out->assign(4, nullptr);
      for (int o = 0; o < 3; ++o) TF_RETURN_IF_ERROR(ctx->allocate_output(o, TensorShape({k}), &(*out)[o]));
      return ctx->allocate_output(3, TensorShape({}), &(*out)[3]);
    }));
  }
};

class NativeTableSetAccessStatusOp : public OpKernel {
 public:
  explicit NativeTableSetAccessStatusOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<NativeTable> table;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    const Tensor& keys = ctx->input(1);
    const Tensor& counts = ctx->input(2);
    const Tensor& last = ctx->input(3);
    const Tensor& clock = ctx->input(4);
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, CheckKeys(*table, keys));
    OP_REQUIRES_OK(ctx, CheckLength(*table, counts, "counts", n, "keys"));
    OP_REQUIRES_OK(ctx, CheckLength(*table, last, "last", n, "keys"));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(clock.shape()),
                table->Error("clock must be a scalar, got shape ", clock.shape().DebugString()));
    OP_REQUIRES_OK(ctx, table->SetAccessStatus(keys, counts, last, clock.scalar<int64_t>()()));
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableCreate").Device(DEVICE_CPU), NativeTableCreateOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableLookupOrInit").Device(DEVICE_CPU), NativeTableLookupOrInitOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableApplySparse").Device(DEVICE_CPU), NativeTableApplySparseOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableFind").Device(DEVICE_CPU), NativeTableFindOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableUpsert").Device(DEVICE_CPU), NativeTableUpsertOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableRemove").Device(DEVICE_CPU), NativeTableRemoveOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableSize").Device(DEVICE_CPU), NativeTableSizeOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableExport").Device(DEVICE_CPU), NativeTableExportOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableExportChunk").Device(DEVICE_CPU), NativeTableExportChunkOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableTierStats").Device(DEVICE_CPU), NativeTableTierStatsOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableChanges").Device(DEVICE_CPU), NativeTableChangesOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableClearChanges").Device(DEVICE_CPU), NativeTableClearChangesOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableAccessStatus").Device(DEVICE_CPU), NativeTableAccessStatusOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>NativeTableSetAccessStatus").Device(DEVICE_CPU),
                        NativeTableSetAccessStatusOp);

}  // namespace fusedrec
}  // namespace tensorflow
