"""The main job: generate tokens with a small Llama-style decoder, jitted with and without hlofuse.

The model has random weights: token embedding, then pre-norm decoder layers (RMSNorm, grouped-query
attention with rotary position embeddings, a SwiGLU MLP), a final norm and an LM head. Generation
runs a prefill over the prompt and then one decode step per new token, with a KV cache of --cache-len
slots per layer, written with `jax.lax.dynamic_update_slice`, and the sampler --sampler names (greedy
by default; temperature, top-k, top-p, top-k then top-p and min-p written as JetStream, MaxText and
keras-hub write them, drawing with `jax.random.categorical` from a key folded with the position).
Each step attends over the whole cache and masks the unwritten slots with
`jax.nn.dot_product_attention(..., key_value_seq_lengths=...)`. In the decode step hlofuse reads that
mask as the composite's kv_lengths, so the CPU kernel reads only the valid prefix of the cache; in
the prefill (causal, at position 0) the causal bound already keeps the kernel to the prompt.

Both programs (prefill and decode step) are jitted twice: plain, and with
`compiler_options={"hlofuse_pipeline": "default"}`. The two generations run in lockstep (one plain
step, then one hlofuse step), so a noisy machine slows both alike. The demo prints the prefill time,
the median decode step time (per-token latency) and the speed-up, what hlofuse fused and lowered,
and whether the two generations produced the same tokens. The exit code is 1 if the tokens differ
(unless they part at a near-tie of the top two scores the sampler compares, within the dtype's
rounding: see `compare_tokens`), if some attention site of either program was not fused, or if the
sampler was not fused.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import numpy as np

import hlofuse
from hlofuse import pipeline
from hlofuse.jax import HlofuseFallbackWarning

Params = dict[str, Any]
Cache = tuple[jax.Array, jax.Array]  # k, v: (layers, B, S, K, H) each
Step = tuple[jax.Array, jax.Array]  # what a program returns besides the cache: token (B,) i32, logits (B, V)
Sample = tuple[np.ndarray, np.ndarray, np.ndarray]  # token (B,), top-2 score gap (B,), max |score| (B,)

PRESETS: dict[str, dict[str, int]] = {
    # finishes in well under a minute on 2 cores
    "small": dict(layers=4, d_model=512, heads=8, kv_heads=2, head_dim=64, vocab=4096, prompt_len=128,
                  new_tokens=32, batch=1, cache_len=1024),
    # a 2k cache: the decode step's attention is where the time goes, and the kernel reads only the prefix
    "medium": dict(layers=4, d_model=1024, heads=16, kv_heads=4, head_dim=64, vocab=8192, prompt_len=512,
                   new_tokens=64, batch=1, cache_len=2048),
}


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    cache_len: int
    dtype: Any
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def ffn_dim(self) -> int:
        return 256 * ((8 * self.d_model // 3 + 255) // 256)  # Llama's 2/3 * 4d, rounded up


# --------------------------------------------------------------------------------------------------
# The model, written as a JAX user would write it.


def init_params(key: jax.Array, cfg: Config) -> Params:
    """Random weights with fan-in scaling (so activations stay O(1) through the layers)."""

    def dense(k: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        return (jax.random.normal(k, shape, jnp.float32) / np.sqrt(shape[-2])).astype(cfg.dtype)

    d, n, kv, h, f = cfg.d_model, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn_dim
    keys = iter(jax.random.split(key, 2 + 7 * cfg.layers))
    layers = []
    for _ in range(cfg.layers):
        layers.append({
            "attn_norm": jnp.ones((d,), cfg.dtype),
            "wq": dense(next(keys), (d, n * h)),
            "wk": dense(next(keys), (d, kv * h)),
            "wv": dense(next(keys), (d, kv * h)),
            "wo": dense(next(keys), (n * h, d)),
            "mlp_norm": jnp.ones((d,), cfg.dtype),
            "w_gate": dense(next(keys), (d, f)),
            "w_up": dense(next(keys), (d, f)),
            "w_down": dense(next(keys), (f, d)),
        })
    return {
        "embed": jax.random.normal(next(keys), (cfg.vocab, d), jnp.float32).astype(cfg.dtype),
        "layers": layers,
        "final_norm": jnp.ones((d,), cfg.dtype),
        "lm_head": dense(next(keys), (d, cfg.vocab)),
    }


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * weight.astype(jnp.float32)).astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, base: float) -> jax.Array:
    """Rotary embedding (rotate-half form) of x (B, T, heads, H) at positions (B, T)."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[:, :, None, None].astype(jnp.float32) * freqs  # (B, T, 1, half)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def decoder(params: Params, tokens: jax.Array, cache: Cache, pos: jax.Array, cfg: Config,
            *, causal: bool) -> tuple[jax.Array, Cache]:
    """Runs tokens (B, T) at cache positions pos..pos+T-1; returns the last position's logits and the cache.

    Every layer writes its new keys and values into the cache, then attends over all S slots of it,
    with `key_value_seq_lengths = pos + T` hiding the slots not written yet. `causal` adds the causal
    mask among the T new tokens (jax.nn aligns it top-left, which is right for a prefill at pos 0).
    """
    b, t = tokens.shape
    n, kv, h = cfg.heads, cfg.kv_heads, cfg.head_dim
    positions = pos + jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    lengths = jnp.full((b,), pos + t, jnp.int32)
    k_cache, v_cache = cache
    x = params["embed"][tokens]
    for i, layer in enumerate(params["layers"]):
        y = rms_norm(x, layer["attn_norm"], cfg.norm_eps)
        q = rope((y @ layer["wq"]).reshape(b, t, n, h), positions, cfg.rope_base)
        k = rope((y @ layer["wk"]).reshape(b, t, kv, h), positions, cfg.rope_base)
        v = (y @ layer["wv"]).reshape(b, t, kv, h)
        k_cache = jax.lax.dynamic_update_slice(k_cache, k[None], (i, 0, pos, 0, 0))
        v_cache = jax.lax.dynamic_update_slice(v_cache, v[None], (i, 0, pos, 0, 0))
        attn = jax.nn.dot_product_attention(q, k_cache[i], v_cache[i], is_causal=causal,
                                            key_value_seq_lengths=lengths)
        x = x + attn.reshape(b, t, n * h) @ layer["wo"]
        y = rms_norm(x, layer["mlp_norm"], cfg.norm_eps)
        x = x + (jax.nn.silu(y @ layer["w_gate"]) * (y @ layer["w_up"])) @ layer["w_down"]
    x = rms_norm(x[:, -1], params["final_norm"], cfg.norm_eps)
    logits = jnp.dot(x, params["lm_head"], preferred_element_type=jnp.float32)
    return logits, (k_cache, v_cache)


SAMPLERS = ("greedy", "temperature", "top-k", "top-p", "top-k-top-p", "min-p")


@dataclasses.dataclass(frozen=True)
class Sampler:
    """A token sampler as serving stacks write it: logits in f32, then the scores `jax.random.categorical`
    draws from (argmax for greedy), mapped back through the ids when it draws among the top k."""

    name: str = "greedy"
    temperature: float = 0.7
    top_k: int = 50
    top_p: float = 0.9
    min_p: float = 0.05

    @property
    def stochastic(self) -> bool:
        return self.name != "greedy"

    def describe(self) -> str:
        params = {"temperature": f"T={self.temperature}", "top-k": f"T={self.temperature} k={self.top_k}",
                  "top-p": f"T={self.temperature} p={self.top_p}",
                  "top-k-top-p": f"T={self.temperature} k={self.top_k} p={self.top_p}",
                  "min-p": f"T={self.temperature} min_p={self.min_p}"}
        return f"{self.name} {params[self.name]}" if self.name in params else self.name

    def scores(self, logits: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        """The scores the draw compares (before noise), and the vocabulary ids of their positions (None:
        position = id)."""
        x = logits.astype(jnp.float32)
        t = self.temperature
        if self.name == "greedy":
            return x, None
        if self.name == "temperature":
            return x / t, None
        if self.name == "top-k":  # JetStream / gemma: categorical over the top k, ids mapped back
            values, ids = jax.lax.top_k(x, self.top_k)
            return values / t, ids
        if self.name == "top-k-top-p":
            x = jnp.where(x < jax.lax.top_k(x, self.top_k)[0][..., -1:], -jnp.inf, x)
        if self.name in ("top-p", "top-k-top-p"):  # JetStream / MaxText nucleus
            ordered = jnp.sort(x, axis=-1)[..., ::-1]
            cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
            cutoff = jnp.take_along_axis(ordered, jnp.sum(cumulative < self.top_p, axis=-1, keepdims=True), axis=-1)
            return jnp.where(x < cutoff, -jnp.inf, x) / t, None
        if self.name == "min-p":  # keep tokens at least min_p times as likely as the likeliest
            scaled = x / t
            probs = jax.nn.softmax(scaled, axis=-1)
            return jnp.where(probs >= self.min_p * jnp.max(probs, axis=-1, keepdims=True), scaled, -jnp.inf), None
        raise ValueError(f"unknown sampler '{self.name}' (one of {', '.join(SAMPLERS)})")

    def __call__(self, logits: jax.Array, key: jax.Array) -> jax.Array:  # key: (2,) uint32 key data
        scores, ids = self.scores(logits)
        if not self.stochastic:
            return jnp.argmax(scores, axis=-1).astype(jnp.int32)
        drawn = jax.random.categorical(jax.random.wrap_key_data(key), scores, axis=-1)
        if ids is not None:
            drawn = jnp.take_along_axis(ids, drawn[..., None], axis=-1)[..., 0]
        return drawn.astype(jnp.int32)

    def margins(self, logits: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The top-2 gap of what the draw's argmax compares (scores plus the same noise) and its largest
        finite magnitude: how close the choice was. Computed outside the timed programs."""
        scores, _ = self.scores(logits)
        if self.stochastic:
            scores = scores + jax.random.gumbel(jax.random.wrap_key_data(key), scores.shape, scores.dtype)
        top2 = jax.lax.top_k(scores, 2)[0]
        finite = jnp.where(jnp.isfinite(scores), jnp.abs(scores), 0)
        return top2[:, 0] - top2[:, 1], jnp.max(finite, axis=-1)


def prefill(params: Params, prompt: jax.Array, key: jax.Array, cfg: Config, sampler: Sampler) -> tuple[Step, Cache]:
    """Fills a fresh cache with the prompt (B, T); returns the first generated token (B,), its logits and
    the cache."""
    shape = (cfg.layers, prompt.shape[0], cfg.cache_len, cfg.kv_heads, cfg.head_dim)
    cache = (jnp.zeros(shape, cfg.dtype), jnp.zeros(shape, cfg.dtype))
    logits, cache = decoder(params, prompt, cache, jnp.int32(0), cfg, causal=True)
    return (sampler(logits, key), logits), cache


def decode_step(params: Params, token: jax.Array, cache: Cache, pos: jax.Array, key: jax.Array,
                cfg: Config, sampler: Sampler) -> tuple[Step, Cache]:
    """Feeds the token (B,) at cache position pos; returns the next token, its logits and the cache."""
    logits, cache = decoder(params, token[:, None], cache, pos, cfg, causal=False)
    return (sampler(logits, key), logits), cache


# --------------------------------------------------------------------------------------------------
# Driver.


class Progress:
    """A one-line progress bar on a terminal stream; silent when disabled."""

    def __init__(self, total: int, label: str, *, enabled: bool, stream: TextIO = sys.stderr) -> None:
        self.total, self.label, self.enabled, self.stream = total, label, enabled, stream
        self.done = 0
        self.start = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        width = 30
        filled = width * self.done // max(self.total, 1)
        elapsed = time.perf_counter() - self.start
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                          f"{self.done}/{self.total} {elapsed:5.1f}s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


@dataclasses.dataclass
class Variant:
    """One way of compiling the two programs, and what it measured."""

    name: str
    prefill: Callable[..., Any]
    decode: Callable[..., Any]
    stats: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    compile_s: float = 0.0
    prefill_ms: list[float] = dataclasses.field(default_factory=list)
    decode_ms: list[float] = dataclasses.field(default_factory=list)
    samples: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)
    cache: Cache | None = None

    def record(self, sample: Sample) -> None:
        token, gap, scale = sample
        self.samples.append((np.asarray(token), np.asarray(gap), np.asarray(scale)))

    def tokens(self) -> np.ndarray:
        return np.stack([s[0] for s in self.samples], axis=1)  # (B, new_tokens)


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:  # noqa: ANN401
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, (time.perf_counter() - start) * 1e3


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


def compare_tokens(plain: Variant, fused: Variant, dtype: Any) -> tuple[bool, str]:  # noqa: ANN401
    """Whether the two generations agree, and a line saying so.

    Identical tokens agree. Otherwise the generations must be identical up to the first difference,
    and there the plain model's top-2 scores must be a near-tie: closer than the rounding of `dtype`
    can move them (4 units of roundoff of the largest |score|). The scores are what the sampler's
    argmax compares: the logits for greedy, the kept logits / T plus the Gumbel noise of the step's key
    for the stochastic samplers (`Sampler.margins`). Past that token the two continue from different
    prefixes, so the rest is not compared. With f32 this tolerance is about 5e-7 relative, so a
    difference there almost always means a wrong result.
    """
    a, b = plain.tokens(), fused.tokens()
    if np.array_equal(a, b):
        return True, f"tokens identical: yes ({a.size} tokens)"
    step = int(np.argmax((a != b).any(axis=0)))
    row = int(np.argmax(a[:, step] != b[:, step]))
    gap, scale = (float(x[row]) for x in plain.samples[step][1:])
    tol = 4 * float(jnp.finfo(dtype).eps) * scale
    where = f"first difference at new token {step} of row {row}: plain {a[row, step]}, hlofuse {b[row, step]}"
    if gap <= tol:
        return True, (f"tokens identical: up to a near-tie ({where}; plain's top-2 scores differ by {gap:.3g}, "
                      f"within {dtype_name(dtype)} rounding {tol:.3g}, so either token is right)")
    return False, f"tokens identical: NO ({where}; plain's top-2 scores differ by {gap:.3g} > tolerance {tol:.3g})"


def dtype_name(dtype: Any) -> str:  # noqa: ANN401
    return "bf16" if dtype == jnp.bfloat16 else "f32"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hlofuse.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(PRESETS), default="small",
                        help="preset sizes; the flags below override single values (default: %(default)s)")
    presets = "; ".join(f"{name}: " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in preset.items())
                        for name, preset in PRESETS.items())
    sizes = parser.add_argument_group("model and generation sizes", f"default: the preset's ({presets})")
    sizes.add_argument("--layers", type=int)
    sizes.add_argument("--d-model", type=int)
    sizes.add_argument("--heads", type=int, help="query heads")
    sizes.add_argument("--kv-heads", type=int, help="key/value heads (GQA: divides --heads)")
    sizes.add_argument("--head-dim", type=int)
    sizes.add_argument("--vocab", type=int)
    sizes.add_argument("--prompt-len", type=int)
    sizes.add_argument("--new-tokens", type=int, help="tokens generated: 1 from the prefill, the rest decoded")
    sizes.add_argument("--batch", type=int)
    sizes.add_argument("--cache-len", type=int, help="KV cache slots (>= prompt-len + new-tokens - 1)")
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32", help="weights and activations")
    parser.add_argument("--seed", type=int, default=0, help="weights and prompt (default: %(default)s)")
    parser.add_argument("--prefill-repeats", type=int, default=3,
                        help="timed prefill runs per variant, median reported (default: %(default)s)")
    sampling = parser.add_argument_group("sampling", "the same key for both programs: a fused sampler must draw "
                                         "the same tokens")
    sampling.add_argument("--sampler", choices=SAMPLERS, default="greedy", help="(default: %(default)s)")
    sampling.add_argument("--temperature", type=float, default=0.7, help="(default: %(default)s)")
    sampling.add_argument("--top-k", type=int, default=50, help="(default: %(default)s)")
    sampling.add_argument("--top-p", type=float, default=0.9, help="(default: %(default)s)")
    sampling.add_argument("--min-p", type=float, default=0.05, help="(default: %(default)s)")
    parser.add_argument("--pipeline", default="default", help="hlofuse pipeline (default: %(default)s)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: when stderr is a terminal)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    sizes = dict(PRESETS[args.size])
    for name in sizes:
        if getattr(args, name) is not None:
            sizes[name] = getattr(args, name)
    if min(sizes.values()) < 1:
        parser.error("every size must be at least 1")
    if sizes["heads"] % sizes["kv_heads"]:
        parser.error("--kv-heads must divide --heads")
    if sizes["head_dim"] % 2:
        parser.error("--head-dim must be even (rotary embedding)")
    if sizes["cache_len"] < sizes["prompt_len"] + sizes["new_tokens"] - 1:
        parser.error("--cache-len must be at least --prompt-len + --new-tokens - 1")
    if not args.temperature > 0:
        parser.error("--temperature must be positive")
    if not 1 <= args.top_k <= sizes["vocab"]:
        parser.error("--top-k must be between 1 and --vocab")
    if not 0 < args.top_p <= 1 or not 0 <= args.min_p <= 1:
        parser.error("--top-p must be in (0, 1] and --min-p in [0, 1]")
    sampler = Sampler(args.sampler, args.temperature, args.top_k, args.top_p, args.min_p)
    cfg = Config(layers=sizes["layers"], d_model=sizes["d_model"], heads=sizes["heads"], kv_heads=sizes["kv_heads"],
                 head_dim=sizes["head_dim"], vocab=sizes["vocab"], cache_len=sizes["cache_len"],
                 dtype=jnp.bfloat16 if args.dtype == "bf16" else jnp.float32)
    batch, prompt_len, new_tokens = sizes["batch"], sizes["prompt_len"], sizes["new_tokens"]
    progress_on = sys.stderr.isatty() if args.progress is None else args.progress

    key_params, key_prompt = jax.random.split(jax.random.key(args.seed))
    params = init_params(key_params, cfg)
    prompt = jax.random.randint(key_prompt, (batch, prompt_len), 0, cfg.vocab, jnp.int32)
    attn_kind = "MHA" if cfg.kv_heads == cfg.heads else "MQA" if cfg.kv_heads == 1 else "GQA"
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
    print(f"hlofuse {hlofuse.__version__} on jax {jax.__version__} ({jax.default_backend()}, "
          f"{os.cpu_count()} cpus), --size {args.size}")
    print(f"model: {cfg.layers} layers, d_model {cfg.d_model}, heads {cfg.heads}/{cfg.kv_heads} ({attn_kind}), "
          f"head_dim {cfg.head_dim}, ffn {cfg.ffn_dim}, vocab {cfg.vocab}, {args.dtype}, "
          f"{n_params / 1e6:.1f}M params (random, seed {args.seed})")
    print(f"generate: batch {batch}, prompt {prompt_len}, {new_tokens} new tokens ({sampler.describe()}), "
          f"KV cache {cfg.cache_len} slots")

    def prefill_fn(p: Params, tokens: jax.Array, key: jax.Array) -> tuple[Step, Cache]:
        return prefill(p, tokens, key, cfg, sampler)

    def decode_fn(p: Params, token: jax.Array, cache: Cache, pos: jax.Array, key: jax.Array) -> tuple[Step, Cache]:
        return decode_step(p, token, cache, pos, key, cfg, sampler)

    # Each position draws with its own key, the same for both programs.
    base_key = jax.random.key(args.seed + 1)

    def key_at(pos: int) -> jax.Array:
        return jax.random.key_data(jax.random.fold_in(base_key, pos))

    margins = jax.jit(sampler.margins)

    def sample_of(step: Step, key: jax.Array) -> Sample:
        token, logits = step
        gap, scale = margins(logits, key)
        return np.asarray(token), np.asarray(gap), np.asarray(scale)

    options = {"hlofuse_pipeline": args.pipeline}
    variants = [
        Variant("plain", jax.jit(prefill_fn), jax.jit(decode_fn, donate_argnums=2)),
        Variant("hlofuse", jax.jit(prefill_fn, compiler_options=options),
                jax.jit(decode_fn, donate_argnums=2, compiler_options=options)),
    ]
    decode_steps = new_tokens - 1
    bar = Progress(2 * (2 + args.prefill_repeats + decode_steps), "compile, prefill, decode", enabled=progress_on)

    # Compile: the first call of each program. A fallback would mean hlofuse did nothing: stop and say why.
    for variant in variants:
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", HlofuseFallbackWarning)
                before = pipeline.STATS.copy()
                (token, _), cache = jax.block_until_ready(variant.prefill(params, prompt, key_at(0)))
                variant.stats["prefill"] = pipeline.STATS - before
                bar.update()
                before = pipeline.STATS.copy()
                jax.block_until_ready(variant.decode(params, token, cache, jnp.int32(prompt_len), key_at(1)))
                variant.stats["decode"] = pipeline.STATS - before
                bar.update()
        except HlofuseFallbackWarning as fallback:
            bar.close()
            print(f"hlofuse fell back to the plain program, so nothing was fused: {fallback}")
            return 1
        variant.compile_s = time.perf_counter() - start

    # Prefill, alternating the variants; the last run's token and cache start the generation.
    for _ in range(max(args.prefill_repeats, 1)):
        for variant in variants:
            (step, variant.cache), ms = _timed(variant.prefill, params, prompt, key_at(0))
            variant.prefill_ms.append(ms)
            variant.samples = []
            variant.record(sample_of(step, key_at(0)))
            bar.update()
    # Decode in lockstep: one plain step, one hlofuse step, each from its own previous token.
    for step in range(decode_steps):
        pos, key = jnp.int32(prompt_len + step), key_at(1 + step)
        for variant in variants:
            token = jnp.asarray(variant.samples[-1][0])
            (out, variant.cache), ms = _timed(variant.decode, params, token, variant.cache, pos, key)
            variant.decode_ms.append(ms)
            variant.record(sample_of(out, key))
            bar.update()
    bar.close()

    plain, fused = variants
    ok = True
    print()
    for program in ("prefill", "decode"):
        counts = fused.stats[program]
        listed = ", ".join(f"{rule} x{n}" for rule, n in sorted(counts.items())) or "nothing"
        print(f"hlofuse on the {program} program: {listed}")
        if counts.get("softmax_of_qk_to_attention", 0) < cfg.layers:
            print(f"  expected {cfg.layers} fused attention sites, one per layer (HLOFUSE_REMARKS=1 says why not)")
            ok = False
        elif args.pipeline == "default" and counts.get("attention_to_cpu", 0) < cfg.layers:
            print(f"  note: not every site runs on the CPU kernel (backend {jax.default_backend()})")
        if not any(rule.endswith("_to_sample") for rule in counts):
            print("  expected the sampler fused into one hlofuse.sample (HLOFUSE_REMARKS=1 says why not)")
            ok = False

    print()
    print(f"{'':26}{'plain XLA':>12}{'hlofuse':>12}{'speed-up':>10}")
    rows = [("compile (both programs)", plain.compile_s * 1e3, fused.compile_s * 1e3),
            (f"prefill ({prompt_len} tokens)", _median(plain.prefill_ms), _median(fused.prefill_ms)),
            ("decode step (median)", _median(plain.decode_ms), _median(fused.decode_ms))]
    for label, t_plain, t_fused in rows:
        print(f"{label:26}{t_plain:10.2f}ms{t_fused:10.2f}ms{t_plain / t_fused:9.2f}x")
    if decode_steps:
        rates = [1e3 * batch / _median(v.decode_ms) for v in variants]
        print(f"{'decode throughput':26}{rates[0]:8.1f}tok/s{rates[1]:8.1f}tok/s")

    print()
    shown = min(new_tokens, 16)
    print(f"generated (hlofuse, row 0, first {shown}): {fused.tokens()[0, :shown].tolist()}")
    agree, line = compare_tokens(plain, fused, cfg.dtype)
    print(line)
    return 0 if ok and agree else 1


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
