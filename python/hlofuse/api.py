"""The explicit path: `hlofuse.attention(...)` emits the same composite the fusion pass raises.

Both functions work under jax's transformations, as the jnp code they replace does:
- **jax.grad / jax.jvp.** `jax.lax.composite` has no differentiation rule. The composite is wrapped in a
  `jax.custom_jvp` whose rule keeps the composite for the primal output (the kernel still runs forward)
  and takes the tangent from the reference (the decomposition), so gradients are exactly those of the
  program written in jnp. The sampler's token ids are integers: their tangent is zero (float0).
- **jax.vmap.** `jax.lax.composite` has no batching rule either. A `jax.custom_batching.custom_vmap` rule
  folds the mapped axis into attention's batch dim (one composite, one kernel call). A sampler draws per
  element with that element's key, which no single call reproduces, so it maps its calls with
  `lax.map`, except greedy, whose rows are independent and which takes the mapped axis as one more row dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hlofuse.kernels.reference import UNBOUNDED, attention_reference
from hlofuse.kernels.sampling_reference import FORMS, sample_reference
from hlofuse.ops.attention import ATTENTION, ATTENTION_VERSION, is_decode, mask_kind
from hlofuse.ops.sample import SAMPLE, SAMPLE_VERSION


def attention(
    q: jax.Array,  # (B, T, N, H)
    k: jax.Array,  # (B, S, K, H)
    v: jax.Array,  # (B, S, K, D)
    *,
    scale: float | None = None,
    causal: bool = False,
    window: tuple[int, int] | None = None,
    softcap: float = 0.0,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    q_lengths: jax.Array | None = None,
    kv_lengths: jax.Array | None = None,
    q_offset: int = 0,
    masked_value: float = float("-inf"),
    zero_empty_rows: bool = False,
) -> jax.Array:  # (B, T, N, D)
    """Multi-head attention as one `hlofuse.attention` composite, whose decomposition is the jnp reference.

    `window=(left, right)` keeps keys j with -left <= j - (i + q_offset) <= right; `causal` forces
    right = 0. `mask` (True = visible) and `bias` broadcast as (B|1, N|1, T|1, S|1).
    """
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be (B, T, N, H), (B, S, K, H), (B, S, K, D); got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    if q.shape[2] % k.shape[2] or k.shape[2] != v.shape[2]:
        raise ValueError(f"query heads {q.shape[2]} must be a multiple of kv heads {k.shape[2]} (= v's "
                         f"{v.shape[2]})")
    window_left, window_right = window if window is not None else (UNBOUNDED, UNBOUNDED)
    if causal:
        window_right = 0
    operands = {"q": q, "k": k, "v": v, "bias": bias, "mask": mask, "q_lengths": q_lengths,
                "kv_lengths": kv_lengths}
    present = [role for role, value in operands.items() if value is not None]
    attributes = {
        "scale": float(scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])),
        "causal": causal, "window_left": int(window_left), "window_right": int(window_right),
        "q_offset": int(q_offset), "softcap": float(softcap), "masked_value": float(masked_value),
        "mask_kind": mask_kind(present), "num_heads": int(q.shape[2]), "num_kv_heads": int(k.shape[2]),
        "layout": "BTNH", "decode": is_decode(q.shape[1], k.shape[1]), "zero_empty_rows": zero_empty_rows,
    }

    def decomposition(*values: jax.Array, **attrs: object) -> jax.Array:
        named = dict(zip(present, values, strict=True))
        return attention_reference(
            named.pop("q"), named.pop("k"), named.pop("v"), **named,
            scale=attrs["scale"], causal=attrs["causal"], window_left=attrs["window_left"],
            window_right=attrs["window_right"], q_offset=attrs["q_offset"], softcap=attrs["softcap"],
            masked_value=attrs["masked_value"], zero_empty_rows=attrs["zero_empty_rows"],
        )

    composite = jax.lax.composite(decomposition, ATTENTION, ATTENTION_VERSION)
    fused = _transformable(
        lambda *values: composite(*values, **attributes, operands=tuple(present)),
        lambda *values: decomposition(*values, **attributes),
        lambda call: _fold_into_batch(call, present),
    )
    return fused(*(operands[role] for role in present))


def _transformable(
    call: Callable[..., jax.Array],
    reference: Callable[..., jax.Array] | None,
    vmap_rule: Callable[[Callable[..., jax.Array]], Callable[..., tuple[jax.Array, bool]]],
) -> Callable[..., jax.Array]:
    """`call` (which emits a composite) under jax.vmap through `vmap_rule(batched_call)` and under jax.jvp /
    jax.grad with the tangent of `reference` (None: the output is integer and its tangent is zero)."""
    batched = jax.custom_batching.custom_vmap(call)
    batched.def_vmap(vmap_rule(batched))
    differentiable = jax.custom_jvp(batched)

    @differentiable.defjvp
    def _jvp(primals: Sequence[jax.Array], tangents: Sequence[jax.Array]) -> tuple[jax.Array, Any]:
        out = differentiable(*primals)  # itself, so that higher orders (forward over reverse) differentiate it again
        if reference is None:
            return out, np.zeros(out.shape, jax.dtypes.float0)
        return out, jax.jvp(reference, tuple(primals), tuple(tangents))[1]

    return differentiable


def _fold_into_batch(call: Callable[..., jax.Array],
                     roles: Sequence[str]) -> Callable[..., tuple[jax.Array, bool]]:
    """The vmap rule of an attention call: the mapped axis (size A, leading) joins the batch dim B as one
    batch of A * B, the call runs once, and its output splits back. Unmapped operands are broadcast along
    A; a bias or mask whose batch dim is 1 and that is unmapped broadcasts as it is."""

    def rule(axis_size: int, in_batched: Sequence[bool], *values: jax.Array) -> tuple[jax.Array, bool]:
        if not any(in_batched):
            return call(*values), False
        named = dict(zip(roles, zip(values, in_batched, strict=True), strict=True))
        q, q_mapped = named["q"]
        batch = q.shape[1] if q_mapped else q.shape[0]
        folded = []
        for role, (value, mapped) in named.items():
            if not mapped and role in ("bias", "mask") and value.shape[0] == 1:
                folded.append(value)
                continue
            per_element = value.shape[1:] if mapped else value.shape
            if role in ("bias", "mask"):  # (B|1, N|1, T|1, S|1): a batch dim of 1 broadcasts to B first
                per_element = (batch, *per_element[1:])
            value = jnp.broadcast_to(value if mapped else value[None], (axis_size, *per_element))
            folded.append(value.reshape(axis_size * batch, *per_element[1:]))
        out = call(*folded)
        return out.reshape(axis_size, batch, *out.shape[1:]), True

    return rule


def _map_per_element(call: Callable[..., jax.Array]) -> Callable[..., tuple[jax.Array, bool]]:
    """The vmap rule of a sampler call: one call per element of the mapped axis, in a lax.map, with the
    element's own logits and key (an unmapped operand is shared). Greedy (no key) takes the mapped axis as
    one more leading row dim instead: its rows are independent."""

    def rule(axis_size: int, in_batched: Sequence[bool], *values: jax.Array) -> tuple[jax.Array, bool]:
        if not any(in_batched):
            return call(*values), False
        if len(values) == 1:
            return call(values[0]), True
        mapped = [i for i, b in enumerate(in_batched) if b]

        def one(elements: Sequence[jax.Array]) -> jax.Array:
            args = list(values)
            for i, element in zip(mapped, elements, strict=True):
                args[i] = element
            return call(*args)

        return jax.lax.map(one, [values[i] for i in mapped]), True

    return rule


def sample(
    logits: jax.Array,  # (..., V) float
    key: jax.Array,  # (2,) uint32 raw threefry key (jax.random.PRNGKey)
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> jax.Array:  # (...,) int32 token ids
    """Draws one token per row as one `hlofuse.sample` composite, whose decomposition is the jnp reference.

    temperature 0 is greedy (argmax). Otherwise the token is drawn as jax.random.categorical would
    draw it after the filters: top-k alone is the rank-space `top_k` form (categorical over the top-k
    logits / T), top-p alone the nucleus mask `top_p_mask`, both `top_k_top_p_mask`, min-p alone `min_p`.
    """
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1 or not 0 <= min_p <= 1:
        raise ValueError(f"invalid sampling parameters temperature={temperature}, top_k={top_k}, top_p={top_p}, "
                         f"min_p={min_p}")
    if temperature == 0:
        form = "greedy"
    elif min_p > 0:
        if top_k or top_p < 1:
            raise ValueError("min_p does not combine with top_k / top_p in hlofuse.sample")
        form = "min_p"
    elif top_k and top_p < 1:
        form = "top_k_top_p_mask"
    elif top_k:
        form = "top_k"
    elif top_p < 1:
        form = "top_p_mask"
    else:
        form = "temperature"
    attributes = {"mode": FORMS[form].mode, "form": form, "temperature": float(temperature or 1.0),
                  "k": int(top_k), "p": float(top_p), "min_p": float(min_p)}

    def decomposition(*values: jax.Array, **attrs: object) -> jax.Array:
        return sample_reference(values[0], values[1] if len(values) > 1 else None, form=str(attrs["form"]),
                                temperature=float(attrs["temperature"]), k=int(attrs["k"]),
                                p=float(attrs["p"]), min_p=float(attrs["min_p"]))

    composite = jax.lax.composite(decomposition, SAMPLE, SAMPLE_VERSION)
    operands = (logits,) if form == "greedy" else (logits, key)
    fused = _transformable(lambda *values: composite(*values, **attributes), None, _map_per_element)
    return fused(*operands)
