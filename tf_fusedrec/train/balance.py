"""Token-balanced batches, global-count loss weighting and gradient accumulation (MTGRBoost, shared/seeds/004 §5).

User sequences have long-tailed lengths: with a fixed number of samples per worker, every step waits for the worker
that drew the longest sequences. Three pieces fix that without changing what is learned:

* :class:`TokenBatcher` (§5.1, Algorithm 1, dynamic sequence batching) cuts each worker's stream of samples into
  batches whose token counts are closest to a target, so workers get different numbers of samples with similar
  token counts. :func:`fixed_batches` is the unbalanced baseline, :func:`to_dataset` turns either into a
  ``tf.data.Dataset`` of ragged batches.
* Global-count weighting. Each worker's loss is its *sum* of per-item losses times ``N / G``, where N is the number
  of workers and G the number of items (samples or tokens) of all workers' batches of the step, one small allreduce
  (:func:`global_count`). :class:`fr.train.GroupedOptimizer` averages dense gradients over workers (sum x 1/N) and
  scales the embedding rows' gradients, which the embeddings all-to-all has summed over workers, by 1/N. The update
  is then ``(1/G) * sum over every item of every worker of grad l_i``: ONE worker's update on the union of the
  batches with the global-mean loss, whatever the local batch sizes (:class:`GlobalMeanLoss`).
* :class:`Accumulator` (§5.2, gradient accumulation) sums dense gradients and embedding-row gradients per id over K
  micro-batches trained in separate steps and applies them once: the update of one step on the union of the K
  micro-batches (and of every worker's K micro-batches) with the global-mean loss.

Weighting by samples counts each sample once (G = samples of the step); weighting by tokens counts each sequence
token once (G = tokens of the step), the mean of per-token losses. Both are exact in the sense above; the
distributed equality test (tests/distributed/test_balance.py) checks both.

The summary helpers :func:`token_imbalance` and :func:`samples_per_worker` take per-step, per-worker counts, which
:func:`worker_counts` (one allgather) collects.
"""

import collections
import collections.abc
import itertools

import numpy as np
import tensorflow as tf
from tensorflow_recommenders_addons import dynamic_embedding as de

from tf_fusedrec.distributed import comm as comm_lib
from tf_fusedrec.distributed.table import check_table_name
from tf_fusedrec.train.optimizer import embedding_layers, scale_gradient

DEFAULT_BUFFER_SIZE = 1024


def _positive_int(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return int(value)


# --- batching --------------------------------------------------------------------------------------------------


def closest_cut(cumulative_tokens, target_tokens):
    """Where Algorithm 1 cuts a buffer: the largest k in [1, n] whose cumulative token count is closest to the target.

    Args:
      cumulative_tokens: int [n], n >= 1, non-decreasing: the cumulative sums of the buffered samples' token counts
        (element j-1 is S_j, the tokens of the first j samples).
      target_tokens: the target token count N.

    Returns:
      k: the batch is the first k samples. Ties: the LARGEST k at the smallest |S_k - N| wins, so a batch ends
      above the target rather than below when both are equally close, and empty sequences (0 tokens) right after
      the cut point join the batch. k is at least 1: when the first sample alone holds more than 2N tokens, S_0 = 0
      would be closest, and the sample becomes a batch on its own (with any empty sequences right behind it).
      Two binary searches (np.searchsorted) over S.
    """
    cumulative = np.concatenate([[0], np.asarray(cumulative_tokens, np.int64)])
    n = len(cumulative) - 1
    # lo: the largest k with S_k <= N (S_0 = 0 <= N, so lo >= 0).
    lo = int(np.searchsorted(cumulative, target_tokens, side="right")) - 1
    if lo == n:
        return n
    over = int(cumulative[lo + 1])  # the smallest S_k above N
    if lo >= 1 and target_tokens - int(cumulative[lo]) < over - target_tokens:
        return lo
    # The end of the plateau S_k == over (empty sequences after the cut point).
    return int(np.searchsorted(cumulative, over, side="right")) - 1


class TokenBatcher:
    """Dynamic sequence batching (MTGRBoost §5.1, Algorithm 1): batches whose token counts are closest to a target.

        batcher = TokenBatcher(target_tokens=4096, tokens_of="history")   # samples: dicts with a "history" list
        for batch in batcher(samples):   # batch: a list of samples, in stream order
            ...

    The batcher keeps a buffer of samples. While the buffer holds fewer than ``target_tokens`` tokens, it reads the
    next ``buffer_size`` samples of the stream into it (a short buffer is merged into the next fill, never emitted
    early). It then takes the cumulative sums S of the buffered token counts, binary-searches the cut k whose S_k
    is closest to the target (:func:`closest_cut`: ties to the larger k, k >= 1), emits the first k samples as a
    batch and keeps the rest for the next batch. When the stream ends with fewer than ``target_tokens`` tokens
    buffered, the rest is emitted as the last batch (smaller than the target; nothing is emitted for an empty
    stream).

    Guarantees: every sample of the stream is in exactly one batch, in stream order (none dropped, none
    duplicated); empty sequences (0 tokens) are kept like any other sample. When no sequence is longer than the
    target, every batch but the last holds between ``target - L/2`` and ``target + L/2`` tokens, L the longest
    sequence: the cut is the closer of the two cumulative sums around the target, which differ by one sample.

    Sequences longer than the target: with ``max_sequence_tokens=None`` (default) they are allowed, never dropped.
    Such a sample of T tokens is a batch of its own (with any empty sequences right behind it) when it comes first
    in the buffer; otherwise it ends the current batch if the samples before it hold at most ``target - T/2``
    tokens (that cut is then the closer one), and starts the next batch, a batch of its own, if not. Set
    ``max_sequence_tokens`` to make a longer sequence an error instead (a ValueError naming its position in the
    stream); the target must then be at least that cap (a ValueError otherwise), so that every sequence allowed fits
    in a batch.

    A stream of empty sequences only is buffered until it ends (0 tokens never reach the target).

    Args:
      target_tokens: N, tokens per batch (e.g. the mean sequence length times the batch size the model fits).
      buffer_size: samples read from the stream per fill (a chunk of Algorithm 1).
      tokens_of: a sample's token count, an int >= 0: a callable (sample -> tokens), or the name of the sequence
        feature of dict samples (len(sample[name])). Default None: len(sample) for samples that are sequences; dict
        samples then raise a ValueError (their len would be their number of features).
      max_sequence_tokens: optional cap on a sample's tokens; a longer one is an error.
    """

    def __init__(self, target_tokens, buffer_size=DEFAULT_BUFFER_SIZE, tokens_of=None, max_sequence_tokens=None):
        self.target_tokens = _positive_int(target_tokens, "TokenBatcher: target_tokens")
        self.buffer_size = _positive_int(buffer_size, "TokenBatcher: buffer_size")
        if tokens_of is None:
            tokens_of = _length_of_sequence
        elif isinstance(tokens_of, str):
            tokens_of = _length_of_feature(tokens_of)
        elif not callable(tokens_of):
            raise ValueError(f"TokenBatcher: tokens_of must be a callable (sample -> tokens) or a feature name, got "
                             f"{tokens_of!r}")
        self.tokens_of = tokens_of
        self.max_sequence_tokens = None
        if max_sequence_tokens is not None:
            self.max_sequence_tokens = _positive_int(max_sequence_tokens, "TokenBatcher: max_sequence_tokens")
            if self.target_tokens < self.max_sequence_tokens:
                raise ValueError(
                    f"TokenBatcher: target_tokens ({self.target_tokens}) is smaller than max_sequence_tokens "
                    f"({self.max_sequence_tokens}), the longest sequence allowed: raise target_tokens to at least "
                    f"{self.max_sequence_tokens}, or lower the cap (or leave it None: a longer sequence is then a "
                    f"batch of its own)")

    def _tokens(self, sample, position):
        tokens = self.tokens_of(sample)
        if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 0:
            raise ValueError(f"TokenBatcher: tokens_of(sample {position} of the stream) must be an int >= 0, got "
                             f"{tokens!r}")
        if self.max_sequence_tokens is not None and tokens > self.max_sequence_tokens:
            raise ValueError(f"TokenBatcher: sample {position} of the stream holds {tokens} tokens, more than "
                             f"max_sequence_tokens={self.max_sequence_tokens}")
        return int(tokens)

    def __call__(self, stream):
        """Yields the batches of `stream` (an iterable of samples): lists of samples, in stream order."""
        source = iter(stream)
        samples, tokens = [], []
        buffered, read, ended = 0, 0, False
        while True:
            while buffered < self.target_tokens and not ended:
                chunk = list(itertools.islice(source, self.buffer_size))
                ended = len(chunk) < self.buffer_size
                for sample in chunk:
                    t = self._tokens(sample, read)
                    read += 1
                    samples.append(sample)
                    tokens.append(t)
                    buffered += t
            if buffered < self.target_tokens:  # the stream has ended
                if samples:
                    yield samples
                return
            k = closest_cut(np.cumsum(tokens), self.target_tokens)
            batch, samples = samples[:k], samples[k:]
            buffered -= sum(tokens[:k])
            tokens = tokens[k:]
            yield batch


def _length_of_sequence(sample):
    if isinstance(sample, collections.abc.Mapping):
        raise ValueError(f"TokenBatcher: the samples are dicts (features {sorted(sample)}): pass tokens_of=<the name "
                         f"of the sequence feature> or a callable")
    return len(sample)


def _length_of_feature(name):
    def length(sample):
        try:
            return len(sample[name])
        except (KeyError, TypeError, IndexError) as e:
            raise ValueError(f"TokenBatcher: tokens_of='{name}': a sample has no sequence feature '{name}' "
                             f"(got {type(sample).__name__})") from e

    return length


def fixed_batches(stream, batch_size):
    """The unbalanced baseline: consecutive batches of `batch_size` samples; the last one holds the remainder (it is
    emitted, never dropped). Yields lists of samples."""
    batch_size = _positive_int(batch_size, "fixed_batches: batch_size")
    source = iter(stream)
    while True:
        batch = list(itertools.islice(source, batch_size))
        if not batch:
            return
        yield batch


def batch_signature(sequences=None, scalars=None, row_splits_dtype=tf.int64):
    """The tf.data signature of collated batches.

    Args:
      sequences: dict name -> dtype of features each sample holds as a 1-D sequence (any length, 0 included):
        batched as tf.RaggedTensor [B, None].
      scalars: dict name -> dtype of features each sample holds as one value: batched as [B].
      row_splits_dtype: of the ragged tensors.

    Returns:
      dict name -> tf.RaggedTensorSpec / tf.TensorSpec.
    """
    sequences, scalars = dict(sequences or {}), dict(scalars or {})
    both = sorted(set(sequences) & set(scalars))
    if both:
        raise ValueError(f"batch_signature: feature '{both[0]}' is both a sequence and a scalar")
    if not sequences and not scalars:
        raise ValueError("batch_signature: no features (give sequences and/or scalars)")
    signature = {n: tf.RaggedTensorSpec([None, None], tf.as_dtype(d), 1, row_splits_dtype)
                 for n, d in sequences.items()}
    signature.update({n: tf.TensorSpec([None], tf.as_dtype(d)) for n, d in scalars.items()})
    return signature


def _check_signature(signature):
    for name, spec in signature.items():
        ragged = isinstance(spec, tf.RaggedTensorSpec) and spec.shape.rank == 2 and spec.ragged_rank == 1
        dense = isinstance(spec, tf.TensorSpec) and spec.shape.rank is not None and spec.shape.rank >= 1
        if not (ragged or dense):
            raise ValueError(f"signature: feature '{name}' must be a tf.RaggedTensorSpec([None, None], ...) with "
                             f"ragged_rank 1 or a tf.TensorSpec([None, ...]), got {spec!r}")


def collate(batch, signature):
    """A list of sample dicts -> dict name -> tensor: sequences as tf.RaggedTensor [B, None], the rest stacked.

    Args:
      batch: list of samples, each a dict holding every feature of `signature`.
      signature: what batch_signature returns.
    """
    _check_signature(signature)
    out = {}
    for name, spec in signature.items():
        dtype = spec.dtype.as_numpy_dtype
        try:
            values = [sample[name] for sample in batch]
        except (KeyError, TypeError) as e:
            missing = next(i for i, s in enumerate(batch) if not isinstance(s, dict) or name not in s)
            raise ValueError(f"collate: sample {missing} of the batch has no feature '{name}'") from e
        if isinstance(spec, tf.RaggedTensorSpec):
            rows = [np.asarray(v, dtype) for v in values]
            bad = next((i for i, r in enumerate(rows) if r.ndim != 1), None)
            if bad is not None:
                raise ValueError(f"collate: feature '{name}' of sample {bad} must be a 1-D sequence, got shape "
                                 f"{list(rows[bad].shape)}")
            lengths = np.array([len(r) for r in rows], spec.row_splits_dtype.as_numpy_dtype)
            flat = np.concatenate(rows) if rows else np.zeros([0], dtype)
            out[name] = tf.RaggedTensor.from_row_lengths(flat, lengths, validate=False)
        else:
            stacked = np.asarray(values, dtype)
            if not spec.shape[1:].is_compatible_with(stacked.shape[1:]):
                raise ValueError(f"collate: feature '{name}' has per-sample shape {list(stacked.shape[1:])}, the "
                                 f"signature says {spec.shape[1:].as_list()}")
            out[name] = tf.constant(stacked.reshape([len(batch)] + list(stacked.shape[1:])))
    return out


def to_dataset(batches, signature, label_key=None):
    """A tf.data.Dataset of collated batches (from_generator with a ragged signature).

    Args:
      batches: a callable returning an iterable of batches (lists of sample dicts), e.g.
        ``lambda: TokenBatcher(4096, tokens_of=...)(read_samples())``; called each time the dataset is iterated.
      signature: dict name -> spec, what batch_signature returns.
      label_key: None: elements are dicts of every feature; a name: elements are (features without it, labels).

    Returns:
      tf.data.Dataset whose elements have varying batch sizes (the leading dimension is None).
    """
    if not callable(batches):
        raise ValueError(f"to_dataset: batches must be a callable returning an iterable of batches (so the dataset "
                         f"can be iterated more than once), got {type(batches).__name__}")
    _check_signature(signature)
    if label_key is not None and label_key not in signature:
        raise ValueError(f"to_dataset: label_key '{label_key}' is not in the signature ({sorted(signature)})")

    def generate():
        for batch in batches():
            features = collate(batch, signature)
            if label_key is None:
                yield features
            else:
                labels = features.pop(label_key)
                yield features, labels

    if label_key is None:
        output_signature = dict(signature)
    else:
        output_signature = ({n: s for n, s in signature.items() if n != label_key}, signature[label_key])
    return tf.data.Dataset.from_generator(generate, output_signature=output_signature)


# --- global-count weighting ------------------------------------------------------------------------------------


def global_count(local_count, comm, name):
    """The sum over workers of a count: one small allreduce ("sum") named `name`.

    Args:
      local_count: int scalar or vector (e.g. [samples, tokens]) of this worker's batch.
      comm: a Comm (fr.distributed.comm); with one worker the count itself.
      name: the collective's name, equal on every worker (e.g. "FusedRec/balance/count").

    Returns:
      int64 tensor of local_count's shape.
    """
    return comm.allreduce([tf.cast(local_count, tf.int64)], name=name, op="sum")[0]


def global_mean_loss(loss_sum, count, world_size):
    """The loss each worker minimises: ``loss_sum * world_size / global_count``.

    With GroupedOptimizer's averaging over workers (dense: sum x 1/N; embedding rows: summed by the all-to-all, x
    1/N), the update is that of one worker minimising ``(sum over every worker's items of l_i) / global_count``: the
    global mean over the union of the batches.

    Args:
      loss_sum: float scalar, this worker's sum of per-item losses (items: samples or tokens).
      count: int or float scalar > 0, the items of every worker's batch (what global_count returns).
      world_size: N, the number of workers.

    Returns:
      float scalar of loss_sum's dtype.
    """
    loss_sum = tf.convert_to_tensor(loss_sum)
    count = tf.cast(count, loss_sum.dtype)
    check = tf.debugging.assert_positive(count, message="global_mean_loss: the global count is 0 (no worker's batch "
                                                        "holds an item to average over)")
    with tf.control_dependencies([check]):
        return loss_sum * tf.cast(world_size, loss_sum.dtype) / count


class SampleWeighting:
    """Every sample counts once: the global mean is over samples."""

    name = "samples"

    def local_count(self, lengths):
        """lengths: int [B], tokens per sample -> int64 scalar B."""
        return tf.size(lengths, out_type=tf.int64)


class TokenWeighting:
    """Every token counts once: the global mean is over tokens (per-token losses)."""

    name = "tokens"

    def local_count(self, lengths):
        """lengths: int [B], tokens per sample -> int64 scalar sum(lengths)."""
        return tf.reduce_sum(tf.cast(lengths, tf.int64))


WEIGHTINGS = {"samples": SampleWeighting(), "tokens": TokenWeighting()}


def get_weighting(by):
    """"samples" | "tokens" | a weighting object -> the weighting object."""
    if hasattr(by, "local_count"):
        return by
    if by not in WEIGHTINGS:
        raise ValueError(f"weighting 'by' must be one of {sorted(WEIGHTINGS)}, got {by!r}")
    return WEIGHTINGS[by]


WeightedLoss = collections.namedtuple("WeightedLoss", ["loss", "local_count", "global_count"])
WeightedLoss.__doc__ = """What GlobalMeanLoss returns: the loss to differentiate (float scalar), this worker's count
and every worker's (int64 scalars)."""


class GlobalMeanLoss:
    """The global-count weighted loss of one training step.

        weighted = GlobalMeanLoss(model.embedding.comm, by="tokens")
        with tf.GradientTape() as tape:
            per_token = ...                                    # per-token losses of this worker's batch
            result = weighted(per_token, batch["history"].row_lengths())
        optimizer.apply_gradients(zip(tape.gradient(result.loss, variables), variables))   # a GroupedOptimizer

    Args:
      comm: the workers' Comm (the embedding layer's).
      by: "samples" or "tokens" (or a weighting object with local_count(lengths)).
      name: the count allreduce's name (one per step), equal on every worker.
    """

    def __init__(self, comm, by="samples", name="FusedRec/balance/count"):
        self.comm = comm_lib.get_comm(comm)
        self.weighting = get_weighting(by)
        self.name = name

    def __call__(self, losses, lengths):
        """-> WeightedLoss.

        Args:
          losses: per-item losses of this worker's batch, a float tensor or tf.RaggedTensor of any shape: summed.
            By samples: one per sample (a sample's own loss may sum its tokens' losses). By tokens: per token (or
            anything whose sum is the sum of per-token losses).
          lengths: int [B], tokens per sample of this worker's batch.
        """
        if isinstance(losses, tf.RaggedTensor):
            losses = losses.flat_values
        loss_sum = tf.reduce_sum(losses)
        local = self.weighting.local_count(lengths)
        total = tf.stop_gradient(global_count(local, self.comm, self.name))
        return WeightedLoss(global_mean_loss(loss_sum, total, self.comm.size), local, total)


def worker_counts(local_counts, comm, name):
    """Every worker's counts, for the summary metrics: one allgather named `name`.

    Args:
      local_counts: int vector [C] of this worker's batch (e.g. [samples, tokens]).

    Returns:
      int64 [N, C], row r from rank r.
    """
    return comm.allgather(tf.reshape(tf.cast(local_counts, tf.int64), [1, -1]), name=name)


# --- summary metrics -------------------------------------------------------------------------------------------


def _per_step_per_worker(values, what):
    array = np.asarray(values, np.float64)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{what} must be a [steps, workers] array with at least one step and one worker, got "
                         f"shape {list(array.shape)}")
    if (array < 0).any():
        step, worker = np.argwhere(array < 0)[0]
        raise ValueError(f"{what}: negative count {array[step, worker]} at step {step}, worker {worker}")
    return array


def token_imbalance(tokens_per_worker_per_step):
    """The mean over steps of max/min tokens across workers (1.0: perfectly balanced).

    Args:
      tokens_per_worker_per_step: [steps, workers] token counts.

    Returns:
      float. A step where a worker had 0 tokens (a batch of empty sequences only) makes it inf.
    """
    tokens = _per_step_per_worker(tokens_per_worker_per_step, "token_imbalance: tokens_per_worker_per_step")
    largest, smallest = tokens.max(axis=1), tokens.min(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(smallest > 0, largest / np.where(smallest > 0, smallest, 1), np.inf)
    return float(ratios.mean())


def samples_per_worker(samples_per_worker_per_step):
    """Samples each worker trained on: {"total": [per worker], "mean_per_step": [per worker]} (JSON-ready).

    Args:
      samples_per_worker_per_step: [steps, workers] sample counts.
    """
    samples = _per_step_per_worker(samples_per_worker_per_step, "samples_per_worker: samples_per_worker_per_step")
    return {"total": [int(v) for v in samples.sum(axis=0)], "mean_per_step": [float(v) for v in samples.mean(axis=0)]}


# --- gradient accumulation -------------------------------------------------------------------------------------


class Accumulator:
    """Gradient accumulation over K micro-batches trained in separate steps: dense gradients summed in variables,
    embedding-row gradients summed per id in a dynamic table beside each embedding table; one update at apply().

        acc = Accumulator(model, optimizer)          # optimizer: fr.train.make_optimizer(model, ...)

        @tf.function
        def micro_step(batch):
            with tf.GradientTape() as tape:
                loss_sum = tf.reduce_sum(per_sample_losses(model, batch))       # a SUM, not a mean
            variables = model.trainable_variables
            acc.accumulate(zip(tape.gradient(loss_sum, variables), variables), count=batch_size)

        for i, batch in enumerate(batches):
            micro_step(batch)
            if (i + 1) % K == 0:
                tf.function(acc.apply)()   # or a tf.function wrapping it, built once

    Normalisation (``normalize=True``): the micro-steps differentiate SUMS of per-item losses and pass their item
    counts (samples or tokens); apply() sums the counts over workers (one allreduce, G) and hands
    ``accumulated gradient * N / G`` to the optimizer, whose averaging over the N workers makes the update
    ``(1/G) * sum of grad l_i`` over every item of every micro-batch of every worker: one step on the union of all
    of them with the global-mean loss (for any optimizer, SGD included). With ``normalize=False`` the accumulated
    gradients are applied as they are (the losses were normalised by the caller).

    How the rows are found: a FusedEmbedding reads each table once per step through TFRA's ShadowVariable, whose
    ``ids`` hold that step's keys and whose gradient is one row per key (dense, or IndexedSlices into them). A
    micro-step's gradient is therefore only meaningful together with the keys of that step's lookup: accumulate()
    reads them and adds the rows per key into the accumulation table. apply() reads the accumulated keys (sorted),
    points the shadow at them with one more lookup (the rows have not changed since the micro-steps read them:
    nothing is updated in between) and applies the sums through the optimizer, which upserts the rows and their
    optimizer slots. Within ONE step, TrainPipeline(schedule="fwp", micro_batches=K) already trains K micro-batches
    with one table read and one update, but holds all K in one step; this class holds one micro-batch at a time.

    Requirements: the model calls each embedding layer once per micro-step (one lookup per table, as every model in
    tf_fusedrec.models does); the layers were built eagerly (TF2: the tables have shadows) and use no hot-row
    replication; the model's variables exist (call the model once before). Collectives: every worker must run the
    same number of micro-steps between applies (the embeddings' all-to-alls of the micro-steps), and apply() on
    every worker. Accumulated state is not checkpointed: checkpoint right after apply().

    Every variable the Accumulator holds is updated at apply(), with a zero gradient where no micro-batch reached it
    (so every worker issues the same collectives): a no-op for SGD and Adagrad, while optimizers with momentum (Adam)
    move it as they would in any step handing them a zero gradient. Rows of new ids are the ones the micro-steps
    read when the table's initializer is fr.initializers.Hashed (the default: inserted at first read); a TFRA random
    initializer draws the row of an id not yet in the table again at apply().

    Attributes:
      micro_batches: int64 tf.Variable, micro-batches accumulated since the last apply() (or reset()).

    Args:
      model: the Keras model (or layer, or list of layers and models) whose trainable variables are trained.
      optimizer: the optimizer applied at apply(), normally a GroupedOptimizer.
      comm: the workers' Comm; default the optimizer's (or the embedding layers').
      name: names the accumulation tables ({table}/{name}) and the count allreduce (FusedRec/{name}/count).
      normalize: divide by the global count at apply (see above).
    """

    def __init__(self, model, optimizer, comm=None, name="accumulator", normalize=True):
        if not tf.executing_eagerly():
            raise ValueError("Accumulator: create it eagerly (TF2), outside tf.function and tf.compat.v1 graphs")
        self.optimizer, self.name, self.normalize = optimizer, name, bool(normalize)
        layers = embedding_layers(model)
        for layer in layers:
            if getattr(layer, "hot_tables", None):
                raise ValueError(f"Accumulator: layer '{layer.name}' replicates hot rows (replication=...); "
                                 f"accumulating the replicated tables' gradients is not supported")
        if comm is None:
            comm = getattr(optimizer, "comm", None) or (layers[0].comm if layers else None)
        self.comm = comm_lib.get_comm(comm)
        parts = model if isinstance(model, (list, tuple)) else [model]
        variables = [v for part in parts for v in part.trainable_variables]
        if not variables:
            raise ValueError("Accumulator: the model has no trainable variables yet; call it once before")
        self._dense, self._sparse, self._native = {}, {}, {}
        native = {id(t.trainable): t for layer in layers for t in layer.native_tables()}
        for v in variables:
            if id(v) in self._dense or id(v) in self._sparse or id(v) in self._native:  # listed twice
                continue
            if id(v) in native:  # a native table's gradient carries its keys: sums keyed by them
                table = native[id(v)]
                table_name = check_table_name(f"{table.name}/{name}", f"Accumulator '{name}'")
                with tf.name_scope("FusedRecAccumulator"):
                    sums = de.get_variable(table_name, key_dtype=tf.int64, value_dtype=tf.float32, dim=table.dim,
                                           initializer=0.0)
                self._native[id(v)] = (v, sums)
            elif isinstance(v, de.shadow_ops.ShadowVariable):
                table_name = check_table_name(f"{v.params.name}/{name}", f"Accumulator '{name}'")
                with tf.name_scope("FusedRecAccumulator"):
                    sums = de.get_variable(table_name, key_dtype=v.params.key_dtype, value_dtype=v.params.value_dtype,
                                           dim=v.params.dim, initializer=0.0)
                self._sparse[id(v)] = (v, sums)
            elif isinstance(v, de.TrainableWrapper):
                raise ValueError(f"Accumulator: '{v.name}' is a TrainableWrapper (a tf.compat.v1 graph lookup): "
                                 f"build the embedding layers eagerly so their tables have shadows")
            else:
                self._dense[id(v)] = (v, tf.Variable(tf.zeros_like(v), trainable=False,
                                                     name=f"{v.name.split(':')[0]}/{name}"))
        self._count = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}/count")
        self.micro_batches = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}/micro_batches")

    def _key_of(self, var):
        key = id(var)
        if key not in self._dense and key not in self._sparse and key not in self._native:
            raise ValueError(f"Accumulator: variable '{var.name}' was not among the model's trainable variables when "
                             f"the Accumulator was created")
        return key

    def accumulate(self, grads_and_vars, count=None):
        """Adds one micro-batch's gradients (call it in the micro-step, after the model's forward pass).

        Args:
          grads_and_vars: (gradient, variable) pairs, as for apply_gradients; None gradients are skipped.
          count: this worker's items in the micro-batch (int scalar: samples or tokens, matching the loss sum);
            required with normalize=True.

        The additions run eagerly, or as part of the enclosing tf.function (TF2 runs its stateful ops); nothing is
        returned.
        """
        if self.normalize and count is None:
            raise ValueError("Accumulator.accumulate: count (the micro-batch's samples or tokens) is required with "
                             "normalize=True")
        for grad, var in grads_and_vars:
            if grad is None:
                continue
            key = self._key_of(var)
            if key in self._native:
                self._add_keyed_rows(grad, self._native[key][1])
            elif key in self._sparse:
                self._add_rows(grad, *self._sparse[key])
            else:
                self._dense[key][1].assign_add(tf.convert_to_tensor(grad))
        if count is not None:
            self._count.assign_add(tf.cast(count, tf.int64))
        self.micro_batches.assign_add(1)

    @staticmethod
    def _add_rows(grad, shadow, sums):
        keys = shadow.ids.read_value()  # the keys of this step's lookup: row i of the gradient is keys[i]'s
        num_keys = tf.shape(keys)[0]
        if isinstance(grad, tf.IndexedSlices):
            rows = tf.math.unsorted_segment_sum(grad.values, grad.indices, num_keys)
        else:
            rows = tf.convert_to_tensor(grad)
        unique, index = tf.unique(keys, out_idx=tf.int32)
        rows = tf.math.unsorted_segment_sum(rows, index, tf.shape(unique)[0])
        sums.upsert(unique, sums.lookup(unique) + rows)

    @staticmethod
    def _add_keyed_rows(grad, sums):
        """A native table's gradient: IndexedSlices whose indices are the table keys."""
        unique, index = tf.unique(grad.indices, out_idx=tf.int32)
        rows = tf.math.unsorted_segment_sum(grad.values, index, tf.shape(unique)[0])
        sums.upsert(unique, sums.lookup(unique) + rows)

    def apply(self):
        """Applies the accumulated gradients once through the optimizer and clears them.

        Call it eagerly or inside a tf.function (built once and reused); nothing is returned.
        """
        grads_and_vars = []
        for dense, accumulated in self._dense.values():
            grads_and_vars.append((accumulated.read_value(), dense))
        for shadow, sums in self._sparse.values():
            keys, rows = sums.export()
            order = tf.argsort(keys)  # the same order on every worker and in every run
            keys, rows = tf.gather(keys, order), tf.gather(rows, order)
            looked_up = de.shadow_ops.embedding_lookup(shadow, keys)  # points the shadow (and its slots) at keys
            with tf.control_dependencies([looked_up]):
                grads_and_vars.append((tf.identity(rows), shadow))
        for anchor, sums in self._native.values():
            keys, rows = sums.export()
            order = tf.argsort(keys)  # the same order on every worker and in every run
            grads_and_vars.append((tf.IndexedSlices(tf.gather(rows, order), tf.gather(keys, order)), anchor))
        if self.normalize:
            total = tf.cast(global_count(self._count.read_value(), self.comm, f"FusedRec/{self.name}/count"),
                            tf.float32)
            check = tf.debugging.assert_positive(total, message=f"Accumulator '{self.name}'.apply: the global count is "
                                                                f"0 (nothing accumulated on any worker)")
            with tf.control_dependencies([check]):
                scale = tf.cast(self.comm.size, tf.float32) / total
            grads_and_vars = [(scale_gradient(g, scale), v) for g, v in grads_and_vars]
        update = self.optimizer.apply_gradients(grads_and_vars)
        with tf.control_dependencies([update] if update is not None else []):
            self._clear()

    def _clear(self):
        for _, accumulated in self._dense.values():
            accumulated.assign(tf.zeros_like(accumulated))
        for _, sums in list(self._sparse.values()) + list(self._native.values()):
            sums.clear()
        self._count.assign(0)
        self.micro_batches.assign(0)

    def reset(self):
        """Drops what was accumulated without applying it (eagerly or inside a tf.function)."""
        self._clear()
