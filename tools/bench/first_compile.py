#!/usr/bin/env python3
"""The first compile of a sampler in a fresh process, with hlofuse's default pipeline and without.

    python tools/bench/first_compile.py --samplers jetstream_top_p top_k_then_top_p --batch 4 --vocab 32000
    python tools/bench/first_compile.py --lower-all     # and with every candidate's template lowered

Each measurement is a new process that imports JAX, lowers a sampler of the catalogue (test/python/
sampling_variants.py) for (batch, vocab) f32 logits, and times `.compile()` alone, once with
`compiler_options={"hlofuse_pipeline": "default"}` and HLOFUSE_CACHE_DIR=off (every sampling template traced and
lowered, as on a machine that never compiled this shape) and once without hlofuse; the two alternate, --repeats
times. Prints the median seconds of each and their ratio. The template cache on disk (hlofuse.template_cache) takes
most of the first compile away for later processes of the same install: tools/bench/template_cache.py measures it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD = """
import sys, time
sys.path.insert(0, {variants!r})
import jax, jax.numpy as jnp
import sampling_variants
if {lower_all}:  # every candidate's template lowered, none skipped by what its jaxpr implies
    import hlofuse.passes.fuse_sampling as fuse_sampling
    fuse_sampling._required_ops = lambda *args: frozenset()
fn = getattr(sampling_variants, {sampler!r})
lowered = jax.jit(fn).lower(jax.ShapeDtypeStruct(({batch}, {vocab}), jnp.float32),
                            jax.ShapeDtypeStruct((2,), jnp.uint32))
options = {{"hlofuse_pipeline": "default"}} if {fused} else {{}}
start = time.perf_counter()
lowered.compile(compiler_options=options) if options else lowered.compile()
print(time.perf_counter() - start)
"""


def _seconds(sampler: str, batch: int, vocab: int, fused: bool, lower_all: bool = False) -> float:
    code = CHILD.format(variants=str(REPO / "test" / "python"), sampler=sampler, batch=batch, vocab=vocab,
                        fused=fused, lower_all=lower_all)
    env = {**os.environ, "HLOFUSE_CACHE_DIR": "off", "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samplers", nargs="+", default=["jetstream_top_p"],
                        help="names of test/python/sampling_variants.py's functions (default: %(default)s)")
    parser.add_argument("--batch", type=int, nargs="+", default=[4])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lower-all", action="store_true",
                        help="also time hlofuse with every candidate's template lowered (none skipped for an op "
                             "its jaxpr implies and the program lacks: hlofuse.ir.required_ops), interleaved")
    args = parser.parse_args()
    modes = [(True, False), (False, False)] + ([(True, True)] if args.lower_all else [])
    extra = " | lowering all s | skip / all" if args.lower_all else ""
    print(f"| sampler | B | V | hlofuse s | XLA alone s | ratio{extra} |")
    print("|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if args.lower_all else ""))
    for sampler in args.samplers:
        for batch in args.batch:
            for vocab in args.vocab:
                times: dict[tuple[bool, bool], list[float]] = {mode: [] for mode in modes}
                for _ in range(args.repeats):
                    for mode in modes:
                        times[mode].append(_seconds(sampler, batch, vocab, *mode))
                median = {mode: statistics.median(t) for mode, t in times.items()}
                with_hlofuse, alone = median[(True, False)], median[(False, False)]
                row = (f"| {sampler} | {batch} | {vocab} | {with_hlofuse:.2f} | {alone:.2f} | "
                       f"{with_hlofuse / alone:.1f}x |")
                if args.lower_all:
                    every = median[(True, True)]
                    row += f" {every:.2f} | {with_hlofuse / every:.2f}x |"
                print(row, flush=True)


if __name__ == "__main__":
    main()
