"""Pallas token sampling for TPU (Mosaic) and GPU (Triton): `sample_reference`'s token ids without a sort.

`sample(logits, key, form=..., ...)` returns exactly the token ids of
`hlofuse.kernels.sampling_reference.sample_reference` (the `hlofuse.sample` contract, docs/composites.md)
for the forms in FORMS. No kernel sorts the vocabulary:

- greedy and the Gumbel-max draws are one arg-max pass (first index of the largest score, NaN largest);
- the top-k value threshold (the k-th largest) is a bisection over the order-preserving int32 image of
  the float values: the largest t with count(x >= t) >= k, 32 counting passes;
- the nucleus cut is the same bisection on mass: the largest t with mass(x >= t) >= P, which is the
  program's `sorted[sum(cumsum(softmax(sorted)) < p)]` at P = p but for the f32 rounding of the program's cumsum,
  whose order only XLA knows: so the kernel finds it at P = p + slack and p - slack, draws among the tokens at or
  above the first, and leaves a row UNCERTIFIED (for the program's own function) when the winner lies below the
  second (`nucleus_band`; ties at the cut all stay, as in the program);
- rank-space top-k (`top_k`, `temperature_top_k`) walks the top-k in rank order, one arg-max pass per
  rank (value descending, lower id first on ties), drawing the noise at counter row * k + rank;
- the Gumbel noise is threefry2x32 computed in the kernel from int32 vector ops at JAX's counter (the
  flat index of the noise element) with jax.random.gumbel's float steps, rounded to bf16 after every
  op for bf16 logits, so it is the noise `jax.random.categorical` draws, bit for bit.

Layout: rows go to the grid (TPU: 8 rows per block on the sublanes, 16 for bf16; GPU: one row per
program); a block holds its rows' whole vocabulary (TPU: in VMEM, read by every pass without going
back to HBM) and each pass walks it in lane tiles of `block_v`. The TPU kernel takes the logits as
(tiles, rows, block_v), so that a tile is a leading-dimension index of the VMEM block; a tile is at most
6 vregs (8 x 768 f32, 16 x 384 bf16), which libtpu holds without spilling vector registers to VMEM.

Targets (this module's SPECS): `tpu` / `gpu` lower the kernel for that platform on any host,
`tpu-interpret` / `gpu-interpret` run it in Pallas' HLO interpreter. Forms and dtypes the kernel does
not reproduce exactly raise `Unsupported` (the composite stays, with the message as its remark).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from hlofuse.kernels.noise import MAX_COUNTER, at_zero, categorical_at_rows, gumbel, threefry_bits
from hlofuse.kernels.pallas.common import next_pow2, round_up
from hlofuse.kernels.pallas.tpu import DEFAULT_SCOPED_VMEM, LANES, MAX_VMEM
from hlofuse.kernels.sampling_reference import FORMS as REFERENCE_FORMS
from hlofuse.kernels.sampling_reference import (
    SOFTMAX_TIE_MARGIN,
    UNCERTIFIED,
    after_stages,
    min_p_masked,
    nucleus_cut_slack,
    prelude_of,
    reference_where_uncertified,
    sample_reference,
)
from hlofuse.kernels.target import CompositeCall, KernelSpec, Lowered, Unsupported
from hlofuse.ops.sample import SAMPLE, SampleAttrs
from hlofuse.partition import vocab_ranges
from hlofuse.partition.cuts import Cuts, sample_cuts
from hlofuse.partition.ranges import RangeSplit

BACKENDS = ("tpu", "gpu")
FORMS = ("greedy", "greedy_softmax", "categorical", "temperature", "top_k", "temperature_top_k", "top_k_mask",
         "top_p_mask", "top_k_top_p_mask", "min_p")
DTYPES = ("f32", "bf16")
# Forms whose rows the kernel may leave UNCERTIFIED for the program's own function: greedy_softmax near a tie, a
# nucleus whose draw falls in the band its cut's rounding spans (`nucleus_band`), a rank-space top-k whose ranks reach
# a row's zeros of both signs (`_rank_top_k`).
UNCERTIFIED_FORMS = ("greedy_softmax", "top_p_mask", "top_k_top_p_mask", "top_k", "temperature_top_k")
# Forms that threshold probabilities: with bf16 logits the program rounds each probability and each
# step of its cumulative sum to bf16, in an order only a sort reproduces.
BF16_UNSUPPORTED = ("top_p_mask", "top_k_top_p_mask", "min_p")

_INT_MIN = np.int32(np.iinfo(np.int32).min)
_INT_MAX = np.int32(np.iinfo(np.int32).max)
_NEG_INF_KEY = np.int32(np.float32(-np.inf).view(np.int32) ^ _INT_MAX)  # order_key(-inf)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """block_rows: rows per program (TPU: a multiple of 8, 16 for bf16; GPU: 1). block_v: lanes per tile of
    a pass over the vocabulary (TPU: a multiple of 128; GPU: a power of two). 0 = pick from the shapes."""

    block_rows: int = 0
    block_v: int = 0
    num_warps: int = 4  # Triton only

    def __post_init__(self) -> None:
        if self.block_rows < 0 or self.block_v < 0 or self.num_warps < 1:
            raise ValueError(f"invalid {self}")

    @classmethod
    def get_default(cls, backend: str, vocab: int, dtype: Any) -> BlockSizes:  # noqa: ANN401
        if backend == "gpu":
            return cls(block_rows=1, block_v=min(2048, next_pow2(vocab)))
        rows = 16 if jnp.dtype(dtype) == jnp.bfloat16 else 8
        return cls(block_rows=rows, block_v=_tpu_block_v(round_up(vocab, LANES), rows))

    def check(self, backend: str) -> None:
        if backend == "tpu" and (self.block_rows % 8 or self.block_v % LANES):
            raise ValueError(f"TPU tiles need block_rows % 8 == 0 and block_v % {LANES} == 0, got {self}")
        if backend == "gpu" and (self.block_rows != 1 or self.block_v != next_pow2(self.block_v)):
            raise ValueError(f"GPU tiles need block_rows == 1 and a power-of-two block_v, got {self}")


# f32 elements of one lane tile a pass holds in vector registers (6 vregs of 8 x 128). libtpu 0.0.42.1 spilled
# vregs to VMEM from 8: min_p at 8 x 1024 f32, categorical and top_k_mask at 16 x 768 bf16 (the noise's threefry
# keeps several int32 tiles live); at 8 x 3200 every form spilled (57-356 KiB). docs/kernels-pallas.md, "TPU
# tiles without spills".
TPU_TILE_ELEMENTS = 6 * 8 * LANES
# A pass's fixed cost per tile, in vregs of work: libtpu's loop body over a tile was about 93 + 32 bundles per
# f32 vreg (categorical, 8 rows; bf16 at 16 rows about 80 + 40), so a tile's trip costs about 2-3 vregs more.
_TRIP_VREGS = 2


def _tpu_block_v(vocab_pad: int, rows: int) -> int:
    """Lanes per tile: the multiple of 128 whose tile of rows x block_v holds at most TPU_TILE_ELEMENTS, with
    the fewest tiles x (vregs per tile + _TRIP_VREGS) over vocab_pad rounded up to it (ties: the wider)."""
    lanes = vocab_pad // LANES
    most = max(1, TPU_TILE_ELEMENTS // (rows * LANES))
    vregs = max(1, rows // 8)  # per 128 lanes

    def cost(width: int) -> int:
        return -(-lanes // width) * (width * vregs + _TRIP_VREGS)

    return LANES * min(range(1, most + 1), key=lambda width: (cost(width), -width))


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static shapes and attributes of one kernel call."""

    form: str
    bf16: bool
    vocab: int
    vocab_pad: int
    block_rows: int
    block_v: int
    temperature: float  # in the logits' dtype, as the program's constant
    k: int
    p: float
    min_p: float
    # A vocabulary split (`sample_split`): the whole row's V, whose multiples the noise counters step by, and
    # whether the kernel also writes each row's winning score for the merge. A whole row: vocab, False.
    noise_vocab: int = 0
    with_scores: bool = False
    gumbel_at_zero: float | None = None  # f32: a hand-written noise's value where the uniform is 0 (SampleAttrs)

    @property
    def num_tiles(self) -> int:
        return self.vocab_pad // self.block_v


# ----------------------------------------------------------------------------- element helpers


def _round(plan: Plan, x: jax.Array) -> jax.Array:
    """x rounded to the logits' dtype: XLA computes each bf16 op in f32 and rounds its result."""
    return x.astype(jnp.bfloat16).astype(jnp.float32) if plan.bf16 else x


def _scaled(plan: Plan, x: jax.Array) -> jax.Array:
    """x / T in the logits' dtype."""
    return x if plan.temperature == 1.0 else _round(plan, x / jnp.float32(plan.temperature))


def order_key(x: jax.Array) -> jax.Array:
    """int32 image of f32 values with the same order (-0 and +0 map to 0, as they compare equal)."""
    bits = lax.bitcast_convert_type(x, jnp.int32)
    key = bits ^ (lax.shift_right_arithmetic(bits, np.int32(31)) & _INT_MAX)
    return jnp.where(x == 0, np.int32(0), key)


def from_order_key(key: jax.Array) -> jax.Array:
    """The f32 value of an order key (the map is its own inverse on the sign-magnitude bits)."""
    return lax.bitcast_convert_type(key ^ (lax.shift_right_arithmetic(key, np.int32(31)) & _INT_MAX), jnp.float32)


# ----------------------------------------------------------------------------- passes over a row block


@dataclasses.dataclass(frozen=True)
class _Rows:
    """One program's view: `load(j)` gives lane tile j, (rows, block_v) f32; rows start at global row `row0`,
    and local token 0 is the row's token `id0` (0 unless the block holds one split of the vocabulary)."""

    plan: Plan
    load: Callable[[jax.Array], jax.Array]
    row0: jax.Array
    k0: jax.Array
    k1: jax.Array
    id0: jax.Array | int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return self.plan.block_rows, self.plan.block_v

    def ids(self, j: jax.Array) -> jax.Array:
        return j * self.plan.block_v + lax.broadcasted_iota(jnp.int32, self.shape, 1)

    def rows(self) -> jax.Array:  # (rows, 1)
        return self.row0 + lax.broadcasted_iota(jnp.int32, (self.plan.block_rows, 1), 0)

    def fold(self, step: Callable[..., Any], init: Any) -> Any:  # noqa: ANN401
        """step(j, x (rows, block_v), ids, carry) -> carry over every lane tile."""

        def body(j: jax.Array, carry: Any) -> Any:  # noqa: ANN401
            return step(j, self.load(j), self.ids(j), carry)

        return lax.fori_loop(0, self.plan.num_tiles, body, init)

    def column(self, value: Any, dtype: Any = jnp.int32) -> jax.Array:  # noqa: ANN401
        return jnp.full((self.plan.block_rows, 1), value, dtype)


def _tile_argmax(s: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(max, first id of the max, first id of a NaN or INT_MAX) of a tile, per row."""
    nan = s != s
    nan_id = jnp.min(jnp.where(nan, ids, _INT_MAX), axis=1, keepdims=True)
    s = jnp.where(nan, -jnp.inf, s)
    best = jnp.max(s, axis=1, keepdims=True)
    return best, jnp.min(jnp.where(s == best, ids, _INT_MAX), axis=1, keepdims=True), nan_id


def _argmax(rows: _Rows, score: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(the winning score, jnp.argmax) of score(j, x, ids) over the vocabulary: the first index of the max,
    NaN counting as largest (the score is then NaN)."""

    def step(j: jax.Array, x: jax.Array, ids: jax.Array, carry: Any) -> Any:  # noqa: ANN401
        best, best_id, nan_id = carry
        t_best, t_id, t_nan = _tile_argmax(score(j, x, ids), ids)
        take = (best_id == _INT_MAX) | (t_best > best)  # earlier tiles win ties
        return jnp.where(take, t_best, best), jnp.where(take, t_id, best_id), jnp.minimum(nan_id, t_nan)

    init = (rows.column(-jnp.inf, jnp.float32), rows.column(_INT_MAX), rows.column(_INT_MAX))
    best, best_id, nan_id = rows.fold(step, init)
    has_nan = nan_id != _INT_MAX
    return jnp.where(has_nan, jnp.float32(jnp.nan), best), jnp.where(has_nan, nan_id, best_id)


def _bisect(rows: _Rows, lo: jax.Array, hi: jax.Array, holds: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """The largest order key t in [lo, hi] with holds(t) (holds is monotone: true up to some t, then false;
    holds(lo) must be true). 32 halvings cover the int32 range."""

    def body(_: int, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        lo, hi = carry
        half = functools.partial(lax.shift_right_arithmetic, y=np.int32(1))
        mid = half(lo) + half(hi) + ((lo | hi) & 1)  # ceil((lo + hi) / 2) without int32 overflow
        ok = holds(mid) & (lo < hi)
        return jnp.where(ok, mid, lo), jnp.where(ok | (lo >= hi), hi, mid - 1)

    return lax.fori_loop(0, 32, body, (lo, hi))[0]


def _count_at_least(rows: _Rows, values: Callable[[jax.Array], jax.Array], t: jax.Array) -> jax.Array:
    def step(j: jax.Array, x: jax.Array, ids: jax.Array, acc: jax.Array) -> jax.Array:
        return acc + jnp.sum((order_key(values(x)) >= t).astype(jnp.int32), axis=1, keepdims=True)

    return rows.fold(step, rows.column(0))


def kth_largest(rows: _Rows, values: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """(rows, 1) f32: lax.top_k(values, k)[0][..., -1], the largest t with count(values >= t) >= k."""
    k = rows.plan.k
    t = _bisect(rows, rows.column(_INT_MIN), rows.column(_INT_MAX), lambda t: _count_at_least(rows, values, t) >= k)
    return from_order_key(t)


def _row_max(rows: _Rows, values: Callable[[jax.Array], jax.Array]) -> jax.Array:
    def step(j: jax.Array, x: jax.Array, ids: jax.Array, m: jax.Array) -> jax.Array:
        return jnp.maximum(m, jnp.max(values(x), axis=1, keepdims=True))

    return rows.fold(step, rows.column(-jnp.inf, jnp.float32))


def _softmax_sum(rows: _Rows, values: Callable[[jax.Array], jax.Array], m: jax.Array) -> jax.Array:
    def step(j: jax.Array, x: jax.Array, ids: jax.Array, z: jax.Array) -> jax.Array:
        return z + jnp.sum(jnp.exp(values(x) - m), axis=1, keepdims=True)

    return rows.fold(step, rows.column(0.0, jnp.float32))


def nucleus_band(rows: _Rows, values: Callable[[jax.Array], jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(lo, hi), (rows, 1) f32 each: the band of the program's nucleus cut `sorted[sum(cumsum(softmax(sorted)) <
    p)]`, whose f32 rounding only XLA's order decides. With c(P) the largest t with mass(values >= t) >= P
    (probabilities exp(x - max) / sum as jax.nn.softmax computes them), every value below lo = c(p + slack) is cut
    and every value at or above hi = c(p - slack) kept, whatever that order (`nucleus_cut_slack`, with this
    kernel's own f32 sums: within each tile, and over the tiles). lo is -inf (cut nothing) when the whole mass stays
    below p + slack or the row is all -inf; hi is +inf (vouch for nothing) for a row with a NaN or an infinity."""
    plan = rows.plan
    m = _row_max(rows, values)
    z = _softmax_sum(rows, values, m)

    def mass(t: jax.Array) -> jax.Array:
        def step(j: jax.Array, x: jax.Array, ids: jax.Array, acc: jax.Array) -> jax.Array:
            y = values(x)
            prob = jnp.exp(y - m) / z
            return acc + jnp.sum(jnp.where(order_key(y) >= t, prob, 0.0), axis=1, keepdims=True)

        return rows.fold(step, rows.column(0.0, jnp.float32))

    slack = nucleus_cut_slack(plan.vocab, plan.vocab, plan.p, own_terms=2 * (plan.block_v + plan.num_tiles))
    bottom = rows.column(_NEG_INF_KEY)

    def cutoff(target: float) -> tuple[jax.Array, jax.Array]:
        found = mass(bottom) >= jnp.float32(target)
        t = _bisect(rows, bottom, order_key(m), lambda t: mass(t) >= jnp.float32(target))
        return from_order_key(t), found

    lo, lo_found = cutoff(plan.p + slack)
    lo = jnp.where((m > -jnp.inf) & lo_found, lo, -jnp.inf)
    if plan.p - slack <= 0:
        return lo, rows.column(jnp.inf, jnp.float32)
    hi, _ = cutoff(plan.p - slack)
    return lo, jnp.where((m > -jnp.inf) & (m < jnp.inf), hi, jnp.inf)  # (a NaN max compares False: +inf)


def _value_at(rows: _Rows, values: Callable[[jax.Array], jax.Array], local: jax.Array) -> jax.Array:
    """(rows, 1) f32: values at each row's local id `local`."""
    def step(j: jax.Array, x: jax.Array, ids: jax.Array, acc: jax.Array) -> jax.Array:
        return jnp.maximum(acc, jnp.max(jnp.where(ids == local, values(x), -jnp.inf), axis=1, keepdims=True))

    return rows.fold(step, rows.column(-jnp.inf, jnp.float32))


def _noise(rows: _Rows, ids: jax.Array, per_row: int) -> jax.Array:
    """Gumbel noise of the elements `ids` of each row's noise vector of length `per_row`."""
    counter = rows.rows() * np.int32(per_row) + ids  # wraps modulo 2**32 like the uint32 it stands for
    bits = threefry_bits(rows.k0, rows.k1, counter)
    return at_zero(gumbel(bits, rows.plan.bf16), bits, rows.plan.gumbel_at_zero)


def _categorical(rows: _Rows, logits: Callable[[jax.Array], jax.Array]) -> tuple[jax.Array, jax.Array]:
    """jax.random.categorical(key, logits(x)) with the noise indexed by the row's vocabulary id; the
    winner's score (logit + noise) and its local id."""
    plan = rows.plan

    def score(j: jax.Array, x: jax.Array, ids: jax.Array) -> jax.Array:
        return _round(plan, logits(x) + _noise(rows, rows.id0 + ids, plan.noise_vocab))

    return _argmax(rows, score)


def _rank_top_k(rows: _Rows, temperature_first: bool) -> tuple[jax.Array, jax.Array]:
    """`top_k` / `temperature_top_k`: categorical over the top-k (rank order) mapped back to their ids.

    Rank r is found by one pass: the largest value below rank r-1's (equal values: the next larger id). lax.top_k
    ranks +0 above -0, which share an order key here: a row holding both whose top k reach the zeros is UNCERTIFIED
    (one more pass, outside the rank walk, whose registers it leaves alone).
    """
    plan = rows.plan
    select = (lambda x: _scaled(plan, x)) if temperature_first else (lambda x: x)

    def signed_zeros(j: jax.Array, x: jax.Array, ids: jax.Array, carry: Any) -> Any:  # noqa: ANN401
        negative, positive = carry  # (int32 flags: Mosaic carries no boolean vectors through a loop)
        y = select(x)
        sign = lax.bitcast_convert_type(y, jnp.int32) < 0
        negative = jnp.maximum(negative, jnp.max(jnp.where((y == 0) & sign, 1, 0), axis=1, keepdims=True))
        positive = jnp.maximum(positive, jnp.max(jnp.where((y == 0) & ~sign, 1, 0), axis=1, keepdims=True))
        return negative, positive

    negative, positive = rows.fold(signed_zeros, (rows.column(0), rows.column(0)))

    def next_rank(prev_key: jax.Array, prev_id: jax.Array) -> tuple[jax.Array, jax.Array]:
        def step(j: jax.Array, x: jax.Array, ids: jax.Array, carry: Any) -> Any:  # noqa: ANN401
            best_key, best_id = carry
            key = order_key(select(x))
            left = (key < prev_key) | ((key == prev_key) & (ids > prev_id))
            t_key = jnp.max(jnp.where(left, key, _INT_MIN), axis=1, keepdims=True)
            t_id = jnp.min(jnp.where(left & (key == t_key), ids, _INT_MAX), axis=1, keepdims=True)
            take = (t_key > best_key) | ((t_key == best_key) & (t_id < best_id))
            return jnp.where(take, t_key, best_key), jnp.where(take, t_id, best_id)

        return rows.fold(step, (rows.column(_INT_MIN), rows.column(_INT_MAX)))

    def body(rank: jax.Array, carry: Any) -> Any:  # noqa: ANN401
        prev_key, prev_id, best, best_id = carry
        key, token = next_rank(prev_key, prev_id)
        value = from_order_key(key)
        y = value if temperature_first else _scaled(plan, value)
        s = _round(plan, y + _noise(rows, jnp.broadcast_to(rank, key.shape), plan.k))
        take = (best_id < 0) | (s > best) | ((s != s) & (best == best))  # first NaN, else first max
        return key, token, jnp.where(take, s, best), jnp.where(take, token, best_id)

    init = (rows.column(_INT_MAX), rows.column(-1), rows.column(-jnp.inf, jnp.float32), rows.column(-1))
    last_key, _, best, best_id = lax.fori_loop(0, plan.k, body, init)
    zeros_ranked = (negative + positive == 2) & (last_key <= 0)  # the k-th value at or below the zeros: ranked
    return best, jnp.where(zeros_ranked, np.int32(UNCERTIFIED), best_id)


def _min_p_keep(rows: _Rows) -> Callable[[jax.Array], jax.Array]:
    """softmax(y) >= min_p * max(softmax(y)) with y = x / T, as the program computes it in f32."""
    plan = rows.plan
    scaled = functools.partial(_scaled, plan)
    m = _row_max(rows, scaled)
    z = _softmax_sum(rows, scaled, m)
    threshold = jnp.float32(plan.min_p) * (jnp.float32(1.0) / z)  # max(softmax) = exp(0) / z
    return lambda x: jnp.exp(scaled(x) - m) / z >= threshold


def _argmax_of_softmax(rows: _Rows) -> tuple[jax.Array, jax.Array]:
    """argmax(softmax(x)) as jax.nn.softmax computes it, exp(x - max) / sum: argmax(x) unless a token lies
    less than SOFTMAX_TIE_MARGIN below the max (its probability could round to the max's) or the max is NaN
    or +inf; such rows are UNCERTIFIED."""
    score, best = _argmax(rows, lambda j, x, ids: x)
    lo = score - jnp.float32(SOFTMAX_TIE_MARGIN["bfloat16" if rows.plan.bf16 else "float32"])

    def step(j: jax.Array, x: jax.Array, ids: jax.Array, near: jax.Array) -> jax.Array:
        # copies of the max come after its first index and tie it in the softmax too
        return near + jnp.sum(((x > lo) & (x < score)).astype(jnp.int32), axis=1, keepdims=True)

    near = rows.fold(step, rows.column(0))
    # NaN or +inf make every probability NaN (index 0); a row of -inf is NaN too, where argmax(x) is 0 as well
    certified = (score < jnp.inf) & (near == 0)
    return score, jnp.where(certified, best, np.int32(UNCERTIFIED))


def sample_block(rows: _Rows) -> tuple[jax.Array, jax.Array]:
    """(rows, 1) f32 winning scores and (rows, 1) int32 local token ids of one program's rows."""
    plan = rows.plan
    form = plan.form
    neg_inf = jnp.float32(-jnp.inf)
    if form == "greedy":
        return _argmax(rows, lambda j, x, ids: x)
    if form == "greedy_softmax":
        return _argmax_of_softmax(rows)
    if form in ("categorical", "temperature"):
        return _categorical(rows, functools.partial(_scaled, plan))
    if form in ("top_k", "temperature_top_k"):
        return _rank_top_k(rows, form == "temperature_top_k")
    if form == "min_p":
        keep = _min_p_keep(rows)
        return _categorical(rows, lambda x: jnp.where(keep(x), _scaled(plan, x), neg_inf))
    # Mask forms: where(x < threshold, -inf, x), then / T (the program's predicate, so NaN stays NaN).
    masked: Callable[[jax.Array], jax.Array] = lambda x: x  # noqa: E731
    if form in ("top_k_mask", "top_k_top_p_mask"):
        kth = kth_largest(rows, masked)
        masked = lambda x: jnp.where(x < kth, neg_inf, x)  # noqa: E731
    if form in ("top_p_mask", "top_k_top_p_mask"):  # drawn among x >= lo, vouched for where x >= hi
        lo, hi = nucleus_band(rows, masked)
        inner = masked
        score, best = _categorical(rows, lambda x: _scaled(plan, jnp.where(inner(x) < lo, neg_inf, inner(x))))
        certified = _value_at(rows, inner, best) >= hi
        return score, jnp.where(certified, best, np.int32(UNCERTIFIED))
    return _categorical(rows, lambda x: _scaled(plan, masked(x)))


# ----------------------------------------------------------------------------- pallas_calls


def _out_shapes(plan: Plan, shape: tuple[int, int]) -> list[jax.ShapeDtypeStruct]:
    """The token ids, and with `plan.with_scores` the winning scores, of a (rows, lanes) output block."""
    ids = jax.ShapeDtypeStruct(shape, jnp.int32)
    return [ids, jax.ShapeDtypeStruct(shape, jnp.float32)] if plan.with_scores else [ids]


def _write(plan: Plan, rows: _Rows, out_refs: Sequence[Any]) -> None:
    """One program's token ids in the row's vocabulary (local ids + id0), and their scores if asked."""
    score, local = sample_block(rows)
    out_refs[0][...] = jnp.broadcast_to(jnp.where(local == UNCERTIFIED, local, local + rows.id0), out_refs[0].shape)
    if plan.with_scores:
        out_refs[1][...] = jnp.broadcast_to(score, out_refs[1].shape)


def _tpu_call(plan: Plan, logits: jax.Array, key: jax.Array, interpret: Any) -> list[jax.Array]:  # noqa: ANN401
    """logits (num_tiles, rows_pad, block_v), key (4,) int32 (the two key words, the first row's global
    index, the global id of local token 0) -> [ids (rows_pad, 128) int32 (, scores (rows_pad, 128) f32)],
    lane-replicated.

    The tile index is the leading (untiled) dimension, so a pass reads tile j of the VMEM block with a
    dynamic index Mosaic takes on any dimension but the last two; each tile is whole (8, 128) vregs.
    """
    r = plan.block_rows
    rows_pad = logits.shape[1]

    def kernel(key_ref: Any, x_ref: Any, *out_refs: Any) -> None:  # noqa: ANN401
        def load(j: jax.Array) -> jax.Array:
            return x_ref[j].astype(jnp.float32)  # (rows, block_v)

        _write(plan, _Rows(plan, load, key_ref[2] + pl.program_id(0) * r, key_ref[0], key_ref[1], key_ref[3]),
               out_refs)

    vmem = vmem_bytes(plan, logits.dtype)
    out_shapes = _out_shapes(plan, (rows_pad, LANES))
    return list(pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(rows_pad // r,),
            in_specs=[pl.BlockSpec((plan.num_tiles, r, plan.block_v), lambda i, key: (0, i, 0))],
            out_specs=[pl.BlockSpec((r, LANES), lambda i, key: (i, 0))] * len(out_shapes),
        ),
        out_shape=out_shapes,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",), vmem_limit_bytes=MAX_VMEM if vmem > DEFAULT_SCOPED_VMEM else None,
        ),
        interpret=interpret,
        name="hlofuse_sample_tpu",
    )(key, logits))


def _gpu_call(plan: Plan, logits: jax.Array, key: jax.Array, num_warps: int,  # noqa: ANN401
              interpret: Any) -> list[jax.Array]:  # noqa: ANN401
    """logits (rows, vocab_pad), key (4,) int32 as for _tpu_call -> [ids (rows, 1) int32 (, scores (rows, 1)
    f32)]; one program per row, tiles loaded from global memory."""
    bv = plan.block_v

    def kernel(key_ref: Any, x_ref: Any, *out_refs: Any) -> None:  # noqa: ANN401
        def load(j: jax.Array) -> jax.Array:
            return x_ref[:, pl.ds(pl.multiple_of(j * bv, bv), bv)].astype(jnp.float32)  # (1, block_v)

        _write(plan, _Rows(plan, load, key_ref[2] + pl.program_id(0), key_ref[0], key_ref[1], key_ref[3]), out_refs)

    out_shapes = _out_shapes(plan, (logits.shape[0], 1))
    return list(pl.pallas_call(
        kernel,
        grid=(logits.shape[0],),
        in_specs=[pl.BlockSpec((4,), lambda i: (0,)), pl.BlockSpec((1, plan.vocab_pad), lambda i: (i, 0))],
        out_specs=[pl.BlockSpec((1, 1), lambda i: (i, 0))] * len(out_shapes),
        out_shape=out_shapes,
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="hlofuse_sample_gpu",
    )(key, logits))


def vmem_bytes(plan: Plan, dtype: Any) -> int:  # noqa: ANN401
    """VMEM of one TPU grid step: the double-buffered row block plus a few f32 tiles of temporaries."""
    block = plan.block_rows * plan.vocab_pad * jnp.dtype(dtype).itemsize
    return 2 * block + 16 * plan.block_rows * plan.block_v * 4 + 2 * plan.block_rows * LANES * 4


def _plan(form: str, vocab: int, dtype: Any, backend: str, blocks: BlockSizes, temperature: float = 1.0,  # noqa: ANN401
          k: int = 0, p: float = 1.0, min_p: float = 0.0, noise_vocab: int = 0, with_scores: bool = False,
          gumbel_at_zero: float | None = None) -> Plan:
    if backend == "tpu":
        vocab_pad = round_up(vocab, LANES)
        block_v = blocks.block_v or _tpu_block_v(vocab_pad, blocks.block_rows)
        vocab_pad = round_up(vocab_pad, block_v)
    else:
        block_v = blocks.block_v or min(2048, next_pow2(vocab))
        vocab_pad = round_up(vocab, block_v)
    bf16 = jnp.dtype(dtype) == jnp.bfloat16
    if "temperature" not in REFERENCE_FORMS[form].params:  # categorical ignores the attribute
        temperature = 1.0
    t = float(np.asarray(temperature, np.float32).astype(dtype).astype(np.float32))
    return Plan(form=form, bf16=bf16, vocab=vocab, vocab_pad=vocab_pad, block_rows=blocks.block_rows,
                block_v=block_v, temperature=t, k=int(k), p=float(p), min_p=float(min_p),
                noise_vocab=noise_vocab or vocab, with_scores=with_scores, gumbel_at_zero=gumbel_at_zero)


def dtype_name(dtype: Any) -> str:  # noqa: ANN401
    return {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.bfloat16): "bf16"}.get(jnp.dtype(dtype), jnp.dtype(dtype).name)


def check(form: str, name: str, shape: tuple[int, ...], k: int) -> str | None:
    """Why the kernel cannot compute `form` on (shape) logits of dtype `name` exactly, or None when it can."""
    if form not in FORMS:
        return f"has no form '{form}' (not implemented)"
    if name not in DTYPES:
        return f"takes f32 or bf16 logits, not {name}"
    if name == "bf16" and form in BF16_UNSUPPORTED:
        return (f"does not reproduce '{form}' on bf16 logits: the program thresholds bf16-rounded probabilities "
                "and their bf16 cumulative sum")
    vocab = shape[-1] if shape else 0
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    if form in ("top_k", "temperature_top_k", "top_k_mask", "top_k_top_p_mask") and not 1 <= k <= vocab:
        return f"needs 1 <= k <= V, not k = {k}, V = {vocab}"
    per_row = k if form in ("top_k", "temperature_top_k") else vocab
    if rows * per_row > MAX_COUNTER:
        return f"draws noise at counters below 2**32 only, not {rows} rows x {per_row}"
    return None


def sample(
    logits: jax.Array,  # (..., V) f32 or bf16
    key: jax.Array | None,  # (2,) uint32 raw threefry key; None for greedy
    *,
    form: str,
    temperature: float = 1.0,
    k: int = 0,
    p: float = 1.0,
    min_p: float = 0.0,
    backend: str = "tpu",
    block_sizes: BlockSizes | None = None,
    interpret: Any = False,  # noqa: ANN401  (True, or pltpu.InterpretParams for the TPU interpreter)
    row_offset: jax.Array | int = 0,
    gumbel_at_zero: float | None = None,  # f32 logits: a hand-written noise's value where the uniform is 0
) -> jax.Array:  # (...,) int32
    """`sample_reference`'s token ids computed by the Pallas kernel of `backend` ("tpu" or "gpu").

    `row_offset` (an int32 scalar) is the global index of the first row when `logits` are one shard's
    contiguous rows of a larger batch: the noise is drawn at the counters of the global rows, so the
    shard gets the ids the whole batch would give its rows (hlofuse.shard_local)."""
    why = check(form, dtype_name(logits.dtype), logits.shape, k)
    if why is None and gumbel_at_zero is not None and logits.dtype != jnp.float32:
        why = "draws a hand-written noise (gumbel_at_zero) for f32 logits only"
    if why is not None:
        raise ValueError(f"the {backend} sampler {why}")
    batch = logits.shape[:-1]
    rows = int(np.prod(batch, dtype=np.int64))
    plan_params = dict(temperature=temperature, k=k, p=p, min_p=min_p)
    (ids,) = _run(logits.reshape(rows, logits.shape[-1]), key, form, {**plan_params, "gumbel_at_zero": gumbel_at_zero},
                  backend, block_sizes, interpret, row_offset)
    ids = ids.reshape(batch)
    if form in UNCERTIFIED_FORMS:  # the program's softmax or cut, run only when some row needs it
        categorical_fn = categorical_at_rows(row_offset, gumbel_at_zero)
        return reference_where_uncertified(ids, lambda: sample_reference(logits, key, form=form, **plan_params,
                                                                         categorical_fn=categorical_fn))
    return ids


# Forms whose keep-set is the whole row, so that a row's vocabulary splits into parts sampled on their own and
# merged by (score, id) (`sample_split`, `merge_vocab_splits`).
SPLIT_FORMS = ("greedy", "categorical", "temperature")


def sample_split(
    logits: jax.Array,  # (R, W) f32 or bf16: tokens [vocab_offset, vocab_offset + W) of R rows of V = vocab_total
    key: jax.Array | None,  # (2,) uint32 raw threefry key; None for greedy
    *,
    form: str,
    vocab_total: int,
    vocab_offset: jax.Array | int,
    temperature: float = 1.0,
    backend: str = "tpu",
    block_sizes: BlockSizes | None = None,
    interpret: Any = False,  # noqa: ANN401
    row_offset: jax.Array | int = 0,
) -> tuple[jax.Array, jax.Array]:  # ids (R,) int32 in the whole vocabulary, scores (R,) f32
    """One vocabulary split of each row: its winner's id and score (the logit for greedy, else the rounded
    logit / T + Gumbel noise), drawn with the noise `sample` draws for the same tokens of the whole row
    (counter row * vocab_total + id). `merge_vocab_splits` over a row's splits gives `sample`'s id."""
    if form not in SPLIT_FORMS:
        raise ValueError(f"'{form}' cannot be sampled per vocabulary split (splits: {SPLIT_FORMS})")
    why = check(form, dtype_name(logits.dtype), (logits.shape[0], vocab_total), 0)
    if why is not None:
        raise ValueError(f"the {backend} sampler {why}")
    ids, scores = _run(logits, key, form, dict(temperature=temperature, noise_vocab=vocab_total, with_scores=True),
                       backend, block_sizes, interpret, row_offset, vocab_offset)
    return ids, scores


def _run(x: jax.Array, key: jax.Array | None, form: str, plan_params: dict[str, Any], backend: str,
         block_sizes: BlockSizes | None, interpret: Any, row_offset: jax.Array | int,  # noqa: ANN401
         vocab_offset: jax.Array | int = 0) -> list[jax.Array]:
    """The kernel on x (rows, V): [ids (rows,)] or, with plan_params' with_scores, [ids, scores (rows,)]."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if REFERENCE_FORMS[form].stochastic and key is None:
        raise ValueError(f"form '{form}' needs a key")
    rows, vocab = x.shape
    blocks = block_sizes or BlockSizes.get_default(backend, vocab, x.dtype)
    if not blocks.block_rows or not blocks.block_v:
        default = BlockSizes.get_default(backend, vocab, x.dtype)
        blocks = dataclasses.replace(blocks, block_rows=blocks.block_rows or default.block_rows,
                                     block_v=blocks.block_v or default.block_v)
    blocks.check(backend)
    plan = _plan(form, vocab, x.dtype, backend, blocks, **plan_params)
    rows_pad = round_up(rows, plan.block_rows)
    if rows_pad != rows or plan.vocab_pad != plan.vocab:  # padded tokens are -inf: never drawn, never counted
        x = jnp.pad(x, ((0, rows_pad - rows), (0, plan.vocab_pad - plan.vocab)), constant_values=-jnp.inf)
    raw = jnp.zeros((2,), jnp.int32) if key is None else lax.bitcast_convert_type(key.astype(jnp.uint32), jnp.int32)
    offsets = [jnp.asarray(offset, jnp.int32).reshape(1) for offset in (row_offset, vocab_offset)]
    raw = jnp.concatenate([raw, *offsets])
    if backend == "tpu":
        vmem = vmem_bytes(plan, x.dtype)
        if vmem > MAX_VMEM:
            raise ValueError(f"a TPU block of {plan.block_rows} rows x {plan.vocab_pad} needs about "
                             f"{vmem / 2**20:.1f} MiB of VMEM > {MAX_VMEM // 2**20} MiB")
        tiles = x.reshape(rows_pad, plan.num_tiles, plan.block_v).transpose(1, 0, 2)  # one copy unless 1 tile
        outs = _tpu_call(plan, tiles, raw, interpret)
    else:
        outs = _gpu_call(plan, x, raw, blocks.num_warps, interpret)
    return [out[:rows, 0] for out in outs]


# ----------------------------------------------------------------------------- lowerings


def _lowering(call: CompositeCall, backend: str, interpret: bool, platform: str | None) -> Lowered:
    """An `hlofuse.sample` composite as this kernel, or Unsupported saying why not."""
    target = f"{backend}-interpret" if interpret else backend
    attrs = SampleAttrs.from_dict(call.attributes)
    if attrs.scores:
        raise Unsupported(f"the {target} sampler gives back token ids only, not the scores it draws from")
    if attrs.gumbel_at_zero is not None and call.operand_types[0][1] != "f32":
        raise Unsupported(f"the {target} sampler draws a hand-written Gumbel noise (another value where the uniform "
                          "is 0) for f32 logits only")
    if attrs.stages:  # the filters in front of the form by the program's ops (its sorts too), then the kernel
        inner_call = call.with_attributes(stages=())
        return _lowering(inner_call, backend, interpret, platform).after(lambda x: after_stages(x, attrs.stages))
    if (normalized := prelude_of(attrs.form)) is not None:  # the normalization by the program's ops, then the kernel
        inner, normalize = normalized
        return _lowering(call.with_attributes(form=inner), backend, interpret, platform).after(normalize)
    (shape, dtype), *_ = call.operand_types
    why = check(attrs.form, dtype, shape, attrs.k)
    if why is not None:
        raise Unsupported(f"the {target} sampler {why}")
    if backend == "tpu":
        jdtype = jnp.bfloat16 if dtype == "bf16" else jnp.float32
        plan = _plan(attrs.form, shape[-1], jdtype, backend, BlockSizes.get_default(backend, shape[-1], jdtype))
        if vmem_bytes(plan, jdtype) > MAX_VMEM:
            raise Unsupported(f"the {target} sampler keeps a block of rows in VMEM; V = {shape[-1]} is too large")

    def kernel(logits: jax.Array, key: jax.Array | None = None, row_offset: jax.Array | int = 0) -> jax.Array:
        return sample(logits, key, form=attrs.form, backend=backend, interpret=interpret, row_offset=row_offset,
                      gumbel_at_zero=attrs.gumbel_at_zero, **attrs.params())

    return Lowered(kernel, platforms=(platform,) if platform is not None else (), takes_row_offset=True)


# Per-shard calls (hlofuse.shard_local, hlofuse.vocab_splits): the forms whose vocabulary a shard cuts. min_p
# first masks the logits with the program's own ops (`min_p_masked`: a softmax against the row's largest, three
# row reductions the partitioner splits with small all-reduces), then samples the kept tokens as categorical;
# the top-k forms take each range's top k first. The nucleus forms keep whole rows.
VOCAB_SPLIT_FORMS = (*SPLIT_FORMS, "min_p", "top_k", "temperature_top_k", "top_k_mask")
# target -> (backend, interpret, platform); gpu-mosaic samples with the Triton kernel.
_TARGETS = {"tpu": ("tpu", False, "tpu"), "gpu": ("gpu", False, "cuda"), "tpu-interpret": ("tpu", True, None),
            "gpu-interpret": ("gpu", True, None), "gpu-mosaic": ("gpu", False, "cuda"),
            "gpu-mosaic-interpret": ("gpu", True, None)}


def shard_cuts(call: CompositeCall) -> Cuts:
    """The dims a per-shard call keeps local: the rows and, for VOCAB_SPLIT_FORMS, the vocabulary."""
    attrs = SampleAttrs.from_dict(call.attributes)
    # (a hand-written noise's rows are cut, not its vocabulary: the split kernel draws JAX's noise; and filters in
    # front of the form read the whole row)
    splits = attrs.form in VOCAB_SPLIT_FORMS and attrs.gumbel_at_zero is None and not attrs.stages
    return sample_cuts(call, vocab=splits)


def vocab_split(call: CompositeCall, target: str, splits: int) -> RangeSplit:
    """`call` as `splits` vocabulary ranges, one per shard (hlofuse.partition.vocab_ranges), each sampled by
    `sample_split` with the whole row's noise."""
    backend, interpret, platform = _TARGETS[target]
    attrs = SampleAttrs.from_dict(call.attributes)
    if attrs.gumbel_at_zero is not None:  # (`shard_cuts` keeps such a vocabulary whole)
        raise ValueError("a hand-written Gumbel noise is drawn per shard of rows, not of the vocabulary")
    if attrs.stages:  # (likewise)
        raise ValueError("filters in front of the form read the whole row: it is drawn per shard of rows")
    run = functools.partial(sample_split, temperature=attrs.temperature, backend=backend, interpret=interpret)
    if attrs.form in SPLIT_FORMS:
        return vocab_ranges.sampled_ranges(call, splits, run, attrs.form, platform=platform)
    if attrs.form == "min_p":
        mask = functools.partial(min_p_masked, temperature=attrs.temperature, min_p=attrs.min_p)
        return vocab_ranges.sampled_ranges(call, splits, functools.partial(run, temperature=1.0), "categorical",
                                           mask, platform)
    if attrs.form == "top_k_mask":
        return vocab_ranges.top_k_mask_ranges(call, splits, run, attrs.k, platform)
    if attrs.form in ("top_k", "temperature_top_k"):
        return vocab_ranges.rank_top_k_ranges(call, splits, attrs.form, attrs.temperature, attrs.k, platform)
    raise ValueError(f"'{attrs.form}' cannot be sampled per vocabulary split (splits: {VOCAB_SPLIT_FORMS})")


# target=tpu / gpu: lowered for that platform (on any host); the result runs only there.
tpu_lowering = functools.partial(_lowering, backend="tpu", interpret=False, platform="tpu")
gpu_lowering = functools.partial(_lowering, backend="gpu", interpret=False, platform="cuda")
# target=tpu-interpret / gpu-interpret: the same kernels in Pallas' HLO interpreter, on this host.
tpu_interpret_lowering = functools.partial(_lowering, backend="tpu", interpret=True, platform=None)
gpu_interpret_lowering = functools.partial(_lowering, backend="gpu", interpret=True, platform=None)
# gpu-mosaic samples with the Triton kernel.
_LOWERINGS = {"tpu": tpu_lowering, "gpu": gpu_lowering, "tpu-interpret": tpu_interpret_lowering,
              "gpu-interpret": gpu_interpret_lowering, "gpu-mosaic": gpu_lowering,
              "gpu-mosaic-interpret": gpu_interpret_lowering}
# Per-shard calls: the rows and, for VOCAB_SPLIT_FORMS, vocabulary ranges.
SPECS = tuple(KernelSpec(SAMPLE, target, lower, cuts=lambda call, devices: shard_cuts(call),
                         vocab_split=vocab_split) for target, lower in _LOWERINGS.items())

__all__ = [
    "SPECS",
    "SPLIT_FORMS",
    "VOCAB_SPLIT_FORMS",
    "BlockSizes",
    "gpu_interpret_lowering",
    "gpu_lowering",
    "sample",
    "sample_reference",
    "sample_split",
    "shard_cuts",
    "tpu_interpret_lowering",
    "tpu_lowering",
    "vocab_split",
]
