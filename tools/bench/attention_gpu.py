"""GPU attention, side by side in one process: the hlofuse Pallas kernels (Triton, and Mosaic GPU for Hopper),
XLA's unfused program (jax.jit of attention_reference) and jax.nn.dot_product_attention(implementation="cudnn").

    python tools/bench/attention_gpu.py [--quick] [--shapes SPEC;SPEC...] [--repeats N] [--blocks BQ,BK,W,S]

A SPEC is comma-separated key=value pairs over B, T, S, N, K, H, dtype (bf16|f16|f32) and causal (0|1),
e.g. "B=4,T=4096,N=32,K=8,H=128,dtype=bf16,causal=1"; T <= 8 < S is a decode step (flash-decoding).
Prints a markdown table of median times, TFLOP/s over the visible query-key pairs (4 * pairs * H
flops), each hlofuse kernel's speed as a ratio of the others' times (> 1: the kernel is faster) and its
largest difference from XLA's output. cuDNN takes only bf16/f16, and some shapes not at all; the Mosaic
GPU kernel takes bf16/f16 prefill on Hopper (sm_90) only (decode is left to Triton): their columns then
read n/a with the reason below the table. The default set runs in about 2-4 minutes on
an H100/H200 and stops starting new cases after --budget seconds (default 420), so one run stays
under 8 minutes. Needs a CUDA GPU; --cpu-smoke runs three tiny cases in interpret mode instead (the
Mosaic GPU kernel in its own interpreter), to check the script itself on a CPU-only host (its times mean
nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from timing import median_time  # noqa: E402

from hlofuse.kernels.pallas import mosaic_gpu  # noqa: E402
from hlofuse.kernels.pallas.attention import BlockSizes, attention, attention_reference  # noqa: E402
from hlofuse.kernels.reference import attention_visibility  # noqa: E402

DTYPES = {"bf16": jnp.bfloat16, "f16": jnp.float16, "f32": jnp.float32}
KERNELS = ("pallas", "mosaic")  # hlofuse's: Pallas on Triton, Pallas on Mosaic GPU
LABELS = ("pallas", "mosaic", "xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class Case:
    T: int
    S: int
    B: int = 1
    N: int = 16
    K: int = 16
    H: int = 128
    dtype: str = "bf16"
    causal: bool = True

    @property
    def decode(self) -> bool:
        return self.T <= 8 < self.S

    @property
    def q_offset(self) -> int:  # bottom-right: the queries are the last T positions
        return self.S - self.T

    @property
    def name(self) -> str:
        kind = "decode" if self.decode else ("causal" if self.causal else "full")
        return f"B{self.B} T{self.T} S{self.S} N{self.N} K{self.K} H{self.H} {self.dtype} {kind}"

    @classmethod
    def parse(cls, spec: str) -> Case:
        kw: dict[str, Any] = {}
        for item in spec.split(","):
            key, value = (x.strip() for x in item.split("="))
            kw[key] = value if key == "dtype" else bool(int(value)) if key == "causal" else int(value)
        kw.setdefault("S", kw["T"])
        return cls(**kw)


def default_cases(quick: bool) -> list[Case]:
    cases = [
        Case(2048, 2048, B=4, causal=False),
        Case(2048, 2048, B=4),
        Case(4096, 4096, B=2, N=32, K=8),
        Case(8192, 8192, B=1, N=32, K=8, H=64),
        Case(1, 32768, B=8, N=32, K=8),
    ]
    if quick:
        return cases[1:3] + cases[4:]
    return cases + [
        Case(4096, 4096, B=2, dtype="f16"),
        Case(2048, 2048, B=2, dtype="f32"),
        Case(1, 8192, B=32, N=32, K=8),
        Case(4, 131072, B=1, N=32, K=8),
    ]


def visible_pairs(case: Case) -> int:
    vis = attention_visibility(
        case.T, case.S, causal=case.causal, window_left=-1, window_right=-1, q_offset=case.q_offset
    )
    return int(np.asarray(vis).sum()) * case.B * case.N


def run_case(case: Case, repeats: int, blocks: BlockSizes | None, interpret: bool,
             skip: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """One case's times, TFLOP/s and differences from XLA; the programs named in `skip` are left out."""
    dtype = DTYPES[case.dtype]
    key_q, key_k, key_v = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(key_q, (case.B, case.T, case.N, case.H), dtype)
    k = jax.random.normal(key_k, (case.B, case.S, case.K, case.H), dtype)
    v = jax.random.normal(key_v, (case.B, case.S, case.K, case.H), dtype)
    kw = dict(scale=case.H**-0.5, causal=case.causal, q_offset=case.q_offset)
    programs: dict[str, Callable[..., jax.Array]] = {
        "pallas": functools.partial(attention, backend="gpu", block_sizes=blocks, interpret=interpret, **kw),
        "mosaic": functools.partial(mosaic_gpu.attention, interpret=interpret, **kw),
        "xla": functools.partial(attention_reference, **kw),
    }
    if case.decode:  # the gpu-mosaic target hands decode to the Triton kernel
        del programs["mosaic"]
    if not interpret:  # cuDNN's mask is top-left causal: only T == S (or decode, unmasked) compares
        if case.decode or case.T == case.S:
            programs["cudnn"] = functools.partial(
                jax.nn.dot_product_attention, scale=kw["scale"], is_causal=case.causal and not case.decode,
                implementation="cudnn",
            )  # fmt: skip
    for label in skip:
        programs.pop(label, None)
    row: dict[str, Any] = {"case": case.name, "notes": []}
    outputs: dict[str, jax.Array] = {}
    for label, fn in programs.items():
        try:
            compiled = jax.jit(fn).lower(q, k, v).compile()
            outputs[label] = compiled(q, k, v)
            row[f"{label}_s"] = median_time(lambda c=compiled: c(q, k, v).block_until_ready(), repeats)
        except Exception as error:  # cuDNN rejects some dtypes/shapes; report and go on
            row[f"{label}_s"] = None
            row["notes"].append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0][:160]}")
    flops = 4.0 * visible_pairs(case) * case.H
    row["tflops"] = {label: flops / row[f"{label}_s"] / 1e12 if row[f"{label}_s"] else None for label in programs}
    for label in KERNELS:
        row[f"{label}_err"] = None
        if label in outputs and "xla" in outputs:
            diff = jnp.abs(outputs[label].astype(jnp.float32) - outputs["xla"].astype(jnp.float32))
            row[f"{label}_err"] = float(jnp.max(diff))
    return row


def fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def ratio(base: float | None, other: float | None) -> str:
    return "n/a" if base is None or other is None else f"{other / base:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="four cases")
    ap.add_argument("--shapes", help="';'-separated case specs, e.g. 'B=4,T=4096,N=32,K=8,H=128,dtype=bf16'")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per program (median reported)")
    ap.add_argument("--blocks", help="Pallas tiles BLOCK_Q,BLOCK_K[,NUM_WARPS,NUM_STAGES] (default: per shape)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds after which no new case starts")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny cases in interpret mode, no GPU needed")
    args = ap.parse_args(argv)

    if not args.cpu_smoke:
        try:
            gpus = jax.devices("gpu")
        except RuntimeError as error:
            print(
                f"attention_gpu.py needs a CUDA GPU and jax with CUDA support (pip install 'jax[cuda12]'); "
                f"this host has none: {error}",
                file=sys.stderr,
            )
            return 2
        device = f"{gpus[0].device_kind}"
    else:
        device = "CPU, interpret mode (times are not GPU numbers)"
    blocks = None
    if args.blocks:
        fields = [int(x) for x in args.blocks.split(",")]
        blocks = BlockSizes(*fields[:2], 0, *fields[2:])
        blocks.check("gpu")
    if args.cpu_smoke:
        cases = [Case(32, 32, N=4, K=2, H=16, dtype="f32"), Case(1, 256, N=4, K=2, H=16, dtype="bf16"),
                 Case(64, 128, N=4, K=2, H=64, dtype="bf16")]
    else:
        cases = [Case.parse(s) for s in args.shapes.split(";")] if args.shapes else default_cases(args.quick)

    print(f"jax {jax.__version__}; {device}; {args.repeats} repeats, median\n")
    print(
        "| case | Triton ms | Mosaic ms | XLA unfused ms | cuDNN ms | Triton TFLOP/s | Mosaic TFLOP/s | XLA TFLOP/s "
        "| cuDNN TFLOP/s | XLA / Triton | XLA / Mosaic | cuDNN / Triton | cuDNN / Mosaic "
        "| Triton max abs diff vs XLA | Mosaic max abs diff vs XLA |"
    )
    print("|---|" + "---:|" * 14)
    notes: list[str] = []
    start = time.perf_counter()
    for case in cases:
        if time.perf_counter() - start > args.budget:
            notes.append(f"{case.name}: skipped, past the {args.budget:.0f} s budget")
            continue
        r = run_case(case, args.repeats, blocks, args.cpu_smoke)
        ms = {label: None if r.get(f"{label}_s") is None else r[f"{label}_s"] * 1e3 for label in LABELS}
        tf = r["tflops"]
        cells = [fmt(ms[label], ".3f") for label in LABELS] + [fmt(tf.get(label), ".1f") for label in LABELS]
        cells += [ratio(ms[kernel], ms[base]) for base in ("xla", "cudnn") for kernel in KERNELS]
        cells += [fmt(r[f"{kernel}_err"], ".2e") for kernel in KERNELS]
        print(f"| {r['case']} | " + " | ".join(cells) + " |", flush=True)
        notes += [f"{r['case']}: {note}" for note in r["notes"]]
    for note in notes:
        print(f"- {note}")
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
