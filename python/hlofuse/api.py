"""The explicit path: `hlofuse.attention(...)` emits the same composite the fusion pass raises."""

from __future__ import annotations

import math

import jax

from hlofuse.composites import ATTENTION, ATTENTION_VERSION, SAMPLE, SAMPLE_VERSION, is_decode, mask_kind
from hlofuse.kernels.reference import UNBOUNDED, attention_reference


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
    return composite(*(operands[role] for role in present), **attributes, operands=tuple(present))


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
    from hlofuse.kernels.sampling_reference import FORMS, sample_reference

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
    return composite(*operands, **attributes)
