#!/usr/bin/env python3
"""The CPU sampling kernel of a git revision against the working tree's, side by side in one process.

A kernel change is measured against the code it replaces, not against a number from another day: this builds
python/hlofuse/kernels/cpu/sampling.cc (and its sampling_simd.h) of `--base` and of the working tree into two
libraries with the same flags, registers under its own FFI name each one's nucleus band
(`hlofuse_sample_nucleus_band`, the certified nucleus's pass over the row: max, exp, the mass by bin, the cut's
search), with --form its whole draw (`hlofuse_sample` with that form), or with --sort its ascending radix sort of
the row (`hlofuse_sample_sort`: values and ids), checks that both give the same result to the bit, and times them
interleaved, with XLA's argmax of the same logits beside them:

    python tools/bench/sampling_kernel_ab.py                          # HEAD against the working tree
    python tools/bench/sampling_kernel_ab.py --base HEAD~3 --batch 1 8 --vocab 128256 262144
    python tools/bench/sampling_kernel_ab.py --form temperature --temperature 0.7
    python tools/bench/sampling_kernel_ab.py --sort
    python tools/bench/sampling_kernel_ab.py --sort --kept 40          # a row a top-k 40 left

Times are medians of --iters interleaved calls in milliseconds; on 2 shared cores the ratio is the number to read.
Needs g++ and jaxlib's FFI headers (installed with jax).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KERNEL_DIR = "python/hlofuse/kernels/cpu"
SOURCES = ("sampling.cc", "sampling_simd.h")
# The flags CMake builds the kernel library with (python/hlofuse/kernels/cpu/CMakeLists.txt, a Release build).
FLAGS = ("-O3", "-DNDEBUG", "-std=gnu++17", "-fPIC", "-shared", "-fvisibility=hidden", "-fvisibility-inlines-hidden",
         "-fno-math-errno")


def _build(name: str, revision: str | None, out: Path) -> Path:
    """sampling.cc of `revision` (None: the working tree) built into out/name/lib.so."""
    source = out / name
    source.mkdir()
    for file in SOURCES:
        path = f"{KERNEL_DIR}/{file}"
        text = (ROOT / path).read_text() if revision is None else subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{revision}:{path}"], check=True, capture_output=True, text=True).stdout
        (source / file).write_text(text)
    library = source / "lib.so"
    include = Path(jaxlib.__file__).parent / "include"
    print(f"building {name} ({revision or 'working tree'})", file=sys.stderr, flush=True)
    subprocess.run(["g++", *FLAGS, f"-I{include}", "-o", str(library), str(source / "sampling.cc")], check=True,
                   capture_output=True)
    return library


def _band(target: str, p: float) -> object:
    def band(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = [jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32)] * 2
        return jax.ffi.ffi_call(target, out, vmap_method="sequential")(x, p=np.float64(p), from_below=False,
                                                                         by_place=False)

    return jax.jit(band)


def _draw(target: str, form: str, temperature: float, p: float, k: int) -> object:
    from hlofuse.kernels.cpu import sampling

    code = {**sampling.FORM_CODES, **sampling.KERNEL_FORM_CODES}[form]

    def draw(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        rows = x.shape[0]
        out = [jax.ShapeDtypeStruct((rows,), jnp.int32), jax.ShapeDtypeStruct((rows,), jnp.float32)]
        keys = jnp.broadcast_to(jnp.array([0, 42], jnp.uint32), (rows, 2))
        row_ids = jnp.arange(rows, dtype=jnp.int32)
        return tuple(jax.ffi.ffi_call(target, out, vmap_method="sequential")(
            x, keys, row_ids, form=np.int64(code), temperature=np.float32(temperature), k=np.int64(k),
            p=np.float32(p), min_p=np.float32(0), vocab_total=np.int64(0)))

    return jax.jit(draw)


def _sort(target: str) -> object:
    def sort(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = [jax.ShapeDtypeStruct(x.shape, jnp.float32), jax.ShapeDtypeStruct(x.shape, jnp.int32)]
        return jax.ffi.ffi_call(target, out, vmap_method="sequential")(x)

    return jax.jit(sort)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="the git revision to compare against (default HEAD)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--vocab", type=int, nargs="+", default=[128256, 262144])
    parser.add_argument("--scale", type=float, default=3.0, help="the logits' spread: scale x N(0, 1)")
    parser.add_argument("--p", type=float, default=0.9)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--form", help="time the whole draw of this kernel form (temperature, top_p_mask, "
                        "top_p_mask_log_prob, ...; sampling.py's form codes) instead of the nucleus band")
    parser.add_argument("--temperature", type=float, default=1.0, help="the draw's temperature (with --form)")
    parser.add_argument("--k", type=int, default=50, help="the top-k forms' k (with --form; Hugging Face's default)")
    parser.add_argument("--sort", action="store_true", help="time the ascending radix sort of the row instead")
    parser.add_argument("--kept", type=int, help="with --sort: the row as a filter leaves it, its top KEPT logits "
                        "and -inf elsewhere (what a stage after a top-k sorts)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        fns = {}
        for name, revision in (("base", args.base), ("tree", None)):
            library = ctypes.cdll.LoadLibrary(str(_build(name, revision, Path(tmp))))
            if args.sort:
                target = f"hlofuse_ab_{name}_sort"
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(library.hlofuse_sample_sort), platform="cpu")
                fns[name] = _sort(target)
            elif args.form is None:
                target = f"hlofuse_ab_{name}_nucleus_band"
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(library.hlofuse_sample_nucleus_band),
                                            platform="cpu")
                fns[name] = _band(target, args.p)
            else:
                target = f"hlofuse_ab_{name}_sample"
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(library.hlofuse_sample), platform="cpu")
                fns[name] = _draw(target, args.form, args.temperature, args.p, args.k)
        fns["argmax"] = jax.jit(lambda x: jnp.argmax(x, -1))

        print(f"| B | V | {args.base} ms | working tree ms | argmax ms | tree / {args.base} | tree / argmax |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for batch in args.batch:
            for vocab in args.vocab:
                x = jax.random.normal(jax.random.key(0), (batch, vocab)) * args.scale
                if args.kept is not None:
                    x = jnp.where(x >= jax.lax.top_k(x, args.kept)[0][:, -1:], x, -jnp.inf)
                outs = {name: jax.block_until_ready(f(x)) for name, f in fns.items()}
                for a, b in zip(outs["base"], outs["tree"], strict=True):
                    if not np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True):
                        sys.exit(f"{batch}x{vocab}: the two builds' results differ")
                times: dict[str, list[float]] = {name: [] for name in fns}
                for _ in range(args.iters):
                    for name, f in fns.items():
                        start = time.perf_counter()
                        jax.block_until_ready(f(x))
                        times[name].append(time.perf_counter() - start)
                ms = {name: float(np.median(t)) * 1e3 for name, t in times.items()}
                print(f"| {batch} | {vocab} | {ms['base']:.3f} | {ms['tree']:.3f} | {ms['argmax']:.3f} | "
                      f"{ms['tree'] / ms['base']:.2f}x | {ms['tree'] / ms['argmax']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
