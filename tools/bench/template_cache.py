#!/usr/bin/env python3
"""The sampling pass's first run in a fresh process, with its templates lowered or read from disk.

    python tools/bench/template_cache.py --repeats 3 \
        test/fixtures/samplers/gemma_3_1_top_p.mlir test/fixtures/samplers/hf_sample_top_k_top_p_min_p.mlir

Runs `hlofuse-opt --hlofuse-prepare --hlofuse-fuse-sampling` on each module in a new process, three ways,
interleaved: with the cache off (HLOFUSE_CACHE_DIR=off: every template lowered), with an empty cache (lowered and
written), and with the cache the previous run wrote (read back). Prints the median wall seconds of each (the
process's start and JAX's import included), the ratio read / off, and how many templates the pass lowered (the
texts the empty cache holds after one run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run(module: Path, cache: str) -> float:
    env = {**os.environ, "HLOFUSE_CACHE_DIR": cache, "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-m", "hlofuse.tools.opt", str(module), "--hlofuse-prepare", "--hlofuse-fuse-sampling",
               "-o", os.devnull]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="+", type=Path, help="StableHLO modules with a sampler (.mlir)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'module':<40} {'off':>8} {'empty':>8} {'read':>8} {'read/off':>9} {'lowered':>8}")
    for module in args.modules:
        times: dict[str, list[float]] = {"off": [], "empty": [], "read": []}
        lowered = 0
        for _ in range(args.repeats):
            directory = tempfile.mkdtemp(prefix="hlofuse-template-cache-")
            try:
                times["off"].append(_run(module, "off"))
                times["empty"].append(_run(module, directory))
                # (not the ops each writing requires, kept beside the texts: `fuse_sampling._required_ops`)
                lowered = sum(1 for path in Path(directory).glob("*/*.mlir") if not path.name.startswith("required-"))
                times["read"].append(_run(module, directory))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
        medians = {name: statistics.median(values) for name, values in times.items()}
        print(f"{module.name:<40} {medians['off']:8.2f} {medians['empty']:8.2f} {medians['read']:8.2f} "
              f"{medians['read'] / medians['off']:9.2f}x {lowered:8d}")


if __name__ == "__main__":
    main()
