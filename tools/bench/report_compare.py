#!/usr/bin/env python3
"""Does `hlofuse-report --compare` predict the sign and size of a change that this host measures?

    JAX_PLATFORMS=cpu python tools/bench/report_compare.py                  # every pair (a few minutes)
    JAX_PLATFORMS=cpu python tools/bench/report_compare.py --only gqa-decode --json out.json
    JAX_PLATFORMS=cpu python tools/bench/report_compare.py --small          # small shapes (the test's)

Each pair is a model change a researcher proposes (GQA 8 -> 2 KV heads at decode, vocab 128k -> 256k
under top-p, a sliding window, a soft-cap, another sampler), written as two JAX programs. Both are lowered
to StableHLO files, and the command line itself runs on them:

    hlofuse-report A.mlir --compare B.mlir --targets host --measure --json OUT [--no-fuse]

`--measure` with `--compare` compiles both programs for this CPU and times them call for call in turn (A,
B, A, B, ...), so a load that comes and goes on a shared machine slows both alike; the JSON's
`compare.measured` holds the measured CPU time of each (the median call) beside the predicted one. The
check: the predicted change B/A has the measured sign (always, where the measured change is larger than
the noise, --noise), and its size is within --tolerance of the measured B/A (|predicted / measured - 1|).
Fused rows run hlofuse's default pipeline (the CPU kernels); unfused rows model and run the plain program.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from hlofuse.report import cli  # noqa: E402

TOLERANCE = 0.25  # |predicted B/A / measured B/A - 1|
NOISE = 0.05  # a measured |B/A - 1| under this is no change: its sign is not checked


@dataclass
class Pair:
    family: str
    name: str
    a: tuple[Callable[..., Any], tuple[Any, ...]]  # the program and its argument shapes (ShapeDtypeStructs)
    b: tuple[Callable[..., Any], tuple[Any, ...]]
    fuse: bool = True


def _f32(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)


KEY = jax.ShapeDtypeStruct((2,), jnp.uint32)


def attention(causal: bool = False, window: int | None = None, softcap: float | None = None) -> Callable[..., Any]:
    """Attention as a JAX user writes it (GQA through jnp.repeat), which hlofuse fuses."""

    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        groups = q.shape[2] // k.shape[2]
        if groups > 1:
            k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
        s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.float32(np.sqrt(q.shape[-1]))
        if softcap is not None:
            s = softcap * jnp.tanh(s / softcap)
        if causal or window is not None:
            i, j = jnp.arange(q.shape[1])[:, None], jnp.arange(k.shape[1])[None, :]
            visible = j <= i if causal else jnp.ones_like(j <= i)
            if window is not None:
                visible = visible & (j > i - window)
            s = jnp.where(visible, s, -jnp.inf)
        return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s, axis=-1), v)

    return fn


def top_p(x: jax.Array, key: jax.Array) -> jax.Array:
    """Nucleus sampling (p = 0.9, temperature 0.7) in rank space, as samplers write it."""
    ordered = jnp.sort(x, axis=-1)[..., ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    cutoff = jnp.take_along_axis(ordered, jnp.sum(cumulative < 0.9, axis=-1, keepdims=True), axis=-1)
    return jax.random.categorical(jax.random.wrap_key_data(key), jnp.where(x < cutoff, -jnp.inf, x) / 0.7, axis=-1)


def greedy(x: jax.Array, key: jax.Array) -> jax.Array:
    del key
    return jnp.argmax(x, axis=-1)


def pairs(small: bool = False) -> list[Pair]:
    out = []
    # GQA: 8 -> 2 KV heads at decode (32 query heads; H 128): the K/V bytes read fall 4x.
    s, n, h = (4096, 32, 64) if small else (8192, 32, 128)
    for fuse in (True, False):
        out.append(Pair("gqa-decode", f"decode S{s} N{n} KV 8 -> 2 {'fused' if fuse else 'unfused'}",
                        (attention(), (_f32(1, 1, n, h), _f32(1, s, 8, h), _f32(1, s, 8, h))),
                        (attention(), (_f32(1, 1, n, h), _f32(1, s, 2, h), _f32(1, s, 2, h))), fuse))
    # vocab 128k -> 256k under top-p: the sampler's passes over the logits (or the sort) double.
    rows, (va, vb) = (8, (16384, 32768)) if small else (8, (131072, 262144))
    for fuse in (True, False):
        out.append(Pair("vocab-top-p", f"top-p {rows}x{va // 1024}k -> {rows}x{vb // 1024}k "
                                       f"{'fused' if fuse else 'unfused'}",
                        (top_p, (_f32(rows, va), KEY)), (top_p, (_f32(rows, vb), KEY)), fuse))
    if small:
        return out
    # A sliding window of 512 against full causal attention in a prefill of 4096 (fused: tiles skipped).
    q = (_f32(1, 4096, 8, 64),) * 3
    out.append(Pair("window", "prefill T4096 N8 causal: window 512 -> full fused", (attention(True, 512), q),
                    (attention(True), q), True))
    # A logit soft-cap of 30 added to a causal prefill of 2048.
    q = (_f32(1, 2048, 8, 64),) * 3
    out.append(Pair("softcap", "prefill T2048 N8 causal: + soft-cap 30 fused", (attention(True), q),
                    (attention(True, softcap=30.0), q), True))
    # The sampler: greedy -> top-p over 8 x 128k.
    out.append(Pair("sampler", "8x128k greedy -> top-p fused", (greedy, (_f32(8, 131072), KEY)),
                    (top_p, (_f32(8, 131072), KEY)), True))
    return out


def run_pair(pair: Pair, folder: Path, runs: int, calibrate: bool = True) -> dict[str, Any]:
    """Writes both programs as StableHLO, runs `hlofuse-report A --compare B --measure` on them and reads
    its JSON."""
    stem = "".join(c if c.isalnum() else "_" for c in pair.name)
    paths = []
    for side, (fn, shapes) in (("a", pair.a), ("b", pair.b)):
        path = folder / f"{stem}_{side}.mlir"
        path.write_text(jax.jit(fn).lower(*shapes).as_text())
        paths.append(path)
    out = folder / f"{stem}.json"
    argv = [str(paths[0]), "--compare", str(paths[1]), "--targets", "host", "--measure", "--runs", str(runs),
            "--json", str(out), "--quiet"]
    if not pair.fuse:
        argv.append("--no-fuse")
    if not calibrate:
        argv.append("--no-calibrate")
    if cli.main(argv) != 0:
        raise RuntimeError(f"hlofuse-report failed on {pair.name}: {' '.join(argv)}")
    m = json.loads(out.read_text())["compare"]["measured"]
    return {"family": pair.family, "pair": pair.name, "fused": pair.fuse, "command": "hlofuse-report " + " ".join(argv),
            **{k: m[k] for k in ("a_cpu_s", "b_cpu_s", "ratio", "predicted_a_cpu_s", "predicted_b_cpu_s",
                                 "predicted_ratio")}}


def judge(row: dict[str, Any], tolerance: float = TOLERANCE, noise: float = NOISE) -> dict[str, Any]:
    """Adds `sign_ok` (predicted and measured change agree in sign, or the measured one is noise), `size_error`
    (predicted B/A over measured B/A, less 1) and `size_ok`."""
    measured, predicted = row["ratio"], row["predicted_ratio"]
    row["noise"] = abs(measured - 1) < noise
    row["sign_ok"] = row["noise"] or (measured > 1) == (predicted > 1)
    row["size_error"] = predicted / measured - 1
    row["size_ok"] = abs(row["size_error"]) <= tolerance
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", help="these families only (gqa-decode, vocab-top-p, window, softcap, "
                                                  "sampler)")
    parser.add_argument("--small", action="store_true", help="the test's small shapes")
    parser.add_argument("--runs", type=int, default=7, help="timed calls of each program (default: 7)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help=f"allowed |predicted B/A / measured B/A - 1| (default: {TOLERANCE})")
    parser.add_argument("--json", help="write the rows as JSON")
    parser.add_argument("--no-calibrate", action="store_true", help="use the table's host fallbacks")
    options = parser.parse_args()
    rows = []
    print(f"{'pair':<48} {'meas A':>9} {'meas B':>9} {'B/A':>6} {'pred B/A':>8} {'size err':>8}  sign size")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in pairs(options.small):
            if options.only and pair.family not in options.only:
                continue
            row = judge(run_pair(pair, Path(tmp), options.runs, not options.no_calibrate), options.tolerance)
            rows.append(row)
            print(f"{row['pair']:<48} {row['a_cpu_s'] * 1e3:8.2f}m {row['b_cpu_s'] * 1e3:8.2f}m {row['ratio']:6.2f} "
                  f"{row['predicted_ratio']:8.2f} {row['size_error'] * 100:+7.0f}%  "
                  f"{'ok' if row['sign_ok'] else 'NO':<4} {'ok' if row['size_ok'] else 'NO'}", flush=True)
    if rows:
        errs = [abs(r["size_error"]) for r in rows]
        print(f"sign right in {sum(r['sign_ok'] for r in rows)}/{len(rows)} pairs; size within "
              f"{options.tolerance:.0%} in {sum(r['size_ok'] for r in rows)}/{len(rows)} "
              f"(median |error| {statistics.median(errs) * 100:.0f}%, worst {max(errs) * 100:.0f}%)")
    if options.json:
        Path(options.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["sign_ok"] for r in rows) and all(r["size_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
