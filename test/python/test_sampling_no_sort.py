"""A fused top-k, top-p or min-p sampler leaves no sort and no TopK to XLA: its filter runs in the kernel.

Each catalogue variant (sampling_variants.VARIANTS) that fuses whole to a filtering form is lowered to the
CPU kernel and compiled by XLA; the optimized HLO must hold the `hlofuse_sample` call and no `sort`, `topk` or
TopK custom call anywhere. That is what makes the fused sampler sort-free: a sampler fused only at its draw
(the filter left beside the kernel) compiles to the original's sort plus a kernel, and gains nothing.

The forms drawn another way (`<form>_<draw>`) take their top-k and their nucleus's descending sort from the kernel
(kernels/cpu/sampling.py: drawn_form_lowering). A form of XLA_SORT_IN_A_BRANCH (Hugging Face's ascending nuclei among
them) falls back, where equal logits straddle its cut, to its own function, whose sorts sit in a conditional's branch:
for those the entry computation holds no sort.
"""

from __future__ import annotations

import re

import jax
import pytest
from sampling_variants import VARIANTS, Variant, lower

from hlofuse.kernels.cpu.sampling import XLA_SORT_IN_A_BRANCH
from hlofuse.kernels.sampling_reference import FORMS
from hlofuse.pipeline import run_pipeline
from hlofuse.testing.modules import calls_sampling_kernel, clone_module, compile_for_cpu, count_composites

FILTERING_MODES = ("top_k", "top_p", "min_p", "top_k+top_p")
CPU_SUPPORTED_DTYPES = (jax.numpy.float32,)  # the kernel refuses bf16 top-p / min-p (rounded probabilities)


def _filtering(variant: Variant) -> bool:
    return variant.form is not None and FORMS[variant.form].mode in FILTERING_MODES and variant.remark is None


FUSED_WHOLE = [v for v in VARIANTS if _filtering(v) and v.dtype in CPU_SUPPORTED_DTYPES]


def _optimized_hlo(variant: Variant) -> str:
    """The variant fused and lowered to the CPU kernel, as XLA compiles it: the optimized HLO text."""
    module = clone_module(lower(variant).compiler_ir("stablehlo"))
    run_pipeline(module, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling,hlofuse-lower-kernels{target=cpu})")
    assert count_composites(module, None) == 0, "the composite stayed: no CPU kernel took it"
    return "\n".join(m.to_string() for m in compile_for_cpu(module).hlo_modules())


def _sorts(hlo: str) -> list[str]:
    """The sorts and top-ks of an optimized HLO module: `sort(` and `topk(` instructions, TopK custom calls."""
    found = re.findall(r" (sort|topk)\(", hlo)
    found += [f"custom-call {t}" for t in re.findall(r'custom_call_target="([^"]+)"', hlo) if "topk" in t.lower()]
    return found


@pytest.mark.parametrize("variant", FUSED_WHOLE, ids=lambda v: v.name)
def test_fused_filter_runs_in_the_kernel(variant: Variant) -> None:
    hlo = _optimized_hlo(variant)
    assert calls_sampling_kernel(hlo, variant.form)
    if FORMS[variant.form].filters in XLA_SORT_IN_A_BRANCH:  # a tie's batch sorts in a branch: the entry, then
        hlo = next(block for block in hlo.split("\n\n") if block.startswith("ENTRY"))
        assert "conditional(" in hlo and calls_sampling_kernel(hlo, variant.form)
    # (but for the program's own TopKs of what the sampler gives back: grok-1's top 8 of its probabilities)
    own = ["custom-call TopK"] * variant.program_top_ks
    assert _sorts(hlo) == own, f"{variant.name}: XLA still sorts beside the kernel: {_sorts(hlo)}"


def test_the_catalogue_has_filtering_samplers() -> None:
    forms = {FORMS[v.form].filters for v in FUSED_WHOLE}
    assert {"top_k", "top_k_mask", "top_p_mask", "top_k_top_p_mask", "min_p"} <= forms, forms
