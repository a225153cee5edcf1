"""The kernels of the compile grid, run on one lent H200: numerics against the reference, times against XLA and cuDNN.

    python tools/bench/h200_kernels.py [--quick] [--budget SECONDS] [--repeats N]
    python tools/bench/h200_kernels.py --dry-run     # the plan: cases, tiles per chip, what runs; no device
    python tools/bench/h200_kernels.py --cpu-smoke   # tiny cases in interpret mode on any host (times mean nothing)

One process, one table, within 8 minutes (--budget, default 400 s, stops starting new cases; compiles count).
The attention cases are the compile grid's long contexts (test/python/test_compile_grid.py: prefill to
T = 32k, decode against a 128k cache, head dims 64/128/256, bf16 and f32) with the tiles hlofuse picks for the
H200 (hlofuse.kernels.pallas.resources.for_chip("h200")): the Triton kernel (target gpu), the Mosaic GPU
kernel (gpu-mosaic; bf16/f16 prefill, D <= 128), XLA's unfused program (attention_reference under jax.jit)
and cuDNN (jax.nn.dot_product_attention(implementation="cudnn"), where it takes the case), timed by
tools/bench/attention_gpu.py's run_case. A kernel passes when its largest difference from XLA's output is
within the tolerance of its dtype (bf16/f16 3e-2, f32 1e-4 relative to the output's scale). The sampler cases
run first, in a table of their own: the Pallas GPU sampler against sample_reference (the same token ids, exactly),
timed against XLA's sort-based program and an argmax over the same logits (the sampling issue's target: at most
0.05x the first, within 2x the second). The exit status is 1 when any kernel's numerics fail, 2 without a CUDA
GPU (unless --cpu-smoke or --dry-run).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from attention_gpu import DTYPES, LABELS, Case, run_case  # noqa: E402
from timing import median_time  # noqa: E402

from hlofuse.kernels.pallas import attention as pallas_attention  # noqa: E402
from hlofuse.kernels.pallas import common, resources  # noqa: E402
from hlofuse.kernels.pallas.sampling import sample  # noqa: E402
from hlofuse.kernels.sampling_reference import sample_reference  # noqa: E402

CHIP = "h200"
# Largest |kernel - XLA| accepted: bf16/f16 as the interpret-mode tests (test_pallas_attention.py); f32 looser
# than there (1e-5), since on the GPU Triton may run f32 dots as tf32 and XLA's unfused program may too.
TOLERANCE = {"bf16": 3e-2, "f16": 3e-2, "f32": 2e-3}


def attention_cases(quick: bool) -> list[Case]:
    """The compile grid's long contexts (at batch sizes that fill an H200), most informative first."""
    cases = [
        Case(8192, 8192, B=1, N=32, K=8, H=128),
        Case(1, 131072, B=4, N=32, K=8, H=128, causal=False),
        Case(32768, 32768, B=1, N=8, K=8, H=128),
        Case(8192, 8192, B=1, N=32, K=8, H=256, dtype="f32"),
        Case(32768, 32768, B=1, N=8, K=8, H=64),
    ]
    if quick:
        return cases[:3]
    return cases + [
        Case(32768, 32768, B=1, N=8, K=8, H=256),
        Case(8192, 8192, B=1, N=32, K=8, H=128, dtype="f32"),
        Case(1, 131072, B=4, N=32, K=8, H=256, dtype="f32", causal=False),
        Case(1, 131072, B=4, N=32, K=8, H=64, causal=False),
    ]


@dataclasses.dataclass(frozen=True)
class SamplerCase:
    rows: int
    vocab: int
    form: str
    dtype: str = "f32"
    temperature: float = 1.0
    k: int = 0
    p: float = 1.0
    min_p: float = 0.0

    @property
    def name(self) -> str:
        knobs = f" k={self.k}" * bool(self.k) + f" p={self.p:g}" * (self.p < 1) + f" min_p={self.min_p:g}" * bool(
            self.min_p
        )
        return f"sample {self.form} {self.dtype} {self.rows}x{self.vocab} T={self.temperature:g}{knobs}"


def sampler_cases(quick: bool) -> list[SamplerCase]:
    """The sampling issue's speed target first (top-p and top-k + top-p at 1-8 x 128k-262k), then the rest."""
    cases = [
        SamplerCase(8, 128256, "top_k_top_p_mask", temperature=0.7, k=50, p=0.95),
        SamplerCase(1, 128256, "top_p_mask", temperature=0.6, p=0.9),
        SamplerCase(8, 262144, "top_p_mask", temperature=0.6, p=0.9),
        SamplerCase(1, 262144, "top_k_top_p_mask", temperature=0.7, k=50, p=0.95),
        SamplerCase(16, 128256, "top_k", dtype="bf16", temperature=0.6, k=40),
        SamplerCase(8, 256000, "min_p", min_p=0.1),
        SamplerCase(8, 128256, "temperature", temperature=0.8),
        SamplerCase(1, 128256, "greedy"),
    ]
    return cases[:2] if quick else cases


def mosaic_takes(case: Case) -> bool:
    """Whether target gpu-mosaic runs this case on the Mosaic GPU kernel: 16-bit prefill with D <= 128 (f32 and
    wider value dims stay composites there, decode goes to the Triton kernel)."""
    return not case.decode and case.dtype != "f32" and common.round_up(case.H, 64) <= 128


def tiles(case: Case) -> str:
    """The Triton tiles hlofuse picks for this case on the H200, and whether Mosaic GPU takes it."""
    dtype = DTYPES[case.dtype]
    q = jax.ShapeDtypeStruct((case.B, case.T, case.N, case.H), dtype)
    kv = jax.ShapeDtypeStruct((case.B, case.S, case.K, case.H), dtype)
    blocks = pallas_attention.chip_blocks("gpu", q, kv, kv, decode=case.decode, chip=resources.CHIPS[CHIP])
    triton = f"Triton {blocks.block_q}x{blocks.block_k}, {blocks.num_warps} warps, {blocks.num_stages} stages"
    return f"{triton}; Mosaic GPU {'yes' if mosaic_takes(case) else 'no'}"


def attention_row(case: Case, repeats: int, interpret: bool) -> tuple[str, bool]:
    """One markdown row (times, ratios, each kernel's difference from XLA with its verdict) and whether it passed."""
    with resources.for_chip(CHIP):
        r = run_case(case, repeats, None, interpret, skip=() if mosaic_takes(case) else ("mosaic",))
    ms = {label: None if r.get(f"{label}_s") is None else r[f"{label}_s"] * 1e3 for label in LABELS}
    ok, verdicts = True, []
    for label in ("pallas", "mosaic"):
        err = r.get(f"{label}_err")
        if err is None:
            verdicts.append("n/a")
            continue
        passed = bool(np.isfinite(err)) and err <= TOLERANCE[case.dtype]
        ok &= passed
        verdicts.append(f"{err:.1e} {'ok' if passed else 'FAIL'}")
    cells = [_ms(ms[label]) for label in LABELS]
    cells += [_ratio(ms["pallas"], ms["xla"]), _ratio(ms["pallas"], ms["cudnn"]), _ratio(ms["mosaic"], ms["xla"])]
    return f"| {case.name} | " + " | ".join(cells + verdicts) + f" | {'; '.join(r['notes'])} |", ok


def sampler_row(case: SamplerCase, repeats: int, interpret: bool) -> tuple[str, bool]:
    """One markdown row: the Pallas GPU sampler, XLA's program of sample_reference (sort-based filters) and an
    argmax over the same logits (the issue's yardstick), timed interleaved; ids must equal the reference's."""
    dtype = DTYPES[case.dtype]
    logits = (jax.random.normal(jax.random.key(1), (case.rows, case.vocab), jnp.float32) * 3).astype(dtype)
    key = None if case.form == "greedy" else jax.random.key_data(jax.random.key(7)).astype(jnp.uint32)
    kw = dict(form=case.form, temperature=case.temperature, k=case.k, p=case.p, min_p=case.min_p)
    kernel = jax.jit(lambda x, key: sample(x, key, backend="gpu", interpret=interpret, **kw))
    xla = jax.jit(lambda x, key: sample_reference(x, key, **kw))
    argmax = jax.jit(lambda x: jnp.argmax(x, axis=-1))
    got, want = np.asarray(kernel(logits, key)), np.asarray(xla(logits, key))
    same = bool((got == want).all())
    programs = {
        "kernel": lambda: kernel(logits, key).block_until_ready(),
        "xla": lambda: xla(logits, key).block_until_ready(),
        "argmax": lambda: argmax(logits).block_until_ready(),
    }
    times: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(3):  # interleaved rounds, so that a slow moment of the host falls on every program alike
        for name, fn in programs.items():
            times[name].append(median_time(fn, max(1, repeats // 3)))
    t = {name: float(np.median(ts)) for name, ts in times.items()}
    cells = [_ms(t["kernel"] * 1e3), _ms(t["xla"] * 1e3), _ms(t["argmax"] * 1e3)]
    cells += [f"{t['kernel'] / t['xla']:.3f}", f"{t['kernel'] / t['argmax']:.2f}"]
    verdict = "ids equal ok" if same else f"ids differ in {int((got != want).sum())} rows FAIL"
    return f"| {case.name} | " + " | ".join(cells + [verdict]) + " |", same


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _ratio(kernel: float | None, other: float | None) -> str:
    return "n/a" if kernel is None or other is None else f"{other / kernel:.2f}"


HEADER = (
    "| case | Triton ms | Mosaic ms | XLA unfused ms | cuDNN ms | XLA / Triton | cuDNN / Triton | XLA / Mosaic "
    "| Triton max diff vs XLA | Mosaic max diff vs XLA | notes |\n|---|" + "---:|" * 7 + "---|---|---|"
)
SAMPLER_HEADER = (
    "| sampler | Pallas ms | XLA (sort-based) ms | argmax ms | Pallas / XLA | Pallas / argmax | ids vs reference |\n"
    "|---|---:|---:|---:|---:|---:|---|"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="three attention cases and two samplers")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per program (median reported)")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds after which no new case starts")
    ap.add_argument("--dry-run", action="store_true", help="print the cases and the tiles chosen for the H200")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny cases in interpret mode, no GPU needed")
    args = ap.parse_args(argv)

    if args.cpu_smoke:
        attention = [Case(32, 32, N=4, K=2, H=16, dtype="f32"), Case(1, 256, N=4, K=2, H=16, dtype="bf16"),
                     Case(64, 128, N=4, K=2, H=64, dtype="bf16")]  # fmt: skip
        samplers = [SamplerCase(8, 1000, "top_k", temperature=0.7, k=20), SamplerCase(8, 1000, "greedy")]
        device = "CPU, interpret mode (times are not GPU numbers)"
    else:
        attention, samplers = attention_cases(args.quick), sampler_cases(args.quick)
        device = "none (dry run)"
    if args.dry_run:
        print(f"jax {jax.__version__}; plan for {CHIP}; budget {args.budget:.0f} s\n")
        for case in attention:
            print(f"- {case.name}: {tiles(case)}")
        for sampler in samplers:
            print(f"- {sampler.name}: Pallas GPU sampler vs sample_reference (ids) and its XLA program (time)")
        return 0
    if not args.cpu_smoke:
        try:
            gpus = jax.devices("gpu")
        except RuntimeError as error:
            print(f"h200_kernels.py needs a CUDA GPU (pip install 'jax[cuda12]'); this host has none: {error}",
                  file=sys.stderr)  # fmt: skip
            return 2
        device = gpus[0].device_kind
        if "H200" not in device:
            print(f"warning: this is a {device}, not an H200; tiles are still the H200's", file=sys.stderr)

    print(f"jax {jax.__version__}; {device}; {args.repeats} repeats, median; tiles for {CHIP}")
    start, ok, skipped = time.perf_counter(), True, []
    # The samplers first: they are quick, and the sampling issue's numbers should not wait on the long contexts.
    for header, cases, row in ((SAMPLER_HEADER, samplers, sampler_row), (HEADER, attention, attention_row)):
        print(f"\n{header}")
        for case in cases:
            if time.perf_counter() - start > args.budget:
                skipped.append(case.name)
                continue
            try:
                line, passed = row(case, args.repeats, args.cpu_smoke)
            except Exception as error:  # one case's failure must not lose the others' rows
                first_line = str(error).splitlines()[0][:200] if str(error) else ""
                line, passed = f"| {case.name} | error: {type(error).__name__}: {first_line} |", False
            ok &= passed
            print(line, flush=True)
    for name in skipped:
        print(f"- {name}: skipped, past the {args.budget:.0f} s budget")
    print(f"\ntotal {time.perf_counter() - start:.0f} s; numerics {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
