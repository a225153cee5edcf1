"""What the Pallas attention kernels need of a chip, what each chip has, and the tiles chosen from both.

A kernel the chip's compiler would reject, or compile with ptxas spills, is not emitted: the lowering asks
`attention.unfit` / `mosaic_gpu.unfit` and keeps the composite, with a remark naming the limit. The needs
are a small model of each kernel, computed from its tiles and dtypes; the limits are data (`CHIPS`, each
number with its source). `python -m hlofuse.compile_targets` and test/python/test_compile_grid.py check
the model against the real compilers (deviceless compiles for TPU v5e/v6e/v5p and the H100 config).

- **Triton (gpu).** Shared memory of one program, and a register estimate. Both were fitted to what Triton
  and ptxas report for this kernel on sm_90a (docs/kernels-pallas.md, "Resources per chip"): with 4 warps
  and block_q a multiple of 64 Triton uses wgmma, K and V tiles are buffered `num_stages` deep and q sits in
  shared memory; otherwise (mma.sync) K and V are single-buffered and q takes up to four tiles' worth. The
  register estimate counts the f32 accumulator and logits tile per thread, plus q where it lives in
  registers; estimates up to REGISTER_BUDGET compiled without spills (f32 on mma.sync also keeps K in
  registers: triton_f32_mma_registers).
- **Mosaic GPU (gpu-mosaic).** Shared memory is `mosaic_gpu.smem_bytes` (exact); registers: the kernel
  keeps two f32 (block_q, D) accumulators and the f32 logits tile in one warpgroup.
- **TPU (Mosaic).** VMEM per grid step is `tpu.vmem_bytes`, an upper bound (2-3x what libtpu allocates),
  against the scoped VMEM the kernel may ask for. TPU prefill tiles are chosen by libtpu's own static cost:
  the bundles one grid step runs (tpu_bundles.json, measured by `python -m hlofuse.compile_targets
  --tune-tpu-blocks --write`) times the grid steps the shape needs, among the tiles libtpu compiled with no
  vector register spilled to VMEM; a shape with no such tile is refused.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from hlofuse.kernels.pallas import common

KiB, MiB = 1024, 1024 * 1024
GPU_TARGETS_DIR = Path(__file__).resolve().parents[2] / "gpu_targets"
TPU_BUNDLES_FILE = Path(__file__).resolve().parent / "tpu_bundles.json"

# Register estimates (32-bit words per thread, see triton_register_words) up to this compiled without
# spills for every tile and shape of the compile grid (255 registers is sm_90's cap per thread [cc90]);
# at 160 (bf16 H = 256 or f32 H = 128 on 64 x 64 tiles) ptxas spilled 60-116 bytes at T = 32k.
REGISTER_BUDGET = 144
# Mosaic GPU: one warpgroup holds both f32 accumulators and the logits tile; at 192 words per thread ptxas
# used 255 registers with no spill (H = D = 128, block_k 128), at 288 it spilled (H = D = 256, block_k 64).
MOSAIC_REGISTER_BUDGET = 192


@dataclasses.dataclass(frozen=True)
class ChipLimits:
    """What one chip offers a kernel. TPU: VMEM; GPU: shared memory per block and registers per thread."""

    name: str
    backend: str  # "tpu" or "gpu"
    vmem_bytes: int = 0  # TPU: VMEM per TensorCore
    scoped_vmem_bytes: int = 0  # TPU: the scoped VMEM limit a kernel gets without asking for more
    smem_per_block: int = 0  # GPU: shared memory one block may opt in to
    registers_per_thread: int = 0  # GPU
    sources: tuple[str, ...] = ()


def _gpu_field(config: str, name: str) -> int:
    found = re.search(rf"^\s*{name}:\s*(\d+)", (GPU_TARGETS_DIR / config).read_text(), re.MULTILINE)
    if not found:
        raise ValueError(f"{config} has no field {name}")
    return int(found.group(1))


def _gpu(name: str, config: str) -> ChipLimits:
    return ChipLimits(
        name, "gpu", smem_per_block=_gpu_field(config, "shared_memory_per_block_optin"), registers_per_thread=255,
        sources=(f"shared memory: shared_memory_per_block_optin in hlofuse/gpu_targets/{config} (CUDA C++ "
                 "Programming Guide, compute capability 9.0: 227 KiB per block); registers: 255 per thread "
                 "(the same table)",),
    )  # fmt: skip


# TPU VMEM: the capacity libtpu 0.0.42.1 reports for each topology (vmem_capacity in its vmem_report dump);
# the scoped default is what Pallas' TPU docs give (16 MiB on v5e and earlier, 32 MiB on v6e); the kernels
# ask for at most tpu.MAX_VMEM (32 MiB) above it.
_TPU_SOURCE = ("VMEM: vmem_capacity in libtpu 0.0.42.1's vmem_report for the topology; scoped default: "
               "jax's Pallas TPU docs (TPU pipelining, 'the default scoped VMEM limit')",)
CHIPS = {
    "tpu-v5e": ChipLimits("tpu-v5e", "tpu", vmem_bytes=128 * MiB, scoped_vmem_bytes=16 * MiB, sources=_TPU_SOURCE),
    "tpu-v6e": ChipLimits("tpu-v6e", "tpu", vmem_bytes=128 * MiB, scoped_vmem_bytes=32 * MiB, sources=_TPU_SOURCE),
    "tpu-v5p": ChipLimits("tpu-v5p", "tpu", vmem_bytes=64 * MiB, scoped_vmem_bytes=16 * MiB, sources=_TPU_SOURCE),
    "h100": _gpu("h100", "h100.txtpb"),
    "h200": _gpu("h200", "h200.txtpb"),
}
# The chip a lowering assumes when nothing names one: the tightest of each backend's chips for what the
# kernels use (v5e's 16 MiB scoped VMEM; H100 and H200 are the same sm_90a with the same limits).
DEFAULT_CHIP = {"tpu": "tpu-v5e", "gpu": "h100"}

_chip: contextvars.ContextVar[str | None] = contextvars.ContextVar("hlofuse_pallas_chip", default=None)


@contextlib.contextmanager
def for_chip(name: str) -> Iterator[None]:
    """Lowerings inside the block choose tiles for, and check limits of, chip `name` (compile_targets uses it)."""
    if name not in CHIPS:
        raise ValueError(f"unknown chip '{name}' (known: {', '.join(CHIPS)})")
    token = _chip.set(name)
    try:
        yield
    finally:
        _chip.reset(token)


# jax Device.device_kind -> chip, first match wins (v5e reports "TPU v5 lite", v5p "TPU v5").
DEVICE_KINDS = (("tpu v5 lite", "tpu-v5e"), ("tpu v5e", "tpu-v5e"), ("tpu v6 lite", "tpu-v6e"), ("tpu v6e", "tpu-v6e"),
                ("tpu v5p", "tpu-v5p"), ("tpu v5", "tpu-v5p"), ("h200", "h200"), ("h100", "h100"))  # fmt: skip


def chip_of_device_kind(kind: str) -> str | None:
    """The chip of a jax device kind ("TPU v6 lite", "NVIDIA H100 80GB HBM3"), or None for one not known here."""
    kind = kind.lower()
    return next((name for pattern, name in DEVICE_KINDS if pattern in kind), None)


def _device_chip() -> str | None:
    """The chip of JAX's default device when its backends are up on a TPU or GPU (the jit hook on a real chip)."""
    try:
        from jax._src import xla_bridge

        if not xla_bridge.backends_are_initialized():
            return None
        import jax

        device = jax.devices()[0]
    except Exception:  # no backend at all: nothing to learn
        return None
    return chip_of_device_kind(device.device_kind) if device.platform in ("tpu", "gpu") else None


def current_chip(backend: str) -> ChipLimits:
    """The chip set by `for_chip`, else the chip JAX runs on, when one of `backend`'s; else DEFAULT_CHIP."""
    for name in (_chip.get(), _device_chip()):
        if name is not None and CHIPS[name].backend == backend:
            return CHIPS[name]
    return CHIPS[DEFAULT_CHIP[backend]]


# ----------------------------------------------------------------------------- Triton (target gpu)


def triton_uses_wgmma(block_q: int, num_warps: int) -> bool:
    """Whether Triton lowers the kernel's dots to wgmma (seen on sm_90a: 4 warps, block_q a multiple of 64)."""
    return num_warps == 4 and block_q % 64 == 0


def triton_smem_bytes(block_q: int, block_k: int, head_pad: int, value_pad: int, itemsize: int,
                      num_warps: int = 4, num_stages: int = 2) -> int:  # fmt: skip
    """Shared memory of one Triton program, an upper bound (exact for 16-bit dtypes on the wgmma path)."""
    kv = block_k * (head_pad + value_pad) * itemsize
    q = block_q * head_pad * itemsize
    wgmma = num_stages * kv + q
    mma = kv + 4 * q  # 3 tiles of q seen at most (decode against a 128k cache), one more as a margin
    if num_warps == 4:
        return wgmma if triton_uses_wgmma(block_q, num_warps) else mma
    return max(wgmma, mma)  # not fitted: the larger of both


def triton_register_words(block_q: int, block_k: int, head_pad: int, value_pad: int, itemsize: int,
                          num_warps: int = 4) -> int:  # fmt: skip
    """32-bit words per thread the kernel keeps live: the f32 accumulator and logits, plus q in registers
    (f32 q on the wgmma path; two copies of q on the mma.sync path)."""
    threads = 32 * num_warps
    words = (block_q * value_pad + block_q * block_k) // threads
    q_words = block_q * head_pad * itemsize // 4 // threads
    if not triton_uses_wgmma(block_q, num_warps):
        return words + 2 * q_words
    return words + (q_words if itemsize == 4 else 0)


def triton_f32_mma_registers(block_q: int, block_k: int, head_pad: int, value_pad: int) -> int:
    """Registers per thread of an f32 kernel on the mma.sync path (block_q < 64), where the K tile is held in
    registers as tf32 fragments: fitted to ptxas on sm_90a (2.5 per word of K, one per word of q, the
    accumulator and logits, 22 more; within 10% on the 14 tiles measured, docs/kernels-pallas.md)."""
    threads = 128
    k_words, q_words = block_k * head_pad // threads, block_q * head_pad // threads
    return (5 * k_words) // 2 + q_words + (block_q * value_pad + block_q * block_k) // threads + 22


def triton_unfit(block_q: int, block_k: int, head_pad: int, value_pad: int, itemsize: int, num_warps: int,
                 num_stages: int, chip: ChipLimits) -> str | None:  # fmt: skip
    """Why these Triton tiles do not compile cleanly on `chip` (a phrase), or None when they do."""
    smem = triton_smem_bytes(block_q, block_k, head_pad, value_pad, itemsize, num_warps, num_stages)
    if smem > chip.smem_per_block:
        return (f"needs {smem // KiB} KiB of shared memory > {chip.smem_per_block // KiB} KiB per block on "
                f"{chip.name}")  # fmt: skip
    words = triton_register_words(block_q, block_k, head_pad, value_pad, itemsize, num_warps)
    if words > REGISTER_BUDGET:
        return (f"keeps ~{words} registers per thread live > {REGISTER_BUDGET} (above that ptxas spills on "
                f"{chip.name})")  # fmt: skip
    if itemsize == 4 and not triton_uses_wgmma(block_q, num_warps):
        registers = triton_f32_mma_registers(block_q, block_k, head_pad, value_pad)
        if registers > chip.registers_per_thread:
            return (f"needs ~{registers} registers per thread > {chip.registers_per_thread} on {chip.name} "
                    "(f32 K tiles in registers)")  # fmt: skip
    return None


# Tiles tried in order, largest first; the first that fits is taken.
TRITON_PREFILL = ((64, 64), (64, 32), (32, 64), (32, 32), (16, 64), (16, 32), (16, 16))
TRITON_DECODE = ((16, 128), (16, 64), (16, 32), (16, 16))


def triton_tiles(rows: int, s: int, block_q: int, block_k: int) -> tuple[int, int]:
    """Tiles as the kernel uses them: shrunk to the problem, powers of two, at least 16 (attention._plan)."""
    return min(block_q, max(16, common.next_pow2(rows))), min(block_k, max(16, common.next_pow2(s)))


def triton_blocks(rows: int, s: int, h: int, d: int, itemsize: int, decode: bool,
                  chip: ChipLimits) -> tuple[tuple[int, int] | None, str]:  # fmt: skip
    """(block_q, block_k) of the first candidate that fits `chip`, or (None, why the smallest does not)."""
    hp, dp = max(16, common.next_pow2(h)), max(16, common.next_pow2(d))
    why = ""
    for bq, bk in TRITON_DECODE if decode else TRITON_PREFILL:
        tq, tk = triton_tiles(rows, s, bq, bk)
        reason = triton_unfit(tq, tk, hp, dp, itemsize, 4, 2, chip)
        if reason is None:
            return (bq, bk), ""
        why = f"with its smallest tiles ({tq} x {tk}) and head dims ({hp}, {dp}) {reason}"
    return None, why


# ----------------------------------------------------------------------------- Mosaic GPU (target gpu-mosaic)


def mosaic_register_words(block_q: int, block_k: int, value_pad: int) -> int:
    """Words per thread of one warpgroup: the running and the fresh f32 accumulator, and the f32 logits."""
    return (2 * block_q * value_pad + block_q * block_k) // 128


# ----------------------------------------------------------------------------- TPU (target tpu)


@cache
def _tpu_measured() -> dict[str, dict[str, dict[str, int]]]:
    if not TPU_BUNDLES_FILE.is_file():
        return {}
    data: dict[str, dict[str, dict[str, int]]] = json.loads(TPU_BUNDLES_FILE.read_text())
    return data


def tpu_bundles() -> dict[str, dict[str, int]]:
    """'<chip> <dtype> <head_pad>' -> {'<block_q>x<block_k>[/<block_k_inner>]': bundles one grid step runs}
    (TPU_BUNDLES_FILE; a looped tile's inner loop counted once per slice)."""
    return _tpu_measured().get("bundles", {})


def tpu_spills() -> dict[str, dict[str, int]]:
    """The same keys -> bytes of vector registers libtpu spilled to VMEM for that tile (TPU_BUNDLES_FILE)."""
    return _tpu_measured().get("spill_bytes", {})


def tpu_tile_key(block_q: int, block_k: int, block_k_inner: int = 0) -> str:
    """'128x1024/256' for a tile with an inner loop over 256-key slices, '256x512' for one without."""
    return f"{block_q}x{block_k}" + (f"/{block_k_inner}" if block_k_inner and block_k_inner < block_k else "")


def parse_tpu_tile_key(key: str) -> tuple[int, int, int]:
    """(block_q, block_k, block_k_inner) of tpu_tile_key's text (block_k_inner 0: no inner loop)."""
    tile, _, inner = key.partition("/")
    bq, bk = (int(x) for x in tile.split("x"))
    return bq, bk, int(inner or 0)


TPU_PREFILL_DEFAULT = (256, 512)
TPU_DECODE = (16, 1024)


def tpu_tiles(rows: int, s: int, sublanes: int, block_q: int, block_k: int) -> tuple[int, int]:
    """Tiles as the TPU kernel uses them: shrunk to the problem (attention._plan)."""
    return min(block_q, common.round_up(rows, sublanes)), min(block_k, common.round_up(s, 128))


def tpu_steps(rows: int, s: int, sublanes: int, block_q: int, block_k: int, *, groups: int = 1,
              causal_offset: int | None = None) -> int:  # fmt: skip
    """Grid steps per (batch, kv head) that compute: every kv block, or with `causal_offset` (the composite's
    q_offset) only those up to each q tile's last visible key."""
    tq, tk = tpu_tiles(rows, s, sublanes, block_q, block_k)
    q_tiles, k_blocks = -(-rows // tq), -(-s // tk)
    if causal_offset is None:
        return q_tiles * k_blocks
    t = rows // groups
    return sum(
        min(k_blocks, max(0, (min((i * tq + tq - 1) // groups, t - 1) + causal_offset) // tk + 1))
        for i in range(q_tiles)
    )


def tpu_blocks(rows: int, s: int, head_pad: int, dtype: str, chip: ChipLimits, *, groups: int = 1,
               causal_offset: int | None = None) -> tuple[tuple[int, int, int] | None, str]:  # fmt: skip
    """The prefill tiles (block_q, block_k, block_k_inner) with the fewest bundles x computing grid steps for
    this shape among those libtpu compiled without spilling vector registers on `chip`; TPU_PREFILL_DEFAULT
    when nothing was measured for this dtype and padded head dim; (None, why) when every measured tile spills."""
    key = f"{chip.name} {dtype} {head_pad}"
    table = tpu_bundles().get(key)
    if not table:
        return (*TPU_PREFILL_DEFAULT, 0), ""
    spills = tpu_spills().get(key, {})
    sublanes = 16 if dtype == "bf16" else 8
    costs = {}
    for tile, bundles in table.items():
        if spills.get(tile, 0):
            continue
        bq, bk, inner = parse_tpu_tile_key(tile)
        steps = tpu_steps(rows, s, sublanes, bq, bk, groups=groups, causal_offset=causal_offset)
        costs[(bq, bk, inner)] = bundles * steps
    if not costs:
        least = min(spills, key=lambda tile: spills[tile])
        return None, (f"every tile measured for {dtype} with head dim {head_pad} spills vector registers on "
                      f"{chip.name} (the least: {least}, {spills[least] // KiB} KiB; tpu_bundles.json)")
    return min(costs, key=lambda b: (costs[b], b[0] * b[1], -b[2])), ""


def tpu_vmem_limit(chip: ChipLimits) -> int:
    """The most VMEM the kernel may ask for on `chip` (it raises the scoped limit up to tpu.MAX_VMEM)."""
    from hlofuse.kernels.pallas import tpu

    return min(chip.vmem_bytes, max(chip.scoped_vmem_bytes, tpu.MAX_VMEM))
