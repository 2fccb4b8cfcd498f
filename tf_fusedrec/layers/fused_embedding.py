"""FusedEmbedding: the drop-in replacement for a dict of per-feature TFRA embedding layers."""

import collections
import warnings

import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec import initializers
from tf_fusedrec.distributed import comm as comm_lib
from tf_fusedrec.distributed.comm import slot_name
from tf_fusedrec.distributed import admission as admission_lib
from tf_fusedrec.distributed import eviction as eviction_lib
from tf_fusedrec.distributed import replication as replication_lib
from tf_fusedrec.distributed import rounding as rounding_lib
from tf_fusedrec.distributed import tier as tier_lib
from tf_fusedrec.distributed.group_lookup import make_group_lookup
from tf_fusedrec.distributed.table import (ReplicatedTable, ShardedTable, check_storage, check_table_backend,
                                           make_table, packed_ids)
from tf_fusedrec.layers import _common
from tf_fusedrec.layers import _inputs
from tf_fusedrec.layers.protocol import EmbeddingLayer, unconverted

DEDUP_MODES = ("segment", "none")
FUSION_MODES = ("deferred", "source_hash")
STATISTICS = ("ids", "unique_sent", "unique_looked_up", "hot_hits")

EmbeddingDist = collections.namedtuple("EmbeddingDist", ["inputs", "groups"])
EmbeddingDist.__doc__ = """What FusedEmbedding.input_dist returns and lookup_and_output takes: the input dict (the
layouts are rebuilt from it) and one GroupDist per group. Tensors only, so it can be returned from one tf.function and
passed into the next."""


@tf.keras.utils.register_keras_serializable(package="FusedRec")
class FusedEmbedding(EmbeddingLayer):
    """Embeds a dict of sparse features with one all-to-all pair per spec group (FusedRec, Algorithm 1).

    Features with equal (dim, optimizer, initializer) form a group, ordered by name; each group has one table (a
    TFRA dynamic_embedding variable, or tf_fusedrec's native table: table_backend), sharded by owner_of so each
    worker holds only the keys it owns. Each feature is a category of its group's table, except a feature declared
    with `shares` (fr.Feature("target", dim=32, shares="items")): its ids are pairs of the shared feature's
    category, so it reads and trains the same rows, with its own input and combiner. A training step does,
    per group, one keys all-to-all (ids and categories together) and one embeddings all-to-all, where per-feature
    TFRA layers do two per feature. Results equal the per-feature layers' (lossless) and, with the default Hashed
    initializer, do not depend on the number of workers.

    Args:
      features: list of fr.Feature.
      optimizer: default sparse optimizer of features that name none (a name such as "adagrad" or a dict with
        "name" and hyperparameters). Used by fr.train.make_optimizer.
      initializer: default initializer of features that name none; default fr.initializers.Hashed(0, 0.05).
      comm: None/"auto" (Horovod when initialised with size > 1, else single process), "single", "horovod", or
        a comm object. Horovod must be initialised before the layer is created.
      dedup: "segment" (FusedRec: segment unique before sending) or "none" (ablation: send duplicates).
      fusion: "deferred" (FusedRec: the category travels with the id and is hashed in on the owner) or
        "source_hash" (ablation, the paper's TFRA-fused: hash the category in before sending; the owner no longer
        knows categories, so unique_looked_up statistics are -1).
      replication: hot-row replication (HypeReca): None (nothing replicated), "auto" (R per group chosen by the cost
        model from counted batches), a number of rows R per group, or fr.HotReplication(rows, sample_batches,
        max_bytes, costs). The hot set is empty until fr.train.choose_hot_set (the train app and TrainPipeline call
        it) counts the first batches. Needs fusion="deferred", the Hashed initializer and sgd, adagrad or adam.
      storage: "float32" or "float16" rows (optimizer slots stay float32).
      rounding: how float16 storage rounds a row after each update: "nearest" (round to nearest even; an update
        under half a float16 step is lost) or "stochastic" (up or down at random, unbiased: the stored row is the
        float32 row on average), with random bits a function of (table, key, the group optimizer's update count,
        column), so N workers and both table backends round alike (tf_fusedrec/distributed/rounding.py). float32
        rows are never rounded: float32 storage ignores it.
      eviction: None or fr.Eviction(capacity, policy, interval).
      admission: None or fr.Admission(min_count): an id gets a trainable row only once training lookups have read it
        min_count times; until then it reads its initializer's row and its gradient is dropped
        (tf_fusedrec/distributed/admission.py). Sharded tables only.
      expiry: None or fr.Expiry(steps, interval): rows not updated for `steps` steps are removed with their slots,
        checked every `interval` updates. Sharded tables only.
      table_backend: "native" (the default: tf_fusedrec's C++ table: one probe per key to read, initialising new
        keys in the same pass, and one to apply the group's optimizer in place, slots beside the row; see
        tf_fusedrec/distributed/native_table.py) or "tfra" (TFRA dynamic_embedding variables, TFRA's optimizers
        through ShadowVariables: the `[tfra]` extra, Keras 2 only). Both give the same training.
      tier: None (every row in DRAM) or fr.Tiered(dram_bytes, path): each group's table keeps at most dram_bytes of
        entries in DRAM on each worker and the rest in a RocksDB store on local disk under path, for tables larger
        than memory; trains exactly as in DRAM (tf_fusedrec/distributed/tier.py; tier_statistics() reports the
        tiers). Native tables only; the replicated hot rows stay in DRAM.

    Training: with fr.train.make_optimizer(model) (custom loops, model.fit, the train app), each group's optimizer
    updates its table when the GroupedOptimizer applies the step's gradients. With any other optimizer (a plain Keras
    optimizer in model.compile or a custom loop), native tables train too: when that optimizer applies a step, each
    table applies its group's optimizer (the feature spec's, else this layer's `optimizer`) to the rows' gradient of
    the last backward pass (NativeEmbeddingTable.apply_pending); the Keras optimizer updates the dense weights. On
    several workers, averaging the dense gradients and starting the dense weights equal are then the caller's
    (Horovod's DistributedGradientTape and broadcast_variables; a warning says so), where make_optimizer(model,
    default=<the Keras optimizer>) does both; replication, eviction and expiry need make_optimizer.

    Call:
      inputs: dict feature name -> ids: [B], [B, L] (padding -1) or tf.RaggedTensor [B, None] of the feature's
        key_dtype, ids >= 0.
      training: False looks up without inserting new ids and without the trainable path.

    Returns:
      dict feature name -> float32 [B, dim] (ids [B] or a combiner), [B, L, dim] or ragged [B, None, dim].
    """

    def __init__(self, features, optimizer=_common.DEFAULT_OPTIMIZER, initializer=None, comm=None,
                 dedup="segment", fusion="deferred", replication=None, storage="float32", eviction=None,
                 table_backend="native", admission=None, expiry=None, rounding="nearest", tier=None, name=None,
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.supports_jit = False  # Keras 3's fit would otherwise compile the step with XLA: the ops have no XLA kernels
        self.features = _common.parse_features(features, self.name)
        if dedup not in DEDUP_MODES:
            raise ValueError(f"{self.name}: dedup must be one of {DEDUP_MODES}, got {dedup!r}")
        if fusion not in FUSION_MODES:
            raise ValueError(f"{self.name}: fusion must be one of {FUSION_MODES}, got {fusion!r}")
        self.dedup, self.fusion = dedup, fusion
        self.storage = check_storage(storage, self.name)
        self.rounding = rounding_lib.check_rounding(rounding, self.name)
        self.table_backend = check_table_backend(table_backend, self.name)
        self.eviction = eviction_lib.parse_eviction(eviction, self.name, self.features)
        self.admission = admission_lib.parse_admission(admission, self.name)
        self.expiry = admission_lib.parse_expiry(expiry, self.name)
        self.replication = replication_lib.parse_replication(replication, self.name)
        self.tier = tier_lib.parse_tier(tier, self.name)
        if self.tier is not None and self.table_backend != "native":
            raise ValueError(f"{self.name}: tier (tables larger than memory) needs table_backend='native', got "
                             f"{self.table_backend!r}")
        if self.replication is not None and fusion != "deferred":
            raise ValueError(f"{self.name}: replication needs fusion='deferred', got fusion={fusion!r}")
        self.default_optimizer = cfg.optimizer_spec(optimizer, f"{self.name}: optimizer")
        self.default_initializer = initializers.get(initializer) or _common.default_initializer()
        self._feature = {f.name: f for f in self.features}
        self._groups, self._initializers = _common.group_features(
            self.features, self.default_optimizer, self.default_initializer, self.name
        )
        self.comm = comm_lib.get_comm(comm)
        self.tables, self.group_lookups, self.hot_tables = [], [], []
        self._capacities = []  # per group: its table's capacity, or None (not evicted)
        self._hot = _Untracked()  # HotSets: variables of changing length, saved by fr.train.checkpoint, not Keras
        self._hot.sets = []
        for group in self._groups:
            initializer = self._initializers[group.feature_names[0]]
            seed = initializer.seed if initializers.is_hashed(initializer) else 0
            # One salt per category: a feature that shares another's rows has no rows, so no salt, of its own.
            salts = [initializers.feature_salt(seed, n) for n in group.categories]
            capacity = self.eviction.capacity_of(group, self.name) if self.eviction is not None else None
            table = make_table(self.table_backend, f"{self.name}/{group.name}", group.spec.dim, initializer, salts,
                               group.spec.optimizer, self.storage,
                               rounding=self.rounding if self.storage == "float16" else "nearest",
                               track_access=capacity is not None or self.expiry is not None, admission=self.admission,
                               tier=None if self.tier is None else (self.tier, self.comm.rank))
            self.tables.append(table)
            self._capacities.append(capacity)
            hot = None
            if self.replication is not None:
                replication_lib.check_group(self.replication, group, initializer, self.name)
                hot_set = replication_lib.HotSet(f"{self.name}/{group.name}")
                hot = (hot_set, make_table(self.table_backend, f"{self.name}/{group.name}/hot", group.spec.dim,
                                           initializer, salts, group.spec.optimizer))
                self._hot.sets.append(hot_set)
                self.hot_tables.append(hot[1])
            self.group_lookups.append(
                make_group_lookup(group, table, self.comm, self.collective_prefix(group), dedup, fusion, hot))
        # Per native group, its update count in the updates a plain Keras optimizer triggers (not a Keras weight: a
        # GroupedOptimizer, which the Checkpointer needs, keeps its own).
        self._plain = _Untracked()
        self._plain.warned = False
        self._plain.counts = [_plain_optimizer_update(self, group, table)
                                 for group, table in zip(self._groups, self.tables) if table.backend == "native"]
        self._injection = _common.Injection()  # a plain object: Keras must not track the injected tensors
        # Tracked by Keras as the layer's trainable weights (empty in a tf.compat.v1 graph, see EmbeddingTable).
        self._shadows = [t.trainable for t in self.tables + self.hot_tables if t.trainable is not None]
        # Tracked so tf.train.Checkpoint saves the TFRA tables' contents (the shadows only hold one step's rows);
        # native tables are saved by fr.train.Checkpointer.
        tfra = [t for t in self.tables + self.hot_tables if t.backend == "tfra"]
        self._table_params = [t.params for t in tfra] + [t.store for t in tfra if t.store is not None]
        self._stat_order = [n for g in self._groups for n in g.feature_names]
        self._statistics = tf.Variable(
            tf.zeros([len(self._stat_order), len(STATISTICS)], tf.int64), trainable=False, name="statistics"
        )

    @property
    def groups(self):
        """The SpecGroups, in deterministic order."""
        return list(self._groups)

    def optimizer_groups(self):
        """[(OptimizerSpec, [trainable table variables])] per group (the sharded table's, then the replicated
        table's), for fr.train.make_optimizer."""
        hot = self.hot_tables or [None] * len(self.tables)
        return [(g.spec.optimizer, t.trainable_variables + (h.trainable_variables if h is not None else []))
                for g, t, h in zip(self._groups, self.tables, hot)]

    def after_update(self, optimizer):
        """What runs right after each update of `optimizer` (fr.train.make_optimizer's GroupedOptimizer calls it):
        the float16 commit of the updated rows (with each group optimizer's update count, which its update has just
        advanced: the 1-based number of that update), then, after every expiry `interval`-th update, the expiry of
        the rows not updated for `steps` steps, then, after every eviction `interval`-th update, the eviction of the
        rows over capacity, each with their slots. None when the layer has none of them."""
        def slots(table):
            return [] if table.trainable is None else [s for _, s in optimizer.slot_tables(table.trainable)]

        def every(interval, fn, ops):
            with tf.control_dependencies(ops):
                due = tf.equal((optimizer.iterations + 1) % interval, 0)
                return [tf.cond(due, fn, tf.no_op)]

        ops = []
        if self.storage != "float32":
            ops.append(tf.group([t.commit(optimizer.sparse_optimizer_of(t.trainable).iterations)
                                 for t in self.tables]))
        if self.expiry is not None:
            ops = every(self.expiry.interval,
                        lambda: tf.group([t.expire(self.expiry.steps, slots(t)) for t in self.tables]), ops)
        if self.eviction is not None:
            ops = every(self.eviction.interval,
                        lambda: tf.group([t.evict(c, self.eviction.policy, slots(t))
                                          for t, c in zip(self.tables, self._capacities) if c is not None]), ops)
        return tf.group(ops) if ops else None

    def eviction_statistics(self):
        """{group name: {"rows": rows held on this worker, "evicted": rows evicted so far, "capacity": ...}} of the
        evicting tables."""
        return {g.name: {"rows": int(t.size()), "evicted": int(t.evicted.numpy()), "capacity": c}
                for g, t, c in zip(self._groups, self.tables, self._capacities) if c is not None}

    def admission_statistics(self):
        """{group name: {"waiting": keys counted on this worker and not admitted yet, "dropped": gradients of keys
        not admitted dropped so far (one per key and step)}}; empty without admission."""
        if self.admission is None:
            return {}
        return {g.name: {"waiting": int(t.admission.size()), "dropped": int(t.admission.dropped.numpy())}
                for g, t in zip(self._groups, self.tables)}

    def expiry_statistics(self):
        """{group name: {"rows": rows held on this worker, "expired": rows expired so far}}; empty without expiry."""
        if self.expiry is None:
            return {}
        return {g.name: {"rows": int(t.size()), "expired": int(t.expired.numpy())}
                for g, t in zip(self._groups, self.tables)}

    def table_bytes(self):
        """{"rows": bytes of this worker's keys and rows (sharded and replicated), "storage": self.storage}; the
        optimizer's slots are not counted (they stay float32)."""
        return {"rows": sum(t.row_bytes() for t in self.tables + self.hot_tables), "storage": self.storage}

    def embedding_variables(self):
        return [v for t in self.tables + self.hot_tables for v in t.trainable_variables]

    def native_tables(self):
        """[NativeEmbeddingTable] of the groups stored natively (fr.train.GroupedOptimizer applies their updates in
        place, found by their trainable handle)."""
        return [t for t in self.tables + self.hot_tables if t.backend == "native"]

    def replicated_variables(self):
        """The trainable handles of the replicated (hot) tables: their gradients are averaged over workers."""
        return [v for t in self.hot_tables for v in t.trainable_variables]

    @property
    def hot_sets(self):
        """[HotSet] per group (empty without replication)."""
        return list(self._hot.sets)

    def replicated_tables(self):
        """[ReplicatedTable] of the groups (empty without replication), what fr.train.checkpoint saves once."""
        return [ReplicatedTable(t.name, t.params, t.trainable, s) for t, s in zip(self.hot_tables, self._hot.sets)]

    def sharded_tables(self):
        """[ShardedTable] of the groups, in group order (what fr.train.checkpoint saves and restores)."""
        return [ShardedTable(t.name, t.rows, t.trainable,
                             packed_ids(g.num_categories) if g.encoding == "packed" else lambda keys: None,
                             t.admission)
                for g, t in zip(self._groups, self.tables)]

    def access_tables(self):
        """Per group (as sharded_tables), its table where it counts accesses (eviction or expiry), else None."""
        return [t if c is not None or self.expiry is not None else None for t, c in zip(self.tables, self._capacities)]

    def collective_prefix(self, group):
        return f"FusedRec/{self.name}/{group.name}"

    @unconverted
    def call(self, inputs, training=None):
        if self._injection.outputs is not None:
            return self._injection.take(self.features, inputs, self.name)
        # The two halves, flattening (and checking) the inputs once.
        flats, checks = _common.checked_inputs(self.features, inputs, self.name, self.comm,
                                               slot_name(f"FusedRec/{self.name}", "valid", 0))
        dist = self._input_dist(inputs, flats, checks, slot=0, send_after=())
        return self._lookup_and_output([dist], [flats], training, [0])[0]

    def input_dist(self, inputs, slot=0, send_after=(), checked=False):
        """The first half of a call, on ids only: per group fuse -> sender unique -> partition -> keys all-to-all ->
        category-aware unique on the owner. Reads no table, so a pipeline can run it a batch ahead of the update.

        Args:
          inputs: the call's input dict (checked here: a bad id raises before any all-to-all; with several workers
            the check is shared, one allgather named FusedRec/{layer}/valid/slot{slot}, so every worker raises the
            same error naming the feature and the rank whose batch is bad).
          slot: the in-flight slot; collectives are named .../keys/slot{slot}, so batches in distinct slots can be
            in flight at once.
          send_after: tensors the keys all-to-alls wait for (the fuse, unique and partition before them do not):
            a pipeline sends the next batch's keys once the current batch's rows have arrived, so they do not queue
            in front of them.
          checked: True when the caller has already checked the values on every worker (TrainPipeline does).

        Returns:
          EmbeddingDist.
        """
        flats, checks = _common.checked_inputs(self.features, inputs, self.name, self.comm,
                                               slot_name(f"FusedRec/{self.name}", "valid", slot), checked)
        return self._input_dist(inputs, flats, checks, slot, send_after)

    def _input_dist(self, inputs, flats, checks, slot, send_after):
        dists = []
        with tf.control_dependencies(checks):
            for group, group_lookup in zip(self._groups, self.group_lookups):
                with tf.name_scope(f"{group.name}/input_dist"):
                    ids = [flats[n].ids for n in group.feature_names]
                    if checks:  # (one node after the checks, not an Identity per feature)
                        ids = tf.identity_n(ids)
                    dists.append(group_lookup.input_dist(ids, slot, send_after))
        return EmbeddingDist(inputs, tuple(dists))

    def flatten(self, inputs, local_checks=True):
        """Checks the input dict; -> ({name: FlatFeature}, the assertion ops on this worker's ids (negative, too
        large); none with local_checks=False)."""
        return _common.flatten_inputs(self.features, inputs, self.name, local_checks=local_checks)

    def lookup_and_output(self, dist, training=None, slot=0):
        """The second half of a call: per group table read -> embeddings all-to-all -> recover -> combiners.

        Args:
          dist: an EmbeddingDist from input_dist (of this step's batch, possibly computed during the previous step).
          training: as in call.
          slot: the slot of the embeddings all-to-all (.../embeddings/slot{slot}).

        Returns:
          The call's output dict.
        """
        return self.lookup_and_output_many([dist], training=training, slots=[slot])[0]

    def lookup_and_output_many(self, dists, training=None, slots=None):
        """lookup_and_output for the micro-batches of one batch: per group ONE table read over the union of their
        keys (the table's trainable handle sees one lookup per step), then an embeddings all-to-all per micro-batch
        (slot slots[i], default i) that a pipeline can overlap with another micro-batch's dense compute.

        Returns:
          list of output dicts, one per dist.
        """
        slots = list(range(len(dists))) if slots is None else list(slots)
        flats = [self.flatten(d.inputs, local_checks=False)[0] for d in dists]  # layouts only: input_dist checked
        return self._lookup_and_output(dists, flats, training, slots)

    def _lookup_and_output(self, dists, flats, training, slots):
        outputs = [{} for _ in dists]
        stat_rows = []
        for g, (group, group_lookup) in enumerate(zip(self._groups, self.group_lookups)):
            group_dists = [d.groups[g] for d in dists]
            with tf.name_scope(f"{group.name}/lookup"):
                rows = group_lookup.lookup(group_dists, training)
            features = [self._feature[name] for name in group.feature_names]
            for i, (dist, flat) in enumerate(zip(group_dists, flats)):
                layouts = [flat[name].layout for name in group.feature_names]
                with tf.name_scope(f"{group.name}/output_dist"):
                    segments, totals = zip(*(_inputs.output_segments(f, lay) for f, lay in zip(features, layouts)))
                    sums = group_lookup.output_sums(rows[i], dist, segments, totals, slots[i])
                for f, feature_sums, layout in zip(features, sums, layouts):
                    outputs[i][f.name] = _inputs.finish_rows(f, feature_sums, layout)
            stat_rows.append(tf.stack([
                tf.cast(tf.add_n([d.feature_sizes for d in group_dists]), tf.int64),
                _per_feature(tf.add_n([d.unique_sent for d in group_dists]), group),
                _per_feature(_sum_counts([d.unique_looked_up for d in group_dists]), group),
                tf.add_n([d.hot_hits for d in group_dists]),
            ], axis=1))
        update = self._statistics.assign(tf.concat(stat_rows, axis=0))
        if tf.compat.v1.executing_eagerly_outside_functions():
            return outputs  # eager and tf.function run the stateful update without being asked
        return [{name: _common.after([update], out) for name, out in o.items()} for o in outputs]

    def injected(self, outputs):
        """Within the block, the next call of the layer returns `outputs` (a dict from lookup_and_output) after
        checking the call's input dict: how a pipeline runs a user's model on embeddings it computed ahead."""
        return self._injection.block(outputs, self.name)

    def statistics(self):
        """Per feature, from the last call on this worker: {"ids": ids looked up (padding excluded),
        "unique_sent": unique ids this worker sent, "unique_looked_up": unique ids of the feature this worker
        looked up in its table as owner (from category_unique's per-category counts; -1 with fusion="source_hash"),
        "hot_hits": ids served from the replicated hot rows (0 without replication)}.
        The unique counts are per category: a feature that shares another's rows (Feature.shares) has its unique ids
        counted with the shared feature's (an id of both is one pair, sent and looked up once), and 0 (-1 where
        unknown) of its own, so that no pair is counted twice.
        Values are int64 scalars (tensors in graph mode)."""
        values = self._statistics.read_value()
        return {
            name: {stat: values[i, j] for j, stat in enumerate(STATISTICS)} for i, name in enumerate(self._stat_order)
        }

    def tier_statistics(self):
        """Per group (its name), this worker's table tiers, from its counters (native tables only; {} for TFRA):
        dram_rows, disk_rows, dram_capacity_rows (-1: all in DRAM), dram_bytes, and since the table was created the
        training lookups' keys found in DRAM (hits), on disk (disk_hits), in neither (new_keys), evicted_rows,
        bytes_read and bytes_written (disk), and hit_rate: hits / (hits + disk_hits), the share of the lookups of rows
        that exist served from DRAM (1.0 before any). Python ints and floats (eager)."""
        out = {}
        for group, table in zip(self._groups, self.tables):
            if getattr(table, "backend", None) != "native":
                continue
            stats = table.tier_stats()
            found = stats["hits"] + stats["disk_hits"]
            stats["hit_rate"] = stats["hits"] / found if found else 1.0
            out[group.name] = stats
        return out

    def get_config(self):
        config = super().get_config()
        config.update(_common.layer_config(self.features, self.default_optimizer, self.default_initializer))
        config.update({"dedup": self.dedup, "fusion": self.fusion, "storage": self.storage,
                       "rounding": self.rounding, "table_backend": self.table_backend})
        if self.eviction is not None:
            config["eviction"] = self.eviction.get_config()
        if self.admission is not None:
            config["admission"] = self.admission.get_config()
        if self.expiry is not None:
            config["expiry"] = self.expiry.get_config()
        if self.replication is not None:
            config["replication"] = self.replication.get_config()
        if self.tier is not None:
            config["tier"] = self.tier.get_config()
        return config


class _Untracked:
    """Holds what Keras must not track."""


def _per_feature(counts, group):
    """Per-category counts [C] -> per-feature [M]: a feature's category count, 0 for a feature that shares another's
    rows (its pairs are counted under the shared feature), or -1 where the counts are unknown (-1)."""
    if not group.shares:
        return counts
    padded = tf.concat([counts, tf.minimum(tf.reduce_min(counts), 0)[None]], axis=0)  # -1 stays -1, else 0
    sharing = dict(group.shares)
    return tf.gather(padded, [group.num_categories if n in sharing else group.category_of(n)
                              for n in group.feature_names])


def _sum_counts(counts):
    """Per-category counts summed over micro-batches; -1 (unknown) stays -1."""
    if len(counts) == 1:
        return counts[0]
    total = tf.add_n(counts)
    return tf.where(counts[0] < 0, counts[0], total)


def _plain_optimizer_update(layer, group, table):
    """Sets `table.pending_update`: the update a native table applies when a plain Keras optimizer steps, while no
    GroupedOptimizer claims it (FusedEmbedding's docstring, "Training"; NativeEmbeddingTable.apply_pending). The
    group's optimizer (a fresh Keras optimizer of its spec) gives the learning rate; a step count kept here counts the
    updates (Adam's bias correction, stochastic rounding). Embedding gradients are scaled by 1 / workers, as
    GroupedOptimizer scales them (the embeddings all-to-all has summed them over the workers that asked for each
    row). Returns the step count."""
    from tf_fusedrec import _keras  # noqa: PLC0415

    optimizer = _Untracked()
    optimizer.value = group.spec.optimizer.build()
    if tf.executing_eagerly():
        _keras.current_learning_rate(optimizer.value)  # creates a legacy optimizer's hyperparameters now, not in a trace
    count = tf.Variable(tf.constant(0, tf.int64), name=f"{table.name.replace('/', '_')}_updates", trainable=False)

    def update(grad):
        needs = [what for what, on in (("replication", layer.replication is not None),
                                       ("eviction", layer.eviction is not None), ("expiry", layer.expiry is not None))
                 if on]
        if needs:
            raise ValueError(f"{layer.name}: {', '.join(needs)} needs fr.train.make_optimizer(model) to train the "
                             f"tables; a plain Keras optimizer trains the layer's tables only without them")
        if layer.comm.size > 1:
            from tf_fusedrec.train.optimizer import scale_gradient  # noqa: PLC0415  (train imports the layers)

            # Said once per layer, when the step is built: the dense half of the multi-worker step is the caller's.
            if not layer._plain.warned:  # noqa: SLF001  (this module's own state of the layer)
                layer._plain.warned = True  # noqa: SLF001
                warnings.warn(f"{layer.name}: a plain Keras optimizer on {layer.comm.size} workers trains the tables, "
                              f"but averaging the dense gradients and starting the dense weights equal are then "
                              f"yours (hvd.DistributedGradientTape, hvd.broadcast_variables); "
                              f"fr.train.make_optimizer(model, default=<your optimizer>) does both", stacklevel=2)
            grad = scale_gradient(grad, 1.0 / layer.comm.size)
        step = tf.identity(count.assign_add(1))
        return table.apply_gradients(grad, _keras.current_learning_rate(optimizer.value), step)

    table.pending_update = update
    return count
