"""The main job (`python -m hlofuse.demo`) at tiny sizes: every attention site fused and on the kernel, same tokens."""

from __future__ import annotations

import numpy as np
import pytest

import hlofuse.jax as hjax
from hlofuse import demo, pipeline
from hlofuse.kernels import cpu

LAYERS = 2
TINY = ["--layers", str(LAYERS), "--d-model", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
        "--vocab", "128", "--prompt-len", "8", "--new-tokens", "5", "--batch", "2", "--cache-len", "32",
        "--prefill-repeats", "1", "--no-progress"]


@pytest.fixture(autouse=True)
def _hook_and_kernels():
    if not cpu.is_available():
        pytest.skip("the native CPU kernels are not built")
    hjax.install()  # the entry point installs it in an installed package; a source checkout needs this


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_demo_fuses_every_site_and_generates_the_same_tokens(dtype, capsys):
    before = pipeline.STATS.copy()
    assert demo.main([*TINY, "--dtype", dtype]) == 0
    out = capsys.readouterr().out
    counts = pipeline.STATS - before
    # one site per layer in each of the two programs, all lowered to the native kernel
    assert counts["softmax_of_qk_to_attention"] == 2 * LAYERS
    assert counts["attention_to_cpu"] == 2 * LAYERS
    assert counts["attention_not_fused"] == 0
    assert "tokens identical: yes" in out or (dtype == "bf16" and "up to a near-tie" in out)
    assert "decode step (median)" in out and "prefill (8 tokens)" in out


@pytest.mark.parametrize("sampler", [s for s in demo.SAMPLERS if s != "greedy"])
def test_demo_fuses_each_sampler_and_draws_the_same_tokens(sampler, capsys):
    """The stochastic samplers as serving stacks write them, with the same key per position in both programs:
    fused in the prefill and in the decode step, lowered to the CPU kernel, the same tokens."""
    before = pipeline.STATS.copy()
    assert demo.main([*TINY, "--sampler", sampler, "--top-k", "20"]) == 0
    out = capsys.readouterr().out
    counts = pipeline.STATS - before
    assert counts["sample_to_cpu"] == 2, counts
    assert sum(n for rule, n in counts.items() if rule.endswith("_to_sample")) == 2, counts
    assert counts["sampling_not_fused"] == 0
    assert "tokens identical: yes" in out
    assert f"({sampler}" in out


def test_help_lists_the_size_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--size", "--layers", "--d-model", "--heads", "--kv-heads", "--head-dim", "--vocab", "--prompt-len",
                 "--new-tokens", "--batch", "--cache-len", "--dtype", "--seed", "--sampler", "--temperature", "--top-k",
                 "--top-p", "--min-p"):
        assert flag in out


def _variant(rows: list[tuple[list[int], float]]) -> demo.Variant:
    variant = demo.Variant("v", prefill=print, decode=print)
    for tokens, gap in rows:
        variant.samples.append((np.array(tokens), np.full(len(tokens), gap), np.full(len(tokens), 10.0)))
    return variant


def test_token_comparison_accepts_only_near_ties():
    plain = _variant([([1, 2], 1.0), ([3, 4], 1e-3), ([5, 6], 1.0)])
    assert demo.compare_tokens(plain, _variant([([1, 2], 1.0), ([3, 4], 1.0), ([5, 6], 1.0)]), np.float32)[0]
    diverged = _variant([([1, 2], 1.0), ([3, 9], 1.0), ([7, 7], 1.0)])
    # a 1e-3 gap on logits of 10 is a tie in bf16 (eps 2^-7) but a real difference in f32
    assert demo.compare_tokens(plain, diverged, demo.jnp.bfloat16)[0]
    agree, line = demo.compare_tokens(plain, diverged, np.float32)
    assert not agree and "NO" in line and "new token 1 of row 1" in line
