"""CPU attention, side by side in one process: the hlofuse FFI kernel, XLA's unfused program
(jax.jit of attention_reference) and torch.nn.functional.scaled_dot_product_attention.

    python tools/bench/attention_cpu.py [--quick] [--shapes SPEC;SPEC...] [--repeats N]
    python tools/bench/attention_cpu.py --compare A.so --compare B.so [--shapes ...] [--repeats N]
    python tools/bench/attention_cpu.py --isa amx --isa avx512 [--shapes ...] [--repeats N]

A SPEC is comma-separated key=value pairs over B, T, S, N, K, H, dtype (f32|bf16) and causal (0|1),
e.g. "T=4096,S=4096,N=8,K=8,H=128,dtype=f32,causal=1". Prints a markdown table of median times,
hlofuse's time as a fraction of the others', hlofuse GFLOP/s (over the visible query-key pairs) and as a
share of this machine's f32 GEMM peak (measured first, in this process: the faster of XLA's and torch's
2048^3 f32 matmul, best of 10; on a shared machine the load when it runs and when a row runs differ, so
read the share as approximate), XLA's temp bytes (compiled.memory_analysis()), and each program's extra peak RSS:
the resident memory its first run adds at its peak over what the process held before (Linux:
/proc/self/clear_refs resets the peak, VmHWM reads it), which also counts what XLA cannot see, such
as the hlofuse kernel's own scratch (per thread, about 4 * (block_q * (2H + D) + block_k * (H + D))
bytes, plus splits * block_q * D floats per tile on the decode path) and the output.

With --compare (twice or more), each library (a scratch cmake build of the kernel, e.g. before and
after a change) is registered under its own FFI target and timed in this one process against torch,
the repetitions interleaved (each repetition runs A, B, ..., torch once, in a fresh random order), so
that load from other jobs on a shared machine, and what each program leaves behind in the caches and
on the cores for the next, hits every column alike. It prints medians, each library / torch and each
library / the first.

With --isa (twice or more, or beside --compare), a column is the installed kernel library with
HLOFUSE_CPU_ISA set to that name for its calls (the kernel reads it per call), e.g. `--isa amx --isa
avx512` times the AMX bf16 tiles against bf16 widened to f32 in one process. The header names the
kernel each column actually ran (`isa()` under that setting): asking for amx on a CPU without it runs
the best kernel below.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# torch's OpenMP threads otherwise spin after each op, taking the cores from whatever runs next (XLA's
# pool, or other jobs on a shared machine). Measured on 2 shared cores: torch alone at T1 S2048 K8 f32
# took 12 ms with spinning threads and 0.30 ms without; interleaved, the hlofuse call after torch was
# up to 3x slower. Set it before torch loads its OpenMP runtime; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from timing import median_time, run_times  # noqa: E402

from hlofuse.kernels import cpu  # noqa: E402
from hlofuse.kernels.cpu import ISA_ENV  # noqa: E402
from hlofuse.kernels.cpu.attention import attention, attention_reference  # noqa: E402
from hlofuse.kernels.reference import attention_visibility  # noqa: E402

try:
    import torch
except ImportError:  # torch is optional
    torch = None


@dataclasses.dataclass(frozen=True)
class Case:
    T: int
    S: int
    N: int = 8
    K: int = 8
    H: int = 128
    B: int = 1
    dtype: str = "f32"
    causal: bool = False

    @property
    def decode(self) -> bool:
        return self.T <= 8 and self.S > self.T

    @property
    def name(self) -> str:
        kind = "decode" if self.decode else ("causal" if self.causal else "full")
        return f"B{self.B} T{self.T} S{self.S} N{self.N} K{self.K} H{self.H} {self.dtype} {kind}"

    @property
    def q_offset(self) -> int:  # decode rows sit at the end of the cache
        return self.S - self.T if self.decode else 0

    @classmethod
    def parse(cls, spec: str) -> Case:
        kw: dict[str, Any] = {}
        for item in spec.split(","):
            key, value = item.split("=")
            key = key.strip()
            kw[key] = value if key == "dtype" else bool(int(value)) if key == "causal" else int(value)
        kw.setdefault("S", kw["T"])
        return cls(**kw)


def default_cases(quick: bool) -> list[Case]:
    if quick:
        return [
            Case(1024, 1024, H=128, causal=False),
            Case(1024, 1024, H=128, causal=True),
            Case(1024, 1024, K=2, H=64, dtype="bf16", causal=True),
            Case(1, 8192, K=2, H=128),
        ]
    cases = [Case(t, t, H=h, causal=c) for t in (512, 2048, 4096) for h in (64, 128) for c in (False, True)]
    cases += [Case(8192, 8192, H=128, causal=True)]
    cases += [Case(4096, 4096, K=2, H=128, causal=c) for c in (False, True)]
    cases += [Case(4096, 4096, H=128, dtype="bf16", causal=c) for c in (False, True)]
    cases += [Case(1, s, K=k, H=128, dtype=d) for s in (2048, 8192, 32768) for k in (8, 2) for d in ("f32",)]
    cases += [Case(1, 32768, K=2, H=128, dtype="bf16")]
    return cases


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def fix_malloc_thresholds() -> None:
    """Large blocks always from mmap, returned on free: glibc otherwise raises its mmap threshold after the
    first large free, keeps later blocks of that size on its heap and resident after they are freed, and a
    program run after another would show no extra peak. (A no-op where glibc's mallopt is absent.)"""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: fixed, which also stops the dynamic adjustment
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD: give freed heap tops back
    except (OSError, AttributeError):
        pass


def extra_peak_rss(fn: Callable[[], Any]) -> int | None:
    """Bytes of resident memory `fn()` adds at its peak (None where /proc cannot tell: not Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # resets VmHWM to the current RSS
    except OSError:
        return None
    before = _status_kib("VmRSS")
    fn()
    peak = _status_kib("VmHWM")
    return None if before is None or peak is None else max(0, peak - before) * 1024


def gemm_peak_gflops(repeats: int = 10, n: int = 2048) -> tuple[float, dict[str, float]]:
    """This machine's f32 GEMM rate, GFLOP/s: the faster of XLA's and torch's n^3 matmul, each at its best of
    `repeats` (a capability, where the attention rows are medians), and each one's rate."""
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((n, n), np.float32)) for _ in range(2))
    matmul = jax.jit(jnp.matmul).lower(a, b).compile()
    rates = {"XLA": 2.0 * n**3 / min(run_times(lambda: matmul(a, b).block_until_ready(), repeats)) / 1e9}
    if torch is not None:
        ta, tb = torch.from_numpy(np.asarray(a)), torch.from_numpy(np.asarray(b))
        rates["torch"] = 2.0 * n**3 / min(run_times(lambda: torch.mm(ta, tb), repeats)) / 1e9
    return max(rates.values()), rates


def temp_bytes(compiled: Any) -> int | None:
    try:
        return int(compiled.memory_analysis().temp_size_in_bytes)
    except Exception:  # memory_analysis is optional on some backends
        return None


def visible_pairs(case: Case) -> int:
    vis = attention_visibility(
        case.T, case.S, causal=case.causal, window_left=-1, window_right=-1, q_offset=case.q_offset
    )
    return int(np.asarray(vis).sum()) * case.B * case.N


def case_inputs(case: Case) -> tuple[jax.Array, jax.Array, jax.Array, dict[str, Any]]:
    """q, k, v (standard normal draws, seed 0, in the case's dtype) and the attention keywords of `case`."""
    dtype = jnp.float32 if case.dtype == "f32" else jnp.bfloat16
    rng = np.random.default_rng(0)
    shapes = ((case.B, case.T, case.N, case.H), (case.B, case.S, case.K, case.H), (case.B, case.S, case.K, case.H))
    q, k, v = (jnp.asarray(rng.standard_normal(s, np.float32), dtype) for s in shapes)
    return q, k, v, dict(scale=case.H**-0.5, causal=case.causal, q_offset=case.q_offset)


def run_case(case: Case, repeats: int) -> dict[str, Any]:
    q, k, v, kw = case_inputs(case)
    row: dict[str, Any] = {"case": case.name}

    for label, fn in (("hlofuse", attention), ("xla", attention_reference)):
        jitted = jax.jit(functools.partial(fn, **kw))
        compiled = jitted.lower(q, k, v).compile()
        run = functools.partial(lambda c: c(q, k, v).block_until_ready(), compiled)
        row[f"{label}_rss"] = extra_peak_rss(run)  # the first run: nothing of it is resident yet
        row[f"{label}_s"] = median_time(run, repeats)
        row[f"{label}_temp"] = temp_bytes(compiled)

    row["torch_s"] = row["torch_rss"] = None
    if torch is not None:
        run_torch = torch_sdpa(case, q, k, v, kw["scale"])
        row["torch_rss"] = extra_peak_rss(run_torch)
        row["torch_s"] = median_time(run_torch, repeats)
    flops = 2.0 * visible_pairs(case) * (case.H + case.H)
    row["gflops"] = flops / row["hlofuse_s"] / 1e9
    return row


def torch_sdpa(case: Case, q: jax.Array, k: jax.Array, v: jax.Array, scale: float) -> Callable[[], None]:
    """torch's scaled_dot_product_attention on copies of q, k, v in its (B, N, T, H) layout."""
    tdtype = torch.float32 if case.dtype == "f32" else torch.bfloat16
    tq, tk, tv = (
        torch.from_numpy(np.array(x.astype(jnp.float32))).to(tdtype).transpose(1, 2).contiguous() for x in (q, k, v)
    )
    causal = case.causal and not case.decode

    def run() -> None:
        with torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(
                tq, tk, tv, is_causal=causal, scale=scale, enable_gqa=case.N != case.K
            )

    return run


@dataclasses.dataclass(frozen=True)
class Column:
    """One timed kernel: an FFI target (a library registered under its own name) run with HLOFUSE_CPU_ISA
    set to `isa` (unset when None)."""

    label: str
    target: str
    isa: str | None


def _set_isa(isa: str | None) -> None:
    if isa is None:
        os.environ.pop(ISA_ENV, None)
    else:
        os.environ[ISA_ENV] = isa


def compare_case(columns: list[Column], case: Case, repeats: int) -> list[float]:
    """Median seconds of each column's kernel, then torch's (if installed), repetitions interleaved."""
    from hlofuse.kernels.cpu import attention as attention_module

    q, k, v, kw = case_inputs(case)
    fns: list[Callable[[], Any]] = []
    default_target = attention_module.TARGET
    try:
        for column in columns:
            attention_module.TARGET = column.target  # read when the call is traced
            compiled = jax.jit(functools.partial(attention, **kw)).lower(q, k, v).compile()
            fns.append(lambda c=compiled, isa=column.isa: (_set_isa(isa), c(q, k, v).block_until_ready()))
    finally:
        attention_module.TARGET = default_target
    if torch is not None:
        fns.append(torch_sdpa(case, q, k, v, kw["scale"]))
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    # Each repetition runs the columns in a fresh (seeded) random order, so that every column follows
    # each other one about as often: the call right after torch shares the cores with torch's
    # still-spinning OpenMP threads and finds the caches full of torch's copies (measured: with the
    # order fixed, the first of two identical libraries took 1.2x the second at T1 S2048 K8 f32 and
    # 3x at S8192; a rotated order keeps the same neighbours).
    order = list(range(len(fns)))
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for i in order:
            t0 = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def library_columns(libs: list[str]) -> list[Column]:
    """Each library registered under its own FFI target, labelled by its file name (its path if names repeat),
    run with this process's HLOFUSE_CPU_ISA."""
    import ctypes

    names = [Path(p).name for p in libs]
    labels = names if len(set(names)) == len(names) else list(libs)
    columns = []
    for i, (path, label) in enumerate(zip(libs, labels, strict=True)):
        target = f"hlofuse_attention_compare{i}"
        lib = ctypes.cdll.LoadLibrary(str(Path(path).resolve()))
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(lib.hlofuse_attention), platform="cpu")
        columns.append(Column(label, target, os.environ.get(ISA_ENV)))
    return columns


def isa_columns(isas: list[str]) -> list[Column]:
    """The installed library under each HLOFUSE_CPU_ISA setting, labelled with the kernel it picks."""
    from hlofuse.kernels.cpu import attention as attention_module

    cpu.register()
    own, columns = os.environ.get(ISA_ENV), []
    try:
        for isa in isas:
            _set_isa(isa)
            picked = cpu.isa()
            columns.append(Column(isa if picked == isa else f"{isa} (runs {picked})", attention_module.TARGET, isa))
    finally:
        _set_isa(own)
    return columns


def compare_columns(columns: list[Column], cases: list[Case], repeats: int) -> None:
    """Side-by-side table of kernels (and torch), repetitions interleaved."""
    cols = [c.label for c in columns]
    print(
        "| case | "
        + " | ".join(f"{c} ms" for c in cols)
        + " | torch SDPA ms | "
        + " | ".join(f"{c} / torch" for c in cols)
        + " | "
        + " | ".join(f"{c} / {cols[0]}" for c in cols[1:])
        + " |"
    )
    print("|---|" + "---:|" * (3 * len(cols)))
    own = os.environ.get(ISA_ENV)
    for case in cases:
        try:
            med = compare_case(columns, case, repeats)
        finally:
            _set_isa(own)
        lib_med, torch_med = med[: len(columns)], (med[len(columns)] if torch is not None else None)
        print(
            f"| {case.name} | "
            + " | ".join(fmt_ms(m) for m in lib_med)
            + f" | {fmt_ms(torch_med)} | "
            + " | ".join(fmt_ratio(m, torch_med) for m in lib_med)
            + " | "
            + " | ".join(fmt_ratio(m, lib_med[0]) for m in lib_med[1:])
            + " |",
            flush=True,
        )


def fmt_ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f}"


def fmt_ratio(base: float, x: float | None) -> str:
    return "n/a" if x is None else f"{base / x:.2f}"


def fmt_mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="four small cases")
    ap.add_argument("--shapes", help="';'-separated case specs, e.g. 'T=4096,N=8,K=8,H=128,dtype=f32,causal=1'")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per program (median reported)")
    ap.add_argument(
        "--compare", action="append", metavar="LIB", help="a kernel library to time side by side (give two or more)"
    )
    ap.add_argument(
        "--isa",
        action="append",
        metavar="NAME",
        help="time the installed library with HLOFUSE_CPU_ISA=NAME as one more column (amx, avx512bf16, avx512, "
        "avx2, generic)",
    )
    args = ap.parse_args(argv)

    cases = [Case.parse(s) for s in args.shapes.split(";")] if args.shapes else default_cases(args.quick)
    threads = os.cpu_count() or 1
    if torch is not None:
        torch.set_num_threads(threads)
        torch_note = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    else:
        torch_note = "torch not installed: its column is n/a (pip install torch for it)"
    if args.compare or args.isa:
        if len(args.compare or []) + len(args.isa or []) < 2:
            ap.error("--compare and --isa need two or more columns in all")
        columns = library_columns(args.compare or []) + isa_columns(args.isa or [])
        print(f"jax {jax.__version__}; {threads} CPU threads; {torch_note}; repetitions interleaved\n")
        compare_columns(columns, cases, args.repeats)
        return 0
    cpu.register()
    fix_malloc_thresholds()
    print(f"jax {jax.__version__}; hlofuse kernel ISA {cpu.isa()}; {threads} CPU threads; {torch_note}")
    peak, rates = gemm_peak_gflops()
    print(
        f"f32 GEMM peak here: {peak:.1f} GFLOP/s (2048^3 matmul: "
        + ", ".join(f"{name} {rate:.1f}" for name, rate in rates.items())
        + ")\n"
    )
    print(
        "| case | hlofuse ms | XLA unfused ms | torch SDPA ms | hlofuse / XLA | hlofuse / torch "
        "| hlofuse GFLOP/s | of f32 GEMM peak | XLA temp MiB | extra peak RSS MiB: hlofuse | XLA | torch |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        r = run_case(case, args.repeats)
        base = r["hlofuse_s"]
        print(
            f"| {r['case']} | {fmt_ms(base)} | {fmt_ms(r['xla_s'])} | {fmt_ms(r['torch_s'])} "
            f"| {fmt_ratio(base, r['xla_s'])} | {fmt_ratio(base, r['torch_s'])} | {r['gflops']:.1f} "
            f"| {r['gflops'] / peak:.0%} | {fmt_mib(r['xla_temp'])} | {fmt_mib(r['hlofuse_rss'])} "
            f"| {fmt_mib(r['xla_rss'])} | {fmt_mib(r['torch_rss'])} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
