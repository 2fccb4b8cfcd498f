/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace fusedrec {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// The row width is the table's (an attr of the create op, not of these ops): the Python wrappers set it.
constexpr int64_t kUnknown = InferenceContext::kUnknownDim;

// Input `index` is a vector; merges its length into *n.
Status MergeVector(InferenceContext* c, int index, DimensionHandle* n) {
  ShapeHandle v;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(index), 1, &v));
  return c->Merge(*n, c->Dim(v, 0), n);
}

// Input `index` is a matrix [n, dim]; merges its first dimension into *n.
Status MergeRows(InferenceContext* c, int index, DimensionHandle* n) {
  ShapeHandle m;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(index), 2, &m));
  return c->Merge(*n, c->Dim(m, 0), n);
}

Status CheckHandle(InferenceContext* c) {
  ShapeHandle unused;
  return c->WithRank(c->input(0), 0, &unused);
}

// table, keys [U], categories [U], ids [U] -> rows [U, dim].
Status LookupOrInitShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckHandle(c));
  DimensionHandle n = c->UnknownDim();
  for (int i = 1; i <= 3; ++i) TF_RETURN_IF_ERROR(MergeVector(c, i, &n));
  c->set_output(0, c->Matrix(n, kUnknown));
  return OkStatus();
}

// table, keys [U], grads [U, dim], categories [U], ids [U], lr, adam_lr, update_count (scalars).
Status ApplySparseShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckHandle(c));
  DimensionHandle n = c->UnknownDim();
  TF_RETURN_IF_ERROR(MergeVector(c, 1, &n));
  TF_RETURN_IF_ERROR(MergeRows(c, 2, &n));
  TF_RETURN_IF_ERROR(MergeVector(c, 3, &n));
  TF_RETURN_IF_ERROR(MergeVector(c, 4, &n));
  ShapeHandle unused;
  for (int i = 5; i <= 7; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  return OkStatus();
}

// table, keys [K] -> values [K, dim], exists [K].
Status FindShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckHandle(c));
  DimensionHandle n = c->UnknownDim();
  TF_RETURN_IF_ERROR(MergeVector(c, 1, &n));
  c->set_output(0, c->Matrix(n, kUnknown));
  c->set_output(1, c->Vector(n));
  return OkStatus();
}

// table, keys [K], values [K, dim].
Status UpsertShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckHandle(c));
  DimensionHandle n = c->UnknownDim();
  TF_RETURN_IF_ERROR(MergeVector(c, 1, &n));
  return MergeRows(c, 2, &n);
}

// table, keys [K].
Status RemoveShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckHandle(c));
  DimensionHandle n = c->UnknownDim();
  return MergeVector(c, 1, &n);
}

Status SizeShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckHandle(c));
  c->set_output(0, c->Scalar());
  return OkStatus();
}

// table -> keys [K], rows [K, dim], slots [K, S, dim].
Status ExportShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckHandle(c));
  const DimensionHandle k = c->UnknownDim();
  c->set_output(0, c->Vector(k));
  c->set_output(1, c->Matrix(k, kUnknown));
  c->set_output(2, c->MakeShape({k, kUnknown, kUnknown}));
  return OkStatus();
}

// table -> keys [K], counts [K], last [K], clock [].
Status AccessStatusShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckHandle(c));
  const DimensionHandle k = c->UnknownDim();
  for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(k));
  c->set_output(3, c->Scalar());
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>NativeTableCreate")
    .Output("table: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("table_name: string")
    .Attr("dim: int >= 1")
    .Attr("optimizer: {'sgd', 'adagrad', 'adam', 'adamw', 'ftrl', 'rmsprop'}")
    .Attr("momentum: string = '0.0'")
    .Attr("nesterov: bool = false")
    .Attr("rho: string = '0.9'")
    .Attr("centered: bool = false")
    .Attr("epsilon: string = '1e-07'")
    .Attr("beta_1: string = '0.9'")
    .Attr("beta_2: string = '0.999'")
    .Attr("weight_decay: string = '0.004'")
    .Attr("learning_rate_power: string = '-0.5'")
    .Attr("l1_regularization_strength: string = '0.0'")
    .Attr("l2_regularization_strength: string = '0.0'")
    .Attr("l2_shrinkage_regularization_strength: string = '0.0'")
    .Attr("beta: string = '0.0'")
    .Attr("slot_init: list(float) = []")
    .Attr("storage: {'float32', 'float16'} = 'float32'")
    .Attr("rounding: {'nearest', 'stochastic'} = 'nearest'")
    .Attr("init: {'hashed', 'constant', 'normal', 'uniform', 'truncated_normal'}")
    .Attr("seed: int = 0")
    .Attr("mean: string = '0.0'")
    .Attr("stddev: string = '0.05'")
    .Attr("minval: string = '-0.05'")
    .Attr("maxval: string = '0.05'")
    .Attr("value: string = '0.0'")
    .Attr("salts: list(int)")
    .Attr("track_access: bool = false")
    .Attr("tier_path: string = ''")
    .Attr("tier_dram_bytes: int = 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
The handle of a native embedding table (int64 key -> float32 or float16 row of `dim`, optimizer slots beside it),
creating the table on first run. Tables are shared by (container, shared_name); an empty shared_name means the node
name. Creating with a shared_name that holds a table of another config is an error.
optimizer and its hyperparameters other than the learning rate (Keras 3's names and defaults; each optimizer reads
its own, see NativeTableApplySparse): sgd momentum, nesterov; adagrad epsilon; adam and adamw beta_1, beta_2,
epsilon (adamw also weight_decay); ftrl learning_rate_power and the *_regularization_strength, beta; rmsprop rho,
momentum, epsilon, centered. slot_init: the initial value of each slot (an initial_accumulator_value): sgd has a
momentum slot with momentum > 0 only, rmsprop rms, then momentum (momentum > 0), then mg (centered).
mean, stddev, minval, maxval, value and the float hyperparameters: float64 values as decimal strings that round-trip
(Python's repr): a float attr is float32, the hashed initializer multiplies by stddev in float64, and Keras takes
constants such as 1 - rho in float64 before rounding them to float32.
rounding: how an update's float32 row is rounded to float16 storage: nearest (even), or stochastic (float16 storage
only) with random bits a function of (salts[0], key, update_count, column). Upserts and new keys' initial rows are
rounded to nearest.
tier_path, tier_dram_bytes: a tiered table: at most tier_dram_bytes of entries in DRAM, the others in a RocksDB store
in directory tier_path (created empty; removed with the table). RocksDB's library is loaded when such a table is
created. The table's contents and updates are those of the all-DRAM table.
)doc");

REGISTER_OP("FusedRec>NativeTableLookupOrInit")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("categories: int32")
    .Input("ids: int64")
    .Output("rows: float")
    .Attr("insert: bool = true")
    .SetIsStateful()
    .SetShapeFn(LookupOrInitShape)
    .Doc(R"doc(
rows[i] = the row of keys[i]. A missing key gets its initial row from (categories[i], ids[i]); with insert it is
inserted in the same probe (slots at slot_init) and, with track_access, every key's count and last access updated.
)doc");

REGISTER_OP("FusedRec>NativeTableApplySparse")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("grads: float")
    .Input("categories: int32")
    .Input("ids: int64")
    .Input("lr: float")
    .Input("adam_lr: float")
    .Input("update_count: int64")
    .Attr("distinct_keys: bool = false")
    .SetIsStateful()
    .SetShapeFn(ApplySparseShape)
    .Doc(R"doc(
One in-place optimizer update per distinct key (grads of repeated keys summed first), lazy as TF's
ResourceSparseApply* kernels: only the rows of these keys and their slots change. A missing key is first inserted
with its initial row from (categories, ids). lr: the step's learning rate. adam_lr: adam and adamw's bias-corrected
learning rate (lr * sqrt(1 - beta_2^t) / (1 - beta_1^t), in float32 as TF computes it; ignored by the others).
update_count: the optimizer's 1-based update number, the random bits' source with stochastic rounding (ignored
otherwise). distinct_keys: the caller vouches that no key repeats (the keys of one lookup), and the deduplication
pass is skipped; a repeated key is then updated once per occurrence. The update rules are in
cc/kernels/impl/native_table.h (float32, in TensorFlow's order of operations).
)doc");

REGISTER_OP("FusedRec>NativeTableFind")
    .Input("table: resource")
    .Input("keys: int64")
    .Output("values: float")
    .Output("exists: bool")
    .Attr("part: int = 0")
    .SetIsStateful()
    .SetShapeFn(FindShape)
    .Doc(R"doc(
Rows (part 0) or slot part - 1 of keys; zeros and exists false for a missing key. Inserts nothing.
)doc");

REGISTER_OP("FusedRec>NativeTableUpsert")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("values: float")
    .Attr("part: int = 0")
    .SetIsStateful()
    .SetShapeFn(UpsertShape)
    .Doc(R"doc(
Sets the rows (part 0) or slot part - 1 of keys, inserting missing keys.
)doc");

REGISTER_OP("FusedRec>NativeTableRemove")
    .Input("table: resource")
    .Input("keys: int64")
    .SetIsStateful()
    .SetShapeFn(RemoveShape)
    .Doc("Removes keys (missing ones are ignored) with their slots and access stats.");

REGISTER_OP("FusedRec>NativeTableSize")
    .Input("table: resource")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn(SizeShape)
    .Doc("Number of keys in the table.");

REGISTER_OP("FusedRec>NativeTableTierStats")
    .Input("table: resource")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(CheckHandle(c));
      c->set_output(0, c->Vector(12));
      return OkStatus();
    })
    .Doc(R"doc(
The tiers' counters, int64 [12]: rows in DRAM, rows on disk, the most rows DRAM holds (-1: all-DRAM, unbounded), bytes
of the DRAM arrays; then since the table was created: training lookups' keys found in DRAM, found on disk (read into
DRAM), found in neither (new), rows evicted to disk, bytes read from disk, bytes written to it, and the
microseconds training calls spent evicting to the store and reading from it. An all-DRAM table
gives (size, 0, -1, bytes, 0, ...).
)doc");

REGISTER_OP("FusedRec>NativeTableExport")
    .Input("table: resource")
    .Output("keys: int64")
    .Output("rows: float")
    .Output("slots: float")
    .SetIsStateful()
    .SetShapeFn(ExportShape)
    .Doc("Every key with its row [dim] and slots [S, dim], in the table's slot order.");

REGISTER_OP("FusedRec>NativeTableExportChunk")
    .Input("table: resource")
    .Input("cursor: int64")
    .Input("max_rows: int64")
    .Output("keys: int64")
    .Output("rows: float")
    .Output("slots: float")
    .Output("counts: int64")
    .Output("last: int64")
    .Output("next: int64")
    .Output("clock: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ExportShape(c));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
      const DimensionHandle k = c->Dim(c->output(0), 0);
      c->set_output(3, c->Vector(k));
      c->set_output(4, c->Vector(k));
      c->set_output(5, c->Vector(2));
      c->set_output(6, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
An export in chunks, for a table larger than memory: up to max_rows keys from `cursor` on, with their rows [dim], slots
[S, dim] and access stats (count, last; zeros where the table keeps none), the cursor of the next chunk and the table's
clock (training lookups so far). The first
chunk's cursor is (0, 0); the export is over when next is (3, 0). Each entry comes once over the chunks while the table
does not change between them: the DRAM entries in slot order, then a tiered table's stored rows in key order.
)doc");

namespace {

// table -> keys [C], rows [C, dim], slots [C, S, dim], removed [R].
Status ChangesShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(ExportShape(c));
  c->set_output(3, c->Vector(c->UnknownDim()));
  return OkStatus();
}

}  // namespace

REGISTER_OP("FusedRec>NativeTableChanges")
    .Input("table: resource")
    .Output("keys: int64")
    .Output("rows: float")
    .Output("slots: float")
    .Output("removed: int64")
    .SetIsStateful()
    .SetShapeFn(ChangesShape)
    .Doc("The keys inserted or written since the last NativeTableClearChanges with their rows and slots (as "
         "NativeTableExport), and the keys removed since then that the table does not hold now (ascending). "
         "FailedPrecondition before the first NativeTableClearChanges.");

REGISTER_OP("FusedRec>NativeTableClearChanges")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(CheckHandle)
    .Doc("Forgets the changes NativeTableChanges reports; removals are logged from the first call on.");

REGISTER_OP("FusedRec>NativeTableAccessStatus")
    .Input("table: resource")
    .Output("keys: int64")
    .Output("counts: int64")
    .Output("last: int64")
    .Output("clock: int64")
    .SetIsStateful()
    .SetShapeFn(AccessStatusShape)
    .Doc("Every key with its access count and last access clock, and the table's clock (needs track_access).");

namespace {

// table, keys [K], counts [K], last [K], clock [].
Status SetAccessStatusShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckHandle(c));
  DimensionHandle n = c->UnknownDim();
  for (int i = 1; i <= 3; ++i) TF_RETURN_IF_ERROR(MergeVector(c, i, &n));
  ShapeHandle unused;
  return c->WithRank(c->input(4), 0, &unused);
}

}  // namespace

REGISTER_OP("FusedRec>NativeTableSetAccessStatus")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("counts: int64")
    .Input("last: int64")
    .Input("clock: int64")
    .SetIsStateful()
    .SetShapeFn(SetAccessStatusShape)
    .Doc(R"doc(
Sets the access count and last access clock of keys, and the table's clock (needs track_access; a checkpoint's
restore). Every key must be in the table (its row restored first), counts >= 0 and 0 <= last <= clock: otherwise
nothing is set. A repeated key takes its last entry; keys not given keep their stats.
)doc");

}  // namespace fusedrec
}  // namespace tensorflow
