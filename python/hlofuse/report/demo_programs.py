"""The demo model's programs (hlofuse.demo) as StableHLO files, for hlofuse-report to read.

    python -m hlofuse.report.demo_programs OUT_DIR [--size small|medium] [--kv-heads N] [--vocab V]
                                            [--sampler NAME] [--batch B] [--dtype f32|bf16]

writes OUT_DIR/prefill.mlir and OUT_DIR/decode_step.mlir: the demo's prefill over its prompt and one
decode step against its KV cache, lowered (for the CPU, as jax.jit does here) at the preset's sizes with
the overrides given, from abstract shapes (nothing is initialised or run). A model change a researcher
proposes is then two directories and one `hlofuse-report A --compare B`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def lower_demo(size: str = "small", *, sampler: str = "greedy", dtype: str = "f32",
               **overrides: int) -> dict[str, str]:
    """{"prefill": text, "decode_step": text}: the demo's two programs as StableHLO text."""
    import jax
    import jax.numpy as jnp

    from hlofuse import demo

    preset = dict(demo.PRESETS[size])
    preset.update({k: v for k, v in overrides.items() if v is not None})
    cfg = demo.Config(layers=preset["layers"], d_model=preset["d_model"], heads=preset["heads"],
                      kv_heads=preset["kv_heads"], head_dim=preset["head_dim"], vocab=preset["vocab"],
                      cache_len=preset["cache_len"], dtype=jnp.bfloat16 if dtype == "bf16" else jnp.float32)
    if cfg.heads % cfg.kv_heads:
        raise ValueError(f"--kv-heads {cfg.kv_heads} does not divide the {cfg.heads} query heads")
    chosen = demo.Sampler(name=sampler)
    params = jax.eval_shape(lambda k: demo.init_params(k, cfg), jax.random.key(0))
    b = preset["batch"]
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    prompt = jax.ShapeDtypeStruct((b, preset["prompt_len"]), jnp.int32)
    cache_shape = (cfg.layers, b, cfg.cache_len, cfg.kv_heads, cfg.head_dim)
    cache = (jax.ShapeDtypeStruct(cache_shape, cfg.dtype),) * 2

    def prefill(params: Any, prompt: Any, key: Any) -> Any:  # noqa: ANN401
        return demo.prefill(params, prompt, key, cfg, chosen)

    def decode_step(params: Any, token: Any, cache: Any, pos: Any, key: Any) -> Any:  # noqa: ANN401
        return demo.decode_step(params, token, cache, pos, key, cfg, chosen)

    token = jax.ShapeDtypeStruct((b,), jnp.int32)
    pos = jax.ShapeDtypeStruct((), jnp.int32)
    return {"prefill": jax.jit(prefill).lower(params, prompt, key).as_text(),
            "decode_step": jax.jit(decode_step).lower(params, token, cache, pos, key).as_text()}


def main(argv: Sequence[str] | None = None) -> int:
    from hlofuse import demo

    parser = argparse.ArgumentParser(prog="python -m hlofuse.report.demo_programs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the folder to write prefill.mlir and decode_step.mlir into (made if missing)")
    parser.add_argument("--size", choices=sorted(demo.PRESETS), default="small")
    for flag in ("layers", "d-model", "heads", "kv-heads", "head-dim", "vocab", "prompt-len", "batch", "cache-len"):
        parser.add_argument(f"--{flag}", type=int, help="(default: the preset's)")
    parser.add_argument("--sampler", choices=demo.SAMPLERS, default="greedy")
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    args = parser.parse_args(argv)
    overrides = {k: getattr(args, k) for k in ("layers", "d_model", "heads", "kv_heads", "head_dim", "vocab",
                                                "prompt_len", "batch", "cache_len")}
    try:
        texts = lower_demo(args.size, sampler=args.sampler, dtype=args.dtype, **overrides)
    except ValueError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (out / f"{name}.mlir").write_text(text)
        print(out / f"{name}.mlir")
    return 0


if __name__ == "__main__":
    sys.exit(main())
