"""A catalogue of attention as people write it in JAX: one entry per variant the fusion must cover.

Each variant is a function of (q, k, v, *extras) plus the shapes and dtypes to lower it with, and how
many attention sites it holds. The end-to-end tests jit each one with and without hlofuse; the lit
tests are generated from the same entries (tools/gen_lit_attention.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

B, T, N, K, H = 2, 16, 4, 2, 8


@dataclass(frozen=True)
class Variant:
    name: str
    fn: Callable[..., Any]
    shapes: tuple[tuple[tuple[int, ...], Any], ...]
    sites: int = 1
    expect: dict[str, Any] = field(default_factory=dict)  # composite attributes the fusion must infer

    def args(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        out = []
        for shape, dtype in self.shapes:
            if dtype == jnp.bool_:
                out.append(rng.random(shape) > 0.3)
            elif jnp.issubdtype(dtype, jnp.integer):
                out.append(rng.integers(1, T + 1, size=shape).astype(dtype))
            else:
                out.append(rng.standard_normal(shape).astype(dtype))
        return out


def _qkv(
    t: int = T,
    s: int = T,
    n: int = N,
    k: int = N,
    dtype: Any = jnp.float32,  # noqa: ANN401
    h: int = H,
) -> tuple[tuple[tuple[int, ...], Any], ...]:
    return (((B, t, n, h), dtype), ((B, s, k, h), dtype), ((B, s, k, h), dtype))


def _softmax_attend(s: jax.Array, v: jax.Array) -> jax.Array:
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s, axis=-1), v)


def _logits(q: jax.Array, k: jax.Array) -> jax.Array:
    return jnp.einsum("btnh,bsnh->bnts", q, k)


def plain_divide_sqrt(q, k, v):
    return _softmax_attend(_logits(q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype), v)


def multiply_constant(q, k, v):
    return _softmax_attend(_logits(q, k) * 0.125, v)


def prescaled_query(q, k, v):
    return _softmax_attend(_logits(q * (q.shape[-1] ** -0.5), k), v)


def no_scale(q, k, v):
    return _softmax_attend(_logits(q, k), v)


def causal_tril_inf(q, k, v):
    s = _logits(q, k) / np.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    return _softmax_attend(jnp.where(mask, s, -jnp.inf), v)


def causal_finfo_min(q, k, v):
    s = _logits(q, k) * 0.3
    rows, cols = jnp.arange(q.shape[1])[:, None], jnp.arange(k.shape[1])[None, :]
    return _softmax_attend(jnp.where(cols <= rows, s, jnp.finfo(s.dtype).min), v)


def causal_large_negative(q, k, v):
    s = _logits(q, k) * 0.3
    mask = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    return _softmax_attend(jnp.where(mask, s, -1e9), v)


def sliding_window(q, k, v):
    s = _logits(q, k) * 0.3
    rows, cols = jnp.arange(q.shape[1])[:, None], jnp.arange(k.shape[1])[None, :]
    visible = (cols <= rows) & (rows - cols < 4)
    return _softmax_attend(jnp.where(visible, s, -jnp.inf), v)


def two_sided_window(q, k, v):
    s = _logits(q, k) * 0.3
    rows, cols = jnp.arange(q.shape[1])[:, None], jnp.arange(k.shape[1])[None, :]
    visible = (cols - rows <= 3) & (rows - cols <= 3)
    return _softmax_attend(jnp.where(visible, s, -jnp.inf), v)


def boolean_mask(q, k, v, mask):
    return _softmax_attend(jnp.where(mask[:, None], _logits(q, k) * 0.3, -jnp.inf), v)


def additive_bias(q, k, v, bias):
    return _softmax_attend(_logits(q, k) * 0.3 + bias, v)


def causal_and_padding(q, k, v, kv_len):
    s = _logits(q, k) * 0.3
    rows, cols = jnp.arange(q.shape[1])[:, None], jnp.arange(k.shape[1])[None, :]
    causal = cols <= rows
    padding = jnp.arange(k.shape[1])[None, :] < kv_len[:, None]
    visible = causal[None, None] & padding[:, None, None, :]
    return _softmax_attend(jnp.where(visible, s, jnp.finfo(jnp.float32).min), v)


def softcap(q, k, v):
    s = _logits(q, k) * 0.3
    s = jnp.tanh(s / 20.0) * 20.0
    mask = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    return _softmax_attend(jnp.where(mask, s, -jnp.inf), v)


def gqa_repeat(q, k, v):
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    return _softmax_attend(_logits(q, k) * 0.3, v)


def gqa_grouped_einsum(q, k, v):
    b, t, n, h = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, t, kv, n // kv, h)
    s = jnp.einsum("btkgh,bskh->bkgts", qg, k) * 0.3
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bkgts,bskh->btkgh", p, v).reshape(b, t, n, h)


def bnth_layout(q, k, v):
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # B N T H
    s = jnp.einsum("bnth,bnsh->bnts", q, k) * 0.3
    out = jnp.einsum("bnts,bnsh->bnth", jax.nn.softmax(s, axis=-1), v)
    return out.transpose(0, 2, 1, 3)


def matmul_style(q, k, v):
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    s = (q @ k.swapaxes(-1, -2)) * 0.3
    return (jax.nn.softmax(s, axis=-1) @ v).transpose(0, 2, 1, 3)


def bf16_f32_softmax(q, k, v):
    s = _logits(q, k).astype(jnp.float32) * 0.3
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    return jnp.einsum("bnts,bsnh->btnh", p, v)


def all_bf16(q, k, v):
    return _softmax_attend(_logits(q, k) * jnp.bfloat16(0.3), v)


def decode_with_cache(q, k, v, cache_len):
    # one query against a cache of S slots, valid up to cache_len[b]
    s = _logits(q, k) * 0.3
    valid = jnp.arange(k.shape[1])[None, :] < cache_len[:, None]
    return _softmax_attend(jnp.where(valid[:, None, None, :], s, -1e30), v)


def nn_dot_product_attention(q, k, v):
    return jax.nn.dot_product_attention(q, k, v)


def nn_causal_gqa(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


def nn_bias_lengths_window(q, k, v, bias, kv_len):
    return jax.nn.dot_product_attention(
        q, k, v, bias=bias, key_value_seq_lengths=kv_len, local_window_size=(3, 0), is_causal=True
    )


def nn_query_lengths(q, k, v, q_len, kv_len):
    return jax.nn.dot_product_attention(q, k, v, query_seq_lengths=q_len, key_value_seq_lengths=kv_len)


def nn_constant_lengths(q, k, v):
    # a prefill at position 0: the lengths are constants
    return jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                        key_value_seq_lengths=jnp.full((q.shape[0],), 10, jnp.int32))


def nn_mask(q, k, v, mask):
    return jax.nn.dot_product_attention(q, k, v, mask=mask)


def two_layers(q, k, v):
    x = causal_tril_inf(q, k, v)
    return causal_tril_inf(x, k, v)


def inside_nested_jit(q, k, v):
    # a jitted helper becomes a private func.call in the outer program
    return jax.jit(causal_tril_inf)(q, k, v) * 2.0


def normalized_after_pv(q, k, v):
    # MaxText-style: unnormalised exp(s - max) · v, then divided by the row sum moved to BTN1
    s = _logits(q, k) * 0.3
    rows, cols = jnp.arange(q.shape[1])[:, None], jnp.arange(k.shape[1])[None, :]
    s = jnp.where(cols <= rows, s, -0.7 * float(jnp.finfo(jnp.float32).max))
    local_max = jnp.max(s, axis=-1, keepdims=True)
    local_exps = jnp.exp(s - local_max)
    local_sum = jnp.moveaxis(jnp.sum(local_exps, axis=-1, keepdims=True), 1, 2)  # (B, T, N, 1)
    local_out = jnp.einsum("bnts,bsnh->btnh", local_exps, v)
    return local_out / local_sum


def scan_layers(q, k, v):
    def layer(x, _):
        return causal_tril_inf(x, k, v), None

    out, _ = jax.lax.scan(layer, q, None, length=3)
    return out


def masked_fill_float_mask(q, k, v, mask):
    # PyTorch ports: scores.masked_fill(mask == 0, -inf) with a float 0/1 mask
    s = _logits(q, k) * 0.3
    mask = (mask > 0).astype(s.dtype)  # a 0/1 float mask, as PyTorch code passes it
    return _softmax_attend(jnp.where(mask[:, None] == 0, -jnp.inf, s), v)


def masked_fill_not_causal_or_padding(q, k, v, kv_len):
    s = _logits(q, k) * 0.3
    rows, cols = jnp.arange(q.shape[1])[:, None], jnp.arange(k.shape[1])[None, :]
    hidden = (cols > rows)[None, None] | (jnp.arange(k.shape[1])[None, :] >= kv_len[:, None])[:, None, None, :]
    return _softmax_attend(jnp.where(hidden, -1e9, s), v)


def zero_one_int_masks(q, k, v, kv_len):
    # keras-hub: causal and padding as 0/1 ints, combined with minimum, tested with != 0; f32 iotas
    s = _logits(q, k) * 0.3
    rows = jnp.arange(q.shape[1], dtype=jnp.float32)[:, None]
    cols = jnp.arange(k.shape[1], dtype=jnp.float32)[None, :]
    causal = (rows >= cols).astype(jnp.int32)[None]
    padding = (jnp.arange(k.shape[1])[None, None, :] < kv_len[:, None, None]).astype(jnp.int32)
    visible = jnp.minimum(causal, padding) != 0
    return _softmax_attend(jnp.where(visible[:, None], s, -1e9), v)


def softmax_remasked(q, k, v, kv_len):
    # keras' Softmax(mask): masked probabilities are zeroed again after normalising
    s = _logits(q, k) * 0.3
    visible = jnp.arange(k.shape[1])[None, None, None, :] < kv_len[:, None, None, None]
    p = jax.nn.softmax(jnp.where(visible, s, -1e9), axis=-1)
    return jnp.einsum("bnts,bsnh->btnh", jnp.where(visible, p, 0.0), v)


def no_match_remasked_by_other_mask(q, k, v, kv_len):
    s = _logits(q, k) * 0.3
    visible = jnp.arange(k.shape[1])[None, None, None, :] < kv_len[:, None, None, None]
    p = jax.nn.softmax(jnp.where(visible, s, -1e9), axis=-1)
    return jnp.einsum("bnts,bsnh->btnh", jnp.where(p > 0.1, p, 0.0), v)


def no_match_softmax_without_dot(q, k, v):
    return jax.nn.softmax(q, axis=-1) + k


def no_match_probs_escape(q, k, v):
    s = _logits(q, k) * 0.3
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bnts,bsnh->btnh", p, v), p


def no_match_grad(q, k, v):
    return jax.grad(lambda q: causal_tril_inf(q, k, v).sum())(q)


def bmm_folded(q, k, v):
    """PyTorch's matmul on 4-D tensors (torchax): batch and heads folded into one dim around each bmm."""
    b, t, n, h = q.shape
    s = k.shape[1]
    qf = q.transpose(0, 2, 1, 3).reshape(b * n, t, h)
    kf = k.transpose(0, 2, 3, 1).reshape(b * n, h, s)
    scores = jax.lax.batch_matmul(qf, kf).reshape(b, n, t, s) * (h**-0.5)
    probs = jax.nn.softmax(scores, axis=-1).reshape(b * n, t, s)
    out = jax.lax.batch_matmul(probs, v.transpose(0, 2, 1, 3).reshape(b * n, s, h))
    return out.reshape(b, n, t, h).transpose(0, 2, 1, 3)


def repeat_kv_bmm_additive_causal(q, k, v, pad):
    """Hugging Face eager attention as torchax lowers it: repeat_kv by expand + reshape, bmm-folded dims,
    and a (B, 1, T, S) additive mask `where(causal & padding, 0, finfo.min)`."""
    b, t, n, h = q.shape
    s, kv = k.shape[1], k.shape[2]

    def repeat(x):  # (B, S, K, H) -> (B, N, S, H)
        x = x.transpose(0, 2, 1, 3)[:, :, None]
        return jnp.broadcast_to(x, (b, kv, n // kv, s, h)).reshape(b, n, s, h)

    qf = q.transpose(0, 2, 1, 3).reshape(b * n, t, h)
    kf = repeat(k).transpose(0, 1, 3, 2).reshape(b * n, h, s)
    scores = jax.lax.batch_matmul(qf, kf).reshape(b, n, t, s) * (h**-0.5)
    visible = (jnp.arange(s)[None, :] <= jnp.arange(t)[:, None])[None, None] & pad[:, None, None, :]
    scores = scores + jnp.where(visible, 0.0, jnp.finfo(jnp.float32).min) * 1.0
    probs = jax.nn.softmax(scores, axis=-1).reshape(b * n, t, s)
    out = jax.lax.batch_matmul(probs, repeat(v).reshape(b * n, s, h))
    return out.reshape(b, n, t, h).transpose(0, 2, 1, 3)


def sdpa_bool_to_bias(q, k, v, pad):
    """torch sdpa with a boolean attn_mask (torchax): the mask becomes a -inf bias, added after the scale."""
    bias = jnp.where(jnp.logical_not(pad[:, None, None, :]), -jnp.inf, 0.0)
    scores = jnp.einsum("btnh,bsnh->bnts", q, k) * (q.shape[-1] ** -0.5) + bias
    return _softmax_attend(scores, v)


def mqa_squeezed_head(q, k, v):
    """One kv head with its dim squeezed away: q (B,T,N,H) against k, v (B,S,H)."""
    scores = jnp.einsum("btnh,bsh->bnts", q, k[:, :, 0]) / np.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    probs = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bnts,bsh->btnh", probs, v[:, :, 0])


def two_masks_and_two_biases(q, k, v, pad, seg_mask, bias_heads, bias_keys):
    """Causal, a key padding vector and a (B,T,S) mask in separate wheres; a per-head and a per-key bias."""
    t, s = q.shape[1], k.shape[1]
    scores = _logits(q, k) * 0.125 + bias_heads[None] + bias_keys[:, None, None, :]
    scores = jnp.where(jnp.tril(jnp.ones((t, s), bool)), scores, -jnp.inf)
    scores = jnp.where(pad[:, None, None, :], scores, -jnp.inf)
    scores = jnp.where(seg_mask[:, None], scores, -jnp.inf)
    return _softmax_attend(scores, v)


def causal_by_cumsum(q, k, v):
    """Positions from a cumsum over ones and arange arithmetic: evaluated, it is the causal band."""
    t, s = q.shape[1], k.shape[1]
    q_pos = jnp.cumsum(jnp.ones((t,), jnp.int32)) - 1
    k_pos = (jnp.arange(s) * 3) // 3
    scores = jnp.where(k_pos[None, :] <= q_pos[:, None], _logits(q, k) * 0.125, -jnp.inf)
    return _softmax_attend(scores, v)


def chunked_causal_and_padding(q, k, v, pad):
    """Chunked (block-local) causal attention ANDed with key padding: no band, so a constant mask operand."""
    t, s = q.shape[1], k.shape[1]
    qi, ki = jnp.arange(t)[:, None], jnp.arange(s)[None, :]
    local = (qi // 4 == ki // 4) & (ki <= qi)
    scores = jnp.where(local[None, None] & pad[:, None, None, :], _logits(q, k) * 0.125, -jnp.inf)
    return _softmax_attend(scores, v)


def window_by_tril_difference(q, k, v, pad):
    """A sliding window as tril(ones) minus tril(ones, -4), in float, ANDed with padding by a multiply."""
    t, s = q.shape[1], k.shape[1]
    band = jnp.tril(jnp.ones((t, s)), 0) - jnp.tril(jnp.ones((t, s)), -4)
    keep = band[None, None] * pad[:, None, None, :].astype(jnp.float32)
    return _softmax_attend(jnp.where(keep > 0, _logits(q, k) * 0.125, -1e9), v)


def chunked_float_mask(q, k, v, pad):
    """A chunked 0/1 float mask times a float padding mask: the constant part stays a mask operand."""
    t, s = q.shape[1], k.shape[1]
    local = (jnp.arange(t)[:, None] // 4 == jnp.arange(s)[None, :] // 4).astype(jnp.float32)
    keep = local[None, None] * pad[:, None, None, :].astype(jnp.float32)
    return _softmax_attend(jnp.where(keep > 0, _logits(q, k) * 0.125, -jnp.inf), v)


def gemma_library_style(q, k, v):
    """google-deepmind/gemma's layout: (B,T,K,G,S) logits from a 5-D grouped query, soft-cap, and a causal
    sliding window from positions built by broadcasting an arange."""
    b, t, n, h = q.shape
    kv = k.shape[2]
    pos = jnp.broadcast_to(jnp.arange(t)[None], (b, t))
    logits = jnp.einsum("BTKGH,BSKH->BTKGS", (q * h**-0.5).reshape(b, t, kv, n // kv, h), k)
    logits = jnp.tanh(logits / 50.0) * 50.0
    visible = (pos[:, :, None] >= pos[:, None, :]) & (pos[:, :, None] - pos[:, None, :] < 8)
    logits = jnp.where(visible[:, :, None, None, :], logits, -2.3819763e38)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("BTKGS,BSKH->BTKGH", probs, v).reshape(b, t, n, h)


def segment_ids_and_causal(q, k, v, segments):
    """jax's Pallas mha_reference: segment-id equality ANDed with causal, fill -0.7 * finfo.max."""
    t = q.shape[1]
    same = (segments[:, :, None] == segments[:, None, :])[:, None]
    visible = jnp.logical_and(same, jnp.tril(jnp.ones((t, t), bool))[None, None])
    logits = jnp.where(visible, jnp.einsum("bqhc,bkhc->bhqk", q, k), -0.7 * float(jnp.finfo(jnp.float32).max))
    return jnp.einsum("bhqk,bkhc->bqhc", jax.nn.softmax(logits, axis=-1), v)


def heads_first_named_axes(q, k, v):
    """Named-axis code (levanter-style) that puts heads before batch: batch dims (N, B) on both dots."""
    t, h = q.shape[1], q.shape[-1]
    logits = jnp.einsum("nbth,nbsh->nbts", q.transpose(2, 0, 1, 3), k.transpose(2, 0, 1, 3)) / np.sqrt(h)
    logits = jnp.where(jnp.arange(t)[:, None] >= jnp.arange(t)[None, :], logits, -1e9)
    out = jnp.einsum("nbts,nbsh->bthn", jax.nn.softmax(logits, axis=-1), v.transpose(2, 0, 1, 3))
    return out.transpose(0, 1, 3, 2)


def extended_mask_one_minus(q, k, v, pad):
    """BERT-era code: the padding mask as `(1 - m) * finfo.min`, added to the scores."""
    extended = (1.0 - pad[:, None, None, :].astype(jnp.float32)) * jnp.finfo(jnp.float32).min
    return _softmax_attend(_logits(q, k) * 0.125 + extended, v)


def position_bias_masked_sum(q, k, v, pad, position_bias, fill=-jnp.inf):
    """T5 through torch sdpa: where(causal, position_bias, fill) plus an additive padding mask, the sum
    added with torch.add's alpha (a multiply by 1), and sdpa's zero bias when there is no mask."""
    t = q.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))[None, None]
    masked = jnp.where(causal, position_bias, fill) * 1.0
    padding = jnp.where(pad[:, None, None, :], 0.0, fill)
    return _softmax_attend(_logits(q, k) + (padding + masked) * 1.0 + jnp.zeros((t, t)), v)


def no_match_finite_fill_added_twice(q, k, v, pad, position_bias):
    """The same with finfo.min: keys masked by both get 2 * finfo.min = -inf, so a fully masked row is not
    the uniform average a finite masked_value gives."""
    return position_bias_masked_sum(q, k, v, pad, position_bias, fill=jnp.finfo(jnp.float32).min)


def bf16_f32_output(q, k, v):
    """bf16 q, k, v whose dots return f32 (preferred_element_type): the composite's result is f32."""
    scores = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32) * 0.125
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bnts,bsnh->btnh", probs, v, preferred_element_type=jnp.float32)


F32, BF16 = jnp.float32, jnp.bfloat16
I32, BOOL = jnp.int32, jnp.bool_

VARIANTS: tuple[Variant, ...] = (
    Variant("plain_divide_sqrt", plain_divide_sqrt, _qkv(), expect={"scale": 8**-0.5}),
    Variant("multiply_constant", multiply_constant, _qkv(), expect={"scale": 0.125}),
    Variant("prescaled_query", prescaled_query, _qkv(), expect={"scale": 8**-0.5}),
    Variant("no_scale", no_scale, _qkv(), expect={"scale": 1.0}),
    Variant("causal_tril_inf", causal_tril_inf, _qkv(), expect={"causal": True, "q_offset": 0}),
    Variant("causal_finfo_min", causal_finfo_min, _qkv(), expect={"causal": True}),
    Variant(
        "causal_large_negative", causal_large_negative, _qkv(), expect={"causal": True, "masked_value": -1e9}
    ),
    Variant("causal_bottom_right", causal_tril_inf, _qkv(t=4, s=T), expect={"causal": True, "q_offset": 0}),
    Variant("sliding_window", sliding_window, _qkv(), expect={"causal": True, "window_left": 3}),
    Variant(
        "two_sided_window", two_sided_window, _qkv(), expect={"causal": True, "q_offset": 3, "window_left": 6}
    ),
    Variant("boolean_mask", boolean_mask, _qkv() + (((B, T, T), BOOL),), expect={"mask_kind": "boolean"}),
    Variant(
        "additive_bias", additive_bias, _qkv() + (((B, N, T, T), F32),), expect={"mask_kind": "additive"}
    ),
    Variant(
        "causal_and_padding",
        causal_and_padding,
        _qkv() + (((B,), I32),),
        expect={"causal": True, "mask_kind": "lengths"},
    ),
    Variant("masked_fill_float_mask", masked_fill_float_mask, _qkv() + (((B, T, T), F32),),
            expect={"mask_kind": "boolean"}),
    Variant("masked_fill_not_causal_or_padding", masked_fill_not_causal_or_padding, _qkv() + (((B,), I32),),
            expect={"causal": True, "mask_kind": "lengths", "masked_value": -1e9}),
    Variant("softcap", softcap, _qkv(), expect={"softcap": 20.0, "causal": True}),
    Variant("gqa_repeat", gqa_repeat, _qkv(k=K), expect={"num_heads": N, "num_kv_heads": K}),
    Variant("mqa_repeat", gqa_repeat, _qkv(k=1), expect={"num_heads": N, "num_kv_heads": 1}),
    Variant("gqa_grouped_einsum", gqa_grouped_einsum, _qkv(k=K), expect={"num_heads": N, "num_kv_heads": K}),
    Variant("bnth_layout", bnth_layout, _qkv()),
    Variant("matmul_style", matmul_style, _qkv()),
    Variant("matmul_unit_batch", matmul_style, ((((1, T, N, H), F32),) * 3)),
    Variant("bf16_f32_softmax", bf16_f32_softmax, _qkv(dtype=BF16)),
    Variant("all_bf16", all_bf16, _qkv(dtype=BF16)),
    Variant("f16_f32_softmax", bf16_f32_softmax, _qkv(dtype=jnp.float16)),
    Variant(
        "decode_with_cache",
        decode_with_cache,
        _qkv(t=1, s=64) + (((B,), I32),),
        expect={"decode": True, "mask_kind": "lengths"},
    ),
    Variant("nn_dot_product_attention", nn_dot_product_attention, _qkv()),
    Variant("nn_causal_gqa", nn_causal_gqa, _qkv(k=K), expect={"causal": True, "num_kv_heads": K}),
    Variant("nn_causal_gqa_bf16", nn_causal_gqa, _qkv(k=K, dtype=BF16), expect={"causal": True}),
    Variant(
        "nn_bias_lengths_window",
        nn_bias_lengths_window,
        _qkv(k=K) + (((B, N, T, T), F32), ((B,), I32)),
        expect={"causal": True, "window_left": 3, "mask_kind": "additive+lengths"},
    ),
    Variant(
        "nn_query_lengths",
        nn_query_lengths,
        _qkv() + (((B,), I32), ((B,), I32)),
        expect={"mask_kind": "lengths"},
    ),
    Variant("nn_constant_lengths", nn_constant_lengths, _qkv(), expect={"causal": True, "mask_kind": "lengths"}),
    Variant("nn_mask", nn_mask, _qkv() + (((B, N, T, T), BOOL),), expect={"mask_kind": "boolean"}),
    Variant("two_layers", two_layers, _qkv(), sites=2),
    Variant("scan_layers", scan_layers, _qkv(), sites=1),
    Variant("normalized_after_pv", normalized_after_pv, _qkv(), expect={"causal": True}),
    Variant("inside_nested_jit", inside_nested_jit, _qkv(), expect={"causal": True}),
    Variant("zero_one_int_masks", zero_one_int_masks, _qkv() + (((B,), I32),),
            expect={"causal": True, "mask_kind": "lengths"}),
    Variant("softmax_remasked", softmax_remasked, _qkv() + (((B,), I32),),
            expect={"zero_empty_rows": True, "mask_kind": "lengths"}),
    Variant("bmm_folded", bmm_folded, _qkv(), expect={"num_heads": N, "num_kv_heads": N}),
    Variant("repeat_kv_bmm_additive_causal", repeat_kv_bmm_additive_causal, _qkv(k=K) + (((B, T), BOOL),),
            expect={"causal": True, "num_heads": N, "num_kv_heads": K, "mask_kind": "boolean"}),
    Variant("sdpa_bool_to_bias", sdpa_bool_to_bias, _qkv() + (((B, T), BOOL),),
            expect={"mask_kind": "boolean"}),
    Variant("mqa_squeezed_head", mqa_squeezed_head, _qkv(k=1), expect={"causal": True, "num_heads": N,
                                                                       "num_kv_heads": 1}),
    Variant("two_masks_and_two_biases", two_masks_and_two_biases,
            _qkv() + (((B, T), BOOL), ((B, T, T), BOOL), ((N, T, T), F32), ((B, T), F32)),
            expect={"causal": True, "mask_kind": "additive+boolean"}),
    Variant("bf16_f32_output", bf16_f32_output, _qkv(dtype=BF16)),
    Variant("extended_mask_one_minus", extended_mask_one_minus, _qkv() + (((B, T), BOOL),),
            expect={"mask_kind": "boolean"}),
    Variant("position_bias_masked_sum", position_bias_masked_sum, _qkv() + (((B, T), BOOL), ((1, N, T, T), F32)),
            expect={"causal": True, "mask_kind": "additive+boolean"}),
    Variant("gemma_library_style", gemma_library_style, _qkv(k=K), expect={"causal": True, "window_left": 7,
            "softcap": 50.0, "num_heads": N, "num_kv_heads": K, "mask_kind": "none"}),
    Variant("segment_ids_and_causal", segment_ids_and_causal, _qkv() + (((B, T), I32),),
            expect={"causal": True, "mask_kind": "boolean"}),
    Variant("heads_first_named_axes", heads_first_named_axes, _qkv(), expect={"causal": True, "num_heads": N,
                                                                              "num_kv_heads": N}),
    Variant("causal_by_cumsum", causal_by_cumsum, _qkv(), expect={"causal": True, "q_offset": 0, "mask_kind": "none"}),
    Variant("chunked_causal_and_padding", chunked_causal_and_padding, _qkv() + (((B, T), BOOL),),
            expect={"mask_kind": "boolean"}),
    Variant("chunked_float_mask", chunked_float_mask, _qkv() + (((B, T), BOOL),), expect={"mask_kind": "boolean",
                                                                                          "causal": False}),
    Variant("window_by_tril_difference", window_by_tril_difference, _qkv() + (((B, T), BOOL),),
            expect={"causal": True, "window_left": 3, "mask_kind": "boolean"}),
    Variant("no_match_finite_fill_added_twice", no_match_finite_fill_added_twice,
            _qkv() + (((B, T), BOOL), ((1, N, T, T), F32)), sites=0),
    Variant("no_match_remasked_by_other_mask", no_match_remasked_by_other_mask, _qkv() + (((B,), I32),), sites=0),
    Variant("no_match_softmax_without_dot", no_match_softmax_without_dot, _qkv(), sites=0),
    Variant("no_match_probs_escape", no_match_probs_escape, _qkv(), sites=0),
    Variant("no_match_grad", no_match_grad, _qkv(), sites=0),
)


def lower(variant: Variant) -> Any:  # noqa: ANN401
    specs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in variant.shapes]
    return jax.jit(variant.fn, keep_unused=True).lower(*specs)
