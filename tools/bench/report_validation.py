#!/usr/bin/env python3
"""hlofuse-report's host model against measurements on this CPU.

    JAX_PLATFORMS=cpu python tools/bench/report_validation.py            # every program (a few minutes)
    JAX_PLATFORMS=cpu python tools/bench/report_validation.py --quick    # one of each family
    JAX_PLATFORMS=cpu python tools/bench/report_validation.py --only attention --json out.json

For each program: the report's predicted host time (hlofuse.report, target `host`, modelled fused or, for
the "unfused" rows, as XLA runs the plain program) and the CPU time it predicts, against the same jitted
program with the same arguments, --runs calls after its warm-up calls (at least 3, up to 10 or 1 s: a fresh
program's first calls run slower): the median CPU time of a call, and the
best and median wall times. Then the median and worst absolute relative error over the programs that
take more than 1 ms. The host is calibrated afresh first (--no-calibrate keeps the cached ceilings).

On a machine shared with other jobs the CPU time is the measure to check: it is what the work takes
whatever else runs (the ceilings are work per CPU-second, hlofuse.report.hardware), while a wall time
grows by however long the call waits for a core. Where XLA runs a program on one thread (this jaxlib's
CPU client does, for dots too) the uncontended wall time is the CPU time.

Families: matmuls 256-4096 (f32, and bf16 at 1024), attention prefill and decode fused and unfused (T
512-8192), softmax + sampling over 32k-256k vocabularies (greedy, temperature, top-p), big elementwise
programs, and hlofuse.demo's prefill and decode step.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from hlofuse.report import hardware, report  # noqa: E402
from hlofuse.report.measure import warm_up  # noqa: E402


@dataclass
class Program:
    family: str
    name: str
    fn: Callable[..., Any]
    make: Callable[[], tuple[Any, ...]]  # the arguments, made when the program runs (the memory is shared)
    fuse: bool = True
    kv_fill: float = 1.0
    runs: int = 5
    quick: bool = False


def _rand(key: int, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:  # noqa: ANN401
    return jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(dtype)


def matmuls() -> list[Program]:
    out = []
    for n in (256, 512, 1024, 2048, 4096):
        out.append(Program("matmul", f"matmul f32 {n}", lambda a, b: a @ b,
                           lambda n=n: (_rand(0, (n, n)), _rand(1, (n, n))), runs=3 if n == 4096 else 5,
                           quick=n == 1024))
    out.append(Program("matmul", "matmul bf16 1024", lambda a, b: a @ b,
                       lambda: (_rand(0, (1024, 1024), jnp.bfloat16), _rand(1, (1024, 1024), jnp.bfloat16))))
    out.append(Program("matmul", "mlp f32 [2048,1024]x[1024,4096] gelu", lambda x, w: jax.nn.gelu(x @ w),
                       lambda: (_rand(0, (2048, 1024)), _rand(1, (1024, 4096)))))
    return out


def attention_fn(causal: bool) -> Callable[..., jax.Array]:
    def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        groups = q.shape[2] // k.shape[2]
        if groups > 1:
            k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
        s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.float32(np.sqrt(q.shape[-1]))
        if causal:
            t, length = q.shape[1], k.shape[1]
            visible = jnp.arange(length)[None, :] <= jnp.arange(t)[:, None] + (length - t)
            s = jnp.where(visible, s, -jnp.inf)
        p = jax.nn.softmax(s, axis=-1)
        return jnp.einsum("bnts,bsnh->btnh", p, v)

    return attention


def attentions() -> list[Program]:
    out = []
    prefill = [(512, 8, 8, 64, True), (2048, 8, 2, 64, True), (8192, 1, 1, 64, True), (2048, 8, 8, 64, False)]
    for t, n, kv, h, causal in prefill:
        def args(t: int = t, n: int = n, kv: int = kv, h: int = h) -> tuple[jax.Array, ...]:
            return _rand(0, (1, t, n, h)), _rand(1, (1, t, kv, h)), _rand(2, (1, t, kv, h))

        tag = f"prefill T{t} N{n}/{kv} H{h}" + (" causal" if causal else "")
        for fuse in (True, False):
            out.append(Program("attention", f"{tag} {'fused' if fuse else 'unfused'}", attention_fn(causal), args,
                               fuse=fuse, runs=3 if t >= 8192 else 5, quick=t == 2048 and causal))
    for s, b in ((4096, 1), (16384, 1), (8192, 4)):
        def args(s: int = s, b: int = b) -> tuple[jax.Array, ...]:
            return _rand(0, (b, 1, 32, 128)), _rand(1, (b, s, 8, 128)), _rand(2, (b, s, 8, 128))

        for fuse in (True, False):
            out.append(Program("attention", f"decode B{b} S{s} N32/8 H128 {'fused' if fuse else 'unfused'}",
                               attention_fn(False), args, fuse=fuse, quick=s == 4096))
    return out


def samplers() -> list[Program]:
    out = []
    for vocab in (32768, 131072, 262144):
        def logits(vocab: int = vocab) -> tuple[jax.Array]:
            return (_rand(3, (8, vocab)) * 3,)

        def with_key(vocab: int = vocab) -> tuple[jax.Array, jax.Array]:
            return _rand(3, (8, vocab)) * 3, jax.random.key_data(jax.random.key(7))

        def greedy(x: jax.Array) -> jax.Array:
            return jnp.argmax(jax.nn.softmax(x, axis=-1), axis=-1)

        def temperature(x: jax.Array, k: jax.Array) -> jax.Array:
            return jax.random.categorical(jax.random.wrap_key_data(k), x / 0.7, axis=-1)

        def top_p(x: jax.Array, k: jax.Array) -> jax.Array:
            ordered = jnp.sort(x, axis=-1)[..., ::-1]
            cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
            cutoff = jnp.take_along_axis(ordered, jnp.sum(cumulative < 0.9, axis=-1, keepdims=True), axis=-1)
            return jax.random.categorical(jax.random.wrap_key_data(k), jnp.where(x < cutoff, -jnp.inf, x) / 0.7,
                                          axis=-1)

        for name, fn, args in (("greedy(softmax)", greedy, logits), ("temperature", temperature, with_key),
                               ("top-p", top_p, with_key)):
            for fuse in (True, False):
                out.append(Program("sampling", f"{name} 8x{vocab} {'fused' if fuse else 'unfused'}", fn, args,
                                   fuse=fuse, quick=vocab == 131072 and name == "top-p"))
    return out


def elementwise() -> list[Program]:
    def x() -> tuple[jax.Array]:
        return (_rand(4, (4096, 4096)),)

    def xy() -> tuple[jax.Array, jax.Array]:
        return _rand(4, (4096, 4096)), _rand(5, (4096, 4096))

    def layernorm(a: jax.Array) -> jax.Array:
        mean = a.mean(-1, keepdims=True)
        return (a - mean) * jax.lax.rsqrt(((a - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

    return [
        Program("elementwise", "x*y+1 f32 16M", lambda a, b: a * b + 1.0, xy, quick=True),
        Program("elementwise", "gelu(x)*y f32 16M", lambda a, b: jax.nn.gelu(a) * b, xy),
        Program("elementwise", "layernorm f32 [4096,4096]", layernorm, x),
        Program("elementwise", "softmax f32 [4096,4096]", lambda a: jax.nn.softmax(a, -1), x),
        Program("elementwise", "tanh chain x32 f32 16M", _chain, x),
    ]


def _chain(a: jax.Array) -> jax.Array:
    for _ in range(32):
        a = jnp.tanh(a) * 1.01
    return a


def demo() -> list[Program]:
    from hlofuse.demo import PRESETS, Config, Sampler, decode_step, init_params, prefill

    out = []
    sampler = Sampler()
    for size in ("small", "medium"):
        p = PRESETS[size]
        cfg = Config(layers=p["layers"], d_model=p["d_model"], heads=p["heads"], kv_heads=p["kv_heads"],
                     head_dim=p["head_dim"], vocab=p["vocab"], cache_len=p["cache_len"], dtype=jnp.float32)
        params = init_params(jax.random.key(0), cfg)
        prompt = jax.random.randint(jax.random.key(1), (1, p["prompt_len"]), 0, cfg.vocab, jnp.int32)
        key = jax.random.key_data(jax.random.key(2))

        def prefill_fn(params: Any, tokens: jax.Array, key: jax.Array, cfg: Config = cfg) -> Any:  # noqa: ANN401
            return prefill(params, tokens, key, cfg, sampler)

        def decode_fn(params: Any, token: jax.Array, cache: Any, pos: jax.Array, key: jax.Array,  # noqa: ANN401
                      cfg: Config = cfg) -> Any:
            return decode_step(params, token, cache, pos, key, cfg, sampler)

        (_, _), cache = jax.jit(prefill_fn)(params, prompt, key)
        pos = jnp.int32(p["prompt_len"])
        token = jnp.zeros((1,), jnp.int32)
        fill = (p["prompt_len"] + 1) / p["cache_len"]
        for fuse in (True, False):
            tag = "fused" if fuse else "unfused"
            out.append(Program("demo", f"demo {size} prefill T{p['prompt_len']} {tag}", prefill_fn,
                               lambda a=(params, prompt, key): a, fuse=fuse, quick=size == "small"))
            out.append(Program("demo", f"demo {size} decode step (cache {p['cache_len']}) {tag}", decode_fn,
                               lambda a=(params, token, cache, pos, key): a, fuse=fuse, kv_fill=fill,
                               quick=size == "small"))
    return out


FAMILIES = {"matmul": matmuls, "attention": attentions, "sampling": samplers, "elementwise": elementwise,
            "demo": demo}


def measure(program: Program, args: tuple[Any, ...]) -> dict[str, float]:
    options = {"hlofuse_pipeline": "default"} if program.fuse else {}
    compiled = jax.jit(program.fn, compiler_options=options).lower(*args).compile()
    warm_up(lambda: compiled(*args))  # until the first calls' slower start has passed (as --measure does)
    times, cpus = [], []
    for _ in range(program.runs):
        start, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return {"median_s": statistics.median(times), "best_s": min(times), "cpu_s": statistics.median(cpus)}


def _available_memory() -> float:
    """MemAvailable from /proc/meminfo, in bytes (a shared machine: never push it into the OOM killer)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


def errors(rows: list[dict[str, Any]], key: str, predicted: str, threshold: float = 1e-3) -> tuple[float, float, int]:
    errs = [abs(r[predicted] - r[key]) / r[key] for r in rows if r[key] > threshold]
    if not errs:
        return math.nan, math.nan, 0
    return statistics.median(errs), max(errs), len(errs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one or two programs per family")
    parser.add_argument("--only", nargs="+", choices=sorted(FAMILIES), help="these families only")
    parser.add_argument("--runs", type=int, default=None, help="timed calls per program (default: 5, 3 for big)")
    parser.add_argument("--json", help="write the rows as JSON")
    parser.add_argument("--no-calibrate", action="store_true", help="keep the cached host calibration")
    options = parser.parse_args()
    if not options.no_calibrate:
        hardware.host_calibration(refresh=True, verbose=True)  # the ceilings of the machine as it is now
    rows = []
    print(f"{'program':<50} {'pred':>9} {'pred cpu':>9} {'cpu':>9} {'err cpu':>8} {'best':>9} {'median':>9} "
          f"{'err best':>8}  bound")
    for family in options.only or FAMILIES:
        for program in FAMILIES[family]():
            if options.quick and not program.quick:
                continue
            if options.runs:
                program.runs = options.runs
            args = program.make()
            rep = report(program.fn, *args, targets="host", fuse=program.fuse, kv_fill=program.kv_fill,
                         name=program.name)
            host = rep.targets["host"]
            need = sum(a.nbytes for a in jax.tree.leaves(args)) + 2 * max(
                (r.bytes / max(r.count, 1) for r in host.regions), default=0.0)
            if need > 0.6 * _available_memory():
                print(f"{program.name:<50} skipped: needs ~{need / 2 ** 20:.0f} MiB, "
                      f"{_available_memory() / 2 ** 20:.0f} MiB available", flush=True)
                continue
            measured = measure(program, args)
            del args
            top = max(host.regions, key=lambda r: r.predicted_s) if host.regions else None
            row = {"family": family, "program": program.name, "predicted_s": host.predicted_s,
                   "predicted_cpu_s": host.predicted_cpu_s, "cpu_s": measured["cpu_s"],
                   "median_s": measured["median_s"], "best_s": measured["best_s"], "fused": program.fuse,
                   "top_region": top.name if top else "", "bound": top.bound if top else ""}
            rows.append(row)
            err_c = (row["predicted_cpu_s"] - row["cpu_s"]) / row["cpu_s"]
            err_b = (row["predicted_s"] - row["best_s"]) / row["best_s"]
            print(f"{program.name:<50} {row['predicted_s'] * 1e3:8.3f}m {row['predicted_cpu_s'] * 1e3:8.3f}m "
                  f"{row['cpu_s'] * 1e3:8.3f}m {err_c * 100:+7.0f}% {row['best_s'] * 1e3:8.3f}m "
                  f"{row['median_s'] * 1e3:8.3f}m {err_b * 100:+7.0f}%  {row['bound']}", flush=True)
    for measured, predicted, what in (("cpu_s", "predicted_cpu_s", "CPU time (median call)"),
                                      ("best_s", "predicted_s", "wall time (best call)"),
                                      ("median_s", "predicted_s", "wall time (median call)")):
        med, worst, n = errors(rows, measured, predicted)
        print(f"{what}: median |error| {med * 100:.0f}%, worst {worst * 100:.0f}% over {n} programs > 1 ms")
    if options.json:
        Path(options.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
