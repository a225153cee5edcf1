"""hlofuse.kernels.pallas.resources: the chips' limits, the kernels' resource model, the tiles chosen from both.

The measurements below are what Triton + ptxas (jax-cuda12-plugin 0.10.2, ptxas 12.9, the H100 target config)
reported for the Triton kernel at T = S = 1024, N = 8, causal (python -m hlofuse.compile_targets and the
compile grid, test/python/test_compile_grid.py, recheck them against the compilers); no compiler runs here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from hlofuse.kernels.pallas import attention as pallas_attention
from hlofuse.kernels.pallas import resources

H100 = resources.CHIPS["h100"]

# (itemsize, block_q, block_k, head_pad, shared memory bytes Triton allocated, ptxas spilled?)
TRITON_MEASURED = [
    (2, 64, 64, 64, 40960, False), (2, 64, 32, 64, 24576, False), (2, 32, 64, 64, 24576, False),
    (2, 64, 64, 128, 81920, False), (2, 64, 32, 128, 49152, False), (2, 32, 64, 128, 45056, False),
    (2, 128, 64, 128, 98304, True), (2, 64, 64, 256, 163840, False), (2, 64, 32, 256, 98304, False),
    (2, 128, 64, 256, 196608, True), (4, 64, 64, 64, 65536, False), (4, 64, 32, 128, 81920, False),
    (4, 64, 64, 128, 131072, False), (4, 128, 64, 128, 163840, True), (4, 64, 64, 256, 262144, None),
    (4, 64, 32, 256, 163840, True), (4, 32, 64, 256, 172032, True), (4, 16, 64, 256, 151552, True),
    (4, 16, 32, 256, 83968, False), (4, 16, 16, 256, 50176, False), (4, 32, 32, 256, 102400, True),
    (4, 16, 64, 128, 77824, False),
]  # fmt: skip


@pytest.mark.parametrize(("itemsize", "bq", "bk", "hp", "smem", "spilled"), TRITON_MEASURED)
def test_triton_model_bounds_what_the_compiler_reported(itemsize, bq, bk, hp, smem, spilled):
    model = resources.triton_smem_bytes(bq, bk, hp, hp, itemsize)
    assert model >= smem
    if itemsize == 2 and resources.triton_uses_wgmma(bq, 4):
        assert model == smem  # exact where the kernel runs on wgmma with 16-bit tiles
    reason = resources.triton_unfit(bq, bk, hp, hp, itemsize, 4, 2, H100)
    if spilled or spilled is None:  # None: the compiler refused (shared memory)
        assert reason is not None, (bq, bk, hp, itemsize)


def test_chip_limits_come_from_the_shipped_target_configs():
    assert H100.smem_per_block == resources.CHIPS["h200"].smem_per_block == 232448
    assert H100.registers_per_thread == 255 and H100.sources
    assert resources.CHIPS["tpu-v5e"].scoped_vmem_bytes == 16 * resources.MiB
    assert resources.tpu_vmem_limit(resources.CHIPS["tpu-v5p"]) == 32 * resources.MiB
    assert all(chip.sources for chip in resources.CHIPS.values())


def test_for_chip_selects_the_limits_of_its_backend_only():
    assert resources.current_chip("gpu").name == "h100" and resources.current_chip("tpu").name == "tpu-v5e"
    with resources.for_chip("tpu-v6e"):
        assert resources.current_chip("tpu").name == "tpu-v6e"
        assert resources.current_chip("gpu").name == "h100"
    assert resources.current_chip("tpu").name == "tpu-v5e"
    with pytest.raises(ValueError, match="unknown chip 'v7x'"):
        with resources.for_chip("v7x"):
            pass


def test_the_chip_jax_runs_on_is_taken_when_none_is_named(monkeypatch):
    assert resources.chip_of_device_kind("TPU v5 lite") == "tpu-v5e"
    assert resources.chip_of_device_kind("TPU v6 lite") == "tpu-v6e"
    assert resources.chip_of_device_kind("TPU v5") == "tpu-v5p"
    assert resources.chip_of_device_kind("NVIDIA H200") == "h200"
    assert resources.chip_of_device_kind("NVIDIA H100 80GB HBM3") == "h100"
    assert resources.chip_of_device_kind("cpu") is None
    assert resources._device_chip() is None  # the CPU here
    monkeypatch.setattr(resources, "_device_chip", lambda: "tpu-v6e")
    assert resources.current_chip("tpu").name == "tpu-v6e" and resources.current_chip("gpu").name == "h100"
    with resources.for_chip("tpu-v5p"):  # a named chip wins
        assert resources.current_chip("tpu").name == "tpu-v5p"


@pytest.mark.parametrize(
    ("dtype", "t", "s", "h", "want"),
    [
        (jnp.bfloat16, 1024, 1024, 128, (64, 64)),
        (jnp.float32, 1024, 1024, 64, (64, 64)),
        (jnp.float32, 1024, 1024, 128, (64, 32)),  # 64 x 64 spilled at T = 32k
        (jnp.bfloat16, 1024, 1024, 256, (64, 32)),
        (jnp.float32, 1024, 1024, 256, (16, 32)),  # 64 x 64 needs 256 KiB of shared memory
        (jnp.bfloat16, 1, 131072, 128, (16, 128)),  # decode
        (jnp.float32, 1, 131072, 256, (16, 32)),
        (jnp.float32, 16, 32, 8, (64, 64)),  # tiny: the tiles shrink to the problem in the plan
    ],
)
def test_triton_tiles_are_the_largest_that_fit(dtype, t, s, h, want):
    q = jax.ShapeDtypeStruct((1, t, 8, h), dtype)
    kv = jax.ShapeDtypeStruct((1, s, 8, h), dtype)
    decode = t <= pallas_attention.DECODE_MAX_T < s
    blocks = pallas_attention.chip_blocks("gpu", q, kv, kv, decode=decode)
    assert (blocks.block_q, blocks.block_k) == want
    blocks.check("gpu")


def test_no_triton_tile_fits_a_huge_f32_head_dim():
    found, why = resources.triton_blocks(1024, 1024, 1024, 1024, 4, False, H100)
    assert found is None and why.startswith("with its smallest tiles (16 x 16) and head dims (1024, 1024)")


def test_mosaic_gpu_register_model_splits_what_spilled_from_what_did_not():
    # ptxas: H = D = 128 with 128-key blocks used 255 registers, no spill; D = 256 (64-key blocks) spilled.
    assert resources.mosaic_register_words(64, 128, 128) <= resources.MOSAIC_REGISTER_BUDGET
    assert resources.mosaic_register_words(64, 64, 256) > resources.MOSAIC_REGISTER_BUDGET


def test_tpu_tiles_minimise_bundles_times_steps_among_those_that_do_not_spill():
    table, spills = resources.tpu_bundles(), resources.tpu_spills()
    assert "tpu-v5e bf16 128" in table and "256x512" in table["tpu-v5e bf16 128"]
    chip = resources.CHIPS["tpu-v5e"]
    rows, s = 4096, 4096
    chosen, why = resources.tpu_blocks(rows, s, 128, "bf16", chip)
    assert chosen is not None and why == ""
    costs = {
        key: bundles * resources.tpu_steps(rows, s, 16, *resources.parse_tpu_tile_key(key)[:2])
        for key, bundles in table["tpu-v5e bf16 128"].items()
        if spills["tpu-v5e bf16 128"][key] == 0
    }
    assert spills["tpu-v5e bf16 128"][resources.tpu_tile_key(*chosen)] == 0
    assert costs[resources.tpu_tile_key(*chosen)] == min(costs.values())
    # Nothing measured for this head dim: the default tiles.
    assert resources.tpu_blocks(rows, s, 512, "bf16", chip) == ((*resources.TPU_PREFILL_DEFAULT, 0), "")


def test_tpu_tiles_are_refused_when_every_measured_tile_spills(monkeypatch):
    chip = resources.CHIPS["tpu-v5e"]
    monkeypatch.setattr(resources, "tpu_bundles", lambda: {"tpu-v5e bf16 128": {"128x128": 700, "256x512": 1600}})
    monkeypatch.setattr(resources, "tpu_spills", lambda: {"tpu-v5e bf16 128": {"128x128": 12288, "256x512": 479232}})
    found, why = resources.tpu_blocks(4096, 4096, 128, "bf16", chip)
    assert found is None
    assert why == ("every tile measured for bf16 with head dim 128 spills vector registers on tpu-v5e "
                   "(the least: 128x128, 12 KiB; tpu_bundles.json)")  # fmt: skip


def test_tpu_tile_keys_round_trip():
    assert resources.tpu_tile_key(128, 1024, 256) == "128x1024/256"
    assert resources.tpu_tile_key(256, 512) == resources.tpu_tile_key(256, 512, 512) == "256x512"
    assert resources.parse_tpu_tile_key("128x1024/256") == (128, 1024, 256)
    assert resources.parse_tpu_tile_key("256x512") == (256, 512, 0)


def test_tpu_causal_steps_count_only_visible_blocks():
    full = resources.tpu_steps(1024, 1024, 8, 256, 256)
    causal = resources.tpu_steps(1024, 1024, 8, 256, 256, causal_offset=0)
    assert (full, causal) == (16, 10)  # 1 + 2 + 3 + 4 blocks under the diagonal
    # Bottom-right causal with q_offset = S - T: the last 256 queries see all 4 blocks.
    assert resources.tpu_steps(256, 1024, 8, 256, 256, causal_offset=768) == 4


def test_chosen_tpu_tiles_fit_the_vmem_the_kernel_may_ask_for():
    from hlofuse.kernels.pallas import tpu

    for dtype in (jnp.bfloat16, jnp.float32):
        for h in (64, 128, 256):
            q = jax.ShapeDtypeStruct((1, 32768, 8, h), dtype)
            blocks = pallas_attention.chip_blocks("tpu", q, q, q, decode=False, has_side=True)
            plan = pallas_attention._plan("tpu", q, q, q, blocks, pallas_attention._NO_ATTRS)
            assert tpu.vmem_bytes(plan, jnp.dtype(dtype).itemsize) <= tpu.MAX_VMEM


# Every tile the choice can return computes the same attention, up to float rounding (interpret mode).
CANDIDATES = [("gpu", bq, bk) for bq, bk in resources.TRITON_PREFILL + resources.TRITON_DECODE[:1]]
CANDIDATES += [("tpu", 128, 128), ("tpu", 128, 256), ("tpu", 256, 256), ("tpu", 64, 256, 128), ("tpu", 128, 512, 256)]


@pytest.mark.parametrize(("backend", "block_q", "block_k", "block_k_inner"),
                         [c + (0,) * (4 - len(c)) for c in CANDIDATES], ids=["-".join(map(str, c)) for c in CANDIDATES])
def test_every_candidate_tile_gives_the_reference(backend, block_q, block_k, block_k_inner):
    import numpy as np

    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (1, 96, 4, 64), jnp.float32)  # GQA G = 2: 192 rows, a ragged last tile
    k = jax.random.normal(keys[1], (1, 320, 2, 64), jnp.float32)
    v = jax.random.normal(keys[2], (1, 320, 2, 64), jnp.float32)
    kw = dict(scale=0.125, causal=True, q_offset=224)
    blocks = pallas_attention.BlockSizes(block_q, block_k, block_k_inner=block_k_inner)
    got = pallas_attention.attention(q, k, v, backend=backend, interpret=True, block_sizes=blocks, **kw)
    want = pallas_attention.attention_reference(q, k, v, **kw)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
