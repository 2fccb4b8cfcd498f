"""GRM (MTGRBoost, shared/seeds/004 sec. 2): HSTU blocks over a user's jagged sequence and an MMoE multi-task head.

    embedding = fr.FusedEmbedding([fr.Feature("items", 32), fr.Feature("target", 32), fr.Feature("device", 8)])
    model = GRM(embedding, sequence_feature="items")
    logits = model({"items": ragged_ids,          # int64 tf.RaggedTensor [B, None], rows may be empty
                    "target": ids, "device": ids})  # int64 [B] each
    # logits: float32 [B, 2] (click, conversion)

**Sequence.** The sequence feature is embedded with ``combiner=None`` (ragged ``[B, None, d]``); the blocks work on
its flat values ``X: [T, d]`` (``T`` the batch's total tokens) and row splits, never on a ``[B, Lmax, .]`` padding.

**HSTU block** (Zhai et al. 2024, seed 004 eq. 1-3), for each block and ``X: [T, d]``:

    U, Q, K, V = Split(SiLU(LayerNorm(X) W1 + b1))                    # each [T, hidden_dim], H heads of hidden_dim / H
    A[i, j]    = SiLU(<Q_i, K_j>_h + bias_h(bucket(i - j))) / n_i       # only for j <= i in the same sequence
    O_i        = sum_j A[i, j] V_j                                      # per head, [T, hidden_dim]
    X         <- X + (LayerNorm(O) * U) W2 + b2                         # [T, d]

The input LayerNorm is the official HSTU code's (the paper's MLP(E)); there is no 1/sqrt(d) scaling (pointwise
SiLU, not softmax, attention). ``n_i`` (``attention_norm``): ``"causal"`` divides by ``i + 1``, the number of keys
position ``i`` sees, so a position's state depends on the items up to it only (dividing by the sequence's length
would tell each position how many items follow it); an int ``N`` divides by ``N`` (the HSTU code's fixed maximum
length). ``bucket(d) = min(floor(log2(d + 1)), position_buckets - 1)`` is a learned per-head bias of the relative
distance (zero-initialised; ``position_buckets=0``: none).

**Padding-free attention.** ``ops.ragged_causal_attention`` (one op each way, cc/kernels/ragged_attention_op.cc)
computes it sequence by sequence on the flat tokens and the row splits: time ``O(sum_b L_b^2 * hidden_dim)``, not
``O(B Lmax^2)``, memory ``O(T * hidden_dim)``: a batch of one long sequence and many short ones costs what its pairs
cost, and every sequence's states equal those it gets alone. It replaced the pair-list form (still here as
:func:`causal_pairs`, the tests' reference): the (query, key) pairs ``j <= i`` listed from the row splits, scores as
dot products of the gathered Q and K rows, outputs a segment sum of ``A * V[key]``, whose ``[pairs, heads,
head_dim]`` temporaries took about 90% of a training step (benchmarks/profiling/grm_op_profile.py, benchmarks/results/grm/profile).

**Pooling** (``pooling``): ``"last"`` (default) takes the last item's state, which has seen the whole history
through the causal attention; ``"mean"`` averages the states of a sequence. An empty sequence pools to zeros (the
head then sees its context only).

**MMoE head.** ``h = [pooled, context embeddings (by feature name)]``; ``experts`` MLPs (``expert_units``, ReLU);
per task a softmax gate ``g_t = softmax(h Wg_t)`` over all experts (dense MMoE, not the paper's top-k) and a tower
MLP (``tower_units``, then one logit) on ``sum_e g_t[e] expert_e(h)``. ``call`` returns the tasks' logits
``[B, num_tasks]``.
"""

import collections

import tensorflow as tf

from tf_fusedrec import ops
from tf_fusedrec.layers.protocol import unconverted
from tf_fusedrec.models import _blocks
from tf_fusedrec.ops import indexing

TASKS = ("click", "conversion")
POOLINGS = ("last", "mean")

CausalPairs = collections.namedtuple("CausalPairs", ["query", "key", "bucket", "normalizer"])
CausalPairs.__doc__ = """The causal attention pairs of a ragged batch, from :func:`causal_pairs`.

Attributes:
  query: int64 [P], the flat token index i of each pair (sorted).
  key: int64 [P], the flat token index j <= i of the same sequence.
  bucket: int32 [P], the relative-position bucket of i - j (zeros without buckets).
  normalizer: float32 [P], n_i of the pair's query.
"""


def causal_pairs(row_splits, position_buckets=0, attention_norm="causal", name=None):
    """The (query, key) pairs ``j <= i`` within each sequence of a ragged batch: ``P = sum_b L_b (L_b + 1) / 2``.

    Args:
      row_splits: int32/int64 [B + 1], the sequences' row splits over T flat tokens.
      position_buckets: number of log-spaced relative-position buckets (0: every bucket is 0).
      attention_norm: "causal" (``n_i = i + 1``, i the position in its sequence) or a positive int N.
      name: name scope.

    Returns:
      CausalPairs of [P] tensors.
    """
    with tf.name_scope(name or "causal_pairs"):
        row_splits = tf.cast(row_splits, tf.int64)
        rows = indexing.rows_of(row_splits)  # [T]
        starts = tf.gather(row_splits, rows)  # [T], the first token of each token's sequence
        tokens = tf.range(row_splits[-1])
        keys = tf.ragged.range(starts, tokens + 1)  # [T, None]: the keys each query sees
        query, key = indexing.rows_of(keys.row_splits), keys.flat_values
        distance = query - key
        bucket = tf.zeros_like(distance, tf.int32)
        for k in range(1, position_buckets):  # floor(log2(d + 1)), capped: exact integer comparisons
            bucket += tf.cast(distance + 1 >= 2**k, tf.int32)
        if attention_norm == "causal":
            normalizer = tf.cast(tf.gather(tokens - starts, query) + 1, tf.float32)
        else:
            normalizer = tf.fill(tf.shape(query), tf.constant(float(attention_norm), tf.float32))
        return CausalPairs(query, key, bucket, normalizer)


class HSTUBlock(tf.keras.layers.Layer):
    """One HSTU block on flat tokens (see the module docstring).

    Args:
      dim: d, the width of the token states (the sequence feature's embedding dim).
      hidden_dim: width of each of U, Q, K, V; a multiple of num_heads.
      num_heads: H.
      position_buckets: relative-position buckets of the attention bias (0: none).
      attention_norm: "causal" or a positive int (the module docstring's n_i).
      seed: seed of the kernel initialisers.

    Call:
      x: float32 [T, dim], the flat token states.
      row_splits: int64 [B + 1], the sequences' offsets into the T tokens.

    Returns:
      float32 [T, dim].
    """

    def __init__(self, dim, hidden_dim, num_heads=1, position_buckets=0, attention_norm="causal", seed=0, name=None,
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.dim, self.hidden_dim, self.num_heads = dim, hidden_dim, num_heads
        self.position_buckets, self.score_norm = position_buckets, attention_norm  # attention_norm is the LayerNorm
        self.input_norm = tf.keras.layers.LayerNormalization(epsilon=1e-6, name="input_norm")
        self.uqkv = tf.keras.layers.Dense(4 * hidden_dim, name="uqkv",
                                          kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed))
        self.attention_norm = tf.keras.layers.LayerNormalization(epsilon=1e-6, name="attention_norm")
        self.output_projection = tf.keras.layers.Dense(
            dim, name="output", kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + 1))

    def build(self, input_shape):
        self.position_bias = None
        if self.position_buckets:
            # Keywords: Keras 3's add_weight takes the shape first, tf_keras' the name.
            self.position_bias = self.add_weight(name="position_bias", shape=[self.position_buckets, self.num_heads],
                                                 initializer="zeros")
        super().build(input_shape)

    @unconverted
    def call(self, x, row_splits):
        heads, head_dim = self.num_heads, self.hidden_dim // self.num_heads
        uqkv = tf.nn.silu(self.uqkv(self.input_norm(x)))
        u, q, k, v = tf.split(uqkv, 4, axis=-1)  # [T, hidden_dim] each
        q, k, v = (tf.cast(tf.reshape(t, [-1, heads, head_dim]), tf.float32) for t in (q, k, v))
        bias = None if self.position_bias is None else tf.cast(self.position_bias, tf.float32)
        attended = ops.ragged_causal_attention(q, k, v, row_splits, bias, self.score_norm)  # [T, H, head_dim]
        attended = tf.cast(tf.reshape(attended, [-1, self.hidden_dim]), x.dtype)
        return x + self.output_projection(self.attention_norm(attended) * u)


class MMoE(tf.keras.layers.Layer):
    """Multi-gate mixture of experts (Ma et al. 2018): shared experts, one softmax gate and one tower per task.

    Args:
      num_tasks: number of task logits.
      experts: number of expert MLPs.
      expert_units: widths of each expert (ReLU throughout).
      tower_units: widths of each task tower before its logit.
      seed: seed of the kernel initialisers.

    Call:
      h: float32 [B, features].

    Returns:
      float32 [B, num_tasks] logits.
    """

    def __init__(self, num_tasks, experts=4, expert_units=(64, 32), tower_units=(16,), seed=0, name=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self.experts = [_blocks.mlp(expert_units, f"expert_{e}", seed=seed + 100 * e) for e in range(experts)]
        self.gates = [tf.keras.layers.Dense(experts, activation="softmax", name=f"gate_{t}",
                                            kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 5000 + t))
                      for t in range(num_tasks)]
        self.towers = [_blocks.mlp(list(tower_units) + [1], f"tower_{t}", last_activation=None,
                                   seed=seed + 6000 + 100 * t) for t in range(num_tasks)]

    @unconverted
    def call(self, h):
        expert_outputs = tf.stack([expert(h) for expert in self.experts], axis=1)  # [B, E, units]
        logits = []
        for gate, tower in zip(self.gates, self.towers):
            mixed = tf.einsum("be,beu->bu", gate(h), expert_outputs)
            logits.append(tower(mixed)[:, 0])
        return tf.stack(logits, axis=1)


class GRM(tf.keras.Model):
    """Generative recommender: HSTU blocks over the sequence feature, an MMoE head over it and the contexts.

    Args:
      embedding: FusedEmbedding or PerFeatureEmbedding. The sequence feature must have combiner None; every other
        feature is a context feature with one id per example (combiner None, ids [B]; a multi-hot context needs a
        combiner).
      sequence_feature: name of the sequence feature.
      num_blocks: HSTU blocks.
      hidden_dim: width of each of U, Q, K, V (a multiple of num_heads).
      num_heads: attention heads.
      position_buckets: relative-position buckets of the attention bias (0: none).
      attention_norm: "causal" or a positive int (see the module docstring).
      pooling: "last" or "mean".
      experts, expert_units, tower_units: the MMoE head.
      tasks: task names; the logits' columns.
      seed: seed of the dense initialisers.

    Call:
      inputs: dict feature name -> ids: the sequence feature a tf.RaggedTensor [B, None], the others [B].
      training: passed to the embedding layer.

    Returns:
      float32 [B, len(tasks)] logits.
    """

    def __init__(self, embedding, sequence_feature="items", num_blocks=2, hidden_dim=32, num_heads=2,
                 position_buckets=16, attention_norm="causal", pooling="last", experts=4, expert_units=(64, 32),
                 tower_units=(16,), tasks=TASKS, seed=0, name="grm"):
        super().__init__(name=name)
        features = {f.name: f for f in embedding.features}
        if sequence_feature not in features:
            raise ValueError(f"{name}: sequence_feature {sequence_feature!r} is not a feature of the embedding "
                             f"({sorted(features)})")
        if features[sequence_feature].combiner is not None:
            raise ValueError(f"{name}: the sequence feature {sequence_feature!r} needs combiner None (one embedding "
                             f"per item), got {features[sequence_feature].combiner!r}")
        for arg, value in (("num_blocks", num_blocks), ("hidden_dim", hidden_dim), ("num_heads", num_heads),
                           ("experts", experts)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: {arg} must be a positive int, got {value!r}")
        if hidden_dim % num_heads:
            raise ValueError(f"{name}: hidden_dim ({hidden_dim}) must be a multiple of num_heads ({num_heads})")
        if isinstance(position_buckets, bool) or not isinstance(position_buckets, int) or position_buckets < 0:
            raise ValueError(f"{name}: position_buckets must be an int >= 0, got {position_buckets!r}")
        if attention_norm != "causal" and (isinstance(attention_norm, bool) or not isinstance(attention_norm, int)
                                           or attention_norm <= 0):
            raise ValueError(f"{name}: attention_norm must be 'causal' or a positive int, got {attention_norm!r}")
        if pooling not in POOLINGS:
            raise ValueError(f"{name}: pooling must be one of {POOLINGS}, got {pooling!r}")
        if not tasks:
            raise ValueError(f"{name}: tasks must name at least one task")
        self.embedding = embedding
        self.sequence_feature = sequence_feature
        self.context_features = sorted(n for n in features if n != sequence_feature)
        self.position_buckets, self.attention_norm, self.pooling = position_buckets, attention_norm, pooling
        self.tasks = tuple(tasks)
        dim = features[sequence_feature].dim
        self.blocks = [HSTUBlock(dim, hidden_dim, num_heads, position_buckets, attention_norm, seed=seed + 10 * i,
                                 name=f"hstu_{i}") for i in range(num_blocks)]
        self.head = MMoE(len(self.tasks), experts, expert_units, tower_units, seed=seed + 1000, name="mmoe")

    def _embed(self, inputs, training):
        outputs = _blocks.compute_dtype(self.embedding(_blocks.sparse_inputs(inputs), training=training),
                                        self.compute_dtype)
        sequence = outputs[self.sequence_feature]
        if not isinstance(sequence, tf.RaggedTensor):
            raise ValueError(f"{self.name}: feature {self.sequence_feature!r} must be fed as a tf.RaggedTensor "
                             f"[B, None] of ids, got a dense tensor of shape {inputs[self.sequence_feature].shape}")
        return sequence, outputs

    def _states(self, sequence):
        x, splits = sequence.flat_values, sequence.row_splits
        for block in self.blocks:
            x = block(x, splits)
        return x, splits

    def sequence_states(self, inputs, training=None):
        """The last block's states of every item: float32 tf.RaggedTensor [B, None, dim] (rows as the input's)."""
        sequence, _ = self._embed(inputs, training)
        x, splits = self._states(sequence)
        return tf.RaggedTensor.from_row_splits(x, splits, validate=False)

    def _pool(self, x, splits):
        splits = tf.cast(splits, tf.int64)
        lengths = splits[1:] - splits[:-1]
        if self.pooling == "mean":
            rows = indexing.rows_of(splits)
            sums = tf.math.unsorted_segment_sum(x, rows, num_segments=tf.size(lengths, out_type=tf.int64))
            return sums / tf.cast(tf.maximum(lengths, 1), x.dtype)[:, None]
        # An empty row reads the zero row appended after the T tokens.
        padded = tf.pad(x, [[0, 1], [0, 0]])
        last = tf.where(lengths > 0, splits[1:] - 1, tf.shape(x, out_type=tf.int64)[0])
        return tf.gather(padded, last)

    @unconverted
    def call(self, inputs, training=None):
        sequence, outputs = self._embed(inputs, training)
        x, splits = self._states(sequence)
        pooled = self._pool(x, splits)  # [B, dim]
        h = tf.concat([pooled] + [outputs[n] for n in self.context_features], axis=1)
        return _blocks.logits(self.head(h))
