#!/usr/bin/env python3
"""Library-written samplers on the CPU: the program as the library writes it, compiled by XLA, against the same
program through hlofuse's default pipeline (`compiler_options={"hlofuse_pipeline": "default"}`), and argmax.

    python tools/bench/sampling_library.py                          # batch 1 and 8, vocab 128256 and 262144
    python tools/bench/sampling_library.py --batch 8 --vocab 128256 --samplers gemma_top_p

The samplers are the catalogue's library writings (test/python/sampling_variants.py: gemma's top-p and top-k,
keras-hub's random, top-k, top-p and top-k + top-p, Hugging Face's temperature + top-k warpers with
torch.multinomial as torchax lowers them, JetStream's top-p and top-k + top-p, the flax / gemma / tunix
rank-space `_sample_top_p` with and without its floor, MaxText's nucleus with its -1e7 fill and its composite,
tunix's sample_top_p, Hugging Face's epsilon warper, EasyDeL's per-row top-p plain and vmapped, a draw with a key
per row, tpu-inference's and EasyDeL eSurge's searched top-k and top-p with per-row parameters, Hugging Face's
typical warper, gemma 3.1.0's top-p, the nucleus sorted by a hand-written argsort (the llama reference's
`sample_top_p` ported to JAX) and as torchax lowers the torch original, also with top_p = 1, Pax's draw with a
temperature per row, and litgpt's one-row `sample` with its top-k, and with its top-k and top-p, as torchax lowers
them, Hugging Face's Temperature, TopP then MinP chain, and axlearn's log-probabilities through its searched top-k and
top-p, and its searched top-k alone, and T5X's searched top-k step with the drawn token's log-probability, and
audiocraft's (MusicGen's) top-k of the probabilities through torch.multinomial, gemma_pytorch's sampler, and
torch.multinomial with replacement after a top-k mask and after a temperature alone, and the exponential race of
gpt-fast, torchtune and vLLM after a top-k and after a top-p mask, and mesh-transformer-jax's (GPT-J's) and
transformer_vq's nuclei, and Megatron-LM's classic top-p through torchax, with torch.multinomial and with a
categorical, and x-transformers' top-p of the logits, and transformers 2.x's top_k_top_p_filtering, through
torchax, and PaLM-jax's and lucidrains' hand-written Gumbel noise, and x-transformers' min-p and top-a of the
logits, and the top k of the probabilities at T = 1, and nanoGPT's top-k and the llama reference's `sample_top_p`
with torch.multinomial's (B, 1) ids unsqueezed, and the textbook `-log(-log(u))` Gumbel-max, and Levanter's top-p
with and without the drawn token's log-probability, and the nucleus of Haiku's `nucleus_sample` and grok-1, and
xformers' fastgen top-p and a hand-written min-p, drawn by torch.multinomial of their weights, not renormalised, and
perceiver-ar's nucleus of the logits, then / T, and grok-1's `sample_token`, (B, 1, V) logits with T, p and a mask
per row, a key per row, and the token's probability and the top 8 read from what it drew from, in f32 and on its
model's bf16 logits, and google-deepmind/simply's top-k, top-p and top-k + top-p with the token's log-probability, and
the classic top-p as small JAX engines write it: a flipped argsort, a roll, the mask put back by the order's argsort or
the filled logits scattered back, and JAX code's top-k by a sort's k-th (kept at or above it, or masked below it as
minGPT's ports write it), alone and before the classic cut, as a Flax NNX sampler and minGPT's chain write them, and
the cut not shifted, alone and after minGPT's top-k of one row, and chains whose earlier filters are stages: a min-p
of the probabilities before a top-k, with and without a temperature between them, Flax's top-p before a min-p, and a
top-k before top-a).
tools/bench/sampling_cpu.py times the kernel's forms directly. Each row: the fusion (form, "whole" or "part"),
then medians of --iters interleaved calls (original, fused, argmax, in turn; each round with the next key) in
milliseconds, fused / original and fused / argmax. Token ids are checked equal first, for every key. On 2 shared
cores the ratios are the numbers to read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test" / "python"))
import sampling_variants  # noqa: E402

from hlofuse.pipeline import run_pipeline  # noqa: E402
from hlofuse.testing.modules import clone_module, sample_attrs  # noqa: E402

SAMPLERS = ("gemma_top_p", "gemma_top_k_by_batch_index", "keras_hub_random", "keras_hub_top_k",
            "torchax_top_k_warper_multinomial", "multinomial_temperature", "multinomial_top_k_mask", "jetstream_top_p",
            "top_k_then_top_p", "keras_hub_top_p", "keras_hub_top_k_top_p", "gemma_top_p_rank_space",
            "floored_top_k_top_p_rank_space", "maxtext_top_p_fill", "maxtext_composite",
            "torchax_top_p_warper_multinomial", "torchax_top_k_top_p_warpers_multinomial",
            "torchax_min_p_warper_multinomial", "torchax_top_k_min_p_argsort_multinomial",
            "flax_top_p_warper", "flax_top_k_top_p_warpers", "tunix_top_p", "tunix_top_k_top_p",
            "torchax_epsilon_warper_multinomial", "easydel_per_row_top_p", "easydel_vmapped_per_row_top_p",
            "split_key_per_row", "tpu_inference_searched", "esurge_searched", "torchax_typical_warper_multinomial",
            "gemma_3_1_top_p", "hand_written_top_p_by_argsort", "llama_reference_top_p_through_torchax",
            "pax_temperature_per_row", "pax_top_k_top_p_per_row", "pax_temperature", "pax_top_k_top_p",
            "litgpt_top_k_multinomial", "litgpt_top_k_top_p_multinomial", "torchax_top_p_min_p_warpers_multinomial",
            "axlearn_searched_chain", "axlearn_searched_top_k", "llama_reference_temperature_only_through_torchax",
            "searched_top_k_with_log_prob", "audiocraft_top_k", "gemma_pytorch_sampler",
            "multinomial_with_replacement_top_k_mask", "multinomial_with_replacement_temperature",
            "exponential_race_top_k", "exponential_race_top_p", "mtj_nucleaus_sample",
            "transformer_vq_nucleus_scaled", "megatron_top_p_multinomial", "classic_top_p_categorical",
            "x_transformers_top_p_multinomial", "old_hugging_face_top_k_top_p_multinomial", "palm_gumbel_sample",
            "lucidrains_gumbel_top_k", "lucidrains_gumbel_top_p", "x_transformers_min_p_multinomial",
            "x_transformers_top_a_multinomial", "top_k_of_probs_at_t1", "nanogpt_top_k_multinomial_unsqueezed",
            "llama_reference_top_p_unsqueezed", "hand_gumbel_unguarded", "levanter_top_p_sample",
            "levanter_top_p_sample_with_log_prob", "haiku_nucleus_sample", "fastgen_top_p_through_torchax",
            "min_p_of_probs_weights", "perceiver_ar_nucleus_sample", "grok_sample_token", "simply_top_k_sample",
            "simply_top_p_sample", "simply_top_k_top_p_sample", "grok_sample_token_bf16", "jax_classic_top_p_roll",
            "jax_classic_top_p_scattered_back", "jax_classic_top_p_descending_at_or_above",
            "jax_classic_top_p_sorted_apart", "jax_classic_top_p_one_row", "jax_top_k_by_sort_column",
            "mingpt_jax_top_k_below_sort_column", "jax_top_k_below_sort_slice", "nnx_top_k_then_top_p",
            "mingpt_top_k_then_classic_top_p", "jax_unshifted_top_p", "jax_top_k_then_unshifted_top_p_one_row",
            "min_p_in_logit_space_of_a_batch", "sequence_min_p_in_logit_space",
            "sequence_top_p_by_count_cutoff_under_conds", "sequences_top_p_by_count_cutoff_with_one_key",
            "sequence_chain_top_k_top_p_min_p", "sequence_chain_top_k_then_count_cutoff_under_conds",
            "chain_min_p_of_probs_then_top_k", "chain_min_p_of_probs_then_temperature_then_top_k",
            "chain_flax_top_p_then_min_p_of_probs", "chain_top_k_then_top_a")


def _fusion(fn: Any, x: jax.ShapeDtypeStruct, key: jax.ShapeDtypeStruct) -> str:  # noqa: ANN401
    """How the pass fuses `fn`: its composite's form, and whether whole (no fused-in-part remark)."""
    module = clone_module(jax.jit(fn).lower(x, key).compiler_ir("stablehlo"))
    result = run_pipeline(module, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    attrs = sample_attrs(module)
    if not attrs:
        return "not fused"
    part = any("fused only in part" in str(r) for r in result.remarks)
    return f"{attrs[0].form} ({'part' if part else 'whole'})"


def _median_ms(fns: dict[str, Any], x: jax.Array, iters: int) -> dict[str, float]:
    """Medians over `iters` interleaved calls, each round with the next key (as a decode loop steps its key: a
    certified nucleus's fallback runs for the keys that draw in its band, not for every call or none)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        jax.block_until_ready(fn(x, _key(0)))
    for i in range(iters):
        key = _key(i)
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(x, key))
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def _variant(name: str) -> sampling_variants.Variant:
    """The catalogue's variant `name` (its logits' shape and dtype)."""
    return next(v for v in sampling_variants.VARIANTS if v.name == name)


def _key(i: int) -> jax.Array:
    return jnp.array([7, 11 + i], jnp.uint32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--vocab", type=int, nargs="*", default=[128256, 262144])
    parser.add_argument("--samplers", nargs="*", default=list(SAMPLERS), choices=SAMPLERS)
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--scale", type=float, default=3.0,
                        help="the logits' spread: scale x N(0, 1) (3: a nucleus of hundreds at p = 0.9 and T = 0.7 "
                             "over 128256; 6 and above: the few tokens of a peaked, model-like row)")
    parser.add_argument("--memory", action="store_true",
                        help="print, after each row, the compiled programs' temporaries (MiB): past 32 MiB glibc maps "
                             "them afresh on every call (docs/kernels-cpu-sampling.md)")
    args = parser.parse_args()
    print("| sampler | fusion | B | V | original ms | fused ms | argmax ms | fused/original | fused/argmax |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.samplers:
        fn = getattr(sampling_variants, name)
        variant = _variant(name)
        units = (1,) * (len(variant.shape) - 2)  # (B, 1, V) decode logits where the variant takes them
        one_row = len(variant.shape) == 1  # (V,) logits: one prompt, as engines write it at batch 1
        for batch in [1] if one_row else args.batch:
            for vocab in args.vocab:
                shape = (vocab,) if one_row else (batch, *units, vocab)
                x = args.scale * jax.random.normal(jax.random.key(0), shape, jnp.float32)
                x = x.astype(variant.dtype)  # (grok's bf16 logits)
                spec = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((2,), jnp.uint32))
                fns = {"original": jax.jit(fn),
                       "fused": jax.jit(fn, compiler_options={"hlofuse_pipeline": "default", "hlofuse_strict": True}),
                       "argmax": jax.jit(lambda x, key: jnp.argmax(x, axis=-1))}
                for i in range(args.iters):  # the ids (and what else it returns) of every key timed
                    for got, want in zip(jax.tree.leaves(fns["fused"](x, _key(i))),
                                         jax.tree.leaves(fns["original"](x, _key(i))), strict=True):
                        np.testing.assert_array_equal(got, want, err_msg=name)
                ms = _median_ms(fns, x, args.iters)
                print(f"| {name} | {_fusion(fn, *spec)} | {batch} | {vocab} | {ms['original']:.3f} | "
                      f"{ms['fused']:.3f} | {ms['argmax']:.3f} | {ms['fused'] / ms['original']:.3f}x | "
                      f"{ms['fused'] / ms['argmax']:.2f}x |", flush=True)
                if args.memory:
                    temp = {n: f.lower(*spec).compile().memory_analysis().temp_size_in_bytes / 2**20
                            for n, f in fns.items()}
                    print("  temporaries MiB: " + ", ".join(f"{n} {t:.1f}" for n, t in temp.items()), flush=True)


if __name__ == "__main__":
    main()
