"""Synthetic click data with Zipf-skewed ids and a hidden model, the project's default data.

    inputs = [SparseInput("user", 1_000_000, zipf=calibrate_zipf(1_000_000)),
              SparseInput("tags", 10_000, hotness=(0, 5))]          # 0 to 5 ids per example, empty rows happen
    ds = synthetic_dataset(inputs, num_dense=13, batch_size=2048, seed=0, rank=r, num_ranks=n, steps=1000)
    for features, label in ds: ...   # {"user": int64 [B], "tags": ragged int64 [B, None], "dense": float32 [B, 13]}

**Determinism and workers.** Step ``s`` has one global batch of ``batch_size * num_ranks`` rows, a function of
``(seed, held_out, s)`` only; worker ``r`` gets rows ``[r * batch_size, (r + 1) * batch_size)`` of it. So two workers
with batch B together see exactly what one worker with batch 2B sees, a resumed run (``start_step``) continues with
the same batches, and ``held_out=True`` is an independent stream from the same hidden model (an evaluation set).
The random numbers of global rows ``[256 k, 256 (k + 1))`` of step ``s`` come from one NumPy ``PCG64`` seeded with
``(seed, held_out, s, k)``, so a worker draws only the 256-row blocks its slice touches (about ``batch_size`` rows,
not the global batch) and ``start_step`` skips ahead without generating anything. ``steps`` counts from step 0:
the stream holds steps ``start_step, ..., steps - 1`` (``steps=None``: endless), so a run of ``steps`` steps resumed
at step k passes the same ``steps`` and ``start_step=k``.

**Ids.** Feature ``f`` draws a rank ``k`` in ``[0, vocab_size)`` from the truncated Zipf law
``p(k) = (k + 1) ** -zipf / H`` by inverse CDF: over the exact, precomputed CDF of the first 2**20 ranks (a
closed-form guess and a walk of a rank or two, equal to ``np.searchsorted(cdf, u, "right")`` and about 5x faster),
and for the ranks beyond by the closed-form inverse of the midpoint-rule integral (relative error below 1e-12 there),
then maps it through the fixed bijection ``id = (k * A_f + B_f) % vocab_size`` with ``gcd(A_f, vocab_size)
== 1``, where ``A_f, B_f`` derive from ``(seed, feature name)``: the hot ids are spread over the id space, not
0, 1, 2. Features draw independent random numbers. Multi-hot features (``hotness != 1``) are ``tf.RaggedTensor``
``[B, None]`` (ids of a row drawn independently, so repeats happen); ``hotness=(lo, hi)`` draws each row's length
uniformly in ``[lo, hi]``, and ``lo = 0`` gives empty rows.

**Drift** (``drift=d``, default 0): new ids arrive popular and fade. At step ``s`` a drawn rank ``k`` takes the id of
rank ``(k - floor(d * s)) % vocab_size`` of step 0, ``id = (((k - floor(d * s)) % vocab_size) * A_f + B_f) %
vocab_size``: every id sinks ``d`` ranks per step, and the ``d`` ids that enter the top ranks per step come from the
far tail (almost never seen before), like new items, while the hidden weight of each id stays what it was. A model
``n`` steps old has not trained the ids that arrived since (how fresh a served model must be:
benchmarks/publishing/bench_freshness_auc.py). Step 0 and the calibration sample are unshifted; the held-out stream of a step
drifts as the training stream does.

**Labels.** A hidden model: each (feature, id) has a weight ``w in [-1, 1)``, a splitmix64 hash of (seed, feature
name, id), never stored. An example's sparse score is the sum over features of the weight of its id (the mean over a
multi-hot row; 0 for an empty row), standardized over a fixed calibration sample so it has mean 0 and variance 1;
the dense score is ``dense @ v`` with ``dense ~ N(0, 1)`` and a fixed unit vector ``v`` (variance 1). The logit
is ``2.5 * (sparse + dense) / sqrt(2)`` (``2.5 * sparse`` without dense features), and
``label ~ Bernoulli(sigmoid(logit))``: labels are about balanced (mean 0.50 +- 0.02 in the configurations tested), and the logit itself, the best any
model can do, has an AUC of about 0.90 (``hidden_logits`` returns the logit of a batch, e.g. to report that
ceiling; a model must learn one weight per id, so rarely seen tail ids keep it below).

**Skew calibration.** ``top_share`` gives the fraction of accesses carried by the most frequent ``top_fraction`` of the
ids (exact, from the pmf), ``calibrate_zipf`` the exponent for a target share. For "2% of the ids carry 90% of the
accesses" (as reported for Criteo Kaggle), ``calibrate_zipf(V)`` gives:

    vocab_size    zipf      (top 2% of the ids carry 90% of the accesses)
    10_000        1.3491
    100_000       1.2250
    1_000_000     1.1558
    10_000_000    1.1124

(the default ``zipf=1.05`` gives top-2% shares of 0.658, 0.740, 0.795 and 0.834 for these sizes).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import heapq
import math
import numbers
from typing import Iterable, Sequence, Union

import numpy as np
import tensorflow as tf

from tf_fusedrec import hashing

__all__ = ["SparseInput", "calibrate_zipf", "hidden_logits", "synthetic_dataset", "top_share"]

_BLOCK = 256            # global rows per random-number block
_HEAD = 1 << 20          # ranks whose CDF is tabulated exactly
_MAX_VOCAB = 1 << 62
_LOGIT_SCALE = 2.5
_CALIBRATION_ROWS = 8192
_STREAM_TAG = 0x5EED_DA7A  # separates the batch streams from the seeds used for the hidden model


# ----------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------

def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class SparseInput:
    """One synthetic sparse feature.

    ``vocab_size`` ids ``[0, vocab_size)``; ``zipf`` > 0 is the exponent of the truncated Zipf law of id ranks;
    ``hotness`` is the number of ids per example: ``1`` gives an int64 ``[B]`` tensor, another int ``h`` a ragged
    ``[B, None]`` tensor whose rows all have ``h`` ids, and ``(lo, hi)`` a ragged tensor whose row lengths are uniform
    in ``[lo, hi]`` (``lo = 0`` gives empty rows).
    """

    name: str
    vocab_size: int
    zipf: float = 1.05
    hotness: Union[int, tuple[int, int]] = 1

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"SparseInput: name must be a non-empty string, got {self.name!r}")
        where = f"SparseInput {self.name!r}"
        if self.name == "dense":
            raise ValueError(f"{where}: name 'dense' is reserved for the dense features")
        if not _is_int(self.vocab_size) or not 1 <= self.vocab_size <= _MAX_VOCAB:
            raise ValueError(f"{where}: vocab_size must be an int in [1, 2**62], got {self.vocab_size!r}")
        object.__setattr__(self, "vocab_size", int(self.vocab_size))
        if (not isinstance(self.zipf, numbers.Real) or isinstance(self.zipf, bool) or not math.isfinite(self.zipf)
                or self.zipf <= 0):
            raise ValueError(f"{where}: zipf (the exponent) must be a finite number > 0, got {self.zipf!r}")
        object.__setattr__(self, "zipf", float(self.zipf))
        h = self.hotness
        if _is_int(h):
            if h < 1:
                raise ValueError(f"{where}: hotness must be >= 1 (or a (lo, hi) range), got {h!r}")
            object.__setattr__(self, "hotness", int(h))
        elif isinstance(h, (tuple, list)) and len(h) == 2 and all(_is_int(v) for v in h):
            lo, hi = int(h[0]), int(h[1])
            if not 0 <= lo <= hi or hi < 1:
                raise ValueError(f"{where}: hotness range (lo, hi) needs 0 <= lo <= hi and hi >= 1, got {tuple(h)!r}")
            object.__setattr__(self, "hotness", (lo, hi))
        else:
            raise ValueError(f"{where}: hotness must be an int >= 1 or a (lo, hi) pair of ints, got {h!r}")

    @property
    def multi_hot(self) -> bool:
        """True when the feature is a ragged ``[B, None]`` tensor (any hotness other than 1)."""
        return self.hotness != 1

    @property
    def mean_hotness(self) -> float:
        """Expected number of ids per example."""
        return float(self.hotness) if _is_int(self.hotness) else (self.hotness[0] + self.hotness[1]) / 2.0


def _as_inputs(inputs) -> tuple[SparseInput, ...]:
    if isinstance(inputs, SparseInput):
        return (inputs,)
    inputs = tuple(inputs)
    for i, inp in enumerate(inputs):
        if not isinstance(inp, SparseInput):
            raise ValueError(f"inputs[{i}] must be a SparseInput, got {type(inp).__name__}")
    names = [inp.name for inp in inputs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate SparseInput names: {dup}")
    return inputs


# ----------------------------------------------------------------------------------------------------------------
# Truncated Zipf law
# ----------------------------------------------------------------------------------------------------------------

class _TruncatedZipf:
    """p(k) = (k + 1) ** -s / H over k in [0, n): exact CDF for the first 2**20 ranks, integral beyond."""

    def __init__(self, n: int, s: float):
        self.n, self.s = n, s
        self.head = min(n, _HEAD)
        cum = np.cumsum(np.arange(1, self.head + 1, dtype=np.float64) ** -s)
        self._head_mass = float(cum[-1])
        self._a = self.head + 0.5
        tail = self._antiderivative(n + 0.5) - self._antiderivative(self._a) if n > self.head else 0.0
        self.total = self._head_mass + tail
        self._cdf = cum / self.total          # P(rank <= k) for k < head

    def _antiderivative(self, x):
        t = 1.0 - self.s
        if abs(t) < 1e-12:
            return np.log(x)
        return np.expm1(t * np.log(x)) / t

    def cdf(self, m: int) -> float:
        """Probability of the ranks [0, m)."""
        m = min(max(int(m), 0), self.n)
        if m == 0:
            return 0.0
        if m <= self.head:
            return float(self._cdf[m - 1])
        tail = self._antiderivative(m + 0.5) - self._antiderivative(self._a)
        return float((self._head_mass + tail) / self.total)

    def pmf(self, k: int) -> float:
        return (k + 1.0) ** -self.s / self.total

    def _guess(self, u: np.ndarray) -> np.ndarray:
        """Ranks from the midpoint-rule integral anchored at the end of the exact table: exact beyond the table,
        within about one rank of the exact answer inside it."""
        y = u * self.total - self._head_mass + self._antiderivative(self._a)
        t = 1.0 - self.s
        if abs(t) < 1e-12:
            x = np.exp(y)
        else:
            x = np.exp(np.log(np.maximum(1.0 + t * y, 1e-300)) / t)
        return np.clip(np.floor(x - 0.5), 0, self.n - 1).astype(np.int64)

    def sample(self, u: np.ndarray) -> np.ndarray:
        """Ranks (int64) for uniforms u in [0, 1): the inverse CDF, ``searchsorted(cdf, u, "right")`` in the table."""
        r = self._guess(u)
        head = u < self._cdf[-1]
        if not head.all():
            r[~head] = np.maximum(r[~head], self.head) if self.n > self.head else self.n - 1
        if not head.any():
            return r
        hu = u[head] if not head.all() else u
        hr = np.minimum(r[head] if not head.all() else r, self.head - 1)
        cdf = self._cdf
        for _ in range(4):   # the guess is within a rank or two: walk to the exact answer cdf[r-1] <= u < cdf[r]
            up = cdf[hr] <= hu
            down = (hr > 0) & (cdf[np.maximum(hr - 1, 0)] > hu)
            if not (up.any() or down.any()):
                break
            hr += up
            hr -= down
        else:
            bad = (cdf[hr] <= hu) | ((hr > 0) & (cdf[np.maximum(hr - 1, 0)] > hu))
            if bad.any():
                hr[bad] = np.searchsorted(cdf, hu[bad], side="right")
        if head.all():
            return hr
        r[head] = hr
        return r


@functools.lru_cache(maxsize=64)
def _zipf_law(n: int, s: float) -> _TruncatedZipf:
    return _TruncatedZipf(n, s)


def _top_count(vocab_size: int, top_fraction: float) -> int:
    return min(vocab_size, max(1, int(round(top_fraction * vocab_size))))


def _check_fraction(top_fraction):
    if not isinstance(top_fraction, numbers.Real) or not 0 < top_fraction <= 1:
        raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction!r}")


def top_share(inputs: Union[SparseInput, Iterable[SparseInput]], top_fraction: float = 0.02,
              samples: int | None = None, seed: int = 0) -> float:
    """Fraction of id accesses carried by the most frequent ``top_fraction`` of the ids.

    For a list of inputs the ids of all features form one population of ``sum(vocab_size)`` ids (an id of feature
    ``f`` is the pair (f, id)), each feature contributing ``mean_hotness`` accesses per example; the top
    ``round(top_fraction * sum(vocab_size))`` of them are counted. ``samples=None`` computes the expected share
    exactly from the pmf; an int draws that many accesses (with ``seed``) and ranks the ids by their observed counts
    (the way the statistic is measured on a real data set; with few samples per id it is biased upwards).
    """
    _check_fraction(top_fraction)
    inputs = _as_inputs(inputs)
    if not inputs:
        raise ValueError("top_share needs at least one SparseInput")
    weights = np.array([inp.mean_hotness for inp in inputs], np.float64)
    if weights.sum() <= 0:
        raise ValueError("top_share: every input has hotness (0, 0); there are no accesses")
    weights /= weights.sum()
    total_vocab = sum(inp.vocab_size for inp in inputs)
    k_top = min(total_vocab, max(1, int(round(top_fraction * total_vocab))))
    laws = [_zipf_law(inp.vocab_size, inp.zipf) for inp in inputs]

    if samples is not None:
        if not _is_int(samples) or samples < 1:
            raise ValueError(f"samples must be None or an int >= 1, got {samples!r}")
        rng = np.random.default_rng([int(seed), _STREAM_TAG, 1])
        per_feature = rng.multinomial(int(samples), weights)
        counts = []
        for law, n in zip(laws, per_feature):
            if n:
                counts.append(np.unique(law.sample(rng.random(n)), return_counts=True)[1])
        counts = np.sort(np.concatenate(counts))[::-1]
        return float(counts[:k_top].sum() / counts.sum())

    if len(inputs) == 1:
        return laws[0].cdf(k_top)
    # Weighted pmfs q_f(k) = w_f p_f(k) all decrease in k: the top k_top ids are those with q above a threshold t.
    def count_above(log_t):
        c = 0
        out = []
        for w, law in zip(weights, laws):
            if w == 0:
                out.append(0)
                continue
            # (k + 1) ** -s * w / H >= t  <=>  k + 1 <= (w / (H t)) ** (1 / s)
            log_m = (math.log(w / law.total) - log_t) / law.s
            m = law.n if log_m > math.log(law.n) + 1 else min(max(math.floor(math.exp(log_m) * (1 + 1e-12)), 0), law.n)
            out.append(m)
            c += m
        return c, out

    hi = max(math.log(w / law.total) for w, law in zip(weights, laws) if w > 0) + 1.0   # nothing above
    lo = min(math.log(w * law.pmf(law.n - 1)) for w, law in zip(weights, laws) if w > 0) - 1.0  # everything
    for _ in range(200):
        mid = (lo + hi) / 2
        if count_above(mid)[0] <= k_top:
            hi = mid
        else:
            lo = mid
    c, counts = count_above(hi)
    share = sum(w * law.cdf(m) for w, law, m in zip(weights, laws, counts))
    # Ties at the threshold: take the remaining ids greedily (at most a few).
    heap = [(-w * law.pmf(m), i) for i, (w, law, m) in enumerate(zip(weights, laws, counts)) if w > 0 and m < law.n]
    heapq.heapify(heap)
    for _ in range(k_top - c):
        if not heap:
            break
        q, i = heapq.heappop(heap)
        share += -q
        counts[i] += 1
        if counts[i] < laws[i].n:
            heapq.heappush(heap, (-weights[i] * laws[i].pmf(counts[i]), i))
    return float(min(share, 1.0))


@functools.lru_cache(maxsize=256)
def calibrate_zipf(vocab_size: int, top_fraction: float = 0.02, target_share: float = 0.90) -> float:
    """The exponent for which the top ``top_fraction`` of ``vocab_size`` ids carry ``target_share`` of the accesses.

    Bisection on the exponent of the truncated Zipf law (the share grows with it), to 1e-7.
    ``calibrate_zipf(1_000_000)`` ~ 1.1558: "2% of the ids carry 90% of the accesses".
    """
    if not _is_int(vocab_size) or not 1 <= vocab_size <= _MAX_VOCAB:
        raise ValueError(f"vocab_size must be an int in [1, 2**62], got {vocab_size!r}")
    _check_fraction(top_fraction)
    k_top = _top_count(int(vocab_size), top_fraction)
    floor_share = k_top / vocab_size   # the share of a uniform law (exponent -> 0)
    if not isinstance(target_share, numbers.Real) or not floor_share < target_share < 1:
        raise ValueError(f"target_share must be in ({floor_share:g}, 1) for vocab_size {vocab_size} and "
                         f"top_fraction {top_fraction} (a uniform law already gives {floor_share:g}), "
                         f"got {target_share!r}")

    def share(s):
        return _TruncatedZipf(int(vocab_size), s).cdf(k_top)

    lo, hi = 1e-6, 1.0
    while share(hi) < target_share:
        lo, hi = hi, hi * 2
        if hi > 1e4:  # pragma: no cover - only for absurd targets
            raise ValueError(f"target_share {target_share} is out of reach for vocab_size {vocab_size}")
    while hi - lo > 1e-7:
        mid = (lo + hi) / 2
        if share(mid) < target_share:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 7)


# ----------------------------------------------------------------------------------------------------------------
# The hidden model and the batch generator
# ----------------------------------------------------------------------------------------------------------------

def _key64(*parts) -> int:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


class _Feature:
    """Per-feature constants: the law, the id bijection, the weight key."""

    def __init__(self, inp: SparseInput, seed: int):
        self.inp = inp
        self.law = _zipf_law(inp.vocab_size, inp.zipf)
        v = inp.vocab_size
        key = _key64("perm", seed, inp.name)
        if v == 1:
            self.mult, self.offset = 1, 0
        else:
            limit = v if v < (1 << 31) else 1 << (63 - v.bit_length())   # keeps rank * mult below 2**63
            mult = key % (limit - 1) + 1
            while math.gcd(mult, v) != 1:
                mult = mult % (limit - 1) + 1
            self.mult, self.offset = mult, (key >> 32) % v
        self.weight_key = np.uint64(_key64("weight", seed, inp.name))

    def ids(self, u: np.ndarray, shift: int = 0) -> np.ndarray:
        ranks = self.law.sample(u)
        v = self.inp.vocab_size
        if shift:
            ranks = (ranks - shift % v) % v
        return (ranks * self.mult % v + self.offset) % v

    def weights(self, ids: np.ndarray) -> np.ndarray:
        """Hidden weight in [-1, 1) of each id."""
        with np.errstate(over="ignore"):
            h = hashing.mix64(ids.astype(np.uint64) + self.weight_key)
        return (h >> np.uint64(11)).astype(np.float64) * (2.0 ** -52) - 1.0


class _Generator:
    def __init__(self, inputs: tuple[SparseInput, ...], num_dense: int, seed: int):
        self.inputs, self.num_dense, self.seed = inputs, num_dense, seed
        self.features = [_Feature(inp, seed) for inp in inputs]
        if num_dense:
            v = np.random.default_rng([seed, _STREAM_TAG, 2]).standard_normal(num_dense)
            self.dense_weights = v / np.linalg.norm(v)
        else:
            self.dense_weights = np.zeros(0)
        self.sparse_mean, self.sparse_std = 0.0, 1.0
        if inputs:
            sample = self._draw(np.random.default_rng([seed, _STREAM_TAG, 3]), _CALIBRATION_ROWS)
            score = self._sparse_score(self._ids(sample)[0])
            self.sparse_mean = float(score.mean())
            std = float(score.std())
            self.sparse_std = std if std > 1e-9 else 1.0

    # Random numbers of a block of rows, in a fixed order: the row lengths of the variable-hotness features (one
    # [rows, k] draw), one uniform per id of every feature (feature after feature), the dense features, the label
    # uniforms.
    def _draw(self, rng: np.random.Generator, rows: int):
        """Per feature (lengths or None for a fixed hotness, uniforms); dense; label uniforms."""
        lengths = [None] * len(self.features)
        var = [i for i, f in enumerate(self.features) if isinstance(f.inp.hotness, tuple)]
        if var:
            lo = np.array([self.features[i].inp.hotness[0] for i in var], np.int64)
            hi = np.array([self.features[i].inp.hotness[1] for i in var], np.int64)
            drawn = rng.integers(lo, hi + 1, size=(rows, len(var)), dtype=np.int64)
            for j, i in enumerate(var):
                lengths[i] = drawn[:, j]
        totals = [rows * f.inp.hotness if x is None else int(x.sum()) for f, x in zip(self.features, lengths)]
        u = rng.random(sum(totals))
        ends = np.cumsum(totals, dtype=np.int64)
        sparse = [(x, u[e - t:e]) for x, t, e in zip(lengths, totals, ends)]
        dense = rng.standard_normal((rows, self.num_dense), dtype=np.float32)
        label_u = rng.random(rows)
        return sparse, dense, label_u

    def _ids(self, drawn, shift=0):
        sparse, dense, label_u = drawn
        rows = label_u.size
        ids = []
        for f, (lengths, u) in zip(self.features, sparse):
            if lengths is None:
                splits = np.arange(0, rows * f.inp.hotness + 1, f.inp.hotness, dtype=np.int64)
            else:
                splits = np.zeros(rows + 1, np.int64)
                np.cumsum(lengths, out=splits[1:])
            ids.append((f.ids(u, shift), splits))
        return ids, dense, label_u

    def _sparse_score(self, ids):
        score = None
        for f, (values, splits) in zip(self.features, ids):
            w = f.weights(values)
            if f.inp.hotness == 1:
                term = w
            else:
                rows = splits.size - 1
                lengths = np.diff(splits)
                seg = np.repeat(np.arange(rows), lengths)
                term = np.bincount(seg, weights=w, minlength=rows) / np.maximum(lengths, 1)
            score = term.copy() if score is None else score + term
        return score

    def logits(self, ids, dense) -> np.ndarray:
        rows = dense.shape[0] if dense is not None else ids[0][1].size - 1
        z = np.zeros(rows)
        parts = 0
        if self.features:
            z += (self._sparse_score(ids) - self.sparse_mean) / self.sparse_std
            parts += 1
        if self.num_dense:
            z += dense.astype(np.float64) @ self.dense_weights
            parts += 1
        return _LOGIT_SCALE * z / math.sqrt(max(parts, 1))

    def rows(self, step: int, held_out: bool, start: int, stop: int, drift: float = 0.0):
        """Global rows [start, stop) of the batch of ``step``: (ids per feature as (values, splits), dense, label);
        `drift` ids per step shift the popular ids (the module docstring)."""
        b0, b1 = start // _BLOCK, -(-stop // _BLOCK)
        blocks = [self._draw(np.random.Generator(np.random.PCG64([self.seed, int(held_out), step, b, _STREAM_TAG])),
                             _BLOCK) for b in range(b0, b1)]
        lo, hi = start - b0 * _BLOCK, stop - b0 * _BLOCK
        sparse = []
        for i, f in enumerate(self.features):
            u = np.concatenate([blk[0][i][1] for blk in blocks]) if len(blocks) > 1 else blocks[0][0][i][1]
            if blocks[0][0][i][0] is None:
                h = f.inp.hotness
                sparse.append((None, u[lo * h:hi * h]))
            else:
                lengths = np.concatenate([blk[0][i][0] for blk in blocks])
                offsets = np.zeros(lengths.size + 1, np.int64)
                np.cumsum(lengths, out=offsets[1:])
                sparse.append((lengths[lo:hi], u[offsets[lo]:offsets[hi]]))
        dense = np.concatenate([blk[1] for blk in blocks])[lo:hi]
        label_u = np.concatenate([blk[2] for blk in blocks])[lo:hi]
        ids, dense, label_u = self._ids((sparse, dense, label_u), int(math.floor(drift * step)))
        logit = self.logits(ids, dense)
        label = (label_u < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return ids, dense, label


@functools.lru_cache(maxsize=16)
def _generator(inputs: tuple[SparseInput, ...], num_dense: int, seed: int) -> _Generator:
    return _Generator(inputs, num_dense, seed)


def _check_int(name, value, low, high=None):
    if not _is_int(value) or value < low or (high is not None and value > high):
        rng = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an int {rng}, got {value!r}")
    return int(value)


def synthetic_dataset(inputs: Sequence[SparseInput], num_dense: int, batch_size: int, seed: int = 0,
                      rank: int = 0, num_ranks: int = 1, steps: int | None = None, held_out: bool = False,
                      start_step: int = 0, drift: float = 0.0) -> tf.data.Dataset:
    """This worker's batches ``(features, label)`` of the synthetic stream; see the module docstring.

    ``features``: name -> int64 ``[B]`` (hotness 1) or ragged int64 ``[B, None]``, plus ``"dense"`` -> float32
    ``[B, num_dense]`` when ``num_dense > 0``; ``label``: float32 ``[B]`` in {0, 1}. ``B = batch_size`` (per worker).
    The stream has the batches of steps ``start_step, ..., steps - 1`` (endless with ``steps=None``): it equals
    ``synthetic_dataset(..., steps=steps).skip(start_step)`` but generates nothing for the skipped steps.
    ``drift``: ids per step by which popularity moves (a number >= 0; the module docstring).
    """
    inputs = _as_inputs(inputs)
    num_dense = _check_int("num_dense", num_dense, 0)
    if not inputs and not num_dense:
        raise ValueError("synthetic_dataset needs at least one SparseInput or num_dense > 0")
    batch_size = _check_int("batch_size", batch_size, 1)
    seed = _check_int("seed", seed, 0)
    num_ranks = _check_int("num_ranks", num_ranks, 1)
    rank = _check_int("rank", rank, 0, num_ranks - 1)
    if steps is not None:
        steps = _check_int("steps", steps, 0)
    start_step = _check_int("start_step", start_step, 0)
    if (not isinstance(drift, numbers.Real) or isinstance(drift, bool) or not math.isfinite(drift)
            or drift < 0):
        raise ValueError(f"drift must be a finite number >= 0 (ids per step), got {drift!r}")
    drift = float(drift)
    held_out = bool(held_out)
    gen = _generator(inputs, num_dense, seed)
    start, stop = rank * batch_size, (rank + 1) * batch_size

    def batches():
        step = start_step
        while steps is None or step < steps:
            ids, dense, label = gen.rows(step, held_out, start, stop, drift)
            flat = []
            for inp, (values, splits) in zip(inputs, ids):
                flat.extend([values] if not inp.multi_hot else [values, splits])
            if num_dense:
                flat.append(dense)
            flat.append(label)
            yield tuple(flat)
            step += 1

    signature = []
    for inp in inputs:
        if inp.multi_hot:
            signature += [tf.TensorSpec([None], tf.int64), tf.TensorSpec([batch_size + 1], tf.int64)]
        else:
            signature.append(tf.TensorSpec([batch_size], tf.int64))
    if num_dense:
        signature.append(tf.TensorSpec([batch_size, num_dense], tf.float32))
    signature.append(tf.TensorSpec([batch_size], tf.float32))

    def assemble(*flat):
        features, i = {}, 0
        for inp in inputs:
            if inp.multi_hot:
                features[inp.name] = tf.RaggedTensor.from_row_splits(flat[i], flat[i + 1], validate=False)
                i += 2
            else:
                features[inp.name] = flat[i]
                i += 1
        if num_dense:
            features["dense"] = flat[i]
            i += 1
        return features, flat[i]

    ds = tf.data.Dataset.from_generator(batches, output_signature=tuple(signature))
    return ds.map(assemble).prefetch(tf.data.AUTOTUNE)


def hidden_logits(inputs: Sequence[SparseInput], features, seed: int = 0) -> np.ndarray:
    """The hidden model's logit (float64 ``[B]``) of a batch ``features`` of ``synthetic_dataset(inputs, ...,
    seed=seed)`` (the dict as the dataset yields it, tensors or NumPy arrays). ``sigmoid(logit)`` is the label's
    probability, so e.g. the AUC of these logits is the best AUC a model can reach."""
    inputs = _as_inputs(inputs)
    dense = features.get("dense")
    num_dense = 0 if dense is None else int(dense.shape[1])
    dense = None if dense is None else np.asarray(dense)
    gen = _generator(inputs, num_dense, _check_int("seed", seed, 0))
    ids = []
    for inp in inputs:
        x = features[inp.name]
        if isinstance(x, tf.RaggedTensor):
            ids.append((x.flat_values.numpy().astype(np.int64), x.row_splits.numpy().astype(np.int64)))
        else:
            values = np.asarray(x).astype(np.int64).reshape(-1)
            ids.append((values, np.arange(values.size + 1, dtype=np.int64)))
    if dense is None:
        dense = np.zeros((ids[0][1].size - 1, 0), np.float32)
    return gen.logits(ids, dense)
