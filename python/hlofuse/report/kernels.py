"""Models of hlofuse's kernels: what one call of a lowered `hlofuse.attention` / `hlofuse.sample` costs a chip.

Flash attention reads Q once, streams K and V through on-chip memory and writes O; the (T, S) scores never
reach HBM. Tiles of (block_q, block_k) that the causal or window bounds hide are skipped, so their
FLOPs and their K/V reads vanish. On a TPU, GPU or Trainium each query block reads the K/V tiles it sees
once (the CPU kernel's tiles stay in cache, so K and V are read once there); a TPU packs a GQA group's
query heads into the rows of one block. Decode (a few queries against a long cache) is bound by the K/V
bytes. The sort-free sampler reads the logits once or twice (docs/kernels-cpu-sampling.md: top-k one pass
with a heap; greedy the max then the first index; top-p / min-p a max then the mass pass) and draws noise
only for the few tokens that can still win.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hlofuse.report.graph import dtype_bytes
from hlofuse.report.hardware import Chip

# Logit passes of the sort-free sampler per mode (docs/kernels-cpu-sampling.md "How it works").
SAMPLER_PASSES = {"greedy": 2.0, "top_k": 1.0, "temperature": 2.0, "top_p": 2.0, "min_p": 2.0, "top_k+top_p": 2.0,
                  # typical sampling sorts its scores (the kernel's radix sort: 4 passes), then a softmax and cumsum
                  "typical": 7.0, "top_k+typical": 7.0}
# Vector ops per visible score in a flash kernel: scale, mask, running max, subtract, sum, rescale.
ATTENTION_VECTOR_OPS = 6.0


@dataclass
class KernelCost:
    name: str
    flops: float  # what the chip executes (padded tiles included)
    useful_flops: float  # the math of the visible scores, unpadded
    mxu_flops: float
    vector_flops: float
    transcendentals: float
    bytes: float
    compute_s: float
    memory_s: float
    details: dict[str, Any] = field(default_factory=dict)


def visible_fraction(t: int, s: int, block_q: int, block_k: int, attrs: dict[str, Any]) -> float:
    """The fraction of (block_q x block_k) tiles of the (T, S) grid with a visible key (causal / window bands)."""
    causal = bool(attrs.get("causal"))
    left = int(attrs.get("window_left", -1))
    right = int(attrs.get("window_right", -1))
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left < 0 and right < 0:
        return 1.0
    offset = int(attrs.get("q_offset", 0))
    block_q, block_k = max(1, min(block_q, t)), max(1, min(block_k, s))
    q_blocks, k_blocks = math.ceil(t / block_q), math.ceil(s / block_k)
    if q_blocks * k_blocks > 1 << 16:  # coarse grid for huge problems: the fraction, not the count, matters
        scale = math.sqrt(q_blocks * k_blocks / (1 << 16))
        block_q, block_k = int(block_q * scale) + 1, int(block_k * scale) + 1
        q_blocks, k_blocks = math.ceil(t / block_q), math.ceil(s / block_k)
    visible = 0
    for qb in range(q_blocks):
        q0, q1 = qb * block_q + offset, min(t, (qb + 1) * block_q) - 1 + offset
        lo = q0 - left if left >= 0 else -math.inf  # keys j with q - left <= j <= q + right
        hi = q1 + right if right >= 0 else math.inf
        first = max(0, math.floor(lo / block_k)) if lo != -math.inf else 0
        last = min(k_blocks - 1, math.floor(hi / block_k)) if hi != math.inf else k_blocks - 1
        if last >= first:
            visible += last - first + 1
    return visible / (q_blocks * k_blocks)


def attention_cost(chip: Chip, attrs: dict[str, Any], operand_types: Any, result_types: Any,  # noqa: ANN401
                   kernel_operands: list[tuple[int, ...]] | None = None, *, kv_fill: float = 1.0) -> KernelCost:
    """One flash attention call on `chip`, from the composite's attributes and canonical operand types."""
    (q_shape, dtype), (k_shape, _), (v_shape, _) = operand_types[:3]
    b, t, n, h = q_shape
    s, kv = k_shape[1], k_shape[2]
    d = v_shape[3]
    roles = list(attrs.get("operands", ["q", "k", "v"]))
    width = dtype_bytes(dtype)
    out_width = dtype_bytes(result_types[0][1]) if result_types else width
    h_pad, d_pad = h, d
    if kernel_operands and chip.family == "tpu":  # the wrapper pads the head dim to the 128 lanes
        lanes = max((shape[-1] for shape in kernel_operands if len(shape) == 4), default=h)
        h_pad, d_pad = max(h, lanes), max(d, lanes)
    block_q, block_k = chip.attention_block
    s_eff = max(1, int(round(s * kv_fill))) if attrs.get("decode") or "kv_lengths" in roles else s
    vis = visible_fraction(t, s_eff, block_q, block_k, attrs)
    scores = b * n * t * s_eff * vis
    useful = 2.0 * b * n * t * s_eff * (h + d) * _exact_visible(t, s_eff, attrs)
    mxu = 2.0 * scores * (h_pad + d_pad)
    softcap = float(attrs.get("softcap", 0) or 0) != 0.0
    vector = (ATTENTION_VECTOR_OPS + 2 * softcap) * scores
    trans = scores * (1 + softcap)  # exp, and tanh for a soft-cap
    q_bytes = b * t * n * h * width
    o_bytes = b * t * n * d * out_width
    kv_bytes = b * s_eff * kv * (h + d) * width
    groups = max(1, n // max(kv, 1))
    l2 = chip.onchip.get("l2_bytes", 0.0)
    if chip.family == "cpu" or t <= 8 or (chip.family == "gpu" and kv_bytes <= l2 / 2):
        kv_reads = 1.0  # the K/V tiles come from a cache after their first read
    else:
        rows = t * groups if chip.family in ("tpu", "neuron") else t
        kv_reads = max(1.0, math.ceil(rows / block_q) * vis)
    extra = 0.0
    for role, (shape, dt) in zip(roles, operand_types, strict=False):
        if role in ("bias", "mask"):
            extra += math.prod(shape) * dtype_bytes(dt) * vis
        elif role in ("q_lengths", "kv_lengths"):
            extra += math.prod(shape) * 4
    total_bytes = q_bytes + o_bytes + kv_bytes * kv_reads + extra
    threads = chip.kernel_threads if chip.family == "cpu" else 1.0
    decode_host = chip.family == "cpu" and t <= 8 and chip.decode_bw > 0
    if decode_host:
        threads = chip.decode_threads
    if decode_host:
        # At decode the CPU kernel streams each K/V block and then does its math on it, a block at a time, with
        # no overlap: the K/V bytes at its measured decode rate plus the FLOPs of the group's query rows at its
        # prefill rate (a GQA group of 16 heads does 4x the math per K/V byte of a group of 4).
        # (`serial`: the call's time is the sum of the two, and the bound the larger)
        compute = 0.0
        if chip.attention_flops:
            compute += 2.0 * scores * (h + d) / (chip.attention_flops * threads)
        if softcap:
            compute += scores / (chip.transcendental_rate * threads)
    elif chip.family == "cpu" and chip.attention_flops:
        compute = 4.0 * scores * h / (chip.attention_flops * threads)  # the kernel's measured rate, per thread
        if softcap:  # the calibration has no soft-cap: its tanh per visible score comes on top
            compute += scores / (chip.transcendental_rate * threads)
    else:
        mxu_s = mxu / chip.peak(dtype)
        vpu_s = vector / chip.vector_flops + trans / chip.transcendental_rate
        compute = max(mxu_s, vpu_s)  # a pipelined flash kernel overlaps the matrix and vector units
    memory = chip.memory_time(total_bytes - o_bytes, o_bytes) / threads
    if decode_host:
        memory = kv_bytes / (chip.decode_bw * threads)
    window = ""
    if attrs.get("causal"):
        window = " causal"
    if int(attrs.get("window_left", -1)) >= 0:
        window += f" window {attrs.get('window_left')}"
    gqa = f"{n}/{kv}" if kv != n else f"{n}"
    phase = "decode" if attrs.get("decode") else "prefill"
    name = f"hlofuse.attention {phase} {dtype} B{b} T{t} S{s} N{gqa} H{h}{window}"
    return KernelCost(name, mxu + vector + trans, useful, mxu, vector, trans, total_bytes, compute, memory,
                      {"visible_tiles": vis, "kv_reads": kv_reads, "head_dim": h, "head_dim_padded": h_pad,
                       "kv_bytes": kv_bytes, "serial": decode_host,
                       "block": [block_q, block_k]})


def _exact_visible(t: int, s: int, attrs: dict[str, Any]) -> float:
    """The exact fraction of visible (query, key) pairs (no tile rounding)."""
    return visible_fraction(t, s, 1, 1, attrs) if t * s <= 1 << 16 else visible_fraction(t, s, 8, 8, attrs)


def sample_cost(chip: Chip, attrs: dict[str, Any], operand_types: Any, result_types: Any) -> KernelCost:  # noqa: ANN401
    """One sort-free sampler call: `passes` reads of the logits, a few vector ops per element, exp where the
    mode needs the softmax mass."""
    shape, dtype = operand_types[0]
    vocab = shape[-1] if shape else 1
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    mode = str(attrs.get("mode", "greedy"))
    passes = SAMPLER_PASSES.get(mode, 2.0)
    elements = rows * vocab
    logits_bytes = elements * dtype_bytes(dtype)
    vector = 4.0 * elements * passes
    trans = elements if mode in ("top_p", "min_p", "top_k+top_p", "epsilon", "top_k+epsilon") else 0.0
    if mode in ("typical", "top_k+typical"):  # the log-softmax's exp and log, and the sorted row's exp
        trans = 3.0 * elements
    total_bytes = logits_bytes * passes + rows * 4
    threads = chip.kernel_threads if chip.family == "cpu" else 1.0
    compute = (vector / chip.vector_flops + trans / chip.transcendental_rate) / threads
    measured = chip.sampler_s_per_element.get(mode) if chip.family == "cpu" else None
    if measured:  # the host kernel's own measured rate for this mode (hardware._calibrate_sampler)
        compute = max(compute, measured * elements / threads)
    # A second pass over a row finds it in cache when a row fits (the CPU runs rows one at a time).
    first = chip.memory_time(logits_bytes, 0.0)
    rest = (passes - 1) * chip.memory_time(vocab * dtype_bytes(dtype), 0.0) * rows
    name = f"hlofuse.sample {mode} {dtype} [{rows}x{vocab}]"
    return KernelCost(name, vector + trans, vector + trans, 0.0, vector, trans, total_bytes, compute,
                      (first + rest) / threads,
                      {"passes": passes})


def kernel_cost(chip: Chip, site: Any, kernel_operands: list[tuple[int, ...]] | None = None,  # noqa: ANN401
                *, kv_fill: float = 1.0) -> KernelCost:
    if site.name == "hlofuse.attention":
        return attention_cost(chip, site.attributes, site.operand_types, site.result_types, kernel_operands,
                              kv_fill=kv_fill)
    return sample_cost(chip, site.attributes, site.operand_types, site.result_types)
