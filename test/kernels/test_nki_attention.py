"""The NKI attention kernels against attention_reference, and the NKI emulator's limits.

`TestNkiAttention` runs the kernels under hlofuse's NumPy emulation of NKI (every CI host);
`TestNkiSimulator` reruns the same grid under NKI's own simulator (`nki.simulate_kernel`) where
`neuronxcc` imports, and is skipped otherwise. Small block sizes make even small shapes span several
query and key tiles, with padding on both axes. The limit tests run tiny kernels that each break one
hardware rule and check the emulator's message.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import check_key_ranges_merge

from hlofuse.kernels.nki import emulator, hostcall
from hlofuse.kernels.nki.attention import HAVE_NEURONXCC, BlockSizes, attention, attention_reference
from hlofuse.kernels.nki.emulator import NkiEmulatorError, NkiLimitError, nisa, nki, nl

TOL = {jnp.float32: dict(rtol=1e-5, atol=1e-5), jnp.bfloat16: dict(rtol=0, atol=3e-2)}
SMALL = BlockSizes(block_q=16, block_k=128)


def _inputs(seed: int, b: int, t: int, s: int, n: int, kv: int, h: int, d: int, dtype: Any) -> tuple[Any, ...]:  # noqa: ANN401
    rng = np.random.default_rng(seed)
    shapes = ((b, t, n, h), (b, s, kv, h), (b, s, kv, d))
    return tuple(jnp.asarray(rng.standard_normal(shape), dtype) for shape in shapes)


# (b, t, s, n, kv, h, d), dtype, attributes and optional operands (built by _extras)
CASES = [
    ((2, 40, 300, 4, 2, 16, 8), jnp.float32, dict(causal=True, q_offset=260)),  # GQA, bottom-right causal
    ((1, 33, 33, 2, 1, 8, 16), jnp.float32, dict(window_left=5, window_right=2)),  # MQA, sliding window, D != H
    ((2, 24, 150, 2, 2, 32, 32), jnp.float32, dict(softcap=5.0, bias=True, causal=True, q_offset=126)),
    ((2, 20, 200, 4, 4, 16, 16), jnp.float32, dict(mask=True, kv_lengths=True, q_lengths=True)),
    ((2, 17, 17, 2, 2, 8, 8), jnp.float32, dict(causal=True, masked_value=-1e9, q_lengths=True)),  # empty rows
    ((2, 17, 140, 4, 2, 16, 16), jnp.bfloat16, dict(causal=True, q_offset=123, kv_lengths=True)),
    ((2, 1, 600, 8, 2, 32, 32), jnp.float32, dict(causal=True, q_offset=599, kv_lengths=True)),  # decode
    ((1, 4, 300, 4, 1, 16, 16), jnp.bfloat16, dict(window_left=50, causal=True, q_offset=296, bias=True)),
    ((1, 2, 200, 2, 2, 8, 8), jnp.float32, dict(mask=True, masked_value=float(jnp.finfo(jnp.float32).min))),
]
IDS = ["gqa_causal", "mqa_window", "softcap_bias", "mask_lengths", "finite_fill_empty_rows", "bf16_causal",
       "decode_gqa_lengths", "decode_bf16_window_bias", "decode_mask_finfo_min"]  # fmt: skip


def _extras(seed: int, b: int, t: int, s: int, n: int, attrs: dict[str, Any]) -> dict[str, Any]:
    rng = np.random.default_rng(seed + 1)
    kwargs = dict(attrs)
    if kwargs.pop("bias", False):
        kwargs["bias"] = jnp.asarray(rng.standard_normal((1, n, t, s)), jnp.float32)
    if kwargs.pop("mask", False):
        kwargs["mask"] = jnp.asarray(rng.random((b, 1, t, s)) > 0.3)
    if kwargs.pop("kv_lengths", False):
        kwargs["kv_lengths"] = jnp.asarray(rng.integers(s // 2, s + 1, size=b), jnp.int32)
    if kwargs.pop("q_lengths", False):
        kwargs["q_lengths"] = jnp.asarray(rng.integers(1, t + 1, size=b), jnp.int32)
    return kwargs


class TestNkiAttention:
    """Emulated kernels (runner='emulator') against the reference."""

    runner: ClassVar[str] = "emulator"

    @pytest.mark.parametrize(("dims", "dtype", "attrs"), CASES, ids=IDS)
    def test_matches_reference(self, dims: tuple[int, ...], dtype: Any, attrs: dict[str, Any]) -> None:  # noqa: ANN401
        b, t, s, n, kv, h, d = dims
        q, k, v = _inputs(0, b, t, s, n, kv, h, d, dtype)
        kwargs = _extras(0, b, t, s, n, attrs)
        arrays = {key: x for key, x in kwargs.items() if isinstance(x, jax.Array)}
        attrs = {key: x for key, x in kwargs.items() if key not in arrays}
        kernel = functools.partial(attention, scale=h**-0.5, runner=self.runner, block_sizes=SMALL, **attrs)
        got = jax.jit(kernel)(q, k, v, **arrays)  # one compile: eager mode would compile op by op
        assert not hostcall.last_errors()
        want = jax.jit(functools.partial(attention_reference, scale=h**-0.5, **attrs))(q, k, v, **arrays)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **TOL[dtype])

    def test_default_tiles_fit_at_head_dim_128(self) -> None:
        """Full-size tiles (128 query rows, 512 keys, H = D = 128) fit SBUF and PSUM, under jit."""
        q, k, v = _inputs(1, 1, 128, 1024, 1, 1, 128, 128, jnp.bfloat16)
        fn = jax.jit(lambda q, k, v: attention(q, k, v, scale=128**-0.5, causal=True, q_offset=896, runner=self.runner))
        got = fn(q, k, v)
        assert not hostcall.last_errors()
        want = attention_reference(q, k, v, scale=128**-0.5, causal=True, q_offset=896)
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **TOL[jnp.bfloat16])

    def test_fully_masked_rows_are_nan_with_an_infinite_fill(self) -> None:
        q, k, v = _inputs(2, 1, 8, 8, 1, 1, 8, 8, jnp.float32)
        got = attention(q, k, v, scale=0.3, window_left=0, window_right=0, q_offset=8, runner=self.runner)
        assert np.isnan(np.asarray(got)).all()


@pytest.mark.skipif(not HAVE_NEURONXCC, reason="neuronxcc (the Neuron SDK, with NKI's simulator) does not import")
class TestNkiSimulator(TestNkiAttention):
    """The same cases under NKI's own simulator (nki.simulate_kernel)."""

    runner: ClassVar[str] = "simulator"


# ----------------------------------------------------------------------------- emulator


def test_matmul_accumulates_bf16_in_fp32_psum() -> None:
    """bf16 operands, fp32 products and sums: 128 * (1 + 2**-7) is not representable in bf16."""

    @nki.jit
    def kernel(a_ref: Any, b_ref: Any) -> Any:  # noqa: ANN401
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((1, 1), dtype=nl.float32, buffer=nl.psum)
        acc[...] += nisa.nc_matmul(nl.load(a_ref), nl.load(b_ref))
        assert acc.buffer is nl.psum and acc.dtype == nl.float32
        nl.store(out, value=nl.copy(acc))
        return out

    a = np.ones((128, 1), emulator.bfloat16)
    b = np.full((128, 1), 1 + 2**-7, emulator.bfloat16)
    assert kernel(a, b)[0, 0] == np.float32(128 * (1 + 2**-7))


def _run(body: Any) -> None:  # noqa: ANN401
    @nki.jit
    def kernel() -> None:
        body()

    kernel()


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (lambda: nl.zeros((129, 4), nl.float32), NkiLimitError, "partition dim 129 of tile (129, 4) exceeds the 128"),
        (
            lambda: nisa.nc_matmul(nl.zeros((128, 128), nl.bfloat16), nl.zeros((128, 513), nl.bfloat16)),
            NkiLimitError,
            "moving free size 513 exceeds gemm_moving_fmax 512",
        ),
        (
            lambda: nisa.nc_matmul(nl.zeros((64, 129), nl.float32), nl.zeros((64, 8), nl.float32)),
            NkiLimitError,
            "stationary free size 129 exceeds gemm_stationary_fmax 128",
        ),
        (
            lambda: [nl.zeros((128, 32768), nl.float32), nl.zeros((128, 32768), nl.float32)],
            NkiLimitError,
            "SBUF overflow: a (128, 32768) float32 tile needs 131072 bytes per partition with 131072 live, "
            "over the 196608 bytes per partition",
        ),
        (
            lambda: [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)],
            NkiLimitError,
            "PSUM overflow: a (128, 512) float32 tile needs a bank with 8 of 8 banks live",
        ),
        (
            lambda: nl.zeros((128, 513), nl.float32, buffer=nl.psum),
            NkiLimitError,
            "PSUM tile too large: a (128, 513) float32 tile needs 2052 bytes per partition",
        ),
        (
            lambda: nisa.nc_matmul(nl.zeros((8, 8), nl.float32, buffer=nl.psum), nl.zeros((8, 8), nl.float32)),
            NkiEmulatorError,
            "the stationary operand must be in SBUF, not nl.psum",
        ),
        (lambda: nl.max(nl.zeros((8, 8), nl.float32), axis=0), NkiEmulatorError, "not the partition axis"),
        (lambda: nl.softmax, NkiEmulatorError, "nl.softmax is not in hlofuse's NKI emulator subset"),
    ],
    ids=[
        "partition_129",
        "moving_513",
        "stationary_129",
        "sbuf_overflow",
        "psum_overflow",
        "psum_bank",
        "matmul_from_psum",
        "partition_reduce",
        "outside_subset",
    ],  # fmt: skip
)
def test_emulator_rejects(body: Any, error: type[Exception], message: str) -> None:  # noqa: ANN401
    with pytest.raises(error, match=_literal(message)):
        _run(body)


def test_freed_tiles_release_sbuf() -> None:
    """Liveness follows Python references: a loop that rebinds a large tile never overflows."""

    def body() -> None:
        for _ in nl.affine_range(4):
            x = nl.zeros((128, 32768), nl.float32)  # 128 KiB per partition, one live at a time
            del x

    _run(body)


def test_tiles_exist_only_inside_kernels() -> None:
    with pytest.raises(NkiEmulatorError, match="only inside an nki.jit kernel"):
        nl.zeros((8, 8), nl.float32)


def _literal(message: str) -> str:
    import re

    return re.escape(message)


def test_key_ranges_with_their_lse_merge_into_the_whole() -> None:
    """`return_lse` on the decode kernel: each key range's f32 output and log-sum-exp merge into attention
    over all keys (a decode whose KV sequence is sharded, run per shard: hlofuse.shard_local)."""
    run = jax.jit(lambda q, k, v, own: attention(q, k, v, scale=0.2, kv_lengths=own, return_lse=True))
    check_key_ranges_merge(run)


def test_return_lse_is_for_the_decode_kernel() -> None:
    q = jnp.zeros((1, 16, 1, 8), jnp.float32)
    k = jnp.zeros((1, 16, 1, 8), jnp.float32)
    with pytest.raises(ValueError, match="return_lse needs the decode kernel"):
        attention(q, k, k, scale=1.0, return_lse=True)
