"""Plain-jnp references for the hlofuse composites: the oracle every kernel is tested against.

The semantics here are the contract of `stablehlo.composite "hlofuse.attention"` (docs/composites.md):
every kernel, on every backend, computes exactly this function of the composite's canonical operands
and attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from hlofuse.kernels.sampling_reference import sample_reference, sample_reference_with_scores
from hlofuse.kernels.target import CompositeCall, KernelSpec, Partitioning, lowered
from hlofuse.ops.attention import ATTENTION, AttentionAttrs
from hlofuse.ops.sample import SAMPLE, SampleAttrs

UNBOUNDED = -1


def attention_visibility(
    t: int,
    s: int,
    *,
    causal: bool,
    window_left: int,
    window_right: int,
    q_offset: int,
) -> jax.Array:
    """(T, S) bool: which keys each query may see under the causal / sliding-window attributes.

    Query row i sits at key position i + q_offset. Key j is visible iff
    -window_left <= j - (i + q_offset) <= window_right (a bound of -1 is unbounded);
    causal forces window_right = 0.
    """
    rel = jnp.arange(s)[None, :] - (jnp.arange(t)[:, None] + q_offset)
    visible = jnp.ones((t, s), dtype=bool)
    right = 0 if causal else window_right
    if right != UNBOUNDED:
        visible &= rel <= right
    if window_left != UNBOUNDED:
        visible &= rel >= -window_left
    return visible


def attention_mask(
    t: int,
    s: int,
    *,
    causal: bool,
    window_left: int,
    window_right: int,
    q_offset: int,
    mask: jax.Array | None = None,
    q_lengths: jax.Array | None = None,
    kv_lengths: jax.Array | None = None,
) -> jax.Array:  # (B|1, N|1, T, S) bool
    """Every visibility constraint of the composite at once: True where query t may see key s."""
    visible = attention_visibility(
        t, s, causal=causal, window_left=window_left, window_right=window_right, q_offset=q_offset
    )[None, None]
    if mask is not None:
        visible = visible & mask
    if kv_lengths is not None:
        visible = visible & (jnp.arange(s)[None, None, None, :] < kv_lengths[:, None, None, None])
    if q_lengths is not None:
        visible = visible & (jnp.arange(t)[None, None, :, None] < q_lengths[:, None, None, None])
    return visible


def zero_empty_rows_of(out: jax.Array, visible: jax.Array) -> jax.Array:
    """`out` (B, T, N, D) with the rows that see no key set to 0; `visible` as attention_mask gives it."""
    seen = jnp.any(visible, axis=-1)  # (B|1, N|1, T)
    return jnp.where(jnp.swapaxes(seen, 1, 2)[..., None], out, jnp.zeros((), out.dtype))


# A fill at or below this gives masked keys weight exactly 0 in f32 next to any visible key, so that a kernel's
# output zeroed afterwards where a row sees no key (`zeroed_if_asked`) is the program's re-masked softmax.
ZERO_EMPTY_ROWS_FILL_LIMIT = -1e4


def zeroed_if_asked(out: jax.Array, q: jax.Array, k: jax.Array, zero_empty_rows: bool,
                    attrs: dict[str, Any]) -> jax.Array:
    """A kernel's `out` with the rows that see no key set to 0 when `zero_empty_rows` (keras' Softmax(mask)
    zeroes masked probabilities after normalising); `attrs` are the kernel's keyword arguments (the
    composite's attributes and its mask / lengths operands). Exact when masked_value is at most
    ZERO_EMPTY_ROWS_FILL_LIMIT: the kernel's other rows already give masked keys weight 0."""
    if not zero_empty_rows:
        return out
    visible = attention_mask(q.shape[1], k.shape[1], causal=attrs["causal"], window_left=attrs["window_left"],
                             window_right=attrs["window_right"], q_offset=attrs["q_offset"],
                             mask=attrs.get("mask"), q_lengths=attrs.get("q_lengths"),
                             kv_lengths=attrs.get("kv_lengths"))
    return zero_empty_rows_of(out, visible)


def combine_partials(out: jax.Array, lse: jax.Array, dtype: Any) -> jax.Array:  # noqa: ANN401
    """out (..., P, R, D), lse (..., P, R) -> (..., R, D): the softmax over all P key ranges of R rows.

    A split that sees no key (lse -inf, out NaN) weighs 0; a row no split sees is 0/0 = NaN, as the
    reference's fully masked row is. The weighted sum is a dot over P: as a multiply and a reduce, XLA CPU
    took 30x longer (31 ms against 1 ms for 8 splits of (1, 8, 512, 64) f32)."""
    top = jnp.max(lse, axis=-2, keepdims=True)
    empty = lse == -jnp.inf
    weight = jnp.where(empty, 0.0, jnp.exp(lse - jnp.where(jnp.isfinite(top), top, 0.0)))
    parts = jnp.where(empty[..., None], 0.0, out.astype(jnp.float32))
    total = jnp.einsum("...pr,...prd->...rd", weight, parts) / jnp.sum(weight, axis=-2)[..., None]
    return total.astype(dtype)


def attention_reference(
    q: jax.Array,  # (B, T, N, H)
    k: jax.Array,  # (B, S, K, H), N % K == 0
    v: jax.Array,  # (B, S, K, D)
    *,
    scale: float,
    causal: bool = False,
    window_left: int = UNBOUNDED,
    window_right: int = UNBOUNDED,
    q_offset: int = 0,
    softcap: float = 0.0,
    masked_value: float = float("-inf"),
    zero_empty_rows: bool = False,
    bias: jax.Array | None = None,  # (B|1, N|1, T|1, S|1), added to the logits
    mask: jax.Array | None = None,  # (B|1, N|1, T|1, S|1) bool, True = visible
    q_lengths: jax.Array | None = None,  # (B,) int: query rows >= length are masked
    kv_lengths: jax.Array | None = None,  # (B,) int: keys >= length are masked
) -> jax.Array:  # (B, T, N, D), in q's dtype
    """softmax(mask(softcap(q·kᵀ * scale) + bias)) · v, with logits and softmax in float32.

    Masked logits take `masked_value` (like `jnp.where(mask, s, masked_value)`), so a fully masked
    row is NaN when masked_value is -inf and a uniform average over all keys when it is finite,
    exactly as the programs hlofuse rewrites compute it. With `zero_empty_rows`, a row that sees no key
    is 0 instead (keras' `Softmax(mask)` zeroes masked probabilities after normalising).
    """
    b, t, n, _ = q.shape
    s, kv_heads = k.shape[1], k.shape[2]
    groups = n // kv_heads
    qg = q.reshape(b, t, kv_heads, groups, q.shape[-1])
    logits = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32)
    logits = logits * jnp.float32(scale)
    if softcap:
        logits = jnp.tanh(logits / jnp.float32(softcap)) * jnp.float32(softcap)
    logits = logits.reshape(b, n, t, s)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    visible = attention_mask(t, s, causal=causal, window_left=window_left, window_right=window_right,
                             q_offset=q_offset, mask=mask, q_lengths=q_lengths, kv_lengths=kv_lengths)
    logits = jnp.where(visible, logits, jnp.float32(masked_value))
    probs = jax.nn.softmax(logits, axis=-1)
    if zero_empty_rows:
        probs = jnp.where(visible, probs, 0.0)
    probs = probs.reshape(b, kv_heads, groups, t, s)
    out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.reshape(b, t, n, v.shape[-1]).astype(q.dtype)


def attention_lowering(call: CompositeCall) -> Callable[..., Any]:
    """target=reference: the composite's meaning computed from its attributes alone."""
    return AttentionAttrs.from_dict(call.attributes).bind_operands(attention_reference)


def sampling_lowering(call: CompositeCall) -> Callable[..., Any]:
    """target=reference for `hlofuse.sample`: the composite's form, rebuilt from its attributes alone."""
    attrs = SampleAttrs.from_dict(call.attributes)

    def reference(logits: jax.Array, key: jax.Array | None = None, *rows: jax.Array) -> Any:  # noqa: ANN401
        if attrs.scores:  # (ids, the scores its draw perturbs)
            return sample_reference_with_scores(logits, key, form=attrs.form, fill=attrs.fill, **attrs.params(),
                                                rows=rows, gumbel_at_zero=attrs.gumbel_at_zero)
        return sample_reference(logits, key, form=attrs.form, **attrs.params(), rows=rows,
                                gumbel_at_zero=attrs.gumbel_at_zero, stages=attrs.stages)

    return reference


# Plain JAX ops: run on any platform, and XLA partitions them like the program they replace.
SPECS = (KernelSpec(ATTENTION, "reference", lowered(attention_lowering), Partitioning.XLA),
         KernelSpec(SAMPLE, "reference", lowered(sampling_lowering), Partitioning.XLA))
