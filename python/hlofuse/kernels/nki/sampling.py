"""NKI token sampling for Trainium: `sample_reference`'s token ids without sorting the vocabulary.

`sample(logits, key, *, form, ...)` returns exactly the token ids of `sample_reference` (the meaning of
an `hlofuse.sample` composite, docs/composites.md) for the vocabulary-space forms: greedy, categorical,
temperature, top_k_mask, top_p_mask, top_k_top_p_mask and min_p.

NKI layout (the kernel's HBM operands; the wrapper only reshapes):
  logits (R, V) in the program's dtype     noise (R, V) Gumbel noise in the same dtype (stochastic forms)
  out    (R, 1) int32 token ids, or UNCERTIFIED (-1) for a row the kernel cannot vouch for
Rows sit on the partition dim, `block_rows` <= 128 per tile; the vocabulary streams through SBUF along
the free dim in chunks of `block_v`. Every pass reads the row tile's chunks in order and keeps per-row
(rows, 1) state in SBUF; reductions are nl.max / nl.min / nl.sum over the free axis.

Per row tile:
  1. stats pass: row max, smallest finite logit, finite count, a NaN flag, and for the probability
     filters the softmax denominator Z = sum exp(x - max) (the smallest logit with exp(x - max) > 0 bounds
     the top-p search from below: tokens of zero mass cannot be the nucleus cutoff).
  2. threshold search (top-k, top-p): the largest logit v with measure(x >= v) >= target, where measure is
     the count (target k: the k-th largest, ties included) or the softmax mass (target p: the nucleus
     cutoff `sorted[sum(cumsum < p)]` of the sorted program, but for its cumsum's f32 rounding, whose order
     only XLA knows: so the search runs at p + slack, whose cutoff the draw keeps, and at p - slack, at or
     above whose cutoff a winner is vouched for; a winner between is UNCERTIFIED, `nucleus_cut_slack`).
     Bisection in t = sign(x) log1p(|x|), so a search spans the whole float range in a few dozen steps; each
     step is one pass that also snaps the bounds to data values (the smallest logit >= t, the largest < t),
     so [lo, hi] always holds v and lo == hi means v is found. `steps` passes at most; a row not converged by
     then is UNCERTIFIED.
  3. sampling pass: score = where(keep, x / T, -inf) + noise, each op rounded to the logits' dtype as
     XLA rounds it; the first index of the row maximum (ties to the lower id, as jnp.argmax).

Gumbel noise: NKI's engines compute integer arithmetic in fp32 (nisa.tensor_reduce and the elementwise
ops cast to float32; only bitvec ops see raw bits), so threefry2x32's wrapping 32-bit adds cannot be done
exactly on chip. The JAX wrapper therefore draws the noise with the same call `jax.random.categorical`
makes, `jax.random.gumbel(key, logits.shape, logits.dtype)`, and passes it in: exact, but the noise
generation is not fused into the kernel.

Rows marked UNCERTIFIED (a NaN logit, +inf under a probability filter, a search that did not converge
in `steps` passes, e.g. logits within a few ulp of each other near 1e-30, or a nucleus draw in its cut's
band) are recomputed by the wrapper
with `sample_reference` under a `lax.cond`, which runs only when some row needs it; the result is the
reference's in every case.

The kernel is written against `nl` / `nisa` / `nki`: real `neuronxcc.nki` when it imports, else the
emulator (hlofuse.kernels.nki.emulator). `run_kernel` runs it on NumPy arrays under either.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hlofuse.kernels.nki import emulator, hostcall
from hlofuse.kernels.nki.attention import HAVE_NEURONXCC, INSTALL_MESSAGE, missing_sdk, nisa, nki, nl
from hlofuse.kernels.noise import MAX_COUNTER, categorical_at_rows, gumbel_at_rows
from hlofuse.kernels.sampling_reference import (
    FORMS,
    SOFTMAX_TIE_MARGIN,
    UNCERTIFIED,
    after_stages,
    form_params,
    nucleus_cut_slack,
    prelude_of,
    reference_where_uncertified,
    sample_reference,
)
from hlofuse.kernels.target import CompositeCall, KernelSpec, Lowered, Unsupported
from hlofuse.ops.sample import SAMPLE, SampleAttrs

KERNEL_FORMS = ("greedy", "greedy_softmax", "categorical", "temperature", "top_k", "temperature_top_k", "top_k_mask",
                "top_p_mask", "top_k_top_p_mask", "min_p")
# Noise indexed by rank among the top k: one pass per distinct value of the top k, so k is bounded.
RANK_FORMS = ("top_k", "temperature_top_k")
MAX_RANK_K = 256
# Filters on probabilities: the program rounds them (and their cumulative sum) to the logits' dtype.
F32_ONLY_FORMS = ("top_p_mask", "top_k_top_p_mask", "min_p")
DTYPES = ("float32", "bfloat16", "float16")
MAX_VOCAB = 1 << 24  # ids travel as fp32 (the engines' arithmetic type): exact below 2^24
SEARCH_STEPS = 48
BLOCK_ROWS = 128
BLOCK_V = 2048
NEG_INF = float("-inf")
POS_INF = float("inf")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Rows per tile (partitions, <= 128) and vocabulary entries per SBUF chunk (free size)."""

    block_rows: int = BLOCK_ROWS
    block_v: int = BLOCK_V

    def __post_init__(self) -> None:
        if not 1 <= self.block_rows <= 128 or self.block_v < 1:
            raise ValueError(f"block_rows {self.block_rows} must be in [1, 128] and block_v {self.block_v} >= 1")

    @classmethod
    def get_default(cls) -> BlockSizes:
        return cls()


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Everything the kernel knows at trace time (JSON-able: it travels in the host call's config)."""

    form: str
    temperature: float
    k: int
    p: float
    min_p: float
    dtype: str  # the logits' dtype: every value the program rounds is rounded to it
    block_rows: int
    block_v: int
    steps: int = SEARCH_STEPS

    @property
    def stochastic(self) -> bool:
        return FORMS[self.form].stochastic


# ----------------------------------------------------------------------------- kernel


def _chunks(vocab: int, block_v: int) -> list[tuple[int, int]]:
    """Static (start, size) chunks of the vocabulary; the last may be shorter."""
    return [(c0, min(block_v, vocab - c0)) for c0 in range(0, vocab, block_v)]


def _u(x: Any) -> Any:  # noqa: ANN401
    """sign(x) log1p(|x|): monotone, maps the float range onto about [-89, 89] for the bisection."""
    return nl.where(nl.greater_equal(x, 0.0), nl.log(nl.add(x, 1.0)),
                    nl.multiply(nl.log(nl.subtract(1.0, x)), -1.0))  # fmt: skip


def _u_inverse(u: Any) -> Any:  # noqa: ANN401
    return nl.where(nl.greater_equal(u, 0.0), nl.subtract(nl.exp(u), 1.0),
                    nl.subtract(1.0, nl.exp(nl.multiply(u, -1.0))))  # fmt: skip


def _row_stats(load: Callable[[int, int], Any], chunks: list[tuple[int, int]], rows: int, z: bool) -> dict[str, Any]:
    """One pass: max, smallest finite, finite count, NaN/+inf flags and (if z) Z and the smallest x of mass > 0."""
    m = nl.full((rows, 1), NEG_INF, dtype=nl.float32, buffer=nl.sbuf)
    lo = nl.full((rows, 1), POS_INF, dtype=nl.float32, buffer=nl.sbuf)
    finite = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    bad = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)  # > 0: a NaN (or +inf with z)
    for c0, size in chunks:
        x = load(c0, size)
        m[...] = nl.maximum(m, nl.max(x, axis=1, keepdims=True))
        is_finite = nl.greater(x, NEG_INF)
        lo[...] = nl.minimum(lo, nl.min(nl.where(is_finite, x, POS_INF), axis=1, keepdims=True))
        finite[...] = nl.add(finite, nl.sum(nl.where(is_finite, 1.0, 0.0), axis=1, keepdims=True))
        flagged = nl.not_equal(x, x)
        if z:
            flagged = nl.logical_or(flagged, nl.equal(x, POS_INF))
        bad[...] = nl.maximum(bad, nl.max(nl.where(flagged, 1.0, 0.0), axis=1, keepdims=True))
    stats = {"max": m, "lo": lo, "finite": finite, "bad": bad}
    if z:
        m_use = nl.where(nl.equal(m, NEG_INF), 0.0, m)  # rows of -inf only: every exp is 0
        total = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        lo_mass = nl.full((rows, 1), POS_INF, dtype=nl.float32, buffer=nl.sbuf)
        for c0, size in chunks:
            x = load(c0, size)
            e = nl.exp(nl.subtract(x, m_use))
            total[...] = nl.add(total, nl.sum(e, axis=1, keepdims=True))
            lo_mass[...] = nl.minimum(lo_mass, nl.min(nl.where(nl.greater(e, 0.0), x, POS_INF), axis=1, keepdims=True))
        stats.update(z=total, m_use=m_use, lo=nl.where(nl.less_equal(lo_mass, m), lo_mass, lo))
    return stats


def _search(load: Callable[[int, int], Any], chunks: list[tuple[int, int]], rows: int, stats: dict[str, Any],
            target: float, mass: bool, steps: int) -> tuple[Any, Any]:  # fmt: skip
    """(threshold, certified): the largest logit v with measure(x >= v) >= target, per row.

    measure is the count of x >= v, or with `mass` their softmax mass. Rows whose whole measure stays
    below target keep everything (threshold -inf), as the program's mask keeps every x >= -inf then.
    """
    if mass:
        z = stats["z"]
        whole = nl.where(nl.greater(z, 0.0), 1.0, 0.0)  # mass(x >= smallest logit of mass > 0)
    else:
        whole = stats["finite"]
    keep_all = nl.less(whole, target)
    lo = nl.copy(stats["lo"])  # data values; lo <= v <= hi
    hi = nl.copy(stats["max"])
    for _ in nl.sequential_range(steps):
        mid = _u_inverse(nl.add(nl.multiply(_u(lo), 0.5), nl.multiply(_u(hi), 0.5)))
        t = nl.where(nl.logical_and(nl.greater(mid, lo), nl.less_equal(mid, hi)), mid, hi)
        measure = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        above = nl.full((rows, 1), POS_INF, dtype=nl.float32, buffer=nl.sbuf)  # smallest x >= t
        below = nl.full((rows, 1), NEG_INF, dtype=nl.float32, buffer=nl.sbuf)  # largest x < t
        for c0, size in chunks:
            x = load(c0, size)
            ge = nl.greater_equal(x, t)
            weight = nl.exp(nl.subtract(x, stats["m_use"])) if mass else 1.0
            measure[...] = nl.add(measure, nl.sum(nl.where(ge, weight, 0.0), axis=1, keepdims=True))
            above[...] = nl.minimum(above, nl.min(nl.where(ge, x, POS_INF), axis=1, keepdims=True))
            below[...] = nl.maximum(below, nl.max(nl.where(ge, NEG_INF, x), axis=1, keepdims=True))
        if mass:
            measure = nl.divide(measure, stats["z"])
        reached = nl.greater_equal(measure, target)
        lo[...] = nl.where(reached, above, lo)
        hi[...] = nl.where(reached, hi, below)
    found = nl.where(nl.equal(lo, hi), 1.0, 0.0)
    certified = nl.maximum(found, nl.where(keep_all, 1.0, 0.0))
    return nl.where(keep_all, NEG_INF, lo), certified


def _rank_space(values: Callable[[int, int], Any], noise_ref: Any, r0: int, rows: int,  # noqa: ANN401
                chunks: list[tuple[int, int]], top: Any, cfg: KernelConfig, vocab: int) -> tuple[Any, Any]:  # noqa: ANN401
    """(token id, certified) for the rank-space forms: categorical over the top k, noise indexed by rank.

    Walks the distinct values downward, one pass each: group j is every token equal to w_j, holding ranks
    base_j .. base_j + count - 1 in id order (lax.top_k's order), cut at rank k. Its best score is over
    noise[base_j:...] alone, so the winning rank is found without ranking single tokens; the token is then
    the (rank - base)-th occurrence of its value in id order, found by bisection over ids.
    """
    k = cfg.k
    dtype = getattr(nl, cfg.dtype)
    divisor = cfg.temperature if cfg.form == "top_k" else 1.0  # temperature_top_k walks x / T already
    g = nl.load(noise_ref[nl.ds(r0, rows), nl.ds(0, k)], dtype=nl.float32)  # (rows, k): noise by rank
    ranks = nisa.iota(nl.arange(rows)[:, None] * 0 + nl.arange(k)[None, :], dtype=nl.float32)
    w = nl.copy(top)  # value of the current group: the row max first
    valid = nl.full((rows, 1), 1.0, dtype=nl.float32, buffer=nl.sbuf)
    base = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    best = nl.full((rows, 1), NEG_INF, dtype=nl.float32, buffer=nl.sbuf)
    best_rank = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    best_w = nl.copy(top)
    best_base = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    # lax.top_k ranks +0 above -0, which compare equal here: a row holding both, whose top k take its group of zeros,
    # is not vouched for (the sign of a zero is the sign of its reciprocal's infinity)
    negative_zero = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    positive_zero = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    for c0, size in chunks:
        x = values(c0, size)
        zero = nl.equal(x, 0.0)
        inverse = nl.divide(1.0, x)
        negative_zero[...] = nl.maximum(negative_zero, nl.max(nl.where(nl.logical_and(zero, nl.less(inverse, 0.0)),
                                                                       1.0, 0.0), axis=1, keepdims=True))
        positive_zero[...] = nl.maximum(positive_zero, nl.max(nl.where(nl.logical_and(zero, nl.greater(inverse, 0.0)),
                                                                       1.0, 0.0), axis=1, keepdims=True))
    mixed = nl.multiply(negative_zero, positive_zero)
    zero_group = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    for _ in nl.sequential_range(k):
        count = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        below = nl.full((rows, 1), NEG_INF, dtype=nl.float32, buffer=nl.sbuf)  # the next group's value
        for c0, size in chunks:
            x = values(c0, size)
            count[...] = nl.add(count, nl.sum(nl.where(nl.equal(x, w), 1.0, 0.0), axis=1, keepdims=True))
            below[...] = nl.maximum(below, nl.max(nl.where(nl.less(x, w), x, NEG_INF), axis=1, keepdims=True))
        take = nl.minimum(nl.multiply(count, valid), nl.subtract(float(k), base))
        zero_group[...] = nl.maximum(zero_group, nl.where(nl.logical_and(nl.equal(w, 0.0), nl.greater(take, 0.0)),
                                                          mixed, 0.0))
        in_group = nl.logical_and(nl.greater_equal(ranks, base), nl.less(ranks, nl.add(base, take)))
        v = nl.divide(w, divisor)
        score = nl.add(nl.copy(v, dtype=dtype), g)  # values / T + noise, each rounded as the program does
        score = nl.where(in_group, nl.copy(score, dtype=dtype), NEG_INF)
        group_max = nl.max(score, axis=1, keepdims=True)
        first = nl.logical_and(in_group, nl.equal(score, group_max))
        group_rank = nl.min(nl.where(first, ranks, float(k)), axis=1, keepdims=True)
        better = nl.greater(group_max, best)  # strictly: a later rank never wins a tie
        best_rank[...] = nl.where(better, group_rank, best_rank)
        best_w[...] = nl.where(better, w, best_w)
        best_base[...] = nl.where(better, base, best_base)
        best[...] = nl.maximum(best, group_max)
        base[...] = nl.add(base, take)
        valid[...] = nl.where(nl.less(below, w), valid, 0.0)  # no value below w: no more groups
        w[...] = below
    # the token: the smallest id a with count(x == best_w, id <= a) > rank - base; lo < a <= hi, integers
    target = nl.add(nl.subtract(best_rank, best_base), 1.0)
    lo = nl.full((rows, 1), -1.0, dtype=nl.float32, buffer=nl.sbuf)
    hi = nl.full((rows, 1), float(vocab - 1), dtype=nl.float32, buffer=nl.sbuf)
    for _ in nl.sequential_range(math.ceil(math.log2(vocab)) + 1):
        mid = nl.multiply(nl.add(lo, hi), 0.5)
        count = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        floor = nl.full((rows, 1), -1.0, dtype=nl.float32, buffer=nl.sbuf)  # largest id <= mid
        for c0, size in chunks:
            x = values(c0, size)
            ids = nisa.iota(nl.arange(rows)[:, None] * 0 + nl.arange(size)[None, :] + c0, dtype=nl.float32)
            upto = nl.less_equal(ids, mid)
            hit = nl.logical_and(upto, nl.equal(x, best_w))
            count[...] = nl.add(count, nl.sum(nl.where(hit, 1.0, 0.0), axis=1, keepdims=True))
            floor[...] = nl.maximum(floor, nl.max(nl.where(upto, ids, -1.0), axis=1, keepdims=True))
        reached = nl.greater_equal(count, target)
        hi[...] = nl.where(reached, floor, hi)
        lo[...] = nl.where(reached, lo, floor)
    found = nl.where(nl.equal(nl.subtract(hi, lo), 1.0), 1.0, 0.0)
    return hi, nl.minimum(found, nl.subtract(1.0, zero_group))


def _clear_of_softmax_ties(load: Callable[[int, int], Any], chunks: list[tuple[int, int]], best: Any,  # noqa: ANN401
                           dtype: str) -> Any:  # noqa: ANN401
    """(rows, 1) 1.0 where the row's max is below +inf and no token lies less than SOFTMAX_TIE_MARGIN below it
    (its softmax probability could round to the max's; copies of the max come after its first index and tie
    it in both), else 0.0. A row of -inf is certified: its softmax is NaN, whose argmax is 0, as argmax(x)."""
    lo = nl.subtract(best, SOFTMAX_TIE_MARGIN[dtype])
    clear = nl.where(nl.less(best, POS_INF), 1.0, 0.0)  # a NaN row is flagged by the argmax pass
    for c0, size in chunks:
        x = load(c0, size)
        near = nl.logical_and(nl.greater(x, lo), nl.less(x, best))
        clear = nl.minimum(clear, nl.subtract(1.0, nl.max(nl.where(near, 1.0, 0.0), axis=1, keepdims=True)))
    return clear


def _sample_kernel(logits_ref: Any, noise_ref: Any, cfg: KernelConfig) -> Any:  # noqa: ANN401
    """logits (R, V), noise (R, V) | (R, k) | None -> out (R, 1) int32 token ids (UNCERTIFIED: rows to redo)."""
    total_rows, vocab = logits_ref.shape
    out_ref = nl.ndarray((total_rows, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    chunks = _chunks(vocab, cfg.block_v)
    dtype = getattr(nl, cfg.dtype)
    rounds = cfg.dtype != "float32"  # every op of the program rounds to bf16/f16
    for r0 in nl.static_range(0, total_rows, cfg.block_rows):
        rows = min(cfg.block_rows, total_rows - r0)

        def raw(c0: int, size: int, r0: int = r0, rows: int = rows) -> Any:  # noqa: ANN401
            return nl.load(logits_ref[nl.ds(r0, rows), nl.ds(c0, size)], dtype=nl.float32)  # (rows, size)

        def scaled(c0: int, size: int) -> Any:  # noqa: ANN401
            y = nl.divide(raw(c0, size), cfg.temperature)  # x / T in the logits' dtype, as XLA rounds it
            return nl.copy(y, dtype=dtype) if rounds else y

        # the values the filter reads: x for the masks and top_k, x / T for min-p and temperature_top_k
        filtered = scaled if cfg.form in ("min_p", "temperature_top_k") else raw
        if cfg.form in RANK_FORMS:
            stats = _row_stats(filtered, chunks, rows, z=False)
            token, certified = _rank_space(filtered, noise_ref, r0, rows, chunks, stats["max"], cfg, vocab)
            certified = nl.minimum(certified, nl.where(nl.greater(stats["bad"], 0.0), 0.0, 1.0))
            token = nl.where(nl.greater(certified, 0.0), token, float(UNCERTIFIED))
            nl.store(out_ref[nl.ds(r0, rows), :], value=nl.copy(token, dtype=nl.int32))
            continue
        z = cfg.form in F32_ONLY_FORMS
        stats = _row_stats(filtered, chunks, rows, z=z and cfg.form != "top_k_top_p_mask")
        certified = nl.where(nl.greater(stats["bad"], 0.0), 0.0, 1.0)
        thresholds: list[Any] = []  # keep x >= each
        if cfg.form in ("top_k_mask", "top_k_top_p_mask"):
            kth, ok = _search(filtered, chunks, rows, stats, float(cfg.k), mass=False, steps=cfg.steps)
            thresholds.append(kth)
            certified = nl.minimum(certified, ok)
        if cfg.form in ("top_p_mask", "top_k_top_p_mask"):
            source = filtered
            if thresholds:  # the nucleus of what top-k left: x below the k-th are -inf
                kth = thresholds[0]

                def source(c0: int, size: int, kth: Any = kth, filtered: Callable[..., Any] = filtered) -> Any:  # noqa: ANN401
                    x = filtered(c0, size)
                    return nl.where(nl.greater_equal(x, kth), x, NEG_INF)

                stats = _row_stats(source, chunks, rows, z=True)
                certified = nl.minimum(certified, nl.where(nl.greater(stats["bad"], 0.0), 0.0, 1.0))
            # the program's cut, rounded in XLA's order, lies in [lo, hi]: draw among x >= lo, vouch for x >= hi
            slack = nucleus_cut_slack(vocab, vocab, cfg.p, own_terms=2 * (cfg.block_v + len(chunks)))
            cutoff, ok = _search(source, chunks, rows, stats, float(cfg.p + slack), mass=True, steps=cfg.steps)
            thresholds.append(cutoff)
            certified = nl.minimum(certified, ok)
            if cfg.p - slack > 0:
                vouched, ok = _search(source, chunks, rows, stats, float(cfg.p - slack), mass=True, steps=cfg.steps)
                certified = nl.minimum(certified, ok)
            else:
                vouched = nl.full((rows, 1), POS_INF, dtype=nl.float32, buffer=nl.sbuf)
        min_p_floor = None
        if cfg.form == "min_p":  # keep exp(y - max) / Z >= min_p * (1 / Z), each rounded to f32
            inv_z = nl.divide(1.0, stats["z"])
            min_p_floor = nl.multiply(inv_z, float(np.float32(cfg.min_p)))

        best = nl.full((rows, 1), NEG_INF, dtype=nl.float32, buffer=nl.sbuf)
        best_id = nl.zeros((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        best_x = nl.full((rows, 1), NEG_INF, dtype=nl.float32, buffer=nl.sbuf)  # the winner's logit
        for c0, size in chunks:
            x = filtered(c0, size)
            keep = None
            for threshold in thresholds:
                above = nl.greater_equal(x, threshold)
                keep = above if keep is None else nl.logical_and(keep, above)
            if min_p_floor is not None:
                probs = nl.divide(nl.exp(nl.subtract(x, stats["m_use"])), stats["z"])
                keep = nl.greater_equal(probs, min_p_floor)
            score = scaled(c0, size) if cfg.form != "min_p" else x
            if keep is not None:
                score = nl.where(keep, score, NEG_INF)
            if cfg.stochastic:
                noise = nl.load(noise_ref[nl.ds(r0, rows), nl.ds(c0, size)], dtype=nl.float32)
                score = nl.add(score, noise)
                if rounds:
                    score = nl.copy(score, dtype=dtype)
            chunk_max = nl.max(score, axis=1, keepdims=True)
            ids = nisa.iota(nl.arange(rows)[:, None] * 0 + nl.arange(size)[None, :] + c0, dtype=nl.float32)
            chunk_id = nl.min(nl.where(nl.equal(score, chunk_max), ids, float(vocab)), axis=1, keepdims=True)
            better = nl.greater(chunk_max, best)  # strictly: a later chunk never wins a tie
            chunk_x = nl.max(nl.where(nl.equal(ids, chunk_id), x, NEG_INF), axis=1, keepdims=True)
            best_x[...] = nl.where(better, chunk_x, best_x)
            best_id[...] = nl.where(better, chunk_id, best_id)
            best[...] = nl.maximum(best, chunk_max)
            nan = nl.max(nl.where(nl.not_equal(score, score), 1.0, 0.0), axis=1, keepdims=True)
            certified = nl.minimum(certified, nl.subtract(1.0, nan))
        if cfg.form in ("top_p_mask", "top_k_top_p_mask"):
            certified = nl.minimum(certified, nl.where(nl.greater_equal(best_x, vouched), 1.0, 0.0))
        if cfg.form == "greedy_softmax":  # argmax(softmax(x)) is argmax(x) away from the ties its rounding makes
            certified = nl.minimum(certified, _clear_of_softmax_ties(filtered, chunks, best, cfg.dtype))
        token = nl.where(nl.greater(certified, 0.0), best_id, float(UNCERTIFIED))
        nl.store(out_ref[nl.ds(r0, rows), :], value=nl.copy(token, dtype=nl.int32))
    return out_ref


KERNELS = {"sample": _sample_kernel}
_HELPERS = (_u, _u_inverse, _row_stats, _search, _rank_space, _clear_of_softmax_ties)


@functools.cache
def _kernel(simulator: bool) -> Any:  # noqa: ANN401
    """The nki.jit sampling kernel, bound to real NKI (`simulator`) or to the emulator."""
    if simulator:
        if not HAVE_NEURONXCC:
            raise RuntimeError(INSTALL_MESSAGE)
        return nki.jit(_sample_kernel)
    if not HAVE_NEURONXCC:
        return emulator.nki.jit(_sample_kernel)
    # neuronxcc is installed: rebind the kernel and its helpers to the emulator's namespaces
    scope = dict(globals(), nl=emulator.nl, nisa=emulator.nisa, nki=emulator.nki)
    for fn in (*_HELPERS, _sample_kernel):
        scope[fn.__name__] = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    return emulator.nki.jit(scope[_sample_kernel.__name__])


def run_kernel(logits: np.ndarray, *noise: np.ndarray, config: dict[str, Any], simulator: bool = False) -> np.ndarray:
    """The kernel on NumPy arrays, logits (R, V) [and noise (R, V)] -> (R, 1) int32, emulated or simulated."""
    cfg = KernelConfig(**config)
    args = (logits, noise[0] if noise else None)
    fn = _kernel(simulator)
    if simulator:
        return np.asarray(nki.simulate_kernel(fn, *args, cfg=cfg))
    return np.asarray(fn(*args, cfg=cfg))


# ----------------------------------------------------------------------------- the JAX wrapper


def check_form(form: str, dtype: str, vocab: int, k: int, temperature: float) -> None:
    """Raises ValueError naming the value when the kernel cannot reproduce this sampler exactly."""
    if form not in KERNEL_FORMS:
        raise ValueError(f"form '{form}' is not taken; the kernel takes {', '.join(KERNEL_FORMS)}")
    if dtype not in DTYPES:
        raise ValueError(f"logits dtype {dtype} is not one of {', '.join(DTYPES)}")
    if dtype != "float32" and form in F32_ONLY_FORMS:
        raise ValueError(f"'{form}' on {dtype} logits thresholds {dtype}-rounded probabilities, which the kernel "
                         "does not reproduce (it sums in fp32)")
    if not 1 <= vocab <= MAX_VOCAB:
        raise ValueError(f"vocabulary {vocab} is outside [1, {MAX_VOCAB}] (ids are exact in fp32 below 2^24)")
    if form in ("top_k_mask", "top_k_top_p_mask", *RANK_FORMS) and not 1 <= k <= vocab:
        raise ValueError(f"k = {k} is outside [1, vocabulary {vocab}]")
    if form in RANK_FORMS and k > MAX_RANK_K:
        raise ValueError(f"k = {k} exceeds {MAX_RANK_K} for the rank-space form '{form}' (one pass over the "
                         "logits per distinct value of the top k)")
    if FORMS[form].stochastic and not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature {temperature} is not a positive finite number")


def kernel_tokens(
    logits: jax.Array,  # (..., V) f32 | bf16 | f16
    key: jax.Array | None,  # (2,) uint32 raw threefry2x32 key; None for greedy
    *,
    form: str,
    temperature: float = 1.0,
    k: int = 0,
    p: float = 1.0,
    min_p: float = 0.0,
    runner: str = "sim",
    block_sizes: BlockSizes | None = None,
    steps: int = SEARCH_STEPS,
    row_offset: jax.Array | int | None = None,
    gumbel_at_zero: float | None = None,
) -> jax.Array:  # (...,) int32: token ids, UNCERTIFIED where the kernel cannot vouch for a row
    """The kernel's own output, without the reference for uncertified rows (`sample` adds it).

    `row_offset` (an int32 scalar): the logits' rows are rows row_offset.. of a larger batch (one shard's), so
    the noise is that batch's at these rows (`hlofuse.kernels.noise.gumbel_at_rows`, f32 and bf16 only).
    `gumbel_at_zero`: a hand-written noise's value where the uniform is 0 (SampleAttrs; f32 logits), which the noise
    passed in takes there.

    runner "sim": on this host inside the program (a CPU custom call), under NKI's simulator when
    neuronxcc imports and the emulator otherwise ("emulator" / "simulator" force one). runner "device":
    traced with nki.jit on the JAX arrays, which emits the Neuron custom call (needs the Neuron SDK).
    """
    if form in FORMS:  # parameters the form does not read take their neutral values (as the reference)
        temperature, k, p, min_p = (form_params(form, temperature=temperature, k=k, p=p, min_p=min_p)[name]
                                    for name in ("temperature", "k", "p", "min_p"))
    dtype = jnp.dtype(logits.dtype).name
    batch, vocab = logits.shape[:-1], logits.shape[-1]
    check_form(form, dtype, vocab, k, temperature)
    blocks = block_sizes or BlockSizes.get_default()
    rows = math.prod(batch)
    # `x / T` with a Python T divides by T rounded to the logits' dtype (JAX's weak typing)
    rounded_t = float(np.asarray(temperature, dtype=jnp.dtype(logits.dtype)).astype(np.float32))
    cfg = KernelConfig(form=form, temperature=rounded_t, k=int(k), p=float(p), min_p=float(min_p),
                       dtype=dtype, block_rows=blocks.block_rows, block_v=blocks.block_v, steps=steps)
    operands = [logits.reshape(rows, vocab)]
    if FORMS[form].stochastic:
        if key is None:
            raise ValueError(f"form '{form}' draws noise: it needs a key")
        # the exact call jax.random.categorical makes (threefry bits at the same counters)
        width = k if form in RANK_FORMS else vocab  # rank-space forms draw noise for the top k only
        if gumbel_at_zero is not None:
            if logits.dtype != jnp.float32:
                raise ValueError("a hand-written Gumbel noise (gumbel_at_zero) is drawn for f32 logits only")
            offset = 0 if row_offset is None else row_offset
            operands.append(gumbel_at_rows(key, (rows, width), logits.dtype, offset, gumbel_at_zero))
        elif row_offset is None:
            operands.append(jax.random.gumbel(key, (*batch, width), logits.dtype).reshape(rows, width))
        else:
            operands.append(gumbel_at_rows(key, (rows, width), logits.dtype, row_offset))
    if runner == "device":
        tokens = _device_call(cfg, operands)
    else:
        if runner not in ("sim", "emulator", "simulator"):
            raise ValueError(f"runner {runner!r} is not one of sim, emulator, simulator, device")
        simulator = runner == "simulator" or (runner == "sim" and HAVE_NEURONXCC)
        kwargs = {"config": dataclasses.asdict(cfg), "simulator": simulator}
        tokens = hostcall.host_call(run_kernel, operands, kwargs, jax.ShapeDtypeStruct((rows, 1), jnp.int32))
    return tokens.reshape(batch)


def sample(
    logits: jax.Array,  # (..., V) f32 | bf16 | f16
    key: jax.Array | None,  # (2,) uint32 raw threefry2x32 key; None for greedy
    *,
    form: str,
    temperature: float = 1.0,
    k: int = 0,
    p: float = 1.0,
    min_p: float = 0.0,
    row_offset: jax.Array | int | None = None,
    gumbel_at_zero: float | None = None,  # f32: a hand-written noise's value where the uniform is 0
    **kernel_options: Any,  # noqa: ANN401  (runner, block_sizes, steps: see kernel_tokens)
) -> jax.Array:  # (...,) int32
    """`sample_reference`'s token ids by the NKI kernel; rows it marks UNCERTIFIED come from the reference.
    With `row_offset` the rows are rows row_offset.. of a larger batch, and both draw that batch's noise."""
    params = {"temperature": temperature, "k": k, "p": p, "min_p": min_p}
    tokens = kernel_tokens(logits, key, form=form, **params, row_offset=row_offset, gumbel_at_zero=gumbel_at_zero,
                           **kernel_options)
    categorical_fn = (jax.random.categorical if row_offset is None and gumbel_at_zero is None
                      else categorical_at_rows(0 if row_offset is None else row_offset, gumbel_at_zero))

    def reference() -> jax.Array:
        return sample_reference(logits, key, form=form, **params, categorical_fn=categorical_fn)

    # a NaN logit or an unconverged search: the reference, whose sort runs only when some row needs it
    return reference_where_uncertified(tokens, reference)


def _device_call(cfg: KernelConfig, operands: list[jax.Array]) -> jax.Array:
    """nki.jit traced on JAX arrays: with jax-neuronx this emits the AwsNeuronCustomNativeKernel call."""
    if not HAVE_NEURONXCC:
        raise RuntimeError(INSTALL_MESSAGE)
    noise = operands[1] if len(operands) > 1 else None
    return _kernel(simulator=True)(operands[0], noise, cfg=cfg)


# ----------------------------------------------------------------------------- lowerings


def _lowering(call: CompositeCall, runner: str) -> Lowered:
    """An `hlofuse.sample` composite as the NKI kernel, or Unsupported saying why not."""
    target = "neuron" if runner == "device" else "neuron-sim"
    if runner == "device" and not HAVE_NEURONXCC:
        raise Unsupported(INSTALL_MESSAGE)
    names = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
    shape, dtype = call.operand_types[0]
    attrs = SampleAttrs.from_dict(call.attributes)
    if attrs.scores:
        raise Unsupported(f"the {target} sampler does not take this composite: it gives back token ids only, not the "
                          "scores it draws from")
    if attrs.gumbel_at_zero is not None and dtype != "f32":
        raise Unsupported(f"the {target} sampler does not take this composite: it draws a hand-written Gumbel noise "
                          "(another value where the uniform is 0) for f32 logits only")
    if attrs.stages:  # the filters in front of the form by the program's ops (its sorts too), then the kernel
        return _lowering(call.with_attributes(stages=()), runner).after(lambda x: after_stages(x, attrs.stages))
    if (normalized := prelude_of(attrs.form)) is not None:  # the normalization by the program's ops, then the kernel
        inner, normalize = normalized
        return _lowering(call.with_attributes(form=inner), runner).after(normalize)
    try:
        if not shape:
            raise ValueError("logits are a scalar")
        check_form(attrs.form, names.get(dtype, dtype), shape[-1], attrs.k, attrs.temperature)
    except ValueError as reason:
        raise Unsupported(f"the {target} sampler does not take this composite: {reason}") from None

    def kernel(logits: jax.Array, key: jax.Array | None = None, row_offset: jax.Array | None = None) -> jax.Array:
        return sample(logits, key, form=attrs.form, runner=runner, row_offset=row_offset,
                      gumbel_at_zero=attrs.gumbel_at_zero, **attrs.params())

    # A shard of rows draws the whole batch's noise at its rows (f32 / bf16 noise, counters below 2**32).
    width = attrs.k if attrs.form in RANK_FORMS else shape[-1]
    takes_row_offset = dtype in ("f32", "bf16") and math.prod(shape[:-1]) * width <= MAX_COUNTER
    return Lowered(kernel, platforms=("neuron",) if runner == "device" else (), takes_row_offset=takes_row_offset)


# target=neuron: the kernel for a Neuron device (needs neuronxcc); else the composite stays, with a remark.
neuron_lowering = functools.partial(_lowering, runner="device")
# target=neuron-sim: the same kernel run on this host, under NKI's simulator or the emulator.
neuron_sim_lowering = functools.partial(_lowering, runner="sim")
# Per-shard calls: the rows (no vocabulary ranges). target=neuron needs the Neuron SDK on this host.
SPECS = (KernelSpec(SAMPLE, "neuron", neuron_lowering, unavailable=missing_sdk),
         KernelSpec(SAMPLE, "neuron-sim", neuron_sim_lowering))

__all__ = [
    "SPECS",
    "BlockSizes",
    "check_form",
    "kernel_tokens",
    "neuron_lowering",
    "neuron_sim_lowering",
    "run_kernel",
    "sample",
    "sample_reference",
]
