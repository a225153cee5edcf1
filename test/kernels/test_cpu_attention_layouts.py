"""The CPU attention kernel's multi-device forms against attention_reference: leading batch dims folded
into B, the log-sum-exp result, per-entry q_offsets, and partitioned_lowering (kv heads and query / key-range
splits as leading batch dims, key splits combined through their log-sum-exps), on one device."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels import CompositeCall, cpu

if not cpu.is_available():
    pytest.skip("hlofuse CPU kernel library not built", allow_module_level=True)

from hlofuse.kernels.cpu.attention import (  # noqa: E402
    BlockSizes,
    attention,
    attention_with_lse,
    kv_splits_for,
    partitioned_lowering,
    q_splits_for,
)
from hlofuse.kernels.reference import UNBOUNDED, attention_mask, attention_reference  # noqa: E402

_TYPES = {"float32": "f32", "bfloat16": "bf16", "int32": "i32", "bool": "i1"}
TOL = {jnp.float32: dict(rtol=1e-5, atol=1e-5), jnp.bfloat16: dict(rtol=0, atol=2e-2)}


def _normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:  # noqa: ANN401
    return jnp.asarray(rng.standard_normal(shape, np.float32), dtype)


def _close(got: jax.Array, want: jax.Array, dtype: Any) -> None:  # noqa: ANN401
    got, want = np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32))
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, **TOL[dtype])


def _lse_reference(q: jax.Array, k: jax.Array, scale: float, masked_value: float = float("-inf"),
                   **masks: Any) -> jax.Array:  # noqa: ANN401
    """(B, T, N) log-sum-exp of the reference's masked logits."""
    groups = q.shape[2] // k.shape[2]
    logits = jnp.einsum("btnh,bsnh->bnts", q.astype(jnp.float32),
                        jnp.repeat(k, groups, axis=2).astype(jnp.float32)) * scale
    visible = attention_mask(q.shape[1], k.shape[1], causal=False, window_left=UNBOUNDED, window_right=UNBOUNDED,
                             q_offset=0, **masks)
    logits = jnp.where(visible, logits, masked_value)
    return jnp.swapaxes(jax.nn.logsumexp(logits, axis=-1), 1, 2)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("lead", [(2, 3), (2, 1, 3)])
def test_leading_dims_fold_into_batch(dtype: Any, lead: tuple[int, ...]) -> None:  # noqa: ANN401
    """q (*L, T, N, H) is B = prod(L) independent problems; lengths have shape L."""
    rng = np.random.default_rng(0)
    t, s, n, kv, h = 5, 40, 4, 2, 16
    q, k, v = (_normal(rng, (*lead, *x), dtype) for x in ((t, n, h), (s, kv, h), (s, kv, h)))
    kv_lengths = jnp.asarray(rng.integers(1, s + 1, lead), jnp.int32)
    got = attention(q, k, v, scale=0.25, causal=True, q_offset=s - t, kv_lengths=kv_lengths)
    b = int(np.prod(lead))
    want = attention_reference(q.reshape(b, t, n, h), k.reshape(b, s, kv, h), v.reshape(b, s, kv, h), scale=0.25,
                               causal=True, q_offset=s - t, kv_lengths=kv_lengths.reshape(b))
    _close(got, want.reshape(got.shape), dtype)


@pytest.mark.parametrize("bias_lead", [(1, 1), (2, 3), (2, 1), (1, 3)])
def test_leading_dims_of_bias_and_mask(bias_lead: tuple[int, int]) -> None:
    """Bias and mask lead with L, with 1s, or a mix of both (broadcast to L before the call)."""
    rng = np.random.default_rng(1)
    lead, t, s, n, h = (2, 3), 6, 20, 2, 8
    q, k, v = (_normal(rng, (*lead, *x)) for x in ((t, n, h), (s, n, h), (s, n, h)))
    bias = _normal(rng, (*bias_lead, n, 1, s))
    mask = jnp.asarray(rng.random((*bias_lead, 1, t, s)) < 0.8)
    got = attention(q, k, v, scale=0.3, bias=bias, mask=mask, masked_value=-1e9)
    b = int(np.prod(lead))
    full = lambda x: jnp.broadcast_to(x, (*lead, *x.shape[2:])).reshape(b, *x.shape[2:])  # noqa: E731
    want = attention_reference(q.reshape(b, t, n, h), k.reshape(b, s, n, h), v.reshape(b, s, n, h), scale=0.3,
                               bias=full(bias), mask=full(mask), masked_value=-1e9)
    _close(got, want.reshape(got.shape), jnp.float32)


@pytest.mark.parametrize("shape", [(2, 7, 33, 4, 2, 16), (1, 1, 700, 4, 1, 32), (3, 1, 64, 2, 2, 8)])
@pytest.mark.parametrize("kv_splits", [0, 1, 3])
def test_lse_matches_the_logits_logsumexp(shape: tuple[int, ...], kv_splits: int) -> None:
    """lse on the one-pass path and on the decode path (key range split inside the kernel, then merged)."""
    b, t, s, n, kv, h = shape
    rng = np.random.default_rng(2)
    q, k, v = _normal(rng, (b, t, n, h)), _normal(rng, (b, s, kv, h)), _normal(rng, (b, s, kv, h))
    kv_lengths = jnp.asarray(rng.integers(1, s + 1, (b,)), jnp.int32)
    out, lse = attention_with_lse(q, k, v, scale=0.2, kv_lengths=kv_lengths,
                                  block_sizes=BlockSizes(kv_splits=kv_splits))
    _close(out, attention_reference(q, k, v, scale=0.2, kv_lengths=kv_lengths), jnp.float32)
    _close(lse, _lse_reference(q, k, 0.2, kv_lengths=kv_lengths), jnp.float32)


def test_lse_of_rows_that_see_no_key() -> None:
    """-inf masking: the row is NaN and its lse -inf; a finite fill counts masked keys at that logit."""
    rng = np.random.default_rng(3)
    q, k, v = _normal(rng, (2, 3, 2, 8)), _normal(rng, (2, 10, 2, 8)), _normal(rng, (2, 10, 2, 8))
    kv_lengths = jnp.asarray([0, 4], jnp.int32)
    out, lse = attention_with_lse(q, k, v, scale=0.5, kv_lengths=kv_lengths)
    assert np.isnan(np.asarray(out[0])).all() and np.isneginf(np.asarray(lse[0])).all()
    _close(lse[1], _lse_reference(q, k, 0.5, kv_lengths=kv_lengths)[1], jnp.float32)
    out, lse = attention_with_lse(q, k, v, scale=0.5, kv_lengths=kv_lengths, masked_value=-7.0)
    _close(lse, _lse_reference(q, k, 0.5, -7.0, kv_lengths=kv_lengths), jnp.float32)
    _close(out, attention_reference(q, k, v, scale=0.5, kv_lengths=kv_lengths, masked_value=-7.0), jnp.float32)


def test_lse_with_no_keys_is_minus_inf() -> None:
    q, k = jnp.ones((1, 2, 2, 4)), jnp.ones((1, 0, 2, 4))
    out, lse = attention_with_lse(q, k, k, scale=1.0)
    assert np.all(np.asarray(out) == 0) and np.isneginf(np.asarray(lse)).all()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("attrs", [
    dict(causal=True),
    dict(window_left=6, window_right=2),
    dict(causal=True, window_left=9, masked_value=-1e9),
    dict(window_right=0, softcap=4.0, kv_lengths=True),
])
def test_q_offsets_per_batch_entry(dtype: Any, attrs: dict[str, Any]) -> None:  # noqa: ANN401
    """q_offsets (*L,) gives each batch entry its own causal / window offset, as if each were its own call with
    that q_offset; offsets below 0 or past S leave rows that see no key, and tiles whose rows straddle the
    band read only the blocks their rows see (block_q and block_k smaller than T and S)."""
    rng = np.random.default_rng(5)
    lead, t, s, n, kv, h = (2, 3), 24, 80, 4, 2, 16
    q, k, v = (_normal(rng, (*lead, *x), dtype) for x in ((t, n, h), (s, kv, h), (s, kv, h)))
    offsets = jnp.asarray([[-30, -5, 0], [17, 56, 90]], jnp.int32)
    extra = dict(attrs)
    if extra.pop("kv_lengths", False):
        extra["kv_lengths"] = jnp.asarray(rng.integers(0, s + 1, lead), jnp.int32)
    got = attention(q, k, v, scale=0.3, q_offsets=offsets, block_sizes=BlockSizes(block_q=8, block_k=16), **extra)
    b = int(np.prod(lead))
    flat = [x.reshape(b, *x.shape[len(lead):]) for x in (q, k, v)]
    rows = []
    for i, offset in enumerate(np.asarray(offsets).reshape(b)):
        per_row = {name: x.reshape(b)[i:i + 1] for name, x in extra.items() if name == "kv_lengths"}
        scalars = {name: x for name, x in extra.items() if name != "kv_lengths"}
        rows.append(attention_reference(*(x[i:i + 1] for x in flat), scale=0.3, q_offset=int(offset), **scalars,
                                        **per_row))
    _close(got, jnp.concatenate(rows).reshape(got.shape), dtype)


def test_q_offsets_replace_the_static_offset() -> None:
    """With q_offsets present the q_offset attribute is not used: the same offsets give the same result."""
    rng = np.random.default_rng(6)
    q, k, v = _normal(rng, (2, 8, 2, 8)), _normal(rng, (2, 32, 2, 8)), _normal(rng, (2, 32, 2, 8))
    offsets = jnp.asarray([3, 3], jnp.int32)
    got = attention(q, k, v, scale=0.5, causal=True, q_offset=20, q_offsets=offsets)
    _close(got, attention(q, k, v, scale=0.5, causal=True, q_offset=3), jnp.float32)


#===--- partitioned_lowering ------------------------------------------------------------------===#

def _call(shapes: dict[str, tuple[tuple[int, ...], str]], **attrs: Any) -> CompositeCall:  # noqa: ANN401
    q, k = shapes["q"][0], shapes["k"][0]
    values = dict(scale=0.25, num_heads=q[2], num_kv_heads=k[2], decode=q[1] == 1, operands=tuple(shapes), **attrs)
    return CompositeCall("hlofuse.attention", 1, values, tuple(shapes.values()))


PARTITIONED = [  # (B, T, S, N, K, H, attributes, optional operands)
    (2, 1, 64, 8, 2, 16, dict(), ()),
    (2, 1, 64, 4, 4, 16, dict(causal=True, q_offset=37), ("kv_lengths",)),
    (3, 1, 32, 4, 1, 8, dict(window_right=3, q_offset=10, masked_value=-1e9), ()),
    (2, 1, 64, 4, 2, 16, dict(masked_value=-1e9, zero_empty_rows=True), ("q_lengths", "kv_lengths")),
    (2, 1, 64, 4, 2, 16, dict(), ("kv_lengths",)),  # a row with kv length 0: NaN, as the reference
    (2, 1, 64, 4, 2, 16, dict(window_left=5, q_offset=40), ("kv_lengths",)),  # left window: the split's own band
    (2, 9, 64, 4, 2, 16, dict(causal=True, q_offset=55, softcap=5.0), ("bias", "mask")),  # bias, mask: no splits
    # Prefill: a chunk of 8 queries at the end of a 64-key cache (T * N * P <= S * K: key splits under batch).
    (2, 8, 64, 4, 2, 16, dict(causal=True, q_offset=56), ("kv_lengths",)),
    (2, 8, 64, 4, 2, 16, dict(), ()),
    # Full prefills (T = S): split only under multi_device=sequence, along T and S.
    (2, 32, 32, 4, 2, 16, dict(causal=True), ()),
    (2, 32, 32, 4, 4, 8, dict(causal=True, window_left=5), ("q_lengths", "kv_lengths")),
    (1, 16, 32, 2, 1, 16, dict(window_right=3, window_left=2, q_offset=9, masked_value=-1e9), ("q_lengths",)),
    (2, 16, 32, 4, 2, 16, dict(causal=True, masked_value=-1e9, zero_empty_rows=True), ("q_lengths", "kv_lengths")),
    (2, 16, 32, 4, 2, 16, dict(causal=True, q_offset=-8), ()),  # the first 8 rows see no key: NaN
]


@pytest.mark.parametrize("multi_device", ["batch", "sequence"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("case", PARTITIONED)
def test_partitioned_lowering_matches_reference(dtype: Any, case: tuple[Any, ...], multi_device: str) -> None:  # noqa: ANN401
    b, t, s, n, kv, h, attrs, optional = case
    rng = np.random.default_rng(4)
    operands: dict[str, jax.Array] = {"q": _normal(rng, (b, t, n, h), dtype), "k": _normal(rng, (b, s, kv, h), dtype),
                                      "v": _normal(rng, (b, s, kv, h), dtype)}
    if "bias" in optional:
        operands["bias"] = _normal(rng, (1, n, t, s))
    if "mask" in optional:
        operands["mask"] = jnp.asarray(rng.random((b, 1, t, s)) < 0.7)
    if "q_lengths" in optional:
        operands["q_lengths"] = jnp.asarray([max(1, t // 2 + 3), 0][:b], jnp.int32)
    if "kv_lengths" in optional:
        operands["kv_lengths"] = jnp.asarray([s - 3, 0 if "q_lengths" not in optional else 20][:b], jnp.int32)
    call = _call({name: (tuple(x.shape), _TYPES[str(x.dtype)]) for name, x in operands.items()}, **attrs)
    got = jax.jit(partitioned_lowering(call, devices=4, multi_device=multi_device))(*operands.values())
    want = attention_reference(operands["q"], operands["k"], operands["v"], scale=0.25, **attrs,
                               **{name: operands[name] for name in optional})
    _close(got, want, dtype)


def _splits(t: int, s: int, devices: int, sequence: bool = False, n: int = 2, **attrs: Any) -> tuple[int, int]:  # noqa: ANN401
    """(Pt, Ps) of a call with q (1, t, n, 8) and k (1, s, 2, 8)."""
    from hlofuse.composites import AttentionAttrs

    shapes = {"q": ((1, t, n, 8), "f32"), "k": ((1, s, 2, 8), "f32"), "v": ((1, s, 2, 8), "f32")}
    call = _call(shapes, **attrs)
    parsed = AttentionAttrs.from_dict(call.attributes)
    return q_splits_for(parsed, call, devices, sequence), kv_splits_for(parsed, call, devices, sequence)


def test_splits_where_the_dims_divide_and_the_copies_are_bounded() -> None:
    assert _splits(1, 64, 8) == (1, 8)  # decode
    assert _splits(1, 64, 8, causal=True, q_offset=63) == (1, 8)
    assert _splits(1, 64, 8, window_left=4) == (1, 8)  # each split's band comes with its own q_offset
    assert _splits(1, 64, 1) == (1, 1)  # one device
    assert _splits(1, 60, 8) == (1, 1)  # S not a multiple of the device count
    assert _splits(8, 64, 8) == (1, 8)  # a chunk: T * N * P = 128 <= S * K = 128
    assert _splits(8, 64, 8, n=4) == (1, 1)  # 256 copies of query rows > 128 keys: not under batch
    assert _splits(64, 64, 8) == (1, 1)  # a full prefill: not under batch
    assert _splits(64, 64, 8, sequence=True) == (8, 8)
    assert _splits(64, 60, 8, sequence=True) == (8, 1)
    assert _splits(60, 64, 8, sequence=True) == (1, 8)
    assert _splits(1, 64, 8, sequence=True) == (1, 8)


def test_partitioned_call_has_heads_and_splits_leading() -> None:
    """The emitted custom call's operands: q (B, K, P, T, G, H), k (B, K, P, S/P, 1, H), lse result."""
    shapes = {"q": ((2, 1, 8, 16), "f32"), "k": ((2, 64, 2, 16), "f32"), "v": ((2, 64, 2, 16), "f32")}
    kernel = partitioned_lowering(_call(shapes), devices=4)
    text = jax.jit(kernel).lower(*(jax.ShapeDtypeStruct(x[0], jnp.float32) for x in shapes.values())).as_text()
    line = next(x for x in text.splitlines() if "hlofuse_attention" in x)
    assert "(tensor<2x2x4x1x4x16xf32>, tensor<2x2x4x16x1x16xf32>, tensor<2x2x4x16x1x16xf32>)" in line
    assert "-> (tensor<2x2x4x1x4x16xf32>, tensor<2x2x4x1x4xf32>)" in line


def test_sequence_split_call_has_query_and_key_splits_leading() -> None:
    """A causal prefill under multi_device=sequence: q (B, K, Pt, Ps, T/Pt, G, H), k (B, K, Pt, Ps, S/Ps, 1, H),
    and each split's q_offset (B, K, Pt, Ps)."""
    shapes = {"q": ((2, 8, 8, 16), "f32"), "k": ((2, 32, 2, 16), "f32"), "v": ((2, 32, 2, 16), "f32")}
    kernel = partitioned_lowering(_call(shapes, causal=True), devices=4, multi_device="sequence")
    text = jax.jit(kernel).lower(*(jax.ShapeDtypeStruct(x[0], jnp.float32) for x in shapes.values())).as_text()
    line = next(x for x in text.splitlines() if "hlofuse_attention" in x)
    assert ("(tensor<2x2x4x4x2x4x16xf32>, tensor<2x2x4x4x8x1x16xf32>, tensor<2x2x4x4x8x1x16xf32>, "
            "tensor<2x2x4x4xi32>)") in line
    assert "-> (tensor<2x2x4x4x2x4x16xf32>, tensor<2x2x4x4x2x4xf32>)" in line
