"""The distributed lookup of one spec group (FusedRec Algorithm 1, shared/DESIGN.md) as an object with three stages.

* ``input_dist(ids, slot)``:  fuse -> sender unique -> partition by owner -> keys all-to-all -> category-aware unique
  on the owner. Depends on ids only, so a pipeline may run it a batch ahead.
* ``lookup(dists, training)``: table read of the unique keys (new keys get their initial rows) -> gather to the
  received order (on one worker without a hot set the received order is the fused order: lookup then returns the
  unique rows and their index, ``UniqueRows``, and ``output_sums`` gathers them inside its combine op). Reads the
  table, so it runs after the previous batch's update.
* ``output_dist(rows, dist, slot)``: embeddings all-to-all -> recover the fused layout with one composed index ->
  split per feature. The layer calls ``output_sums`` instead, which ends in each feature's rows summed into its
  output rows (its combiner's sums, or one row per id): the recover gather and those sums as one op
  (``ops.gather_segment_sum``), or, with ``fused_output=False`` (or ``FUSED_OUTPUT``), as the chain it replaces
  (output_dist, then a segment sum per feature).

What differs between modes is chosen once, when the object is built, never per batch:

* the route (``LocalRoute`` for one worker: no partition, no all-to-all; ``AllToAllRoute`` otherwise),
* the wire format of the keys all-to-all (``PackedWire``: one reversible int64 per pair; ``PairWire``: an
  (id, category) row; ``KeyWire``: a pre-hashed key, for the source-hash ablation),
* the sender's dedup (``segment_unique``, or none: ``dedup="none"``, and one worker, where the owner's unique is the
  only one the pairs need),
* the sender: ``FusedSender`` (segment dedup, partition by owner, recover index and wire encoding in one op, for
  segment dedup over an all-to-all) or ``ChainSender`` (the same as separate ops: its reference, selectable with
  ``fused_sender=False`` or ``FUSED_SENDER``, and the sender of every other case),
* the fusion: ``FusedGroupLookup`` (deferred hashing: the owner sees categories) or ``SourceHashGroupLookup`` (the
  paper's "TFRA-fused" ablation: the category is hashed into the key before sending, and is lost at the owner),
* hot-row replication: a ``HotReplica`` composed into ``FusedGroupLookup`` (HypeReca's two-fold parallelism,
  tf_fusedrec/distributed/replication.py) serves the pairs of a replicated hot set from every worker's own copy; only
  the cold rest is sharded and sent (with the fused sender, ``ops.fused_sender_hot`` classifies and sends in one op).

Collective names are ``{prefix}/{keys|embeddings}/slot{slot}``: deterministic, equal on every worker, and distinct for
the batches (or micro-batches) a pipeline keeps in flight at once.
"""

import collections

import tensorflow as tf

from tf_fusedrec import initializers
from tf_fusedrec import ops
from tf_fusedrec.ops import indexing
from tf_fusedrec.distributed.comm import slot_name

# The default of FusedGroupLookup's `fused_sender`: layers build their lookups without it, so a process that compares
# the fused sender with the op chain it replaces (a test, a benchmark) sets this before building its layer.
FUSED_SENDER = True
# The default of GroupLookup's `fused_output`, likewise (the combine op, or the chain it replaces).
FUSED_OUTPUT = True

GroupDist = collections.namedtuple(
    "GroupDist",
    [
        "keys",  # int64 [U]: the unique table keys this worker looks up as owner
        "key_segments",  # int32 [U]: the category of each key
        "key_ids",  # int64 [U]: the id behind each key (Hashed initial rows are a function of (category, id))
        "gather_index",  # int32 [m]: received position -> position in keys (I_l)
        "received_splits",  # int32 [N]: pairs received from each rank (= rows sent back to it)
        "recover_index",  # int32 [n]: fused position -> position in the send buffer (I_r)
        "feature_sizes",  # int32 [M]: valid ids per feature, in group order (group.feature_names)
        "unique_sent",  # int64 [C]: pairs this worker sent per category (group.categories)
        "unique_looked_up",  # int64 [C]: unique pairs per category looked up here (-1: categories unknown)
        "hot_keys",  # int64 [T]: the replicated keys some worker's batch touches (equal on every worker; [0]: none)
        "hot_index",  # int32 [h]: each local hot pair's position in hot_keys
        "hot_hits",  # int64 [M]: ids per feature served from the replicated table
    ],
)
GroupDist.__doc__ = "What input_dist hands to lookup and output_dist: tensors only, so it can cross tf.function calls."


# --- wire formats of the keys all-to-all ---------------------------------------------------------------------------

class PackedWire:
    """(segment << (63 - b)) | id: 8 bytes a pair, reversible (every feature of the group declares max_id_bits)."""

    name = "packed"  # the fused sender's `wire`

    def __init__(self, num_categories):
        self.num_categories = num_categories
        self.key_bits = ops.packed_key_bits(num_categories)

    def encode(self, keys, segments):
        return tf.bitwise.bitwise_or(tf.bitwise.left_shift(tf.cast(segments, tf.int64), self.key_bits), keys)

    def decode(self, received):
        segments, ids = ops.decode_unified_keys(received, self.num_categories)
        return ids, segments


class PairWire:
    """An (id, category) int64 row: 16 bytes a pair, any int64 id."""

    name = "pair"  # the fused sender's `wire`

    def encode(self, keys, segments):
        return tf.stack([keys, tf.cast(segments, tf.int64)], axis=1)

    def decode(self, received):
        return received[:, 0], tf.cast(received[:, 1], tf.int32)


class KeyWire:
    """The key alone (source hashing: the category is already folded into it)."""

    def encode(self, keys, segments):  # noqa: ARG002
        return keys

    def decode(self, received):
        return received, None


# --- routes -------------------------------------------------------------------------------------------------------

class LocalRoute:
    """One worker: every pair is its own; nothing is partitioned or sent."""

    def send_keys(self, keys, segments, inverse, name, after=()):  # noqa: ARG002
        """-> (received ids, received segments, received_splits, recover_index)."""
        return keys, segments, tf.size(keys, out_type=tf.int32)[None], inverse

    def send_rows(self, rows, splits, name):  # noqa: ARG002
        return rows


class AllToAllRoute:
    """Partition the unique pairs by owner rank, then one all-to-all for the keys and one for the rows."""

    def __init__(self, comm, wire):
        self.comm, self.wire = comm, wire

    def send_keys(self, keys, segments, inverse, name, after=()):
        """`after`: tensors the all-to-all waits for (the sender's unique and partition do not)."""
        part = ops.partition_by_owner(keys, self.comm.size, segment_ids=segments, name="partition")
        # I_r = I_s after I_u: where each fused position's unique pair sits in the send buffer.
        recover_index = tf.gather(tf.math.invert_permutation(part.order), inverse)
        message = self.wire.encode(part.keys, part.segment_ids)
        if after:
            with tf.control_dependencies(list(after)):
                message = tf.identity(message)
        received, received_splits = self.comm.alltoall(message, part.splits, name=name)
        ids, received_segments = self.wire.decode(received)
        return ids, received_segments, received_splits, recover_index

    def send_rows(self, rows, splits, name):
        received, _ = self.comm.alltoall(rows, splits, name=name)
        return received


# --- sender-side dedup --------------------------------------------------------------------------------------------

def segment_dedup(keys, segments):
    """Unique (category, id) pairs before sending: -> (keys, segments, inverse)."""
    unique = ops.segment_unique(keys, segments)
    return unique.unique_keys, unique.unique_segment_ids, unique.inverse


def no_dedup(keys, segments):
    return keys, segments, tf.range(tf.size(keys, out_type=tf.int32))


# --- senders: fused (keys, segments) -> what the owners received ---------------------------------------------------

class ChainSender:
    """The dedup, then the route's partition and encoding, as separate ops (FusedSender's reference).

    send_keys(keys, segments, name, after) -> (received ids, received segments, received_splits, recover_index,
    unique_sent int64 [C] or None when not `count_sent`)."""

    def __init__(self, dedup, route, num_categories, count_sent=True):
        self.dedup, self.route, self.num_categories, self.count_sent = dedup, route, num_categories, count_sent

    def send_keys(self, keys, segments, name, after=()):
        keys, segments, inverse = self.dedup(keys, segments)
        ids, received_segments, splits, recover_index = self.route.send_keys(keys, segments, inverse, name, after)
        sent = _count(segments, self.num_categories) if self.count_sent else None
        return ids, received_segments, splits, recover_index, sent


class FusedSender:
    """segment_dedup + AllToAllRoute.send_keys with ONE op before the all-to-all (ops.fused_sender): the same message,
    splits, recover index and per-category counts as the chain, bit for bit, without its intermediate tensors."""

    def __init__(self, comm, wire, num_categories):
        self.comm, self.wire, self.num_categories = comm, wire, num_categories

    def send_keys(self, keys, segments, name, after=()):
        """Same as ChainSender.send_keys; `after`: tensors the all-to-all waits for (the fused op does not)."""
        out = ops.fused_sender(keys, segments, self.comm.size, self.num_categories, self.wire.name,
                               name="fused_sender")
        ids, received_segments, received_splits = send_message(self.comm, self.wire, out.message, out.splits, name,
                                                               after)
        return ids, received_segments, received_splits, out.recover_index, out.segment_counts


def send_message(comm, wire, message, splits, name, after=()):
    """A fused sender's message through the keys all-to-all, after `after` -> (received ids, received segments,
    received splits)."""
    if after:
        with tf.control_dependencies(list(after)):
            message = tf.identity(message)
    received, received_splits = comm.alltoall(message, splits, name=name)
    ids, received_segments = wire.decode(received)
    return ids, received_segments, received_splits


@tf.custom_gradient
def _gather_rows(rows, index):
    """tf.gather whose gradient sums duplicates into a dense [U, dim]: the optimizer sees each row once.

    The sum is ops.gather_segment_sum over the upstream rows in order (one feature, its index the identity): bit for
    bit tf.math.unsorted_segment_sum(upstream, index, U), as both sum each row from zero in position order, in one
    pass instead of the segment sum's scan of every position per thread."""

    def grad(upstream):
        upstream = tf.convert_to_tensor(upstream)
        positions = tf.range(tf.size(index, out_type=tf.int32))
        return ops.gather_segment_sum(upstream, positions, [tf.cast(index, tf.int64)],
                                      [tf.shape(rows, out_type=tf.int64)[0]], name="rows_grad")[0], None

    return tf.gather(rows, index), grad


def micro_batch_union(keys, indexes):
    """The keys several micro-batches of one batch read, as ONE set, so that a table is read once per step (its
    trainable handle sees one lookup): keys: per micro-batch int64 [U_i] (unique within it); indexes: per micro-batch
    int32 [m_i] positions in its keys.

    Returns:
      (union keys int64 [U], union_index int32 [sum U_i]: each micro-batch key's position in the union, or None for
      one micro-batch (its keys are the union), per micro-batch int32 [m_i] positions in the union keys).
    """
    if len(keys) == 1:
        return keys[0], None, [indexes[0]]
    union, union_index = tf.unique(tf.concat(keys, axis=0), out_idx=tf.int32)
    offsets = tf.math.cumsum([tf.size(k) for k in keys], exclusive=True)
    return union, union_index, [tf.gather(union_index, index + offsets[i]) for i, index in enumerate(indexes)]


def gather_per_micro_batch(rows, indexes):
    """rows [U, dim] of a union -> [rows[index] for each micro-batch's index], with one gather whose gradient sums
    the duplicates (_gather_rows)."""
    if len(indexes) == 1:
        return [_gather_rows(rows, indexes[0])]
    gathered = _gather_rows(rows, tf.concat(indexes, axis=0))
    return tf.split(gathered, [tf.size(i) for i in indexes], num=len(indexes), axis=0)


def fuse(ids_per_feature, categories):
    """Concatenates a group's ids; -> (keys int64 [n], segments int32 [n], feature_sizes int32 [M]).

    categories: the category of each feature (group.feature_categories): its position in the group, or the shared
    feature's for a feature that shares another's rows, whose ids thus become pairs of that category."""
    with tf.name_scope("fuse"):
        return ops.fuse_ids(ids_per_feature, categories)  # one op: concat, sizes and repeat(categories, sizes)


def _count(segments, num_categories):
    return tf.math.bincount(segments, minlength=num_categories, maxlength=num_categories, dtype=tf.int64)


UniqueRows = collections.namedtuple("UniqueRows", ["rows", "index"])
UniqueRows.__doc__ = """What GroupLookup.lookup returns, in place of rows in received order, where the received order
is the fused order itself (one worker, no hot set: no dedup before the owner's unique, so recover_index is the
identity, and no rows travel): the table's rows of the unique keys [U, dim] and each fused position's row among them
(gather_index, int32 [n]). output_sums sums them into the features' outputs with one gather_segment_sum over the
[U, dim] rows, instead of a gather of n rows and then that op over them; its gradient scatters into the [U, dim] rows
in the same order as the gather's gradient summed the n rows' (so the values are bit for bit the same)."""


class GroupLookup:
    """One spec group's routing and table. Subclasses decide what travels and how keys are formed.

    Args:
      group: SpecGroup.
      table: the group's EmbeddingTable on this worker.
      comm: the comm object (rank, size, alltoall, ...).
      prefix: deterministic collective name prefix (layer and group).
      fused_output: output_sums sums with one op (ops.gather_segment_sum) rather than the chain it replaces
        (bit-identical); None: FUSED_OUTPUT.
    """

    def __init__(self, group, table, comm, prefix, fused_output=None):
        self.group, self.table, self.comm, self.prefix = group, table, comm, prefix
        self.fused_output = FUSED_OUTPUT if fused_output is None else fused_output
        # Subclasses set it where recover_index is the identity and no row travels: output_sums then reads the
        # table's rows directly (see UniqueRows).
        self._unique_rows_out = False

    def input_dist(self, ids_per_feature, slot=0, send_after=()):
        """ids: list of int64 [n_f] valid ids, in group order -> GroupDist. `send_after`: tensors the keys all-to-all
        waits for (a pipeline sends the next batch's keys once this batch's rows have arrived)."""
        raise NotImplementedError

    def lookup(self, dists, training):
        """Reads the rows of one or several dists (micro-batches of one batch) with ONE table lookup, so the table's
        trainable handle sees each step once; -> list of float32 [m_i, dim] in each dist's received order."""
        dists = list(dists)
        keys, union_index, index = micro_batch_union([d.keys for d in dists], [d.gather_index for d in dists])
        if union_index is None:
            segments, ids = dists[0].key_segments, dists[0].key_ids
        else:  # a key's category and id are the same in every micro-batch that holds it
            segments, ids = (tf.math.unsorted_segment_max(tf.concat([getattr(d, field) for d in dists], 0),
                                                          union_index, tf.size(keys))
                             for field in ("key_segments", "key_ids"))
        rows = self.table.lookup(keys, segments, ids, training)
        if self._unique_rows_out and len(dists) == 1:
            return [UniqueRows(rows, index[0])]
        return gather_per_micro_batch(rows, index)

    def output_dist(self, rows, dist, slot=0):
        """Rows in received order -> list of float32 [n_f, dim], one per feature in group order."""
        return self._recover(self.output_buffer(rows, dist, slot), dist)

    def output_sums(self, rows, dist, segments, num_segments, slot=0):
        """output_dist, then each feature's rows summed into its output rows: rows in received order -> list, one per
        feature in group order, of unsorted_segment_sum(feature's rows, segments[f], num_segments[f]) (segments:
        int64 [n_f] per feature; num_segments: int64 scalars). One op, or the chain, bit-identical."""
        if isinstance(rows, UniqueRows):  # the gather to received order, composed into the combine's index
            return ops.gather_segment_sum(rows.rows, rows.index, segments, num_segments, name="combine")
        buffer = self.output_buffer(rows, dist, slot)
        if self.fused_output:
            return ops.gather_segment_sum(buffer, dist.recover_index, segments, num_segments, name="combine")
        return [tf.math.unsorted_segment_sum(r, s, n)
                for r, s, n in zip(self._recover(buffer, dist), segments, num_segments)]

    def output_buffer(self, rows, dist, slot=0):
        """Rows in received order -> the rows recover_index counts (those back from the embeddings all-to-all)."""
        return self._send_rows(rows, dist, slot)

    def _send_rows(self, rows, dist, slot):
        return self._route.send_rows(rows, dist.received_splits, slot_name(self.prefix, "embeddings", slot))

    def _recover(self, buffer, dist):
        """The send buffer's rows (as recover_index counts them) -> the fused layout, split per feature."""
        fused = tf.gather(buffer, dist.recover_index)
        return tf.split(fused, dist.feature_sizes, num=len(self.group.feature_names), axis=0)

    def _no_hot(self):
        """The hot fields of a GroupDist without replication."""
        return (tf.zeros([0], tf.int64), tf.zeros([0], tf.int32),
                tf.zeros([len(self.group.feature_names)], tf.int64))


class FusedGroupLookup(GroupLookup):
    """FusedRec: (category, id) pairs travel, and the owner builds the table keys (deferred hashing).

    Args:
      dedup: "segment" (segment unique before sending) or "none" (send duplicates; the owner still deduplicates).
      fused_sender: with segment dedup over an all-to-all, send through FusedSender (one op) rather than ChainSender
        (the op chain it replaces, bit-identical); None: FUSED_SENDER.
      hot: a HotReplica (hot-row replication): its pairs are served from every worker's copy and never sent. With
        the fused sender, one op (ops.fused_sender_hot) also classifies the unique pairs and sends the cold ones;
        otherwise the dedup, the classification and the route are separate ops (its reference).
    """

    def __init__(self, group, table, comm, prefix, dedup="segment", fused_sender=None, hot=None, fused_output=None):
        super().__init__(group, table, comm, prefix, fused_output)
        self.hot = hot
        wire = PackedWire(group.num_categories) if group.encoding == "packed" else PairWire()
        self._route = LocalRoute() if comm.size == 1 else AllToAllRoute(comm, wire)
        # One worker deduplicates once, on the owner: a sender unique would only repeat it.
        self._dedup = segment_dedup if dedup == "segment" and comm.size > 1 else no_dedup
        self._sent_are_looked_up = dedup == "segment" and comm.size == 1
        # The fused ops (FusedSender, or fused_sender_hot with a hot set) deduplicate: segment dedup only.
        fused = bool(FUSED_SENDER if fused_sender is None else fused_sender) and self._dedup is segment_dedup
        self._fused_hot = fused and hot is not None
        if fused and hot is None:
            self._sender = FusedSender(comm, wire, group.num_categories)
        else:
            self._sender = ChainSender(self._dedup, self._route, group.num_categories,
                                       count_sent=not self._sent_are_looked_up)
        self._wire = wire
        # One worker without a hot set: no_dedup and LocalRoute make recover_index the identity; rows go straight
        # from the table to the combine op (UniqueRows).
        self._unique_rows_out = comm.size == 1 and hot is None and self.fused_output

    def input_dist(self, ids_per_feature, slot=0, send_after=()):
        keys, segments, feature_sizes = fuse(ids_per_feature, self.group.feature_categories)
        name = slot_name(self.prefix, "keys", slot)
        if self.hot is None:
            ids, received_segments, splits, recover_index, sent = self._sender.send_keys(keys, segments, name,
                                                                                         send_after)
            hot = self._no_hot()
        else:
            send_cold = self._send_cold_keys_fused if self._fused_hot else self._send_cold_keys
            ids, received_segments, splits, recover_index, sent, hot = send_cold(
                keys, segments, feature_sizes, name, slot, send_after)
        owner = self._owner_unique(ids, received_segments)
        sent = owner[-1] if self._sent_are_looked_up else sent
        return GroupDist(*owner[:4], splits, recover_index, feature_sizes, sent, owner[-1], *hot)

    def lookup(self, dists, training):
        """As GroupLookup.lookup; with a hot set, per dist (cold rows in received order, hot rows of its local hot
        pairs): one read of each table."""
        dists = list(dists)
        cold = super().lookup(dists, training)
        return cold if self.hot is None else list(zip(cold, self.hot.lookup(dists, training)))

    def output_buffer(self, rows, dist, slot=0):
        """As GroupLookup.output_buffer; with a hot set, rows are (cold, hot): the cold rows travel back, the local
        hot rows follow them in the buffer recover_index counts."""
        if self.hot is None:
            return super().output_buffer(rows, dist, slot)
        cold, hot = rows
        return tf.concat([self._send_rows(cold, dist, slot), hot], axis=0)

    def _send_cold_keys(self, keys, segments, feature_sizes, name, slot, send_after):
        """The sender with a hot set: dedup, classify the unique pairs, send the cold ones only. -> (received ids,
        received segments, received_splits, recover_index into [cold rows received, then the local hot rows], pairs
        sent per category, (hot_keys, hot_index, hot_hits))."""
        num_categories, num_features = self.group.num_categories, len(self.group.feature_names)
        fused_features = indexing.repeat(tf.range(num_features, dtype=tf.int32), feature_sizes,
                                         row_ids=ops.row_ids)
        keys, segments, inverse = self._dedup(keys, segments)
        with tf.name_scope("hot_split"):
            hot_keys = self.hot.hot_set.keys.read_value()  # read once: classify and touched see the same set
            position, is_hot = self.hot.classify(keys, segments, hot_keys, self.group)
            is_cold = tf.logical_not(is_hot)
            cold_at, hot_at = indexing.true_positions(is_cold), indexing.true_positions(is_hot)
            cold_keys, cold_segments = tf.gather(keys, cold_at), tf.gather(segments, cold_at)
            num_cold = tf.size(cold_keys, out_type=tf.int32)
        ids, received_segments, splits, recover_cold = self._route.send_keys(
            cold_keys, cold_segments, tf.range(num_cold), name, send_after)
        with tf.name_scope("hot_rows"):
            hot_position = tf.gather(position, hot_at)
            touched_keys, hot_index = self.hot.touched(hot_position, hot_keys, self.comm,
                                                       slot_name(self.prefix, "hot", slot))
            # The rows output_dist sees: the cold rows back from the owners (send-buffer order), then the hot rows.
            buffer_position = tf.dynamic_stitch(
                [tf.cast(cold_at, tf.int32), tf.cast(hot_at, tf.int32)],
                [recover_cold, num_cold + tf.range(tf.size(hot_position))])
            recover_index = tf.gather(buffer_position, inverse)
            hot_hits = _count(indexing.masked(tf.gather(is_hot, inverse), fused_features), num_features)
        return (ids, received_segments, splits, recover_index, _count(cold_segments, num_categories),
                (touched_keys, hot_index, hot_hits))

    def _send_cold_keys_fused(self, keys, segments, feature_sizes, name, slot, send_after):
        """_send_cold_keys with one op before the keys all-to-all (ops.fused_sender_hot): the same outputs, bit for
        bit, without the chain's dedup, classification and partition as separate ops and their gathers."""
        hot_keys = self.hot.hot_set.keys.read_value()  # read once: the sender and touched see the same set
        out = ops.fused_sender_hot(keys, segments, hot_keys, self.comm.size, self.group.num_categories,
                                   self._wire.name, feature_sizes=feature_sizes, name="fused_sender_hot")
        ids, received_segments, splits = send_message(self.comm, self._wire, out.message, out.splits, name,
                                                      send_after)
        with tf.name_scope("hot_rows"):
            touched_keys, hot_index = self.hot.touched(out.hot_position, hot_keys, self.comm,
                                                       slot_name(self.prefix, "hot", slot))
        return (ids, received_segments, splits, out.recover_index, out.segment_counts,
                (touched_keys, hot_index, out.hot_hits))

    def _owner_unique(self, ids, received_segments):
        """Category-aware unique of the received pairs -> (keys, key_segments, key_ids, gather_index, looked_up)."""
        num_categories = self.group.num_categories
        unique = ops.category_unique(ids, received_segments, num_categories, self.group.encoding,
                                     name="category_unique")
        if self.group.encoding == "packed":
            _, key_ids = ops.decode_unified_keys(unique.unified_keys, num_categories)
        else:
            key_ids = tf.math.unsorted_segment_max(ids, unique.inverse, tf.size(unique.unified_keys))
        looked_up = tf.cast(unique.segment_counts, tf.int64)
        return unique.unified_keys, unique.unique_segment_ids, key_ids, unique.inverse, looked_up


def classify_hot(keys, segments, hot_keys, num_categories, encoding):
    """Which (id, category) pairs are in a hot set: -> (position int32 [n] in hot_keys where the pair's unified key
    is or would be inserted, is_hot bool [n]). hot_keys: the set's sorted unified keys."""
    unified = unified_keys(keys, segments, num_categories, encoding)
    position = tf.searchsorted(hot_keys, unified, side="left", out_type=tf.int32)
    padded = tf.concat([hot_keys, tf.zeros([1], tf.int64)], axis=0)
    return position, tf.logical_and(position < tf.size(hot_keys, out_type=tf.int32),
                                    tf.gather(padded, position) == unified)


def unified_keys(keys, segments, num_categories, encoding):
    """The table key of each (id, category) pair, formed as category_unique forms it (without the unique)."""
    if encoding == "packed":
        return PackedWire(num_categories).encode(keys, segments)
    salt = initializers.mix64(tf.cast(segments, tf.int64) + tf.constant(_GOLDEN, tf.int64))
    return initializers.mix64(tf.bitwise.bitwise_xor(keys, salt))


_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # category_unique's hashed encoding constant, as a signed int64


class HotReplica:
    """Hot-row replication (HypeReca §2.4, §4.2) of one group, as a part of its FusedGroupLookup: the pairs of the
    group's hot set are served from every worker's own copy of their rows (`table`); the rest is sharded and routed as
    without it.

    The lookup's sender classifies its unique pairs by looking their unified keys up in the hot set (sorted keys,
    equal on every worker): hot pairs never enter the keys or embeddings all-to-all. One small allreduce of a flag per
    hot row (named {prefix}/hot/slot{slot}) tells every worker which hot rows some worker's batch touches; lookup reads
    exactly those rows (the same keys, in the same order, on every worker), so their gradients can be averaged with
    the dense ones (fr.train.GroupedOptimizer) and the optimizer updates the rows a sharded table would update, no
    others: SGD, Adagrad and Adam give the sharded results.

    Args:
      hot_set: replication.HotSet of the group (sorted unified keys, their ids and categories).
      table: EmbeddingTable of the replicated rows on this worker (same initializer and salts as the sharded one).
    """

    def __init__(self, hot_set, table):
        self.hot_set, self.table = hot_set, table

    def classify(self, keys, segments, hot_keys, group):
        """hot_keys: the hot set's keys, read -> (position int32 [n] of each pair in them, is_hot bool [n]). An empty
        hot set (R = 0 chosen) skips the hashing and the search: every pair is cold (equal on every worker, so is the
        branch taken)."""
        return tf.cond(tf.size(hot_keys) > 0,
                       lambda: classify_hot(keys, segments, hot_keys, group.num_categories, group.encoding),
                       lambda: (tf.zeros_like(keys, tf.int32), tf.zeros_like(keys, tf.bool)))

    def touched(self, hot_position, hot_keys, comm, name):
        """hot_position: int32 [h], each local hot pair's position in hot_keys (the hot set's keys, read) ->
        (touched_keys int64 [T]: the hot keys some worker's batch touches, equal on every worker; hot_index int32 [h]:
        each local hot pair's position in them)."""
        num_hot = tf.size(hot_keys, out_type=tf.int32)
        touched = tf.math.unsorted_segment_sum(tf.ones_like(hot_position, tf.float32), hot_position, num_hot)
        if comm.size > 1:  # which hot rows does any worker touch (no collective round for an empty set)
            flags = touched
            touched = tf.cond(num_hot > 0, lambda: comm.allreduce([flags], name=name, op="sum")[0], lambda: flags)
        touched = touched > 0
        return indexing.masked(touched, hot_keys), tf.gather(tf.cumsum(tf.cast(touched, tf.int32)) - 1, hot_position)

    def lookup(self, dists, training):
        """-> per dist, the hot rows of its local hot pairs, with one read of the replicated table."""
        keys, _, index = micro_batch_union([d.hot_keys for d in dists], [d.hot_index for d in dists])
        at = tf.searchsorted(self.hot_set.keys.read_value(), keys, side="left", out_type=tf.int32)
        rows = self.table.lookup(keys, tf.gather(self.hot_set.segments, at), tf.gather(self.hot_set.ids, at),
                                 training)
        return gather_per_micro_batch(rows, index)


class SourceHashGroupLookup(GroupLookup):
    """The ablation: the category is hashed into the key on the sender (one unique there), the owner sees keys only.

    Packed keys still carry the category, so new rows start where FusedGroupLookup's do. Hashed keys do not: their
    initial rows come from the fused key itself (deterministic, but not the per-feature rows).
    """

    def __init__(self, group, table, comm, prefix, fused_output=None):
        super().__init__(group, table, comm, prefix, fused_output)
        self._route = LocalRoute() if comm.size == 1 else AllToAllRoute(comm, KeyWire())

    def input_dist(self, ids_per_feature, slot=0, send_after=()):
        num_categories = self.group.num_categories
        keys, segments, feature_sizes = fuse(ids_per_feature, self.group.feature_categories)
        fused = ops.category_unique(keys, segments, num_categories, self.group.encoding, name="source_hash_unique")
        received, _, splits, recover_index = self._route.send_keys(
            fused.unified_keys, None, fused.inverse, slot_name(self.prefix, "keys", slot), send_after)
        unified, inverse = tf.unique(received, out_idx=tf.int32)
        if self.group.encoding == "packed":
            key_segments, key_ids = ops.decode_unified_keys(unified, num_categories)
        else:
            key_segments, key_ids = tf.zeros_like(unified, tf.int32), unified  # category 0's salt, as before
        unknown = tf.fill([num_categories], tf.constant(-1, tf.int64))
        return GroupDist(unified, key_segments, key_ids, inverse, splits, recover_index, feature_sizes,
                         _count(fused.unique_segment_ids, num_categories), unknown, *self._no_hot())


def make_group_lookup(group, table, comm, prefix, dedup="segment", fusion="deferred", hot=None, fused_sender=None):
    """The lookup object of a group for the layer's dedup and fusion choices; hot: (HotSet, hot EmbeddingTable) to
    replicate the group's hot set (fusion "deferred" only); fused_sender: FusedGroupLookup's (None: FUSED_SENDER)."""
    if hot is not None and fusion != "deferred":
        raise ValueError(f"group {group.name}: hot-row replication needs fusion='deferred', got {fusion!r}")
    if fusion == "source_hash":
        return SourceHashGroupLookup(group, table, comm, prefix)
    return FusedGroupLookup(group, table, comm, prefix, dedup=dedup, fused_sender=fused_sender,
                            hot=None if hot is None else HotReplica(*hot))
