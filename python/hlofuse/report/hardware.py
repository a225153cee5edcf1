"""The chips hlofuse-report models: chips.toml (one row per chip, every number with its source), and `host`,
this machine, whose ceilings a short calibration measures and caches.

Calibration (about 10 s on 2 cores; `calibrate()`) times jitted programs on the CPU in CPU-seconds (the
median of a few runs), which other jobs sharing the cores do not inflate as they inflate wall time:
  - GEMM: f32 at N = 64 .. 2048 (the model interpolates the rate by the GEMM's size: a small GEMM never
    reaches the big one's rate on a CPU), and bf16 at N = 1024;
  - memory: a streaming `x * a + b` over 256 MiB (DRAM) and over 4 MiB (the last-level cache); matrix-vector
    dots reading 264 MiB of weights;
  - the vector units: a fused chain of 64 multiply-adds on an in-cache array; exp on one;
  - sort: jnp.sort of 8 rows of 32768;
  - overheads: a trivial program's call, and the cost per op of a chain of small unfusable ops;
  - transposes of the minor dim: a copy, and a loop fusion reading through one, by the distance between
    the elements it reads in turn (64 B to 16 KiB);
  - hlofuse's CPU attention kernel: its FLOP rate on a causal prefill and its K/V rate at decode (the
    kernel's own ceilings).
The result is cached in ~/.cache/hlofuse/report-host-<key>.json (HLOFUSE_CACHE_DIR overrides the folder; "off"
keeps none), keyed by the CPU model, core count, jax version and calibration version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import statistics
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hlofuse.cache import cache_root

TABLE = Path(__file__).with_name("chips.toml")
CALIBRATION_VERSION = 13
# Targets in the order the report lists them.
DEFAULT_TARGETS = ("host", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7", "h100", "h200", "b200", "trn1", "trn2")
ALIASES = {"cpu": "host", "v5e": "tpu-v5e", "v5p": "tpu-v5p", "v6e": "tpu-v6e", "v7": "tpu-v7", "tpu7x": "tpu-v7",
           "ironwood": "tpu-v7", "trillium": "tpu-v6e", "h100-sxm": "h100", "trainium": "trn1", "trainium2": "trn2"}


# Host ceilings that chips.toml may give fallbacks for (used uncalibrated; a calibration replaces them).
HOST_FALLBACKS = ("read_bw", "write_bw", "fault_bw", "gemv_bw", "transpose_bw", "transpose_cache_bw", "strided_bw",
                  "strided_curve", "strided_cache_curve", "decode_bw", "attention_flops")


@dataclass(frozen=True)
class Number:
    value: Any  # noqa: ANN401 - a float, an int or a list
    source: str


@dataclass
class Chip:
    """One row of the table, values in base units. `sources` says where each came from."""

    name: str
    description: str
    kernel_target: str
    family: str  # cpu | tpu | gpu | neuron
    peak_flops: dict[str, float]
    vector_flops: float
    transcendental_rate: float
    hbm_bw: float
    hbm_bytes: float
    interconnect_bw: float
    launch_s: float
    step_s: float
    matmul_tile: int
    attention_block: tuple[int, int]
    onchip: dict[str, float] = field(default_factory=dict)
    cache_bw: float = 0.0  # host only: the last-level cache's streaming bandwidth
    cache_bytes: float = 0.0
    sort_rate: float = 0.0  # compare-exchanges per second (host: measured; else from vector_flops)
    gemm_curve: list[tuple[float, float]] = field(default_factory=list)  # (flops of one GEMM, FLOP/s) measured
    attention_flops: float = 0.0  # hlofuse's attention kernel's FLOP rate (host: measured)
    fault_bw: float = 0.0  # host only: bytes/s of fresh (page-faulted) buffers, 0 = not modelled
    threads: float = 1.0  # host only: threads XLA's dots run on (the ceilings are per thread)
    kernel_threads: float = 1.0  # host only: threads hlofuse's CPU kernels keep busy
    transpose_bw: float = 0.0  # host only: bytes/s (read + written) of a copy that moves the minor dim
    transpose_cache_bw: float = 0.0  # the same when it fits in the last-level cache
    strided_bw: float = 0.0  # host only: bytes/s of a loop fusion reading through such a transpose
    # host only: (bytes between the elements an output row reads in turn, bytes/s) of such a loop fusion, reading
    # from DRAM, and from a source that fits in the last-level cache
    strided_curve: list[tuple[float, float]] = field(default_factory=list)
    strided_cache_curve: list[tuple[float, float]] = field(default_factory=list)
    chain_transcendental_rate: float = 0.0  # host: transcendentals/s past the second per element of one fusion
    variadic_rate: float = 0.0  # host: reducer ops/s of a reduction over several operands (argmax: scalar code)
    sampler_s_per_element: dict[str, float] = field(default_factory=dict)  # host: hlofuse's sampler, by mode
    decode_bw: float = 0.0  # host only: K/V bytes per CPU-second of hlofuse's attention kernel at decode
    decode_threads: float = 1.0
    read_bw: float = 0.0  # host only: DRAM read-only bandwidth (a reduction); 0 = hbm_bw
    gemv_bw: float = 0.0  # host only: bytes/s at which XLA's matrix-vector dots read their weights from DRAM
    write_bw: float = 0.0  # host only: DRAM write bandwidth (from a stream and the read bandwidth); 0 = hbm_bw
    sources: dict[str, str] = field(default_factory=dict)
    calibrated: str = ""  # where host's numbers came from

    def peak(self, dtype: str) -> float:
        """The matrix unit's rate for operands of `dtype` (f16 as bf16, f64 at a quarter of f32, ints as int8)."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        if dtype == "f16":
            return self.peak_flops.get("bf16", self.peak_flops["f32"])
        if dtype == "f64":
            return self.peak_flops["f32"] / 4
        if dtype.startswith(("i", "ui")):
            return self.peak_flops.get("int8", self.peak_flops.get("bf16", self.peak_flops["f32"]))
        if dtype.startswith("f8"):
            return self.peak_flops.get("fp8", self.peak_flops.get("bf16", self.peak_flops["f32"]))
        return self.peak_flops["f32"]

    def gemm_rate(self, dtype: str, gemm_flops: float) -> float:
        """The rate a GEMM of `gemm_flops` (one batch element) reaches: the measured curve on the host (scaled
        for dtypes by their measured peak), the peak elsewhere."""
        peak = self.peak(dtype)
        if not self.gemm_curve:
            return peak
        curve = sorted(self.gemm_curve)
        scale = peak / self.peak_flops["f32"]
        if gemm_flops <= curve[0][0]:
            # below the smallest measured GEMM the time is about constant (call overhead dominates)
            return curve[0][1] * scale * gemm_flops / curve[0][0]
        for (f0, r0), (f1, r1) in zip(curve, curve[1:], strict=False):
            if gemm_flops <= f1:
                w = (math.log(gemm_flops) - math.log(f0)) / (math.log(f1) - math.log(f0))
                return math.exp(math.log(r0) + w * (math.log(r1) - math.log(r0))) * scale
        return curve[-1][1] * scale

    def bandwidth(self, footprint: float) -> float:
        """Memory bandwidth for a region touching `footprint` bytes: the cache's when it fits (host only)."""
        if self.cache_bw and self.cache_bytes and footprint <= self.cache_bytes * 0.75:
            return self.cache_bw
        return self.hbm_bw

    def transpose_time(self, nbytes: float, fused: bool = False, stride: float = 0.0, source: float = 0.0) -> float:
        """Seconds to move `nbytes` (read + written) through a transpose of the minor dim (host only): a copy,
        or (`fused`) a loop fusion that reads through the transpose an element at a time, `stride` bytes
        apart, from a `source` of that many bytes (its rate falls from a line's neighbours to an element a
        line, then an element a page; a source in the last-level cache serves the nearer ones faster)."""
        if fused and self.strided_curve and stride > 0:
            curve = self.strided_curve
            if self.strided_cache_curve and source and self.cache_bytes and source <= self.cache_bytes / 2:
                curve = self.strided_cache_curve
            return nbytes / _interpolate(curve, stride)
        if fused and self.strided_bw:
            return nbytes / self.strided_bw
        if self.transpose_cache_bw and self.cache_bytes and nbytes <= self.cache_bytes * 0.75:
            return nbytes / self.transpose_cache_bw
        return nbytes / self.transpose_bw if self.transpose_bw else nbytes / self.hbm_bw

    def memory_time(self, read: float, written: float) -> float:
        """Seconds to read `read` and write `written` bytes: at the cache's bandwidth when they fit in it, else
        at DRAM's read and write bandwidths (host), or at the HBM bandwidth (accelerators)."""
        footprint = read + written
        if self.cache_bw and self.cache_bytes and footprint <= self.cache_bytes * 0.75:
            return footprint / self.cache_bw
        if self.read_bw and self.write_bw:
            return read / self.read_bw + written / self.write_bw
        return footprint / self.hbm_bw

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["attention_block"] = list(self.attention_block)
        return out


def _value(entry: Any) -> tuple[Any, str]:  # noqa: ANN401
    if isinstance(entry, dict) and "value" in entry:
        return entry["value"], str(entry.get("source", ""))
    return entry, ""


def load_table(path: Path = TABLE) -> dict[str, Chip]:
    """Every chip of the table, uncalibrated."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    chips = {}
    for name, row in data["chips"].items():
        sources: dict[str, str] = {}

        def get(key: str, row: dict[str, Any] = row, sources: dict[str, str] = sources) -> Any:  # noqa: ANN401
            value, source = _value(row[key])
            sources[key] = source
            return value

        peaks = {}
        for dtype, entry in row["peak_flops"].items():
            value, source = _value(entry)
            peaks[dtype] = float(value)
            sources[f"peak_flops.{dtype}"] = source
        onchip = {}
        for key, entry in row.get("onchip", {}).items():
            value, source = _value(entry)
            onchip[key] = float(value)
            sources[f"onchip.{key}"] = source
        block = get("attention_block")
        chip = Chip(name=name, description=row.get("description", name), kernel_target=row["kernel_target"],
                    family=row["family"], peak_flops=peaks, vector_flops=float(get("vector_flops")),
                    transcendental_rate=float(get("transcendental_rate")), hbm_bw=float(get("hbm_bw")),
                    hbm_bytes=float(get("hbm_bytes")), interconnect_bw=float(get("interconnect_bw")),
                    launch_s=float(get("launch_s")), step_s=float(get("step_s")),
                    matmul_tile=int(get("matmul_tile")), attention_block=(int(block[0]), int(block[1])),
                    onchip=onchip, sources=sources)
        if "cache_bw" in row:
            chip.cache_bw = float(get("cache_bw"))
            chip.cache_bytes = float(get("cache_bytes"))
        # Accelerators sort with bitonic networks on the vector units: a compare-exchange is ~4 vector ops.
        chip.sort_rate = chip.vector_flops / 4
        chip.attention_flops = 0.0
        for key in HOST_FALLBACKS:  # the host's calibrated ceilings, where the table gives fallbacks
            if key in row:
                value = get(key)
                value = [(float(a), float(b)) for a, b in value] if isinstance(value, list) else float(value)
                setattr(chip, key, value)
        chips[name] = chip
    return chips


def resolve_targets(names: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """Target names from a comma-separated list ('all' or None: every chip); raises ValueError on unknown ones."""
    if names is None:
        return list(DEFAULT_TARGETS)
    items = names.split(",") if isinstance(names, str) else list(names)
    out = []
    known = set(DEFAULT_TARGETS) | set(load_table())
    for item in (i.strip().lower() for i in items):
        if not item:
            continue
        if item == "all":
            out.extend(DEFAULT_TARGETS)
            continue
        item = ALIASES.get(item, item)
        if item not in known:
            raise ValueError(f"unknown target '{item}' (known: {', '.join(DEFAULT_TARGETS)})")
        out.append(item)
    return list(dict.fromkeys(out))


# ---- host calibration -----------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_key() -> str:
    import jax

    text = f"{_cpu_model()}|{os.cpu_count()}|{jax.__version__}|{CALIBRATION_VERSION}|{platform.machine()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _llc_bytes() -> float:
    """The last-level cache's size from sysfs (the largest cache index of cpu0)."""
    best = 0.0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in base.glob("index*"):
        try:
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = size[-1].upper()
        number = float(size[:-1]) if unit in "KMG" else float(size)
        best = max(best, number * {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(unit, 1))
    return best or 32 * 1024 ** 2


@dataclass(frozen=True)
class Timing:
    wall: float  # the fastest call's wall time
    cpu: float  # the median CPU time of a call (all of the process's threads, kernel time included)
    parallel: float  # the median CPU / wall ratio: how many threads the work kept busy at once


def _timed(fn: Callable[[], Any], budget_s: float, min_runs: int = 3, max_runs: int = 50) -> Timing:
    """Repeated runs of `fn` (after one warm-up) for about `budget_s` seconds.

    The CPU time of a call does not grow when other jobs share the cores (a wall time does, by however long
    the call waits for them), so the ceilings are work per CPU-second; the fastest wall time and the median
    CPU/wall ratio say how many threads a call uses."""
    fn()
    walls, cpus = [], []
    start = time.perf_counter()
    while len(walls) < max_runs and (len(walls) < min_runs or time.perf_counter() - start < budget_s):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return Timing(min(walls), max(statistics.median(cpus), 1e-7),
                  statistics.median(c / w for c, w in zip(cpus, walls, strict=True)))


def calibrate(verbose: bool = False) -> dict[str, Any]:
    """Measures this machine's ceilings (see the module docstring); returns them as a JSON-able dict.

    Rates are work per CPU-second of XLA's single-threaded execution (`threads` says whether its dots
    ran on several cores), so that other jobs on a shared machine do not lower them."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def log(message: str) -> None:
        if verbose:
            print(f"hlofuse-report: calibrating host: {message}", file=sys.stderr)

    out: dict[str, Any] = {"cpu": _cpu_model(), "cores": os.cpu_count(), "jax": jax.__version__,
                           "version": CALIBRATION_VERSION, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    rng = np.random.default_rng(0)
    curve = []
    parallel = 1.0
    for n in (64, 128, 256, 512, 1024, 2048):
        a = jnp.asarray(rng.standard_normal((n, n), np.float32))
        f = jax.jit(lambda x, y: x @ y)
        t = _timed(lambda f=f, a=a: f(a, a).block_until_ready(), 0.4 if n < 2048 else 0.6, max_runs=200)
        curve.append((2.0 * n ** 3, 2.0 * n ** 3 / t.cpu))
        if n >= 512:
            parallel = max(parallel, t.parallel)
        log(f"f32 GEMM {n}: {2 * n ** 3 / t.cpu / 1e9:.1f} GFLOP per CPU-second (wall best {t.wall * 1e3:.2f} ms)")
    out["gemm_curve"] = curve
    out["peak_f32"] = max(r for _, r in curve)
    # XLA's dots use several threads when a call keeps more than one core busy at once
    out["threads"] = float(os.cpu_count() or 1) if parallel >= 1.5 else 1.0
    a16 = jnp.asarray(rng.standard_normal((1024, 1024), np.float32)).astype(jnp.bfloat16)
    f16 = jax.jit(lambda x, y: x @ y)
    t = _timed(lambda: f16(a16, a16).block_until_ready(), 0.5)
    out["peak_bf16"] = 2.0 * 1024 ** 3 / t.cpu
    log(f"bf16 GEMM 1024: {out['peak_bf16'] / 1e9:.1f} GFLOP per CPU-second; dots on {out['threads']:.0f} thread(s)")

    # Matrix-vector dots (a decode step's weights, M = 1) reading 24 weights of 11 MiB from DRAM: XLA's GEMV
    # streams them below a plain reduction's rate.
    weights = [jnp.asarray(rng.standard_normal((1024, 2816), np.float32)) for _ in range(24)]
    row = jnp.ones((1, 1024), jnp.float32)
    gemvs = jax.jit(lambda x, ws: [x @ w for w in ws])
    t = _timed(lambda: jax.block_until_ready(gemvs(row, weights)), 0.5).cpu
    out["gemv_bw"] = sum(w.nbytes for w in weights) / t
    weights.clear()
    log(f"GEMV from DRAM: {out['gemv_bw'] / 1e9:.1f} GB/s of weights")

    # Streams in place (the input donated), so that the time is the memory's, not the page faults' of a
    # fresh output; the fresh-output time then gives the cost of faulting pages in.
    stream = jax.jit(lambda x: x * 1.0001 + 0.5, donate_argnums=0)
    fresh = jax.jit(lambda x: x * 1.0001 + 0.5)
    state = {"x": jnp.ones((64 * 1024 * 1024,), jnp.float32)}  # 256 MiB

    def step() -> None:
        state["x"] = stream(state["x"])
        state["x"].block_until_ready()

    t = _timed(step, 0.6).cpu
    nbytes = state["x"].nbytes
    out["hbm_bw"] = 2 * nbytes / t
    total = jax.jit(lambda x: jnp.sum(x))
    t_read = _timed(lambda: total(state["x"]).block_until_ready(), 0.4).cpu
    out["read_bw"] = nbytes / t_read
    out["write_bw"] = nbytes / max(t - t_read, t * 0.1)
    t_fresh = _timed(lambda: fresh(state["x"]).block_until_ready(), 0.6).cpu
    out["fault_bw"] = nbytes / max(t_fresh - t, t * 0.05)
    state["x"] = jnp.ones((1024 * 1024,), jnp.float32)  # 4 MiB
    t = _timed(step, 0.3, max_runs=400).cpu
    out["cache_bw"] = 2 * state["x"].nbytes / t
    # Transposes of the minor dim: a copy (XLA's tiled transpose) and a loop fusion reading through one (an
    # element at a time); 64 MiB each, a fresh output, so less the page faults.
    state["x"] = jnp.ones((4096, 4096), jnp.float32)
    faults = state["x"].nbytes / out["fault_bw"]
    for key, fn in (("transpose_bw", jax.jit(lambda x: x.T)), ("strided_bw", jax.jit(lambda x: x.T * 1.0001))):
        t = _timed(lambda fn=fn: fn(state["x"]).block_until_ready(), 0.4).cpu
        out[key] = 2 * state["x"].nbytes / max(t - faults, t * 0.1)
    # The loop fusion's rate by the distance between the elements it reads in turn: 32 MiB of (8M / c, c)
    # read along the columns, c elements apart.
    # The same from 8 MiB, in the last-level cache (its output, under the mmap threshold, faults nothing).
    strided = jax.jit(lambda x: x.T * 1.0001)
    for key, mib in (("strided_curve", 32), ("strided_cache_curve", 8)):
        out[key] = []
        for stride in (64, 256, 1024, 4096, 16384):
            state["x"] = jnp.ones((mib * 2 ** 18 * 4 // stride, stride // 4), jnp.float32)
            faults = state["x"].nbytes / out["fault_bw"] if state["x"].nbytes >= 32 * 2 ** 20 else 0.0
            t = _timed(lambda: strided(state["x"]).block_until_ready(), 0.2).cpu
            out[key].append((stride, 2 * state["x"].nbytes / max(t - faults, t * 0.1)))
    state["x"] = jnp.ones((1024, 1024), jnp.float32)  # 4 MiB
    copy = jax.jit(lambda x: x.T)
    t = _timed(lambda: copy(state["x"]).block_until_ready(), 0.3, max_runs=400).cpu
    out["transpose_cache_bw"] = 2 * state["x"].nbytes / t
    state.clear()
    out["cache_bytes"] = _llc_bytes()
    log(f"stream: {out['hbm_bw'] / 1e9:.1f} GB/s DRAM (read {out['read_bw'] / 1e9:.1f}, write "
        f"{out['write_bw'] / 1e9:.1f}), {out['cache_bw'] / 1e9:.1f} GB/s in cache, fresh pages "
        f"{out['fault_bw'] / 1e9:.1f} GB/s, transposes {out['transpose_bw'] / 1e9:.1f} GB/s "
        f"({out['transpose_cache_bw'] / 1e9:.1f} in cache, {out['strided_bw'] / 1e9:.1f} fused)")

    def chain(x: jax.Array) -> jax.Array:
        for i in range(32):
            x = x * 0.999 + (0.001 * i)
        return x

    chained = jax.jit(chain)
    mid = jnp.ones((1024 * 1024,), jnp.float32)
    t = _timed(lambda: chained(mid).block_until_ready(), 0.4).cpu
    out["vector_flops"] = 64 * mid.size / t
    expf = jax.jit(lambda x: jnp.exp(x))
    t = _timed(lambda: expf(mid).block_until_ready(), 0.3).cpu
    stream_s = 2 * mid.nbytes / out["cache_bw"]
    out["transcendental_rate"] = mid.size / max(t - stream_s, t / 4)

    def tanh_chain(x: jax.Array) -> jax.Array:  # XLA CPU's code slows down past a few per element of a fusion
        for _ in range(10):
            x = jnp.tanh(x) * 1.01
        return x

    chained_tanh = jax.jit(tanh_chain)
    t = _timed(lambda: chained_tanh(mid).block_until_ready(), 0.4).cpu
    first = 2 * mid.size / out["transcendental_rate"]
    out["chain_transcendental_rate"] = 8 * mid.size / max(t - stream_s - first, t / 4)
    log(f"vector {out['vector_flops'] / 1e9:.1f} GFLOP/s, exp {out['transcendental_rate'] / 1e9:.2f} G/s "
        f"({out['chain_transcendental_rate'] / 1e9:.2f} G/s chained in one fusion)")

    rows = jnp.asarray(rng.standard_normal((8, 32768), np.float32))
    sortf = jax.jit(lambda x: jnp.sort(x, axis=-1))
    t = _timed(lambda: sortf(rows).block_until_ready(), 0.4).cpu
    out["sort_rate"] = rows.size * math.log2(32768) / t
    argmax = jax.jit(lambda x: jnp.argmax(x, axis=-1))
    body = _argmax_body_ops(argmax, rows)
    t = _timed(lambda: argmax(rows).block_until_ready(), 0.3).cpu
    out["variadic_rate"] = rows.size * body / t
    out["sampler_s_per_element"] = _calibrate_sampler(rng)

    tiny = jnp.ones((8,), jnp.float32)
    trivial = jax.jit(lambda x: x + 1)
    out["step_s"] = _timed(lambda: trivial(tiny).block_until_ready(), 0.3, max_runs=400).cpu

    def unfusable(x: jax.Array) -> jax.Array:  # each reduce-then-broadcast ends a fusion
        for _ in range(32):
            x = x - jnp.max(x)
        return x

    chain_ops = jax.jit(unfusable)
    t = _timed(lambda: chain_ops(tiny).block_until_ready(), 0.3, max_runs=400).cpu
    out["launch_s"] = max(1e-7, (t - out["step_s"]) / 64)
    log(f"call {out['step_s'] * 1e6:.1f} us, per fused op {out['launch_s'] * 1e6:.2f} us")

    out["attention_flops"], out["kernel_threads"], out["decode_bw"], out["decode_threads"] = _calibrate_attention(rng)
    if out["attention_flops"]:
        log(f"hlofuse CPU attention: prefill {out['attention_flops'] / 1e9:.1f} GFLOP per CPU-second on "
            f"{out['kernel_threads']:.0f} thread(s), decode {out['decode_bw'] / 1e9:.1f} GB of K/V per CPU-second on "
            f"{out['decode_threads']:.0f}")
    return out


def _argmax_body_ops(fn: Callable[..., Any], x: Any) -> int:  # noqa: ANN401
    """Ops in the reducer of `fn`'s variadic reduce (as the model counts them)."""
    text = fn.lower(x).as_text()
    match = re.search(r"stablehlo\.reduce\(.*?\{(.*?)stablehlo\.return", text, re.S)
    return max(1, match.group(1).count(" = stablehlo.")) if match else 9


def _calibrate_sampler(rng: Any) -> dict[str, float]:  # noqa: ANN401
    """hlofuse's CPU sampler: CPU-seconds per logit for each mode, on 8 x 131072 f32 (empty if it does not run)."""
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np

        import hlofuse

        logits = jnp.asarray(rng.standard_normal((8, 131072), np.float32) * 3)
        key = jax.random.key_data(jax.random.key(0))
        modes = {"greedy": {"temperature": 0.0}, "temperature": {"temperature": 0.7},
                 "top_k": {"temperature": 0.7, "top_k": 50}, "top_p": {"temperature": 0.7, "top_p": 0.9},
                 "min_p": {"temperature": 0.7, "min_p": 0.05}}
        out = {}
        for mode, kwargs in modes.items():
            fn = jax.jit(lambda x, k, kwargs=kwargs: hlofuse.sample(x, k, **kwargs),
                         compiler_options={"hlofuse_pipeline": "default", "hlofuse_strict": True})
            t = _timed(lambda fn=fn: fn(logits, key).block_until_ready(), 0.2).cpu
            out[mode] = t / logits.size
        out["top_k+top_p"] = max(out["top_k"], out["top_p"])
        return out
    except Exception:  # the kernels are optional
        return {}


def _calibrate_attention(rng: Any) -> tuple[float, float, float, float]:  # noqa: ANN401
    """hlofuse's CPU attention kernel: a causal f32 prefill (B1 T2048 N8 H64) in FLOPs per CPU-second, and a
    decode (B1 S16384 N32/8 H128) in K/V bytes per CPU-second, each with the threads it keeps busy; zeros
    if the kernel does not build or lower here."""
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np

        import hlofuse

        cores = float(os.cpu_count() or 1)
        fused = jax.jit(lambda q, k, v: hlofuse.attention(q, k, v, causal=q.shape[1] > 1),
                        compiler_options={"hlofuse_pipeline": "default", "hlofuse_strict": True})
        from hlofuse.report.kernels import visible_fraction

        b, t, n, h = 1, 2048, 8, 64
        q, k, v = (jnp.asarray(rng.standard_normal((b, t, n, h), np.float32)) for _ in range(3))
        prefill = _timed(lambda: fused(q, k, v).block_until_ready(), 0.5)
        block_q, block_k = load_table()["host"].attention_block  # the tiles the model counts, diagonal ones whole
        visible = visible_fraction(t, t, block_q, block_k, {"causal": True})
        flops = 4.0 * b * n * t * t * h * visible / prefill.cpu
        s, kv = 16384, 8  # K/V of 256 MiB: from DRAM, as at a long context
        q = jnp.asarray(rng.standard_normal((1, 1, 32, 128), np.float32))
        k, v = (jnp.asarray(rng.standard_normal((1, s, kv, 128), np.float32)) for _ in range(2))
        decode = _timed(lambda: fused(q, k, v).block_until_ready(), 0.4)
        # its K/V rate without its math (the decode model adds the FLOPs at the prefill rate: no overlap)
        math_s = 4.0 * 32 * s * 128 / flops
        kv_rate = 2 * k.nbytes / max(decode.cpu - math_s, decode.cpu / 2)
        return flops, cores if prefill.parallel >= 1.5 else 1.0, kv_rate, cores if decode.parallel >= 1.5 else 1.0
    except Exception:  # the kernels are optional: the model falls back to the GEMM curve
        return 0.0, 1.0, 0.0, 1.0


def _stale(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("version") != CALIBRATION_VERSION
    except (OSError, json.JSONDecodeError):
        return False


def host_calibration(*, refresh: bool = False, allow: bool = True, verbose: bool = False) -> dict[str, Any] | None:
    """The cached calibration of this machine, measuring it first if there is none (or `refresh`). With
    HLOFUSE_CACHE_DIR=off nothing is read or kept: each call measures (or, without `allow`, gives None)."""
    root = cache_root()
    path = root / f"report-host-{_cache_key()}.json" if root is not None else None
    if path is not None and path.is_file() and not refresh:
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    if not allow:
        return None
    data = calibrate(verbose=verbose)
    if path is None:
        return data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
        data["cache_path"] = str(path)
        for old in path.parent.glob("report-host-*.json"):  # calibrations of older versions of this module
            if old != path and _stale(old):
                old.unlink(missing_ok=True)
    except OSError:
        pass
    return data


def apply_calibration(chip: Chip, data: dict[str, Any]) -> Chip:
    """`chip` (host) with the measured ceilings."""
    chip = dataclasses.replace(chip, peak_flops=dict(chip.peak_flops), sources=dict(chip.sources))
    where = f"measured on this host {data.get('when', '')} ({data.get('cpu', '?')}, {data.get('cores', '?')} cores)"
    chip.peak_flops["f32"] = float(data["peak_f32"])
    chip.peak_flops["bf16"] = float(data["peak_bf16"])
    # A ceiling never falls with size: a bigger GEMM reaches at least a smaller one's rate on an idle machine (a
    # lower measured rate at 2048 is the cache shared with other jobs), so the curve is made non-decreasing.
    curve, best = [], 0.0
    for f, r in sorted((float(f), float(r)) for f, r in data["gemm_curve"]):
        best = max(best, r)
        curve.append((f, best))
    chip.gemm_curve = curve
    for key in ("vector_flops", "transcendental_rate", "hbm_bw", "cache_bw", "cache_bytes", "sort_rate", "step_s",
                "launch_s", "attention_flops", "fault_bw", "read_bw", "write_bw", "threads", "kernel_threads",
                "transpose_bw", "transpose_cache_bw", "strided_bw", "decode_bw", "decode_threads",
                "chain_transcendental_rate", "variadic_rate", "gemv_bw"):
        if key in data:
            setattr(chip, key, float(data[key]))
            chip.sources[key] = where
    chip.sampler_s_per_element = {k: float(v) for k, v in data.get("sampler_s_per_element", {}).items()}
    chip.strided_curve = [(float(d), float(r)) for d, r in data.get("strided_curve", [])]
    chip.strided_cache_curve = [(float(d), float(r)) for d, r in data.get("strided_cache_curve", [])]
    chip.interconnect_bw = chip.hbm_bw
    chip.sources["peak_flops.f32"] = chip.sources["peak_flops.bf16"] = where
    chip.calibrated = where
    return chip


def chips_for(targets: list[str], *, calibrate_host: bool = True, refresh: bool = False,
              verbose: bool = False) -> dict[str, Chip]:
    """The chips of `targets`, the host calibrated (measured once, then cached) unless `calibrate_host` is False."""
    table = load_table()
    out = {}
    for name in targets:
        chip = table[name]
        if name == "host":
            data = host_calibration(refresh=refresh, allow=calibrate_host, verbose=verbose) if calibrate_host else None
            if data is not None:
                chip = apply_calibration(chip, data)
            else:
                chip.sort_rate = chip.vector_flops / 8
        out[name] = chip
    return out


def _interpolate(curve: list[tuple[float, float]], x: float) -> float:
    """A measured (x, rate) curve at `x`, log-linear between its points and flat beyond its ends."""
    points = sorted(curve)
    if x <= points[0][0]:
        return points[0][1]
    for (x0, r0), (x1, r1) in zip(points, points[1:], strict=False):
        if x <= x1:
            w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(r0) + w * (math.log(r1) - math.log(r0)))
    return points[-1][1]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
