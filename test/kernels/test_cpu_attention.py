"""The native CPU attention kernel against attention_reference, over a grid of shapes and attributes."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import attention_inputs, jitted_reference

from hlofuse.kernels import cpu

if not cpu.is_available():
    pytest.skip(
        f"hlofuse CPU kernel library not built (install the package, or build it with cmake and set ${cpu.LIB_ENV})",
        allow_module_level=True,
    )

from hlofuse.kernels.cpu.attention import BlockSizes, attention, attention_reference  # noqa: E402

_ORDER = ("amx", "avx512bf16", "avx512", "avx2", "generic")


def _kernel_run_under(isa: str) -> str:
    """The kernel a call runs here with HLOFUSE_CPU_ISA=isa."""
    before = os.environ.get("HLOFUSE_CPU_ISA")
    os.environ["HLOFUSE_CPU_ISA"] = isa
    try:
        return cpu.isa()
    finally:
        if before is None:
            del os.environ["HLOFUSE_CPU_ISA"]
        else:
            os.environ["HLOFUSE_CPU_ISA"] = before


# The AMX kernel with its tile instructions in software runs wherever AVX-512 does, so the AMX kernel's
# tile code is checked on CPUs without AMX too.
EMULATED = ["amx-emulated"] if _kernel_run_under("amx-emulated") == "amx-emulated" else []
# The best kernel this CPU runs, every fallback below it, and the emulated AMX kernel.
ISAS = list(_ORDER[_ORDER.index(cpu.isa()) :]) + EMULATED
# Every kernel here that computes bf16 tiles as bf16 pair products (the others widen them to f32).
BF16_TILE_ISAS = [isa for isa in ("amx", "avx512bf16") if _kernel_run_under(isa) == isa] + EMULATED
TOL = {jnp.float32: dict(rtol=1e-5, atol=1e-5), jnp.bfloat16: dict(rtol=0, atol=2e-2)}




def _check(q, k, v, block_sizes=None, **kw):
    extra = {name: kw.pop(name) for name in ("bias", "mask", "q_lengths", "kv_lengths") if name in kw}
    kw.setdefault("scale", q.shape[-1] ** -0.5)
    got = attention(q, k, v, **kw, **extra, block_sizes=block_sizes)
    want = jitted_reference(q, k, v, extra, tuple(sorted(kw.items())))
    assert got.shape == want.shape and got.dtype == want.dtype
    got, want = np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, **TOL[q.dtype.type])


SHAPES = [  # (B, T, S, N, K, H)
    (1, 64, 64, 4, 4, 64),
    (2, 37, 100, 4, 2, 32),
    (1, 130, 77, 4, 1, 80),
    (2, 5, 300, 4, 4, 128),
    (1, 1, 1000, 4, 1, 64),
    (1, 200, 200, 4, 2, 128),
]
ATTRS = [
    dict(),
    dict(causal=True),
    dict(causal=True, q_offset=40),
    dict(window_left=16, window_right=8),
    dict(window_left=7, causal=True, q_offset=-3),
    dict(softcap=5.0),
]


# Each shape meets every other attribute set (a Latin-square slice of the full product).
GRID = [(shape, ATTRS[(i + j) % len(ATTRS)]) for i, shape in enumerate(SHAPES) for j in range(0, len(ATTRS), 2)]


@pytest.mark.parametrize(
    ("shape", "attrs"),
    GRID,
    ids=["x".join(map(str, s)) + "-" + ("-".join(f"{k}{v}" for k, v in a.items()) or "plain") for s, a in GRID],
)
def test_f32_grid(shape, attrs):
    b, t, s, n, kv, h = shape
    _check(*attention_inputs(0, b, t, s, n, kv, h, h, jnp.float32), **attrs)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize(
    "attrs",
    [dict(causal=True, softcap=3.0), dict(window_left=20, window_right=0, q_offset=10)],
    ids=["causal-softcap", "window"],
)
def test_each_isa(isa, dtype, attrs, monkeypatch):
    monkeypatch.setenv("HLOFUSE_CPU_ISA", isa)
    assert cpu.isa() == isa
    _check(*attention_inputs(1, 2, 45, 90, 4, 2, 80, 48, dtype), **attrs)


@pytest.mark.parametrize("shape", [(1, 100, 100, 4, 4, 64), (2, 33, 70, 4, 2, 128)], ids=["mha", "gqa"])
@pytest.mark.parametrize("attrs", [dict(), dict(causal=True)], ids=["plain", "causal"])
def test_bf16(shape, attrs):
    b, t, s, n, kv, h = shape
    _check(*attention_inputs(2, b, t, s, n, kv, h, h, jnp.bfloat16), **attrs)


@pytest.mark.parametrize(
    "bias_shape",
    [(2, 4, 50, 70), (1, 4, 1, 70), (2, 1, 50, 1), (1, 1, 50, 70)],
    ids=lambda s: "x".join(map(str, s)),
)
@pytest.mark.parametrize("bias_dtype", [jnp.float32, jnp.bfloat16])
def test_bias(bias_shape, bias_dtype):
    q, k, v = attention_inputs(3, 2, 50, 70, 4, 2, 64, 64, jnp.float32)
    bias = jnp.asarray(np.random.default_rng(9).standard_normal(bias_shape, np.float32), bias_dtype)
    _check(q, k, v, bias=bias, causal=True, softcap=4.0)


@pytest.mark.parametrize(
    "mask_shape", [(2, 4, 50, 70), (2, 1, 1, 70), (1, 4, 50, 1)], ids=lambda s: "x".join(map(str, s))
)
@pytest.mark.parametrize("masked_value", [float("-inf"), -2.38e38, -3.0])
def test_mask(mask_shape, masked_value):
    q, k, v = attention_inputs(4, 2, 50, 70, 4, 4, 32, 32, jnp.float32)
    mask = jnp.asarray(np.random.default_rng(5).random(mask_shape) < 0.6)
    _check(q, k, v, mask=mask, masked_value=masked_value, window_left=30)


@pytest.mark.parametrize("masked_value", [float("-inf"), -1e30, -2.0])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_lengths_and_fully_masked_rows(masked_value, dtype):
    # Rows past q_lengths, and rows whose causal window ends before kv_lengths starts, are fully masked:
    # NaN with -inf, a uniform average over all S keys with a finite masked_value.
    q, k, v = attention_inputs(5, 2, 70, 150, 4, 2, 64, 64, dtype)
    _check(
        q,
        k,
        v,
        q_lengths=jnp.array([70, 23], jnp.int32),
        kv_lengths=jnp.array([0, 97], jnp.int32),
        masked_value=masked_value,
    )
    _check(q, k, v, causal=True, q_offset=-20, masked_value=masked_value, kv_lengths=jnp.array([150, 40]))


def test_fully_masked_by_bool_mask_finite():
    q, k, v = attention_inputs(6, 1, 20, 90, 4, 4, 32, 32, jnp.float32)
    mask = jnp.zeros((1, 1, 20, 90), bool).at[:, :, ::2, :].set(True)
    _check(q, k, v, mask=mask, masked_value=-5.0, window_left=10)
    _check(q, k, v, mask=mask, masked_value=float("-inf"))


@pytest.mark.parametrize(("splits", "dtype"), [(0, jnp.float32), (3, jnp.bfloat16), (16, jnp.float32)])
def test_decode_split(splits, dtype):
    q, k, v = attention_inputs(7, 2, 1, 1200, 8, 2, 128, 128, dtype)
    lengths = jnp.array([1100, 333], jnp.int32)
    blocks = BlockSizes(kv_splits=splits)
    _check(q, k, v, kv_lengths=lengths, block_sizes=blocks, q_offset=1199)
    _check(q, k, v, kv_lengths=lengths, block_sizes=blocks, masked_value=-1.0)
    _check(q, k, v, block_sizes=blocks, window_left=700, q_offset=1199)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("blocks", [BlockSizes(1, 1), BlockSizes(16, 48), BlockSizes(128, 256), BlockSizes(7, 13)])
def test_block_sizes(blocks, dtype):
    # bf16 with AMX: key blocks that are not whole 16- or 32-key tiles, and tiles of few rows.
    _check(*attention_inputs(8, 1, 90, 110, 4, 2, 64, 64, dtype), causal=True, block_sizes=blocks)


def test_head_dim_differs_from_value_dim():
    _check(*attention_inputs(9, 1, 40, 60, 4, 1, 96, 24, jnp.float32), window_right=5)


def test_empty_keys_and_queries():
    _check(*attention_inputs(10, 1, 4, 0, 4, 2, 32, 32, jnp.float32))
    _check(*attention_inputs(10, 1, 0, 8, 4, 2, 32, 32, jnp.float32))


def test_under_jit_and_vmap():
    q, k, v = attention_inputs(11, 1, 30, 40, 4, 2, 32, 32, jnp.float32)
    f = jax.jit(lambda q, k, v: attention(q, k, v, scale=0.2, causal=True))
    want = attention_reference(q, k, v, scale=0.2, causal=True)
    np.testing.assert_allclose(f(q, k, v), want, rtol=1e-5, atol=1e-5)
    stacked = jax.vmap(f)(q[None].repeat(2, 0), k[None].repeat(2, 0), v[None].repeat(2, 0))
    np.testing.assert_allclose(stacked[1], want, rtol=1e-5, atol=1e-5)


def test_rejects_bad_shapes():
    q, k, v = attention_inputs(12, 1, 8, 8, 3, 2, 32, 32, jnp.float32)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention(q, k, v, scale=1.0)
    q, k, v = attention_inputs(12, 1, 8, 8, 4, 2, 32, 32, jnp.float32)
    with pytest.raises(ValueError, match="broadcast"):
        attention(q, k, v, scale=1.0, bias=jnp.zeros((1, 3, 8, 8)))
    with pytest.raises(ValueError, match="dtype"):
        attention(q.astype(jnp.bfloat16), k, v, scale=1.0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("t", "n", "kv", "h"), [(1, 4, 4, 80), (2, 4, 2, 64), (1, 8, 2, 128)])
def test_few_rows_each_isa(isa, t, n, kv, h, monkeypatch):
    # Tiles of 1..4 rows take the dot-product Q.K^T path where the vector is wide enough.
    monkeypatch.setenv("HLOFUSE_CPU_ISA", isa)
    q, k, v = attention_inputs(13, 2, t, 333, n, kv, h, h, jnp.bfloat16 if h == 64 else jnp.float32)
    _check(q, k, v, kv_lengths=jnp.array([333, 200]), q_offset=300, causal=True, softcap=2.0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    ("bias_shape", "mask_shape"),
    [((2, 4, 2, 333), (2, 1, 2, 333)), ((1, 4, 1, 333), (2, 4, 2, 1)), ((2, 1, 2, 1), (1, 1, 1, 333))],
    ids=["keys-contiguous", "bias-broadcast-rows-mask-broadcast-keys", "bias-broadcast-keys"],
)
def test_few_rows_bias_and_mask_each_isa(isa, bias_shape, mask_shape, monkeypatch):
    # Few-row tiles keep S row major, so bias and mask load along the keys; the last block (333 = 5 * 64 + 13)
    # has keys past its end that must weigh nothing, and a finite masked_value that still counts.
    monkeypatch.setenv("HLOFUSE_CPU_ISA", isa)
    rng = np.random.default_rng(14)
    q, k, v = attention_inputs(14, 2, 2, 333, 4, 2, 64, 64, jnp.float32)
    bias = jnp.asarray(rng.standard_normal(bias_shape, np.float32), jnp.bfloat16)
    mask = jnp.asarray(rng.random(mask_shape) < 0.7)
    for masked_value in (float("-inf"), -3.0):
        _check(q, k, v, bias=bias, mask=mask, masked_value=masked_value, window_left=250, q_offset=320, causal=True)


def _bias_and_mask(seed: int, b: int, n: int, t: int, s: int) -> dict:
    rng = np.random.default_rng(seed)
    bias = jnp.asarray(rng.standard_normal((b, n, t, s), np.float32), jnp.bfloat16)
    return dict(bias=bias, mask=jnp.asarray(rng.random((b, 1, t, s)) < 0.7), masked_value=-3.0)


BF16_TILE_CASES = {  # name: ((B, T, S, N, K, H, D), attributes, block sizes); every tile has more than 4 rows
    "h64-causal": ((1, 100, 100, 4, 4, 64, 64), dict(causal=True), None),
    "h128-gqa": ((2, 33, 70, 4, 2, 128, 128), dict(), None),
    "h256-softcap": ((1, 64, 64, 2, 2, 256, 256), dict(softcap=3.0), None),
    "h80-d48-window": ((1, 90, 110, 4, 2, 80, 48), dict(window_left=20, window_right=5), BlockSizes(16, 48)),
    "mqa-odd-blocks": ((1, 90, 110, 4, 1, 64, 64), dict(causal=True), BlockSizes(7, 13)),
    "big-blocks-offset": ((1, 150, 300, 4, 2, 64, 64), dict(causal=True, q_offset=150), BlockSizes(128, 256)),
    "lengths": (
        (2, 70, 150, 4, 2, 64, 64),
        dict(q_lengths=jnp.array([70, 23], jnp.int32), kv_lengths=jnp.array([0, 97], jnp.int32), masked_value=-1.0),
        None,
    ),
    "bias-and-mask": ((2, 50, 70, 4, 2, 64, 64), _bias_and_mask(15, 2, 4, 50, 70), None),
}


@pytest.mark.parametrize("isa", BF16_TILE_ISAS)
@pytest.mark.parametrize("case", list(BF16_TILE_CASES))
def test_bf16_tiles_each_isa(isa, case, monkeypatch):
    # bf16 prefill tiles take the tile products (tile_gemm) of AMX, AVX512-BF16, or AMX emulated: tiles and
    # key blocks that are not whole 16 x 32 tiles, head dims that are not multiples of 32, and the masks.
    monkeypatch.setenv("HLOFUSE_CPU_ISA", isa)
    assert cpu.isa() == isa
    (b, t, s, n, kv, h, d), attrs, blocks = BF16_TILE_CASES[case]
    _check(*attention_inputs(16, b, t, s, n, kv, h, d, jnp.bfloat16), block_sizes=blocks, **attrs)
