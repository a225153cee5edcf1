#!/usr/bin/env python3
"""Chains of filters on the CPU kernel with the stage sorts of 8688665 against this tree's, in one process.

    python tools/bench/stage_sorts_ab.py sequence_chain_top_k_top_p_min_p chain_flax_top_p_then_min_p_of_probs

Each sampler is a catalogue variant (test/python/sampling_variants.py) at 1 x --vocab, compiled twice through the
default pipeline: with this tree's kernel sorts (a filtered row's fill placed by one pass, int32 keys by
`hlofuse_sample_sort_integers`, a top-k above `TOP_K_BY_SELECTION_UP_TO` by the descending sort), and with those of
8688665 (its library's `hlofuse_sample_sort` built by tools/bench/sampling_kernel_ab.py and registered under another
name, int32 keys by two 16-bit passes of it, every top-k by selection). The ids are checked equal, then both are
timed interleaved: medians of --iters calls in milliseconds and their ratio.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from sampling_kernel_ab import _build

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test" / "python"))
import sampling_variants  # noqa: E402

from hlofuse.kernels.cpu import sampling  # noqa: E402

BASE = "8688665"
BASE_SORT = "hlofuse_ab_base_stage_sort"
OPTIONS = {"hlofuse_pipeline": "default", "hlofuse_strict": True}


def _base_order(keys: jax.Array) -> jax.Array:
    """The stable order of `keys` as 8688665's stages took it: int32 keys by their low, then high 16 bits."""
    if keys.dtype != jnp.int32:
        return sampling._sorted_by(BASE_SORT, keys)[1]
    low = sampling._sorted_by(BASE_SORT, (keys & 0xFFFF).astype(jnp.float32))[1]
    high = jnp.take_along_axis((keys >> 16) + 0x8000, low, axis=-1).astype(jnp.float32)
    return jnp.take_along_axis(low, sampling._sorted_by(BASE_SORT, high)[1], axis=-1)


def _compiled(fn: Any, *args: Any, base: bool) -> Any:  # noqa: ANN401
    """fn through the default pipeline, with the base's stage sorts where `base`."""
    jax.clear_caches()  # (or the second compile is the first's)
    saved = sampling._stable_order_by_kernel, sampling.TOP_K_BY_SELECTION_UP_TO, sampling.SORT_TARGET
    if base:
        sampling._stable_order_by_kernel, sampling.TOP_K_BY_SELECTION_UP_TO = _base_order, sys.maxsize
        sampling.SORT_TARGET = BASE_SORT
    try:
        return jax.jit(fn, compiler_options=OPTIONS).lower(*args).compile()
    finally:
        sampling._stable_order_by_kernel, sampling.TOP_K_BY_SELECTION_UP_TO, sampling.SORT_TARGET = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samplers", nargs="+", help="catalogue variants (sampling_variants.VARIANTS names)")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--iters", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        library = ctypes.cdll.LoadLibrary(str(_build("base", BASE, Path(tmp))))
        jax.ffi.register_ffi_target(BASE_SORT, jax.ffi.pycapsule(library.hlofuse_sample_sort), platform="cpu")
        x = jax.random.normal(jax.random.key(0), (1, args.vocab)) * 3
        key = np.array([3, 41], np.uint32)
        print(f"| sampler | {BASE} ms | tree ms | tree / {BASE} |")
        print("|---|---:|---:|---:|")
        for name in args.samplers:
            variant = next(v for v in sampling_variants.VARIANTS if v.name == name)
            logits = x[0] if len(variant.shape) == 1 else x
            runs = {"base": _compiled(variant.fn, logits, key, base=True),
                    "tree": _compiled(variant.fn, logits, key, base=False)}
            if BASE_SORT not in runs["base"].as_text():
                sys.exit(f"{name}: the base's sorts were not compiled in (no stage sorts by the kernel?)")
            if not np.array_equal(np.asarray(runs["base"](logits, key)), np.asarray(runs["tree"](logits, key))):
                sys.exit(f"{name}: the two give other ids")
            times: dict[str, list[float]] = {run: [] for run in runs}
            for _ in range(args.iters):
                for run, compiled in runs.items():
                    start = time.perf_counter()
                    jax.block_until_ready(compiled(logits, key))
                    times[run].append(time.perf_counter() - start)
            base, tree = (statistics.median(times[run]) * 1e3 for run in ("base", "tree"))
            print(f"| {name} | {base:.3f} | {tree:.3f} | {tree / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
