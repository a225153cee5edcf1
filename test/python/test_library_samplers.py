"""Samplers as real libraries write them (test/fixtures/samplers, tools/fixtures/gen_library_samplers.py).

gemma's `gm.text` sampling methods, keras-hub's samplers, Hugging Face `generate()`'s sampling step under torchax
and the other libraries' steps, one decode step each. Every module must fuse as its manifest says: the form (and
the forms of any other draws it holds), and whether whole or in part with a remark naming what stays in XLA. The
original, the fused module and the fused module lowered to the CPU kernel must return the same token ids for the
same keys; a sampler fused whole to a filtering form must leave no sort or TopK in the compiled program.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from hlofuse.kernels.cpu.sampling import XLA_SORT_IN_A_BRANCH
from hlofuse.kernels.sampling_reference import FORMS
from hlofuse.pipeline import run_pipeline
from hlofuse.testing.modules import (
    calls_sampling_kernel,
    compile_for_cpu,
    count_composites,
    main_func,
    parse_module_text,
    sample_attrs,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "samplers"
MANIFEST: dict[str, dict[str, Any]] = json.loads((FIXTURES / "manifest.json").read_text())
FUSE = "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)"
KEYS = 4


def _run(executable: Any, args: list[np.ndarray]) -> list[np.ndarray]:  # noqa: ANN401
    """Every output of the program: the token ids, then what else it returns (T5X's log-probabilities)."""
    device = jax.devices("cpu")[0]
    buffers = [jax.device_put(a, device) for a in args]
    return [np.asarray(out[0]) for out in executable.execute_sharded(buffers).disassemble_into_single_device_arrays()]


def _logits(shape: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal(shape).astype(np.float32)
    ties = np.round(normal * 2.0) / 2.0
    with_inf = normal * 3.0
    with_inf[..., rng.random(shape[-1]) < 0.3] = -np.inf
    return {"normal": normal, "peaked": normal * 6.0, "ties": ties, "with_inf": with_inf}


def _inputs(entry: dict[str, Any], seed: int) -> dict[str, list[np.ndarray]]:
    """The arguments before the key, by case: the logits of `_logits`, or, for a sampler that computes its logits
    from a hidden state and an embedding table (gemma_pytorch's), normals scaled so the logits are N(0, 1) or peaked."""
    if "arguments" not in entry:
        return {case: [logits] for case, logits in _logits(tuple(entry["logits"]), seed).items()}
    rng = np.random.default_rng(seed)
    hidden, table = (rng.standard_normal(shape).astype(np.float32) for shape in entry["arguments"])
    scale = np.float32(1 / np.sqrt(hidden.shape[-1]))
    return {"normal": [hidden, table * scale], "peaked": [hidden, table * scale * np.float32(6)]}


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_library_sampler_fuses_as_expected_and_draws_the_same_tokens(name: str) -> None:
    entry = MANIFEST[name]
    expected = entry["expected"]
    text = (FIXTURES / f"{name}.mlir").read_text()
    fused = parse_module_text(text)
    result = run_pipeline(fused, FUSE)
    remarks = [str(r) for r in result.remarks]
    if expected["form"] is None:  # a sampler no form takes: left as it is, with a remark that says why
        assert count_composites(fused, "hlofuse.sample") == 0, remarks
        assert result.counters.get("sampling_not_fused"), remarks
        assert any("sampler not fused" in r and expected["remark"] in r for r in remarks), remarks
        return
    # a sampler may hold several draws (tpu-inference: an argmax for its greedy rows beside the categorical)
    forms = sorted([expected["form"], *expected.get("others", [])])
    assert count_composites(fused, "hlofuse.sample") == len(forms), remarks
    assert sorted(attrs.form for attrs in sample_attrs(fused)) == forms, remarks
    partial = [r for r in remarks if "sampler fused only in part" in r]
    if expected["whole"]:
        assert not partial and not result.counters.get("sampling_not_fused"), remarks
    else:
        assert partial and expected["remark"] in partial[0], remarks

    lowered = parse_module_text(str(fused))
    run_pipeline(lowered, "builtin.module(hlofuse-lower-kernels{target=cpu})")
    original = parse_module_text(text)
    arity = len(main_func(original).type.inputs)
    programs = {"original": compile_for_cpu(original), "fused": compile_for_cpu(fused), "cpu": compile_for_cpu(lowered)}
    rng = np.random.default_rng(1)
    for case, inputs in _inputs(entry, seed=0).items():
        for _ in range(KEYS):
            key = rng.integers(0, 2**32, size=2, dtype=np.uint32)
            args = [*inputs, key][:arity]  # a greedy sampler's unused key is not an argument
            outs = {what: _run(program, args) for what, program in programs.items()}
            for what in ("fused", "cpu"):
                for i, (out, want) in enumerate(zip(outs[what], outs["original"], strict=True)):
                    np.testing.assert_array_equal(out, want, err_msg=f"{name} {what} on {case}, output {i}")


WHOLE_FILTERING = sorted(n for n, e in MANIFEST.items() if e["expected"]["whole"] and e["expected"]["form"]
                         and FORMS[e["expected"]["form"]].mode in ("top_k", "top_p", "min_p", "top_k+top_p", "epsilon",
                                                                   "top_k+epsilon"))


@pytest.mark.parametrize("name", WHOLE_FILTERING)
def test_library_filter_runs_in_the_kernel(name: str) -> None:
    module = parse_module_text((FIXTURES / f"{name}.mlir").read_text())
    run_pipeline(module, FUSE[:-1] + ",hlofuse-lower-kernels{target=cpu})")
    hlo = "\n".join(m.to_string() for m in compile_for_cpu(module).hlo_modules())
    form = MANIFEST[name]["expected"]["form"]
    assert calls_sampling_kernel(hlo, form)
    if FORMS[form].filters in XLA_SORT_IN_A_BRANCH:  # its entry computation, then
        hlo = next(block for block in hlo.split("\n\n") if block.startswith("ENTRY"))
        assert "conditional(" in hlo and calls_sampling_kernel(hlo, form)
    top_k_calls = [t for t in re.findall(r'custom_call_target="([^"]+)"', hlo) if "topk" in t.lower()]
    assert not re.findall(r" (sort|topk)\(", hlo) and not top_k_calls, name


def test_the_corpus_covers_each_library() -> None:
    libraries = {lib for entry in MANIFEST.values() for lib in entry["libraries"]}
    assert {"gemma", "keras-hub", "transformers", "torchax"} <= libraries
    assert len(WHOLE_FILTERING) >= 3, WHOLE_FILTERING
