"""Token-balanced batches (MTGRBoost, shared/seeds/004 §5.1, Algorithm 1, dynamic sequence batching).

User sequences have long-tailed lengths: with a fixed number of samples per worker, every step waits for the worker
that drew the longest sequences. :class:`TokenBatcher` cuts each worker's stream of samples into batches whose token
counts are closest to a target, so workers get different numbers of samples with similar token counts.
:func:`fixed_batches` is the unbalanced baseline, :func:`to_dataset` turns either into a ``tf.data.Dataset`` of
ragged batches (:func:`batch_signature`, :func:`collate`). A :class:`StreamPosition` says where a worker's batches
stand in its stream, so that a resumed run cuts the batches the uninterrupted one would have cut next.

Different sample counts per worker would bias the usual per-worker mean loss: train/weighting.py's global-count
weighting makes the update exact again.
"""

import collections
import collections.abc
import itertools

import numpy as np
import tensorflow as tf

DEFAULT_BUFFER_SIZE = 1024

StreamPosition = collections.namedtuple("StreamPosition", ["samples", "buffered"], defaults=(0,))
StreamPosition.__doc__ = """Where a worker's batches stand in its sample stream, what a checkpoint records to resume it.

samples: the samples of the stream that the batches so far hold (the next batch starts at this position).
buffered: how many samples after them a TokenBatcher had already read into its buffer (0 for fixed_batches). A
  resumed batcher starts the stream at `samples` and reads `buffered` samples as its first fill
  (``TokenBatcher(...)(stream, buffered=...)``): its fills then end where the uninterrupted batcher's did, so it cuts
  the same batches (a cut can depend on where a fill ended: empty sequences right behind the closest cut join the
  batch only when they are buffered)."""


def _positive_int(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return int(value)


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

    def __call__(self, stream, buffered=0):
        """Yields the batches of `stream` (an iterable of samples): lists of samples, in stream order.

        buffered: resuming (StreamPosition.buffered): the first `buffered` samples of `stream` are the ones the
          batcher being resumed had read past its last batch; they are read as one fill before the usual ones.
        """
        for batch, _ in self.cuts(stream, buffered):
            yield batch

    def cuts(self, stream, buffered=0):
        """Like calling the batcher, but yields ``(batch, buffered)``: each batch and how many samples of the stream
        the batcher has read past it (the StreamPosition.buffered that resumes the batcher after this batch)."""
        buffered = int(buffered)
        if buffered < 0:
            raise ValueError(f"TokenBatcher: buffered must be >= 0, got {buffered}")
        source = iter(stream)
        samples, tokens = [], []
        buffered_tokens, read, ended = 0, 0, False
        fill = buffered or self.buffer_size  # the first fill: a resumed batcher's buffer
        while True:
            while buffered_tokens < self.target_tokens and not ended:  # true at first (0 tokens buffered)
                chunk = list(itertools.islice(source, fill))
                ended = len(chunk) < fill
                fill = self.buffer_size
                for sample in chunk:
                    t = self._tokens(sample, read)
                    read += 1
                    samples.append(sample)
                    tokens.append(t)
                    buffered_tokens += t
            if buffered_tokens < self.target_tokens:  # the stream has ended
                if samples:
                    yield samples, 0
                return
            k = closest_cut(np.cumsum(tokens), self.target_tokens)
            batch, samples = samples[:k], samples[k:]
            buffered_tokens -= sum(tokens[:k])
            tokens = tokens[k:]
            yield batch, len(samples)


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
