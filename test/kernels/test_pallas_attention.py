"""The Pallas TPU and GPU attention kernels against attention_reference, in interpret mode on the CPU.

`TestPallasAttention` runs both kernels in Pallas' HLO interpreter (interpret=True), the mode the
`tpu-interpret` / `gpu-interpret` targets use. `TestTpuInterpretMode` reruns the TPU cases that
exercise every code path (skipping, splits, empty rows) under the TPU interpreter proper
(pltpu.InterpretParams), which also raises on out-of-bounds block reads and fills uninitialised VMEM
with NaN. Shapes are small and each case covers several attributes, to keep the file well under 90 s.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import attention_inputs, check_key_ranges_merge, check_prefill_key_ranges_merge, jitted_reference
from jax.experimental.pallas import tpu as pltpu

from hlofuse.kernels.pallas.attention import BlockSizes, attention, decode_attention

TOL = {jnp.float32: dict(rtol=1e-5, atol=1e-5), jnp.bfloat16: dict(rtol=0, atol=3e-2)}
# Small tiles, so that even these shapes span several q and kv blocks.
BLOCKS = {"tpu": BlockSizes(block_q=16, block_k=128), "gpu": BlockSizes(block_q=16, block_k=16)}




def _compare(got: jax.Array, want: jax.Array, dtype: Any) -> None:  # noqa: ANN401
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    got_np, want_np = np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32))
    np.testing.assert_array_equal(np.isnan(got_np), np.isnan(want_np))
    np.testing.assert_allclose(got_np, want_np, **TOL[dtype])


# (id, (B, T, S, N, K, H, D), dtype, attributes, optional operands as functions of (rng, B, N, T, S))
CASES: list[tuple[str, tuple[int, ...], Any, dict[str, Any], dict[str, Any]]] = [
    ("causal_bottom_right_gqa", (2, 24, 40, 4, 2, 16, 16), jnp.float32, dict(causal=True, q_offset=16), {}),
    (
        "window_softcap_bias_mask_lengths_bf16",
        (2, 20, 150, 4, 2, 16, 16),
        jnp.bfloat16,
        dict(window_left=40, window_right=8, q_offset=100, softcap=5.0, masked_value=-1e9),
        dict(
            bias=lambda r, b, n, t, s: r.standard_normal((1, n, t, s), np.float32),
            mask=lambda r, b, n, t, s: r.random((b, 1, t, s)) > 0.2,
            kv_lengths=lambda r, b, n, t, s: np.array([s, 110], np.int32),
        ),
    ),
    (
        "mqa_empty_rows_nan",
        (2, 12, 20, 4, 1, 16, 8),
        jnp.float32,
        dict(causal=True),
        dict(
            q_lengths=lambda r, b, n, t, s: np.array([t, 5], np.int32),
            kv_lengths=lambda r, b, n, t, s: np.array([0, 17], np.int32),
        ),
    ),
    (
        "empty_rows_finite_fill_row_bias",
        (1, 16, 24, 2, 2, 16, 16),
        jnp.float32,
        dict(window_left=2, window_right=2, masked_value=float(np.finfo(np.float32).min)),
        dict(
            bias=lambda r, b, n, t, s: r.standard_normal((b, 1, 1, s), np.float32),
            mask=lambda r, b, n, t, s: np.arange(t)[None, None, :, None] % 3 != 0,
        ),
    ),
]
CASE_IDS = [case[0] for case in CASES]


class TestPallasAttention:
    """Each case on each backend, in the HLO interpreter."""

    backends: ClassVar[tuple[str, ...]] = ("tpu", "gpu")

    def interpret(self, backend: str) -> Any:  # noqa: ANN401
        return True

    def run(self, backend: str, case: tuple[str, tuple[int, ...], Any, dict[str, Any], dict[str, Any]]) -> None:
        if backend not in self.backends:
            pytest.skip(f"{type(self).__name__} runs {self.backends} only")
        _, (b, t, s, n, kv, h, d), dtype, attrs, extra_fns = case
        q, k, v = attention_inputs(0, b, t, s, n, kv, h, d, dtype)
        rng = np.random.default_rng(1)
        extra = {name: jnp.asarray(fn(rng, b, n, t, s)) for name, fn in extra_fns.items()}
        kw = {"scale": h**-0.5, **attrs}
        got = attention(q, k, v, **kw, **extra, backend=backend, block_sizes=BLOCKS[backend],
                        interpret=self.interpret(backend))  # fmt: skip
        want = jitted_reference(q, k, v, extra, tuple(sorted(kw.items())))
        if case[0].startswith("mqa_empty_rows"):
            assert np.isnan(np.asarray(want)).any(), "the case must hold rows that see no key"
        _compare(got, want, dtype)

    @pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
    @pytest.mark.parametrize("backend", ["tpu", "gpu"])
    def test_prefill(self, backend: str, case: Any) -> None:  # noqa: ANN401
        self.run(backend, case)

    @pytest.mark.parametrize("backend", ["tpu", "gpu"])
    def test_decode_split_kv(self, backend: str) -> None:
        if backend not in self.backends:
            pytest.skip(f"{type(self).__name__} runs {self.backends} only")
        b, t, s, n, kv, h = 2, 1, 300, 4, 2, 16
        q, k, v = attention_inputs(2, b, t, s, n, kv, h, h, jnp.bfloat16)
        lengths = jnp.asarray([300, 77], jnp.int32)
        blocks = BlockSizes(block_q=16, block_k=128 if backend == "tpu" else 32, num_splits=3)
        got = decode_attention(q, k, v, scale=h**-0.5, causal=True, q_offset=s - 1, kv_lengths=lengths,
                               backend=backend, block_sizes=blocks, interpret=self.interpret(backend))  # fmt: skip
        kw = (("causal", True), ("q_offset", s - 1), ("scale", h**-0.5))
        _compare(got, jitted_reference(q, k, v, {"kv_lengths": lengths}, kw), jnp.bfloat16)


    @pytest.mark.parametrize("attrs", [dict(causal=True), dict(window_left=9, window_right=4)],
                             ids=["causal", "window"])
    @pytest.mark.parametrize("backend", ["tpu", "gpu"])
    def test_q_offsets_per_batch_row(self, backend: str, attrs: dict[str, Any]) -> None:
        """q_offsets: each batch row's own offset, read with the lengths: below 0, inside, past the keys."""
        if backend not in self.backends:
            pytest.skip(f"{type(self).__name__} runs {self.backends} only")
        b, t, s, n, kv, h = 4, 40, 300, 4, 2, 32
        q, k, v = attention_inputs(11, b, t, s, n, kv, h, h, jnp.float32)
        offsets = np.array([-20, 0, 137, 290], np.int32)
        kv_lengths = jnp.asarray([300, 250, 200, 299], jnp.int32)
        got = attention(q, k, v, scale=0.2, q_offsets=jnp.asarray(offsets), kv_lengths=kv_lengths, **attrs,
                        backend=backend, block_sizes=BLOCKS[backend], interpret=self.interpret(backend))
        for row, offset in enumerate(offsets):
            kw = tuple(sorted({"scale": 0.2, "q_offset": int(offset), **attrs}.items()))
            want = jitted_reference(q[row:row + 1], k[row:row + 1], v[row:row + 1],
                                    {"kv_lengths": kv_lengths[row:row + 1]}, kw)
            _compare(got[row:row + 1], want, jnp.float32)


class TestTpuInterpretMode(TestPallasAttention):
    """The TPU kernel under the TPU interpreter proper: simulated VMEM/SMEM, checked block reads."""

    backends: ClassVar[tuple[str, ...]] = ("tpu",)

    def interpret(self, backend: str) -> Any:  # noqa: ANN401
        return pltpu.InterpretParams()

    @pytest.mark.parametrize("case", [CASES[1], CASES[2]], ids=[CASE_IDS[1], CASE_IDS[2]])
    @pytest.mark.parametrize("backend", ["tpu"])
    def test_prefill(self, backend: str, case: Any) -> None:  # noqa: ANN401
        self.run(backend, case)


# ----------------------------------------------------------------------------- entry-point checks


def test_shape_errors_name_both_values() -> None:
    q, k, v = attention_inputs(0, 1, 4, 8, 4, 2, 16, 16, jnp.float32)
    with pytest.raises(ValueError, match=r"k shape \(1, 8, 2, 8\) does not match q shape \(1, 4, 4, 16\)"):
        attention(q, k[..., :8], v, scale=1.0)
    with pytest.raises(ValueError, match="N=4 are not a multiple of kv heads K=3"):
        attention(q, jnp.zeros((1, 8, 3, 16)), jnp.zeros((1, 8, 3, 16)), scale=1.0)
    with pytest.raises(ValueError, match=r"bias shape \(1, 3, 4, 8\) does not broadcast to \(B, N, T, S\)"):
        attention(q, k, v, scale=1.0, bias=jnp.zeros((1, 3, 4, 8)), interpret=True)
    with pytest.raises(ValueError, match=r"kv_lengths shape \(2,\) != \(B,\) = \(1,\)"):
        attention(q, k, v, scale=1.0, kv_lengths=jnp.zeros((2,), jnp.int32), interpret=True)
    with pytest.raises(ValueError, match="float16"):
        attention(q.astype(jnp.float16), k.astype(jnp.float16), v.astype(jnp.float16), scale=1.0, backend="tpu")
    with pytest.raises(ValueError, match="masked_value -10"):
        attention(q, k, v, scale=1.0, masked_value=-10.0)
    with pytest.raises(ValueError, match="at most 8 queries"):
        decode_attention(jnp.zeros((1, 9, 4, 16)), k, v, scale=1.0)


def test_block_sizes_are_validated() -> None:
    with pytest.raises(ValueError, match="invalid BlockSizes"):
        BlockSizes(block_q=0, block_k=128)
    with pytest.raises(ValueError, match="TPU block_q 12 must be a multiple of 8 and block_k 100 a multiple of 128"):
        BlockSizes(block_q=12, block_k=100).check("tpu")
    with pytest.raises(ValueError, match="GPU block_k 48 must be a power of two"):
        BlockSizes(block_q=16, block_k=48).check("gpu")
    for backend in ("tpu", "gpu"):
        for decode in (False, True):
            BlockSizes.get_default(backend, decode=decode).check(backend)


def test_tpu_tiles_too_large_for_vmem_are_rejected() -> None:
    q = jax.ShapeDtypeStruct((1, 2048, 1, 128), jnp.float32)
    big = functools.partial(attention, scale=1.0, block_sizes=BlockSizes(block_q=1024, block_k=2048))
    with pytest.raises(ValueError, match=r"block_q=1024, block_k=2048 .* MiB of VMEM > 32 MiB"):
        jax.eval_shape(big, q, q, q)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
@pytest.mark.parametrize("splits", [1, 2])
def test_key_ranges_with_their_lse_merge_into_the_whole(backend: str, splits: int) -> None:
    """`return_lse`: each key range's f32 output and log-sum-exp merge into attention over all keys (how a
    decode with its KV sequence sharded runs per shard: hlofuse.shard_local)."""
    blocks = BlockSizes(block_q=16, block_k=128 if backend == "tpu" else 64, num_splits=splits)
    check_key_ranges_merge(lambda q, k, v, own: attention(q, k, v, scale=0.2, kv_lengths=own, backend=backend,
                                                          interpret=True, return_lse=True, block_sizes=blocks))


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_prefill_key_ranges_with_their_q_offsets_merge_into_the_whole(backend: str) -> None:
    """A causal prefill chunk over 4 key ranges, each run with q_offsets = q_offset - its start (how a chunk
    against a sequence-sharded cache runs per shard: hlofuse.shard_local.prefill_key_split)."""
    blocks = BlockSizes(block_q=16, block_k=128 if backend == "tpu" else 32)
    check_prefill_key_ranges_merge(lambda q, k, v, **kw: attention(
        q, k, v, scale=0.2, causal=True, backend=backend, interpret=True, return_lse=True, block_sizes=blocks, **kw))


def test_q_offsets_replace_q_offset() -> None:
    q = jnp.zeros((1, 4, 1, 8), jnp.float32)
    with pytest.raises(ValueError, match="q_offset or q_offsets"):
        attention(q, q, q, scale=1.0, q_offset=3, q_offsets=jnp.zeros((1,), jnp.int32), interpret=True)
    with pytest.raises(ValueError, match=r"q_offsets shape \(2,\) != \(B,\)"):
        attention(q, q, q, scale=1.0, q_offsets=jnp.zeros((2,), jnp.int32), interpret=True)


def test_return_lse_needs_an_infinite_masked_value() -> None:
    q = jnp.zeros((1, 1, 1, 8), jnp.float32)
    k = jnp.zeros((1, 128, 1, 8), jnp.float32)
    with pytest.raises(ValueError, match="masked_value -inf"):
        attention(q, k, k, scale=1.0, masked_value=-1e9, return_lse=True, interpret=True)
