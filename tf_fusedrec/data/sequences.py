"""Synthetic user sequences for generative recommenders (GRM): long-tailed histories, context ids, click and
conversion labels from a hidden model.

    spec = SequenceSpec(SparseInput("items", 100_000, zipf=1.1),
                        (SparseInput("target", 100_000, 1.1), SparseInput("device", 16)), target="target")
    for sample in grm_samples(spec, seed=0, rank=r, num_ranks=n):   # one dict per user, for a token batcher
        sample["items"], sample["tokens"], sample["labels"]          # int64 [L], L, float32 [2]
    ds = grm_dataset(spec, batch_size=256, seed=0, rank=r, num_ranks=n)  # fixed sample counts per batch
    for features, labels in ds: ...  # {"items": ragged int64 [B, None], "target": int64 [B], ...}, float32 [B, 2]

``SequenceSpec.from_config(experiment_config)`` builds the spec from a ``data.source: grm_synthetic`` config
(configs/grm_synthetic.yaml): the feature named ``data.sequences.feature`` is the sequence, every other feature is a
context feature with one id per user, each with the ``vocab`` and ``zipf`` of its feature entry.

**Samples and workers.** The stream is endless; sample ``i`` (a global index) is a function of ``(seed, held_out,
i)`` only: every random number is a counter-based SplitMix64 hash of the seed, the stream, ``i`` and, for items, the
position in the sequence. Worker ``rank`` of ``num_ranks`` owns the samples ``rank, rank + num_ranks, rank +
2 num_ranks, ...``; its ``k``-th sample is ``i = rank + k num_ranks``. The workers' shares are disjoint and their
union is the stream, whatever each worker consumes (a token-balanced batcher takes different counts per worker);
with fixed batches, step ``s`` of worker ``r`` holds its samples ``k in [s B, (s + 1) B)``, so 2 workers of batch B
see together the samples 1 worker of batch 2B sees. ``held_out=True`` is an independent stream (an evaluation set)
of the same hidden model. A worker generates only its own samples.

**Lengths.** A log-normal long tail, bounded: ``L = clip(rint(median_length * exp(length_sigma * z)), 1,
longest_length)`` with ``z ~ N(0, 1)`` (Box-Muller on two hashed uniforms). ``median_length`` is the median of the
non-empty lengths; the mass clipped at ``longest_length`` is ``P(z > ln(longest / median) / sigma)`` (4.6e-5 with the
defaults 32, 1.0, 1600). With the defaults (``longest_length = 50 median_length``), the longest of n users is
about ``min(exp(sigma z_n), 50)`` times their median, ``z_n`` the expected maximum of n standard normals. Measured
over disjoint samples of the default stream (5th, 50th, 95th percentile of max / median): n = 1000: 16x, 26x, 48x;
n = 10^4: 33x, 48x, 52x (a median of 31 under the bound 1600); n >= 10^5: 50x, the bound. The mean length is about
``1.65 median`` (``exp(sigma^2 / 2)``).

**Empty sequences** (users without history) are kept, never dropped: a fraction ``empty_fraction`` (default 0) of
the users has ``L = 0``, decided by one more hashed uniform; their ``"items"`` row is empty, ``tokens`` is 0, and
the hidden model sees only their context.

**The cap.** ``max_length`` is the longest sequence the pipeline accepts. A longer one raises ``ValueError`` naming
the cap, the sample and its length (when the chunk of samples holding it is generated: 256 for ``grm_samples``,
a batch for ``grm_dataset``), unless ``truncate=True``, which keeps its last (most recent) ``max_length``
items. Labels are drawn from the full history either way (truncation is the pipeline's choice, not the user's
behaviour). ``tokens`` counts the items after truncation.

**Ids.** Items are Zipf-distributed over the item feature's vocabulary and the context ids over theirs, with the
truncated Zipf law and id bijection of tf_fusedrec.data.synthetic. Ids of a sequence are drawn independently
(repeats happen). The ``target`` context feature (optional) is a candidate item: it draws with its own exponent
through the items' bijection, so an id names the same item in the history and as a target; its vocab must be the
items'.

**Labels** ``[click, conversion]``. A hidden model: per task ``tau``, each item has a weight ``w_tau(id)`` in
[-1, 1) and a vector ``v_tau(id)`` in [-1, 1)^4, each context id a weight; all are splitmix64 hashes of (seed,
task, feature, id), never stored. Three scores: ``recent`` (the mean item weight over the last 16 items), ``match``
(``<mean of v over the history, v(target)>``) and ``context`` (the sum of the context weights; the target's weight
included), each 0 where its inputs are absent, each standardised (mean 0, variance 1) over a fixed calibration
sample of 4096 users. ``logit_tau = 2.5 (recent + match + context) / sqrt(3)`` (``sqrt(2)`` without a target);
``click ~ Bernoulli(sigmoid(logit_click))`` and ``conversion = click * Bernoulli(sigmoid(logit_conversion))``, so a
conversion implies a click: about 50% clicks, 25% conversions. ``grm_hidden_logits`` gives the logits of samples
(e.g. for the AUC ceiling).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Iterator, Optional, Sequence

import numpy as np
import tensorflow as tf

from tf_fusedrec.sequence_config import SequenceConfig as _DEFAULTS
from tf_fusedrec.data.synthetic import SparseInput, _Feature, _is_int, _key64
from tf_fusedrec.hashing import mix64

__all__ = ["RESERVED_KEYS", "SequenceSpec", "TASKS", "grm_batch", "grm_dataset", "grm_hidden_logits", "grm_samples"]

TASKS = ("click", "conversion")
RESERVED_KEYS = ("index", "tokens", "labels", "dense")  # keys of a sample dict that are not features

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_RECENT = 16            # items the "recent" score averages over
_HIDDEN_DIM = 4         # dim of the hidden item vectors
_LOGIT_SCALE = 2.5
_CALIBRATION_USERS = 4096
_CHUNK = 256            # samples generated per vectorised draw by grm_samples
_STREAMS = {False: 0, True: 1, "calibration": 2}


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


@dataclasses.dataclass(frozen=True)
class SequenceSpec:
    """What the GRM synthetic data generates; see the module docstring.

    Args:
      items: the sequence feature (its name, ``vocab_size`` and ``zipf``; hotness must be 1: the lengths come from
        the fields below).
      contexts: context features, one id per user each (hotness 1). Names must be unique, differ from the items'
        and from RESERVED_KEYS.
      target: the name of the context feature that is a candidate item (the hidden model's ``match`` score), or
        None.
      median_length: median of the non-empty sequence lengths, a number >= 1.
      length_sigma: the log-normal's sigma (the tail knob), >= 0.
      longest_length: the generator's bound on lengths, an int >= median_length.
      empty_fraction: fraction of users with an empty sequence, in [0, 1).
      max_length: the cap: a longer sequence is an error (or truncated with ``truncate``), an int >= 1.
      truncate: keep the last ``max_length`` items of a longer sequence instead of raising.
    """

    items: SparseInput
    contexts: tuple = ()
    target: Optional[str] = None
    median_length: float = _DEFAULTS.median_length  # the defaults of a config's data.sequences section
    length_sigma: float = _DEFAULTS.length_sigma
    longest_length: int = _DEFAULTS.longest_length
    empty_fraction: float = _DEFAULTS.empty_fraction
    max_length: int = _DEFAULTS.max_length
    truncate: bool = _DEFAULTS.truncate

    def __post_init__(self):
        if not isinstance(self.items, SparseInput):
            raise ValueError(f"items must be a SparseInput, got {type(self.items).__name__}")
        contexts = tuple(self.contexts)
        object.__setattr__(self, "contexts", contexts)
        for i, c in enumerate(contexts):
            if not isinstance(c, SparseInput):
                raise ValueError(f"contexts[{i}] must be a SparseInput, got {type(c).__name__}")
        names = [self.items.name] + [c.name for c in contexts]
        for name in names:
            if name in RESERVED_KEYS:
                raise ValueError(f"feature '{name}': the name is reserved for the sample dict ({RESERVED_KEYS})")
            if names.count(name) > 1:
                raise ValueError(f"feature '{name}' is given twice (the items and the contexts need unique names)")
        for inp in (self.items,) + contexts:
            if inp.hotness != 1:
                what = "the sequence feature (its lengths come from median_length etc.)" if inp is self.items else \
                    "a context feature (one id per user)"
                raise ValueError(f"feature '{inp.name}': hotness must be 1 for {what}, got {inp.hotness!r}")
        if self.target is not None:
            by_name = {c.name: c for c in contexts}
            if self.target not in by_name:
                raise ValueError(f"target: {self.target!r} is not a context feature (contexts: {sorted(by_name)})")
            if by_name[self.target].vocab_size != self.items.vocab_size:
                raise ValueError(f"target: feature '{self.target}' has vocab {by_name[self.target].vocab_size} but "
                                 f"the items '{self.items.name}' have {self.items.vocab_size}; a target is an item")
        if not _is_real(self.median_length) or self.median_length < 1:
            raise ValueError(f"median_length must be a number >= 1, got {self.median_length!r}")
        if not _is_real(self.length_sigma) or self.length_sigma < 0:
            raise ValueError(f"length_sigma must be a number >= 0, got {self.length_sigma!r}")
        if not _is_int(self.longest_length) or self.longest_length < self.median_length:
            raise ValueError(f"longest_length must be an int >= median_length ({self.median_length}), got "
                             f"{self.longest_length!r}")
        if not _is_real(self.empty_fraction) or not 0 <= self.empty_fraction < 1:
            raise ValueError(f"empty_fraction must be a number in [0, 1), got {self.empty_fraction!r}")
        if not _is_int(self.max_length) or self.max_length < 1:
            raise ValueError(f"max_length must be an int >= 1, got {self.max_length!r}")
        if not isinstance(self.truncate, bool):
            raise ValueError(f"truncate must be true or false, got {self.truncate!r}")

    @property
    def feature_names(self):
        """The sequence feature's name, then the context features' names."""
        return (self.items.name,) + tuple(c.name for c in self.contexts)

    @classmethod
    def from_config(cls, config) -> "SequenceSpec":
        """The spec of an ExperimentConfig with ``data.source: grm_synthetic`` (tf_fusedrec.config)."""
        seq, by_name = sequence_section(config, "grm_synthetic")

        def sparse_input(f):
            if f.hotness != 1:
                raise ValueError(f"feature '{f.name}': hotness must be 1 (the sequence lengths come from "
                                 f"data.sequences; a context feature has one id per user), got {f.hotness!r}")
            return SparseInput(f.name, f.vocab, f.zipf)

        contexts = tuple(sparse_input(f) for f in config.features if f.name != seq.feature)
        return cls(sparse_input(by_name[seq.feature]), contexts, target=seq.target,
                   median_length=seq.median_length, length_sigma=seq.length_sigma,
                   longest_length=seq.longest_length, empty_fraction=seq.empty_fraction,
                   max_length=seq.max_length, truncate=seq.truncate)


def sequence_section(config, source):
    """(data.sequences, {feature name: FeatureConfig}) of a sequence config, checked to have the section and its
    sequence feature among the features (what every sequence source's from_config starts with)."""
    seq = config.data.sequences
    if seq is None:
        raise ValueError(f"data.sequences: missing; the {source} source needs its sequence section")
    by_name = {f.name: f for f in config.features}
    if seq.feature not in by_name:
        raise ValueError(f"feature: the sequence feature {seq.feature!r} is not among the features "
                         f"{sorted(by_name)}")
    return seq, by_name


def _as_spec(spec_or_config, seed):
    """(SequenceSpec, seed) from a spec or an ExperimentConfig; seed None takes the config's data.seed (else 0)."""
    if isinstance(spec_or_config, SequenceSpec):
        spec = spec_or_config
        default_seed = 0
    elif hasattr(spec_or_config, "data") and hasattr(spec_or_config, "features"):
        spec = SequenceSpec.from_config(spec_or_config)
        default_seed = spec_or_config.data.seed
    else:
        raise ValueError(f"expected a SequenceSpec or an ExperimentConfig, got {type(spec_or_config).__name__}")
    seed = default_seed if seed is None else seed
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    return spec, int(seed)


def _check_int(name, value, low, high=None):
    if not _is_int(value) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an int {bounds}, got {value!r}")
    return int(value)


def _uniform(keys) -> np.ndarray:
    """float64 uniforms in [0, 1) of uint64 counters (one SplitMix64 output each)."""
    return (mix64(keys) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _counter(key: int, index: np.ndarray) -> np.ndarray:
    return index.astype(np.uint64) * _GOLDEN + np.uint64(key)


# ----------------------------------------------------------------------------------------------------------------
# The generator
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Drawn:
    """Samples of a list of global indices: row lengths and splits of ``items`` (after the cap), contexts, labels."""

    index: np.ndarray     # int64 [N]
    splits: np.ndarray    # int64 [N + 1]
    items: np.ndarray     # int64 [splits[-1]]
    contexts: dict        # name -> int64 [N]
    labels: np.ndarray    # float32 [N, 2]
    logits: np.ndarray    # float64 [N, 2]


class _Generator:
    def __init__(self, spec: SequenceSpec, seed: int):
        self.spec, self.seed = spec, seed
        self.items = _Feature(spec.items, seed)
        self.contexts = []
        for c in spec.contexts:
            # A target draws with its own exponent through the items' bijection: an id names the same item.
            law = SparseInput(spec.items.name, c.vocab_size, c.zipf) if c.name == spec.target else c
            self.contexts.append((c.name, _Feature(law, seed)))
        self.keys = {stream: {part: _key64("grm", seed, stream, part) for part in
                              ("length", "box", "empty", "items", "click", "conversion")
                              + tuple(f"context:{c.name}" for c in spec.contexts)}
                     for stream in _STREAMS.values()}
        self.hidden = {task: self._hidden_keys(task) for task in TASKS}
        self.norm = {task: [(0.0, 1.0)] * 3 for task in TASKS}
        cal = self.draw(np.arange(_CALIBRATION_USERS, dtype=np.int64), "calibration", check_cap=False)
        for task in TASKS:
            parts = self._scores(task, cal.splits, cal.items, cal.contexts)
            self.norm[task] = [(float(p.mean()), float(p.std()) if p.std() > 1e-9 else 1.0) for p in parts]

    def _hidden_keys(self, task):
        s, name = self.seed, self.spec.items.name
        return {
            "weight": np.uint64(_key64("grm-weight", s, task, name)),
            "vector": [np.uint64(_key64("grm-vector", s, task, name, k)) for k in range(_HIDDEN_DIM)],
            "context": {c.name: np.uint64(_key64("grm-weight", s, task, c.name)) for c in self.spec.contexts},
        }

    @staticmethod
    def _signed(key, ids):
        return 2.0 * _uniform(ids.astype(np.uint64) * _GOLDEN + key) - 1.0

    def _scores(self, task, splits, items, contexts):
        """The raw (recent, match, context) scores, float64 [N] each."""
        keys = self.hidden[task]
        rows = splits.size - 1
        lengths = np.diff(splits)
        row_of = np.repeat(np.arange(rows), lengths)
        position = np.arange(items.size) - splits[:-1][row_of]
        recent_mask = position >= (lengths[row_of] - _RECENT)
        w = self._signed(keys["weight"], items)
        counts = np.minimum(lengths, _RECENT)
        recent = np.bincount(row_of[recent_mask], weights=w[recent_mask], minlength=rows) / np.maximum(counts, 1)
        match = np.zeros(rows)
        if self.spec.target is not None:
            target = contexts[self.spec.target]
            for key in keys["vector"]:
                history = np.bincount(row_of, weights=self._signed(key, items), minlength=rows)
                match += history / np.maximum(lengths, 1) * self._signed(key, target)
        context = np.zeros(rows)
        for name, key in keys["context"].items():
            context += self._signed(key, contexts[name])
        return recent, match, context

    def logits(self, splits, items, contexts) -> np.ndarray:
        """float64 [N, 2]: the hidden model's click and conversion logits of full (untruncated) histories."""
        out = []
        parts = 3 if self.spec.target is not None else 2
        for task in TASKS:
            z = 0.0
            for raw, (mean, std), used in zip(self._scores(task, splits, items, contexts), self.norm[task],
                                              (True, self.spec.target is not None, True)):
                if used:
                    z = z + (raw - mean) / std
            out.append(_LOGIT_SCALE * z / math.sqrt(parts))
        return np.stack(out, axis=1)

    def draw(self, index: np.ndarray, stream, check_cap=True) -> _Drawn:
        """The samples of global indices ``index`` (int64 [N]) of a stream (False, True or "calibration")."""
        spec, keys = self.spec, self.keys[_STREAMS[stream]]
        rows = index.size
        u1 = _uniform(_counter(keys["length"], index))
        u2 = _uniform(_counter(keys["box"], index))
        z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
        lengths = np.clip(np.rint(spec.median_length * np.exp(spec.length_sigma * z)), 1, spec.longest_length)
        lengths = lengths.astype(np.int64)
        if spec.empty_fraction > 0:
            lengths[_uniform(_counter(keys["empty"], index)) < spec.empty_fraction] = 0
        splits = np.zeros(rows + 1, np.int64)
        np.cumsum(lengths, out=splits[1:])
        row_of = np.repeat(np.arange(rows), lengths)
        position = (np.arange(splits[-1]) - splits[:-1][row_of]).astype(np.uint64)
        base = mix64(_counter(keys["items"], index))
        items = self.items.ids(_uniform(base[row_of] + position * _GOLDEN))
        contexts = {name: feature.ids(_uniform(_counter(keys[f"context:{name}"], index)))
                    for name, feature in self.contexts}
        logits = self.logits(splits, items, contexts)
        click = _uniform(_counter(keys["click"], index)) < 1.0 / (1.0 + np.exp(-logits[:, 0]))
        convert = _uniform(_counter(keys["conversion"], index)) < 1.0 / (1.0 + np.exp(-logits[:, 1]))
        labels = np.stack([click, click & convert], axis=1).astype(np.float32)
        if check_cap and lengths.max(initial=0) > spec.max_length:
            splits, items = self._cap(index, lengths, splits, items)
        return _Drawn(index, splits, items, contexts, labels, logits)

    def _cap(self, index, lengths, splits, items):
        cap = self.spec.max_length
        if not self.spec.truncate:
            j = int(np.argmax(lengths > cap))
            raise ValueError(f"sample {int(index[j])} has a sequence of {int(lengths[j])} items, more than the cap "
                             f"max_length={cap}; raise max_length (or lower longest_length) or set truncate: true "
                             f"to keep the last {cap} items")
        kept = np.minimum(lengths, cap)
        row_of = np.repeat(np.arange(lengths.size), lengths)
        position = np.arange(items.size) - splits[:-1][row_of]
        keep = position >= (lengths - kept)[row_of]
        new_splits = np.zeros_like(splits)
        np.cumsum(kept, out=new_splits[1:])
        return new_splits, items[keep]


@functools.lru_cache(maxsize=16)
def _generator(spec: SequenceSpec, seed: int) -> _Generator:
    return _Generator(spec, seed)


def _worker_indices(rank, num_ranks, start, stop):
    return rank + num_ranks * np.arange(start, stop, dtype=np.int64)


def _check_worker(rank, num_ranks):
    num_ranks = _check_int("num_ranks", num_ranks, 1)
    return _check_int("rank", rank, 0, num_ranks - 1), num_ranks


# ----------------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------------

def grm_samples(spec, seed: Optional[int] = None, rank: int = 0, num_ranks: int = 1, start: int = 0,
                stop: Optional[int] = None, held_out: bool = False) -> Iterator[dict]:
    """This worker's samples, one dict per user, from its ``start``-th sample (to ``stop``, or endless).

    Args:
      spec: a SequenceSpec or an ExperimentConfig with ``data.source: grm_synthetic``.
      seed: the data seed; None takes the config's ``data.seed`` (0 for a spec).
      rank, num_ranks: this worker owns global samples ``rank + k num_ranks``.
      start, stop: the range of ``k`` (this worker's sample counter); ``stop=None``: endless.
      held_out: the evaluation stream.

    Yields:
      dict with ``"index"`` (int, the global sample index), ``"tokens"`` (int, the sequence length after the
      cap), the sequence feature -> int64 ``[tokens]``, each context feature -> int64 ``[]``, and ``"labels"`` ->
      float32 ``[2]`` (click, conversion). ``grm_batch`` stacks a list of them into a batch.

    Raises:
      ValueError: a sequence longer than ``spec.max_length`` (without ``truncate``), naming the cap.
    """
    spec, seed = _as_spec(spec, seed)
    rank, num_ranks = _check_worker(rank, num_ranks)
    start = _check_int("start", start, 0)
    if stop is not None:
        stop = _check_int("stop", stop, start)
    gen = _generator(spec, seed)
    name = spec.items.name
    k = start
    while stop is None or k < stop:
        end = k + _CHUNK if stop is None else min(k + _CHUNK, stop)
        d = gen.draw(_worker_indices(rank, num_ranks, k, end), bool(held_out))
        for j in range(d.index.size):
            sample = {"index": int(d.index[j]), "tokens": int(d.splits[j + 1] - d.splits[j]),
                      name: d.items[d.splits[j]:d.splits[j + 1]]}
            for c, ids in d.contexts.items():
                sample[c] = ids[j]
            sample["labels"] = d.labels[j]
            yield sample
        k = end


def grm_batch(samples: Sequence[dict], spec) -> tuple:
    """Stacks sample dicts of ``grm_samples`` into one batch, as ``grm_dataset`` yields it.

    Args:
      samples: a non-empty list of sample dicts.
      spec: their SequenceSpec (or ExperimentConfig).

    Returns:
      ``(features, labels)``: features maps the sequence feature to a ``tf.RaggedTensor`` int64 ``[B, None]`` and
      each context feature to int64 ``[B]``; labels is float32 ``[B, 2]``.
    """
    spec, _ = _as_spec(spec, 0)
    if not samples:
        raise ValueError("grm_batch: needs at least one sample")
    name = spec.items.name
    lengths = np.array([s[name].size for s in samples], np.int64)
    values = np.concatenate([np.asarray(s[name], np.int64) for s in samples])
    features = {name: tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)}
    for c in spec.contexts:
        features[c.name] = tf.constant(np.array([s[c.name] for s in samples], np.int64))
    labels = tf.constant(np.stack([s["labels"] for s in samples]).astype(np.float32))
    return features, labels


def grm_dataset(spec, batch_size: int, seed: Optional[int] = None, rank: int = 0, num_ranks: int = 1,
                held_out: bool = False, start_step: int = 0, steps: Optional[int] = None) -> tf.data.Dataset:
    """This worker's batches of a fixed sample count: step ``s`` holds its samples ``k in [s B, (s + 1) B)``.

    Args:
      spec: a SequenceSpec or an ExperimentConfig with ``data.source: grm_synthetic``.
      batch_size: B, samples per worker and step.
      seed: the data seed; None takes the config's ``data.seed`` (0 for a spec).
      rank, num_ranks: this worker's share (see the module docstring).
      held_out: the evaluation stream.
      start_step, steps: the stream holds steps ``start_step, ..., steps - 1`` (``steps=None``: endless).

    Returns:
      A tf.data.Dataset of ``(features, labels)``: features maps the sequence feature to ``tf.RaggedTensor`` int64
      ``[B, None]`` (rows may be empty when ``empty_fraction > 0``) and each context feature to int64 ``[B]``;
      labels is float32 ``[B, 2]`` (click, conversion). A sequence over the cap raises ``ValueError`` (naming
      ``max_length``) when its batch is generated, unless the spec truncates.
    """
    spec, seed = _as_spec(spec, seed)
    batch_size = _check_int("batch_size", batch_size, 1)
    rank, num_ranks = _check_worker(rank, num_ranks)
    start_step = _check_int("start_step", start_step, 0)
    if steps is not None:
        steps = _check_int("steps", steps, 0)
    gen = _generator(spec, seed)
    held_out = bool(held_out)

    def batches():
        step = start_step
        while steps is None or step < steps:
            d = gen.draw(_worker_indices(rank, num_ranks, step * batch_size, (step + 1) * batch_size), held_out)
            yield (d.items, d.splits) + tuple(d.contexts[c.name] for c in spec.contexts) + (d.labels,)
            step += 1

    signature = ((tf.TensorSpec([None], tf.int64), tf.TensorSpec([batch_size + 1], tf.int64))
                 + tuple(tf.TensorSpec([batch_size], tf.int64) for _ in spec.contexts)
                 + (tf.TensorSpec([batch_size, len(TASKS)], tf.float32),))

    def assemble(values, splits, *rest):
        features = {spec.items.name: tf.RaggedTensor.from_row_splits(values, splits, validate=False)}
        for c, ids in zip(spec.contexts, rest[:-1]):
            features[c.name] = ids
        return features, rest[-1]

    ds = tf.data.Dataset.from_generator(batches, output_signature=signature)
    return ds.map(assemble).prefetch(tf.data.AUTOTUNE)


def grm_hidden_logits(spec, indices, seed: Optional[int] = None, held_out: bool = False) -> np.ndarray:
    """The hidden model's logits (float64 ``[N, 2]``: click, conversion) of global sample ``indices`` (the
    ``"index"`` of ``grm_samples``' dicts); ``sigmoid`` of a column is the probability of its label (conversion:
    given a click). The best any model can do, e.g. to report an AUC ceiling."""
    spec, seed = _as_spec(spec, seed)
    index = np.asarray(indices, np.int64).reshape(-1)
    if index.size and index.min() < 0:
        raise ValueError(f"indices must be >= 0, got {int(index.min())}")
    return _generator(spec, seed).draw(index, bool(held_out), check_cap=False).logits
