"""Random attention programs for the differential test (test_differential.py): one typed spec per program.

`AttentionSpec` describes one attention site: sizes, dtype, where the softmax runs, the scale form, the
layout, the GQA form, soft-cap, and every mask at once (causal, sliding window, boolean tensor, additive
bias, per-sequence lengths) with its fill value. `build(spec)` writes the program as a user would, in
plain jnp or through `jax.nn.dot_product_attention`; `inputs(spec, seed)` makes its arguments; and
`expected_output(spec, args)` is a float64 numpy oracle of the same spec, written independently of both
the program and hlofuse's reference, so the test can tell generator mistakes from fusion mistakes and
measure how much rounding the original program itself does.

Fully masked rows. With an infinite fill (`-inf`, or `-1e9` once it overflows float16) a query row whose
keys are all masked is NaN in the original, and NaN compares equal to NaN, so such a row would check
nothing about the fusion. `allows_empty_rows(spec)` is False for those specs: the strategy keeps them only
when every row keeps a key structurally, and `inputs` then draws lengths and masks that keep one. With a
finite fill a fully masked row is a uniform average over all keys, a value worth comparing, so finite-fill
specs may have such rows (query lengths always make some).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

DTYPES = ("float32", "bfloat16", "float16")
# Where a low-precision program moves to float32: nowhere, right after the q.kᵀ dot, just before the
# softmax, or in the dot itself (preferred_element_type). The probabilities go back to the input dtype.
UPCASTS = ("none", "after_dot", "before_softmax", "preferred")
# none: q.kᵀ; multiply: * scale_value after the dot; divide_sqrt: / jnp.sqrt(H) after the dot;
# prescale_q: q * H**-0.5; prescale_q_divide: q / jnp.sqrt(H) in q's dtype.
SCALES = ("none", "multiply", "divide_sqrt", "prescale_q", "prescale_q_divide")
# btnh: einsums on (B,T,N,H); bnth: transposed to (B,N,T,H) first; matmul: q @ kᵀ on (B,N,T,H);
# v_left: BTNH einsums with v as the first operand of the second one; bmm: PyTorch's 4-D matmul as
# torchax lowers it, batch and heads folded into one dim around each batch_matmul; permuted: logits laid
# out (B,N,S,T), the softmax over axis -2, masks and biases transposed to match.
LAYOUTS = ("btnh", "bnth", "matmul", "v_left", "bmm", "permuted")
# When K < N: jnp.repeat of k and v over heads, the 5-D grouped einsum "btkgh,bskh->bkgts", Hugging
# Face's repeat_kv (broadcast a new group dim, reshape into heads), or, for K = 1, k and v with their
# head dim squeezed away ("btnh,bsh->bnts").
GQA_FORMS = ("none", "repeat", "grouped", "expand", "squeezed")
# Causal and windows from iota comparisons, from jnp.tril / jnp.triu of ones, or from positions that a
# cumsum over ones counts (the mask is then decided by evaluating it).
MASK_STYLES = ("iota", "tril", "cumsum")
# One jnp.where on the conjunction of every predicate, one jnp.where per predicate, or the conjunction
# added as a bias `where(visible, 0, fill)` (PyTorch and Hugging Face write masks that way).
COMBINES = ("and", "chain", "additive")
MASK_SHAPES = ("b1ts", "bnts", "ts")
BIAS_SHAPES = ("bnts", "1nts", "ts")
FILLS = ("-inf", "finfo_min", "-1e9")
APIS = ("jnp", "nn")

F32 = jnp.float32


@dataclass(frozen=True)
class AttentionSpec:
    """One attention program. Sizes follow jax.nn's letters: q (B,T,N,H), k (B,S,K,H), v (B,S,K,D)."""

    b: int
    t: int
    s: int
    n: int
    kv: int  # K, divides n
    h: int
    d: int  # value head dim; == h for api "nn"
    dtype: str = "float32"
    upcast: str = "none"
    api: str = "jnp"  # "nn": jax.nn.dot_product_attention (scale is "divide_sqrt" = default, or "multiply")
    scale: str = "divide_sqrt"
    scale_value: float = 0.3
    layout: str = "btnh"
    gqa: str = "none"
    softcap: float = 0.0  # 0 = none; else tanh(s / c) * c
    causal: bool = False
    window_left: int | None = None
    window_right: int | None = None  # only without causal (jnp); nn always writes both sides
    mask_style: str = "iota"
    combine: str = "and"
    mask: str | None = None  # a MASK_SHAPES entry
    bias: str | None = None  # a BIAS_SHAPES entry
    q_lengths: bool = False
    kv_lengths: bool = False
    fill: str = "-inf"  # ignored by api "nn", which fills with -0.7 * finfo(float32).max

    @property
    def groups(self) -> int:
        return self.n // self.kv

    @property
    def q_offset(self) -> int:
        """Key position of query row 0: bottom-right alignment for jnp programs, top-left in jax.nn."""
        return 0 if self.api == "nn" else self.s - self.t

    @property
    def logits_dtype(self) -> str:
        """The dtype the scale, soft-cap, bias and masks are applied in."""
        return "float32" if self.api == "nn" or self.upcast in ("after_dot", "preferred") else self.dtype

    @property
    def has_masks(self) -> bool:
        return self.causal or self.window_left is not None or self.window_right is not None or bool(
            self.mask or self.q_lengths or self.kv_lengths
        )

    @property
    def right_bound(self) -> int | None:
        """The right edge the program writes, relative to the aligned diagonal (None: unbounded)."""
        if self.api == "nn" and self.window_left is not None:
            right = self.window_right if self.window_right is not None else self.s
            return 0 if self.causal else right
        return 0 if self.causal else self.window_right

    @property
    def left_bound(self) -> int | None:
        if self.api == "nn" and self.window_right is not None and self.window_left is None:
            return self.t
        return self.window_left

    def extra_names(self) -> list[str]:
        """Operands after q, k, v, in order."""
        present = (("bias", self.bias), ("mask", self.mask), ("q_lengths", self.q_lengths),
                   ("kv_lengths", self.kv_lengths))
        return [name for name, used in present if used]


def fill_value(spec: AttentionSpec) -> float:
    """What masked logits become, in the dtype the program masks in."""
    dtype = np.dtype(ml_dtypes.bfloat16) if spec.logits_dtype == "bfloat16" else np.dtype(spec.logits_dtype)
    if spec.api == "nn":
        return float(np.float32(-0.7 * float(np.finfo(np.float32).max)))
    if spec.fill == "-inf":
        return -math.inf
    if spec.fill == "finfo_min":
        return float(ml_dtypes.finfo(dtype).min)
    with np.errstate(over="ignore"):
        return float(np.asarray(-1e9, dtype=dtype))  # -inf in float16


def allows_empty_rows(spec: AttentionSpec) -> bool:
    """Whether a fully masked query row compares as a real value (finite fill) rather than NaN."""
    return math.isfinite(fill_value(spec))


def structural_visibility(spec: AttentionSpec) -> np.ndarray:
    """(T, S) bool: keys each query sees through causal and window masks alone."""
    rel = np.arange(spec.s)[None, :] - (np.arange(spec.t)[:, None] + spec.q_offset)
    visible = np.ones((spec.t, spec.s), dtype=bool)
    if spec.right_bound is not None:
        visible &= rel <= spec.right_bound
    if spec.left_bound is not None:
        visible &= rel >= -spec.left_bound
    return visible


def total_scale(spec: AttentionSpec) -> float:
    if spec.scale == "none":
        return 1.0
    if spec.scale == "multiply":
        return spec.scale_value
    return 1.0 / math.sqrt(spec.h)


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def arg_shapes(spec: AttentionSpec) -> list[tuple[tuple[int, ...], str]]:
    b, t, s, n = spec.b, spec.t, spec.s, spec.n
    shapes = [((b, t, n, spec.h), spec.dtype), ((b, s, spec.kv, spec.h), spec.dtype),
              ((b, s, spec.kv, spec.d), spec.dtype)]
    for name in spec.extra_names():
        if name == "bias":
            lead = {"bnts": (b, n), "1nts": (1, n), "ts": ()}[spec.bias or ""]
            shapes.append(((*lead, t, s), spec.dtype))
        elif name == "mask":
            lead = {"b1ts": (b, 1), "bnts": (b, n), "ts": ()}[spec.mask or ""]
            shapes.append(((*lead, t, s), "bool"))
        else:
            shapes.append(((b,), "int32"))
    return shapes


def build(spec: AttentionSpec) -> tuple[Callable[..., jax.Array], list[jax.ShapeDtypeStruct]]:
    """The program (q, k, v, *extras) -> (B,T,N,D), and the argument specs to lower it with."""
    fn = _nn_program(spec) if spec.api == "nn" else _jnp_program(spec)
    specs = [jax.ShapeDtypeStruct(shape, np_dtype(dtype)) for shape, dtype in arg_shapes(spec)]
    return fn, specs


def inputs(spec: AttentionSpec, seed: int) -> list[np.ndarray]:
    """Arguments for `build(spec)`: normal q/k/v/bias, masks ~70% visible, lengths >= 1. Unless the fill
    is finite, every query row keeps at least one visible key."""
    rng = np.random.default_rng(seed)
    keep_rows = not allows_empty_rows(spec)
    visible = structural_visibility(spec)
    first = np.where(visible.any(axis=1), visible.argmax(axis=1), 0)  # first visible key per row
    out: list[np.ndarray] = []
    names = ["q", "k", "v", *spec.extra_names()]
    for name, (shape, dtype) in zip(names, arg_shapes(spec), strict=True):
        if name == "mask":
            mask = rng.random(shape) < 0.7
            if keep_rows:
                mask[..., np.arange(spec.t), first] = True
            out.append(mask)
        elif name == "kv_lengths":
            low = int(first.max()) + 1 if keep_rows else 1
            out.append(rng.integers(low, spec.s + 1, size=shape).astype(np.int32))
        elif name == "q_lengths":
            out.append(rng.integers(1, spec.t + 1, size=shape).astype(np.int32))
        else:
            out.append(rng.standard_normal(shape, dtype=np.float32).astype(np_dtype(dtype)))
    return out


def expected_output(spec: AttentionSpec, args: Sequence[np.ndarray]) -> np.ndarray:
    """float64 numpy oracle of the spec (not of the program's rounding): (B,T,N,D)."""
    named = dict(zip(["q", "k", "v", *spec.extra_names()], args, strict=True))
    q, k, v = (np.asarray(named[x], dtype=np.float64) for x in ("q", "k", "v"))
    k, v = np.repeat(k, spec.groups, axis=2), np.repeat(v, spec.groups, axis=2)
    logits = np.einsum("btnh,bsnh->bnts", q, k) * total_scale(spec)
    if spec.softcap:
        logits = np.tanh(logits / spec.softcap) * spec.softcap
    if "bias" in named:
        logits = logits + np.asarray(named["bias"], dtype=np.float64)
    visible = np.broadcast_to(structural_visibility(spec), logits.shape)
    if "mask" in named:
        visible = visible & named["mask"]
    t_index, s_index = np.arange(spec.t), np.arange(spec.s)
    if "kv_lengths" in named:
        visible = visible & (s_index[None, None, None, :] < named["kv_lengths"][:, None, None, None])
    if "q_lengths" in named:
        visible = visible & (t_index[None, None, :, None] < named["q_lengths"][:, None, None, None])
    logits = np.where(visible, logits, fill_value(spec))
    with np.errstate(invalid="ignore"):  # a fully masked row under an infinite fill is NaN, as in the program
        weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
        out = np.einsum("bnts,bsnd->btnd", weights / weights.sum(axis=-1, keepdims=True), v)
    if spec.api == "nn" and "q_lengths" in named:  # jax.nn zeroes padded query rows of its output
        out = out * (t_index[None, :] < named["q_lengths"][:, None])[:, :, None, None]
    return out


# ----- the programs, written as users write them ---------------------------------------------------------


def _nn_program(spec: AttentionSpec) -> Callable[..., jax.Array]:
    window = None
    if spec.window_left is not None or spec.window_right is not None:
        window = (spec.left_bound, spec.window_right if spec.window_right is not None else spec.s)

    def program(q: jax.Array, k: jax.Array, v: jax.Array, *extras: jax.Array) -> jax.Array:
        named = dict(zip(spec.extra_names(), extras, strict=True))
        return jax.nn.dot_product_attention(
            q, k, v, bias=named.get("bias"), mask=named.get("mask"),
            scale=spec.scale_value if spec.scale == "multiply" else None, is_causal=spec.causal,
            query_seq_lengths=named.get("q_lengths"), key_value_seq_lengths=named.get("kv_lengths"),
            local_window_size=window,
        )

    return program


def _jnp_program(spec: AttentionSpec) -> Callable[..., jax.Array]:
    def program(q: jax.Array, k: jax.Array, v: jax.Array, *extras: jax.Array) -> jax.Array:
        named = dict(zip(spec.extra_names(), extras, strict=True))
        dtype = q.dtype
        if spec.scale == "prescale_q":
            q = q * (spec.h**-0.5)
        elif spec.scale == "prescale_q_divide":
            q = q / jnp.sqrt(jnp.asarray(spec.h, dtype))
        if spec.gqa == "repeat":
            k, v = jnp.repeat(k, spec.groups, axis=2), jnp.repeat(v, spec.groups, axis=2)
        elif spec.gqa == "expand":
            k, v = _repeat_kv(spec, k), _repeat_kv(spec, v)
        s = _logits(spec, q, k)
        if spec.upcast == "after_dot":
            s = s.astype(F32)
        if spec.scale == "multiply":
            s = s * spec.scale_value
        elif spec.scale == "divide_sqrt":
            s = s / jnp.sqrt(spec.h).astype(s.dtype)
        if spec.softcap:
            s = jnp.tanh(s / spec.softcap) * spec.softcap
        if "bias" in named:
            s = s + _laid_out(spec, _to_scores(spec, named["bias"]))
        s = _apply_masks(spec, s, named)
        if spec.upcast == "before_softmax":
            s = s.astype(F32)
        p = jax.nn.softmax(s, axis=-2 if spec.layout == "permuted" else -1)
        if spec.upcast != "none":
            p = p.astype(dtype)
        return _attend(spec, p, v)

    return program


def _repeat_kv(spec: AttentionSpec, x: jax.Array) -> jax.Array:
    """Hugging Face's repeat_kv: (B,S,K,H) -> (B,K,1,S,H) broadcast to (B,K,G,S,H), reshaped to N heads."""
    b, s, kv, h = x.shape
    grouped = jnp.broadcast_to(x.transpose(0, 2, 1, 3)[:, :, None], (b, kv, spec.groups, s, h))
    return grouped.reshape(b, spec.n, s, h).transpose(0, 2, 1, 3)


def _laid_out(spec: AttentionSpec, x: jax.Array) -> jax.Array:
    """A tensor broadcastable against (.., T, S) logits, in the logits' own layout."""
    return jnp.swapaxes(x, -1, -2) if spec.layout == "permuted" and x.ndim >= 2 else x


def _logits(spec: AttentionSpec, q: jax.Array, k: jax.Array) -> jax.Array:
    """(B,N,T,S), (B,N,S,T) when permuted, or (B,K,G,T,S) for the grouped form."""
    pref: dict[str, Any] = {"preferred_element_type": F32} if spec.upcast == "preferred" else {}
    if spec.gqa == "grouped":
        qg = q.reshape(spec.b, spec.t, spec.kv, spec.groups, spec.h)
        return jnp.einsum("btkgh,bskh->bkgts", qg, k, **pref)
    if spec.gqa == "squeezed":
        return jnp.einsum("btnh,bsh->bnts", q, k[:, :, 0], **pref)
    if spec.layout == "permuted":
        return jnp.einsum("btnh,bsnh->bnst", q, k, **pref)
    if spec.layout == "bmm":
        b, t, n, h = q.shape
        folded_q = q.transpose(0, 2, 1, 3).reshape(b * n, t, h)
        folded_k = k.transpose(0, 2, 3, 1).reshape(b * n, h, spec.s)
        return jax.lax.batch_matmul(folded_q, folded_k, **pref).reshape(b, n, t, spec.s)
    if spec.layout in ("btnh", "v_left"):
        return jnp.einsum("btnh,bsnh->bnts", q, k, **pref)
    q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
    if spec.layout == "bnth":
        return jnp.einsum("bnth,bnsh->bnts", q, k, **pref)
    return jnp.matmul(q, k.swapaxes(-1, -2), **pref)


def _attend(spec: AttentionSpec, p: jax.Array, v: jax.Array) -> jax.Array:
    """P.V back in (B,T,N,D)."""
    if spec.gqa == "grouped":
        if spec.layout == "v_left":
            out = jnp.einsum("bskd,bkgts->btkgd", v, p)
        else:
            out = jnp.einsum("bkgts,bskd->btkgd", p, v)
        return out.reshape(spec.b, spec.t, spec.n, spec.d)
    if spec.gqa == "squeezed":
        return jnp.einsum("bnts,bsd->btnd", p, v[:, :, 0])
    if spec.layout == "permuted":
        return jnp.einsum("bnst,bsnd->btnd", p, v)
    if spec.layout == "bmm":
        b, n = spec.b, spec.n
        folded = jax.lax.batch_matmul(p.reshape(b * n, spec.t, spec.s),
                                      v.transpose(0, 2, 1, 3).reshape(b * n, spec.s, spec.d))
        return folded.reshape(b, n, spec.t, spec.d).transpose(0, 2, 1, 3)
    if spec.layout == "btnh":
        return jnp.einsum("bnts,bsnd->btnd", p, v)
    if spec.layout == "v_left":
        return jnp.einsum("bsnd,bnts->btnd", v, p)
    v = v.transpose(0, 2, 1, 3)
    out = jnp.einsum("bnts,bnsd->bntd", p, v) if spec.layout == "bnth" else p @ v
    return out.transpose(0, 2, 1, 3)


def _to_scores(spec: AttentionSpec, x: jax.Array) -> jax.Array:
    """A (B|1, N|1, T, S) or (T, S) tensor laid out to broadcast against the logits."""
    if spec.gqa != "grouped" or x.ndim == 2:
        return x
    if x.shape[1] == 1:
        return x[:, :, None]
    return x.reshape(x.shape[0], spec.kv, spec.groups, spec.t, spec.s)


def _per_sequence(spec: AttentionSpec, x: jax.Array, axis: str) -> jax.Array:
    """A (B, T) or (B, S) predicate broadcast against the logits."""
    heads = (None, None) if spec.gqa == "grouped" else (None,)
    if axis == "t":
        return x[(slice(None), *heads, slice(None), None)]
    return x[(slice(None), *heads, None, slice(None))]


def _predicates(spec: AttentionSpec, named: dict[str, jax.Array]) -> list[jax.Array]:
    t, s, off = spec.t, spec.s, spec.q_offset
    rows, cols = jnp.arange(t)[:, None], jnp.arange(s)[None, :]
    if spec.mask_style == "cumsum":  # positions counted by a cumsum over ones
        rows = (jnp.cumsum(jnp.ones((t,), jnp.int32)) - 1)[:, None]
        cols = (jnp.cumsum(jnp.ones((s,), jnp.int32)) - 1)[None, :]
    aligned = rows + off if off else rows  # each query's own key position
    ones = jnp.ones((t, s), bool)
    preds: list[jax.Array] = []
    if spec.causal:
        preds.append(jnp.tril(ones, k=off) if spec.mask_style == "tril" else cols <= aligned)
    if spec.window_left is not None:
        left = spec.window_left
        preds.append(jnp.triu(ones, k=off - left) if spec.mask_style == "tril" else aligned - cols <= left)
    if spec.window_right is not None:
        right = spec.window_right
        preds.append(jnp.tril(ones, k=off + right) if spec.mask_style == "tril" else cols - aligned <= right)
    if "mask" in named:
        preds.append(_to_scores(spec, named["mask"]))
    if "kv_lengths" in named:
        preds.append(_per_sequence(spec, jnp.arange(s)[None, :] < named["kv_lengths"][:, None], "s"))
    if "q_lengths" in named:
        preds.append(_per_sequence(spec, jnp.arange(t)[None, :] < named["q_lengths"][:, None], "t"))
    return preds


def _fill(spec: AttentionSpec, s: jax.Array) -> Any:  # noqa: ANN401
    if spec.fill == "-inf":
        return -jnp.inf
    if spec.fill == "finfo_min":
        return jnp.finfo(s.dtype).min
    return -1e9


def _apply_masks(spec: AttentionSpec, s: jax.Array, named: dict[str, jax.Array]) -> jax.Array:
    preds = [_laid_out(spec, pred) for pred in _predicates(spec, named)]
    if not preds:
        return s
    if spec.combine == "chain":
        for pred in preds:
            s = jnp.where(pred, s, _fill(spec, s))
        return s
    visible = preds[0]
    for pred in preds[1:]:
        visible = visible & pred
    if spec.combine == "additive":
        return s + jnp.where(visible, jnp.zeros((), s.dtype), jnp.asarray(_fill(spec, s), s.dtype))
    return jnp.where(visible, s, _fill(spec, s))
