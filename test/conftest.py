"""Test tiers for all of test/: the `slow` marker, set from one table, and hypothesis's `fast` profile.

`./test.sh --fast` runs `pytest -m "not slow"` with HYPOTHESIS_PROFILE=fast; `./test.sh` runs everything with
HYPOTHESIS_PROFILE=ci (docs/architecture.md, "Tests and their tiers"). A test is slow when it takes several
seconds on the 2-core CI machine and the fast tier keeps a cheaper test of the same code. The table below
marks them by node id, so the tests' own files stay as they are:

    "test/python/test_demo.py"                       every test of a module
    "test/python/test_x.py::test_name"               every parametrization of a test (or a class)
    "test/python/test_x.py::test_name[case]"         one parametrization

test/python/test_slow_table.py checks that each entry still names a test.
"""

from __future__ import annotations

import os
import warnings

import pytest
from hypothesis import HealthCheck, settings

# Every test here runs on the CPU: the TPU and CUDA jax plugins, when installed, must not start (the CUDA one
# fails on cuInit without a GPU). Deviceless TPU and GPU compiles make their own clients.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The differential tests read HYPOTHESIS_PROFILE themselves (they register `ci` and `thorough`); `fast` is
# the same settings with a handful of examples, for ./test.sh --fast.
settings.register_profile("fast", max_examples=6, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)

# node id (or prefix, see above) -> why it is slow and what the fast tier keeps. Seconds: the tests' summed
# durations in `pytest -n 2 --durations=0` on the 2-core CI machine under a load of about 15 (four suites at
# once), so about 4-5x what a quiet machine takes; the whole suite summed 7150 s there.
SLOW: dict[str, str] = {
    # Attention and sampling through the whole pipeline, per library fixture, target and platform.
    "test/python/test_fuse_sampling_e2e.py::test_variant_lowered_for_another_platform_fuses_as_for_the_cpu":
        "226 s in an unloaded run (06bc5e4), 127 cases (each variant lowered for tpu or cuda, in turn, "
        "fused and run twice)",
    "test/python/test_library_fixtures.py::test_every_target_lowers_the_library_attention":
        "437 s, 4 targets (gpu alone 380 s)",
    "test/python/test_library_fixtures.py::test_default_pipeline_fuses_and_preserves_outputs": "419 s, 72 fixtures",
    "test/python/test_library_fixtures.py::test_cpu_kernels_replace_every_composite_and_match": "235 s, 70 fixtures",
    "test/python/test_library_fixtures.py::test_fixture_matches_manifest": "141 s, 72 fixtures",
    "test/python/test_library_fixtures.py::test_gemma_on_the_interpreted_kernels_matches_the_original": "101 s, 4",
    "test/python/test_lower_nki.py::test_sampler_on_neuron_sim_returns_the_programs_tokens": "514 s, 33 samplers",
    "test/python/test_lower_pallas.py::test_jit_on_the_interpreted_kernel_matches_the_plain_program":
        "405 s, 98 cases (interpret mode)",
    "test/python/test_lower_pallas.py::test_jit_on_the_interpreted_sampler_returns_the_plain_programs_tokens":
        "45 s, 15 cases",
    "test/python/test_lower_pallas.py::test_jit_on_the_interpreted_mosaic_gpu_kernel_matches_the_plain_program":
        "27 s, 4 cases",
    # Multi-device programs (8 host devices, Shardy propagation, per-shard kernels in interpret mode).
    "test/python/test_sharding.py::test_pallas_and_nki_calls_run_per_shard": "323 s, 3 targets",
    "test/python/test_sharding.py::test_sharded_case":
        "247 s, 26 cases, and 60-100 s of set-up (one subprocess compiles every case), once per run",
    "test/python/test_sharding.py::test_default_pipeline_adds_no_communication": "the same set-up as test_sharded_case",
    "test/python/test_sharding.py::test_local_mode_lowers_only_what_stays_local": "93 s, 2",
    "test/python/test_shard_local.py::test_prefill_ranges_prepared_run_and_merged_are_the_whole": "33 s, 2",
    "test/python/test_concurrent_compiles.py":
        "81 s in an unloaded run (06bc5e4), one test (8 compiles of new shapes, 4 threads at a time, "
        "through the default pipeline)",
    # Regression cases of the differential generators (the generated tests stay, sized by HYPOTHESIS_PROFILE).
    "test/python/test_sampling_differential.py::test_fixed_gap": "59 s, 8 cases",
    # The demo, end to end (./run.sh runs it too).
    "test/python/test_demo.py": "164 s, 7 generations",
    # jax transformations of the explicit API beyond the first gradient.
    "test/python/test_api_transforms.py::test_attention_under_nested_vmap_and_vmap_of_grad": "31 s",
    "test/python/test_api_transforms.py::test_attention_forward_mode_and_hessian_vector_products": "27 s",
    "test/python/test_api_transforms.py::test_scanned_layers_train_with_the_kernel_forward_also_under_remat": "18 s",
    # Kernel property tests: their size is fixed unless HYPOTHESIS_PROFILE=thorough; the grids below stay.
    "test/kernels/test_sampling_properties.py": "310 s, 3 properties",
    "test/kernels/test_attention_properties.py": "186 s, 3 properties",
    # Kernel grids: the fast tier keeps a few cases of each (FAST_SAMPLES).
    "test/kernels/test_cpu_sampling_draws.py::test_drawn_form_gives_the_reference_ids": "52 cases (Latin square)",
    "test/kernels/test_cpu_sampling.py::test_top_k_splits_match_reference": "79 s, 18 cases",
    "test/kernels/test_cpu_sampling.py::test_rows_split_across_threads_match_reference": "28 s, 20 cases",
    "test/kernels/test_cpu_attention_layouts.py::test_partitioned_lowering_matches_reference": "70 s, 56 cases",
    "test/kernels/test_pallas_sampling.py::test_vocabulary_splits_merge_into_the_reference_tokens": "78 s, 8 cases",
    "test/kernels/test_pallas_sampling.py::test_kernel_draws_the_reference_tokens": "58 s, 23 cases",
    "test/kernels/test_pallas_attention.py::test_key_ranges_with_their_lse_merge_into_the_whole": "26 s, 4 cases",
    "test/kernels/test_pallas_attention.py::test_prefill_key_ranges_with_their_q_offsets_merge_into_the_whole":
        "23 s, 2 cases",
    "test/kernels/test_pallas_mosaic_gpu.py::test_kernel_matches_reference_in_the_interpreter": "33 s, 4 cases",
    "test/kernels/test_nki_sampling.py::TestNkiSampling::test_kernel_matches_reference": "55 s, 24 cases",
    "test/kernels/test_pallas_attention.py::TestTpuInterpretMode::test_q_offsets_per_batch_row": "22 s, 4 cases",
    "test/kernels/test_pallas_attention.py::TestTpuInterpretMode::test_decode_split_kv": "13 s, 2 cases",
    "test/kernels/test_pallas_attention.py::TestPallasAttention::test_q_offsets_per_batch_row": "17 s, 4 cases",
    "test/kernels/test_pallas_sampling.py::test_greedy_softmax_is_certified_away_from_ties": "25 s, 4 cases",
    "test/kernels/test_pallas_sampling.py::test_tpu_interpreter_proper": "15 s, 3 cases",
    "test/kernels/test_zero_empty_rows.py::test_rows_that_see_no_key_are_zeroed": "33 s, 10 cases",
    "test/kernels/test_cpu_sampling.py::test_partitioned_lowering_matches_reference": "21 s, 20 cases",
    "test/kernels/test_cpu_sampling.py::test_split_calls_and_merge_match_reference": "15 s, 6 cases",
    "test/kernels/test_cpu_attention_layouts.py::test_lse_matches_the_logits_logsumexp": "26 s, 9 cases",
    "test/python/test_api_transforms.py::test_sample_under_vmap_draws_what_each_element_would": "25 s, 6 cases",
    "test/python/test_api_transforms.py::test_attention_under_vmap_is_one_call_over_the_folded_batch":
        "18 s, 4 cases",
    "test/python/test_differential.py::test_fixed_gap": "14 s, 7 cases",
    "test/python/test_sampling_differential.py::test_known_gap": "15 s, 4 cases",
    # The compile grid: the real TPU and GPU compilers on every kernel hlofuse emits (about 2 min on 2 cores).
    "test/python/test_compile_grid.py::test_attention_variant_compiles_or_is_refused":
        "216 cases (each fusing variant lowered for 4 chip targets, each kernel compiled)",
    "test/python/test_compile_grid.py::test_sampler_form_compiles_or_is_refused":
        "411 s in an unloaded run (06bc5e4), 166 cases (a variant per kernel)",
    "test/python/test_compile_grid.py::test_long_context_compiles_or_is_refused": "64 cases, T to 32k, 128k caches",
    "test/python/test_compile_grid.py::test_bias_and_mask_at_4k_compile_or_are_refused": "16 cases",
    "test/python/test_compile_grid.py::test_sampler_at_real_vocabularies_compiles_without_spills":
        "204 cases (17 forms and dtypes x 3 vocabularies x 4 chip targets, 80 s)",
    "test/kernels/test_pallas_resources.py::test_every_candidate_tile_gives_the_reference": "13 cases, 12 s of CPU",
    "test/python/test_bench_h200.py::test_cpu_smoke_checks_every_kernel_and_prints_the_table":
        "14 s (the H200 script in interpret mode; --dry-run stays in the fast tier)",
}

# Cases of a SLOW entry that stay in the fast tier: one or a few of each grid, so --fast still runs the code.
FAST_SAMPLES: frozenset[str] = frozenset({
    "test/kernels/test_pallas_resources.py::test_every_candidate_tile_gives_the_reference[gpu-16-32]",
    "test/kernels/test_pallas_resources.py::test_every_candidate_tile_gives_the_reference[tpu-128-256]",
    "test/kernels/test_pallas_resources.py::test_every_candidate_tile_gives_the_reference[tpu-64-256-128]",
    "test/python/test_compile_grid.py::test_attention_variant_compiles_or_is_refused[causal_tril_inf-tpu-v5e-tpu]",
    "test/python/test_compile_grid.py::test_attention_variant_compiles_or_is_refused[additive_bias-h100-gpu]",
    "test/python/test_compile_grid.py::test_attention_variant_compiles_or_is_refused[nn_causal_gqa_bf16-h100-gpu-mosaic]",
    "test/python/test_compile_grid.py::test_attention_variant_compiles_or_is_refused[decode_with_cache-tpu-v6e-tpu]",
    "test/python/test_compile_grid.py::test_sampler_form_compiles_or_is_refused[top_k_then_top_p-tpu-v5e-tpu]",
    "test/python/test_compile_grid.py::test_sampler_form_compiles_or_is_refused[jetstream_top_k_bf16-h100-gpu]",
    "test/python/test_compile_grid.py::test_sampler_at_real_vocabularies_compiles_without_spills"
    "[top_k_top_p_mask-f32-32000-tpu-v5e-tpu]",
    "test/python/test_compile_grid.py::test_sampler_at_real_vocabularies_compiles_without_spills"
    "[temperature-bf16-128256-tpu-v6e-tpu]",
    "test/python/test_compile_grid.py::test_long_context_compiles_or_is_refused"
    "[f32-B1-T32768-S32768-N8-H256-causal-h100-gpu]",
    "test/python/test_compile_grid.py::test_long_context_compiles_or_is_refused"
    "[bf16-B1-T32768-S32768-N8-H128-causal-tpu-v5e-tpu]",
    "test/python/test_compile_grid.py::test_long_context_compiles_or_is_refused[bf16-B4-T1-S131072-N32/8-H128-h100-gpu]",
    "test/python/test_fuse_sampling_e2e.py::test_variant_lowered_for_another_platform_fuses_as_for_the_cpu"
    "[argmax-tpu]",
    "test/python/test_library_fixtures.py::test_default_pipeline_fuses_and_preserves_outputs[jnn_dpa_gqa]",
    "test/python/test_library_fixtures.py::test_cpu_kernels_replace_every_composite_and_match"
    "[handwritten_decode_kvcache]",
    "test/python/test_library_fixtures.py::test_fixture_matches_manifest[jnn_dpa_plain]",
    "test/python/test_lower_nki.py::test_sampler_on_neuron_sim_returns_the_programs_tokens[argmax]",
    "test/python/test_lower_pallas.py::test_jit_on_the_interpreted_kernel_matches_the_plain_program"
    "[causal_tril_inf-tpu-interpret]",
    "test/python/test_lower_pallas.py::test_jit_on_the_interpreted_kernel_matches_the_plain_program"
    "[causal_bottom_right-gpu-interpret]",
    "test/python/test_lower_pallas.py::test_jit_on_the_interpreted_sampler_returns_the_plain_programs_tokens"
    "[argmax_bf16-tpu-interpret]",
    "test/python/test_lower_pallas.py::test_jit_on_the_interpreted_sampler_returns_the_plain_programs_tokens"
    "[min_p-gpu-interpret]",
    "test/python/test_lower_pallas.py::test_jit_on_the_interpreted_mosaic_gpu_kernel_matches_the_plain_program"
    "[decode_with_cache]",
    "test/kernels/test_cpu_sampling_draws.py::test_drawn_form_gives_the_reference_ids[top_k_choice-f32]",
    "test/kernels/test_cpu_sampling_draws.py::test_drawn_form_gives_the_reference_ids[categorical_log_softmax-f32]",
    "test/kernels/test_cpu_sampling.py::test_top_k_splits_match_reference[1-float32-top_k]",
    "test/kernels/test_cpu_sampling.py::test_rows_split_across_threads_match_reference[float32-categorical]",
    "test/kernels/test_cpu_attention_layouts.py::test_partitioned_lowering_matches_reference[case2-float32-sequence]",
    "test/kernels/test_pallas_sampling.py::test_vocabulary_splits_merge_into_the_reference_tokens"
    "[gpu-greedy-float32]",
    "test/kernels/test_pallas_sampling.py::test_kernel_draws_the_reference_tokens[tpu-greedy-float32]",
    "test/kernels/test_pallas_sampling.py::test_kernel_draws_the_reference_tokens[gpu-top_k-float32]",
    "test/kernels/test_pallas_sampling.py::test_kernel_draws_the_reference_tokens[tpu-temperature-bfloat16]",
    "test/kernels/test_pallas_mosaic_gpu.py::test_kernel_matches_reference_in_the_interpreter"
    "[causal_bottom_right_gqa_bf16]",
    "test/kernels/test_nki_sampling.py::TestNkiSampling::test_kernel_matches_reference[top_k-float32]",
    "test/kernels/test_nki_sampling.py::TestNkiSampling::test_kernel_matches_reference[categorical-bfloat16]",
    "test/kernels/test_pallas_attention.py::TestTpuInterpretMode::test_q_offsets_per_batch_row[tpu-window]",
    "test/kernels/test_pallas_sampling.py::test_greedy_softmax_is_certified_away_from_ties[float32-gpu]",
    "test/kernels/test_zero_empty_rows.py::test_rows_that_see_no_key_are_zeroed[mask-cpu]",
    "test/kernels/test_zero_empty_rows.py::test_rows_that_see_no_key_are_zeroed[kv_lengths-gpu-interpret]",
    "test/kernels/test_cpu_sampling.py::test_partitioned_lowering_matches_reference[shape0-top_k]",
    "test/kernels/test_cpu_sampling.py::test_partitioned_lowering_matches_reference[shape1-categorical]",
    "test/kernels/test_cpu_sampling.py::test_split_calls_and_merge_match_reference[float32-categorical]",
    "test/kernels/test_cpu_attention_layouts.py::test_lse_matches_the_logits_logsumexp[1-shape0]",
    "test/kernels/test_cpu_attention_layouts.py::test_lse_matches_the_logits_logsumexp[0-shape2]",
    "test/python/test_api_transforms.py::test_sample_under_vmap_draws_what_each_element_would[own-keys-top-k]",
    "test/python/test_api_transforms.py::test_attention_under_vmap_is_one_call_over_the_folded_batch"
    "[queries-mapped-shared-cache]",
})


def slow_reason(nodeid: str) -> str | None:
    """Why `nodeid` is slow (its SLOW entry), or None for a test of the fast tier."""
    if nodeid in FAST_SAMPLES:
        return None
    for key, reason in SLOW.items():
        if nodeid == key or nodeid.startswith((key + "::", key + "[")):
            return reason
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: the marks must be on the items before `-m "not slow"` deselects by them.
    collected = {item.nodeid for item in items}
    for item in items:
        if slow_reason(item.nodeid) is not None:
            item.add_marker(pytest.mark.slow)
    # A sample whose siblings were collected but which was not itself has been renamed: say so.
    for sample in sorted(FAST_SAMPLES - collected):
        base = sample.partition("[")[0]
        if any(nodeid.startswith(base + "[") for nodeid in collected):
            warnings.warn(pytest.PytestWarning(f"test/conftest.py FAST_SAMPLES names no collected test: {sample}"),
                          stacklevel=1)
