"""hlofuse.compile_targets: chips, the shipped GPU target configs, kernel extraction, reading the compilers' dumps.

The compiles themselves (libtpu, Triton and ptxas) run in test/tools/compile_for_tpu.mlir and
compile_for_gpu.mlir, each in a fresh hlofuse-opt process: libtpu reads its dump flags once, when it loads.
"""

from __future__ import annotations

import os
import re
import sys
import threading

import jax
import jax.numpy as jnp
import pytest
from jaxlib.mlir import ir

from hlofuse import compile_targets as ct
from hlofuse import pipeline
from hlofuse.ir.context import clone_module
from hlofuse.tools import opt


def attention(q, k, v):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.125
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def lowered_for(target):
    x = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.float32)
    module = jax.jit(attention).lower(x, x, x).compiler_ir("stablehlo")
    with module.context, ir.Location.unknown():
        module = clone_module(module)
        pipeline.run_pipeline(module, "default", target=target)
    return module


def test_every_chip_names_a_kernel_target_and_a_topology():
    assert set(ct.CHIPS) == {"tpu-v5e", "tpu-v6e", "tpu-v5p", "h100", "h200"}
    for chip in ct.CHIPS.values():
        assert chip.kernel_target in ("tpu", "gpu") and chip.topology
        assert (chip.platform == "cuda") == (chip.target_config is not None)
    with pytest.raises(ValueError, match="unknown chip 'v4'"):
        ct.chip("v4")


@pytest.mark.parametrize("name", ["h100", "h200"])
def test_gpu_target_configs_are_sm90a_with_hopper_limits(name):
    text = ct.gpu_target_config(name)
    fields = dict(re.findall(r"^\s*(\w+): ([^\s#]+)", text, re.MULTILINE))
    assert fields["major"] == "9" and fields["feature_extension"] == "ACCELERATED_FEATURES"
    assert fields["core_count"] == "132" and fields["shared_memory_per_block_optin"] == "232448"
    assert fields["registers_per_block_limit"] == "65536" and fields["platform_name"] == '"CUDA"'
    # Each field's comment names its source, and every source is spelled out in the header.
    header = {tag for tag in re.findall(r"^#\s+\[(\w+)\]", text, re.MULTILINE)}
    used = set(re.findall(r"#\s+\[(\w+)\]", "\n".join(l for l in text.splitlines() if not l.startswith("#"))))
    assert used and used <= header, used - header
    with pytest.raises(ValueError, match="not a GPU chip"):
        ct.gpu_target_config("tpu-v5e")


@pytest.mark.parametrize("target, call, name", [
    ("tpu", "tpu_custom_call", "hlofuse_flash_attention_tpu"),
    ("gpu", "__gpu$xla.gpu.triton", "hlofuse_flash_attention_gpu"),
])
def test_each_kernel_call_becomes_a_module_of_its_own(target, call, name):
    module = lowered_for(target)
    calls = ct.kernel_calls(module)
    assert [ct.kernel_name(c) for c in calls] == [name]
    alone = ct.kernel_module(calls[0])
    assert alone.operation.verify()
    text = str(alone)
    assert text.count("stablehlo.custom_call") == 1 and f"@{call}" in text
    assert "func.func public @main" in text and "return" in text


def test_describe_reads_as_one_phrase():
    tpu = {"vmem_bytes": 2400256, "vmem_window_bytes": 1572864, "vmem_spill_bytes": 434176,
           "vmem_capacity": 134217728, "bundles": 1640}
    assert ct.describe(tpu) == "vmem 2.3 MiB (windows 1.5 MiB, spill 424 KiB) of 128.0 MiB, 1640 bundles"
    gpu = {"registers": 168, "spill_store_bytes": 0, "spill_load_bytes": 0, "shared_memory_bytes": 65536,
           "grid": (1, 2, 8), "threads": (128, 1, 1)}
    assert ct.describe(gpu) == (
        "168 registers, spills 0 B stored / 0 B loaded, shared memory 64 KiB, grid 1x2x8 of 128 threads"
    )
    assert ct.describe({}) == "no resource dump"


VMEM_REPORT = """<html><script>
        const DATA ={"global_info": {"module_name": "hlofuse_kernel", "vmem_capacity": 134217728},
  "hlo_breakdowns": {"name.1": {"blocks": [{"allocations": [
     {"padding": 0, "shape": "f32[256,128]", "size": 131072, "tag": "scratch operand"},
     {"padding": 0, "size": 262144, "tag": "input window allocation for operator input 1. The window shape is \
f32[1,1,256,128], while the full shape is f32[2,4,512,128]. This allocation has 2 buffering levels."},
     {"padding": 0, "size": 4096, "tag": "SPILL"}], "block_size": 397312, "block_type": "SCOPED"}],
     "metadata": "", "total_size": 397312}}};
        const heading = 1;</script></html>"""

SCHEDULE_TLP = (
    "Schedule analysis:\n\ttotal scheduled bundles:    227\n"
    '\t   3.50 scheduled bundles ( 1.58%): %name.1 = f32[2,4,512,128]{3,2,1,0} custom-call(%a, %b), '
    'custom_call_target="tpu_custom_call", backend_config={}\n'
)
SCHEDULE_KERNEL = "Schedule analysis:\n\ttotal scheduled bundles:    1640\n\tempty scheduled bundles:    8\n"


def test_tpu_resources_from_libtpu_dump_files(tmp_path):
    files = {
        "17-TLP-00-schedule-analysis_final_bundles.txt": SCHEDULE_TLP,
        "17-TLP-02-vmem_report.html": VMEM_REPORT,
        "18-name.1-00-schedule-analysis_final_bundles.txt": SCHEDULE_KERNEL,
        "19-copy.3-00-schedule-analysis_final_bundles.txt": "total scheduled bundles:    5\n",
    }
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    assert ct.tpu_resources(str(tmp_path), sorted(files)) == {
        "bundles": 1640,
        "vmem_capacity": 134217728,
        "vmem_bytes": 397312,
        "vmem_spill_bytes": 4096,
        "vmem_window_bytes": 262144,
        "windows": {"input 1": "f32[1,1,256,128]"},
    }


PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for k_mosaic_gpu_kernel
    0 bytes stack frame, 8 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 2 barriers, 1 bytes smem
"""

MOSAIC_LOG = """// -----// IR Dump Before ResolveTrivialLocationsPass () //----- //
    %247 = gpu.launch async [%0] blocks(%arg2, %arg3, %arg4) in (%arg8 = %c2, %arg9 = %c4, %arg10 = %c8) \
threads(%arg5, %arg6, %arg7) in (%arg11 = %c128, %arg12 = %c1, %arg13 = %c1_0) dynamic_shared_memory_size \
%c182312_i32 {
// -----// IR Dump Before ArithExpandOpsPass () //----- //
    gpu.launch blocks(%a, %b, %c) in (%x = %c9, %y = %c9, %z = %c9) threads(%d, %e, %f) in (%u = %c1, \
%v = %c1, %w = %c1)
"""


def test_mosaic_gpu_resources_from_its_dump(tmp_path):
    (tmp_path / "hlofuse_flash_attention_mosaic_gpu_0.ptxas").write_text(PTXAS)
    (tmp_path / "hlofuse_flash_attention_mosaic_gpu_0.mlir-passes.log").write_text(MOSAIC_LOG)
    name, resources = ct.mosaic_gpu_resources(str(tmp_path), "mosaic_gpu_v2")
    assert name == "hlofuse_flash_attention_mosaic_gpu"
    assert resources == {
        "registers": 255, "stack_bytes": 0, "spill_store_bytes": 8, "spill_load_bytes": 16,
        "grid": (2, 4, 8), "threads": (128, 1, 1), "shared_memory_bytes": 182312,
    }


def test_gpu_resources_from_the_thunk_sequence(tmp_path):
    (tmp_path / "module_0001.k.thunk_sequence.txt").write_text(
        "001: kCustomKernel [source | next=003 (2)] loop_broadcast_fusion grid: [1, 1, 1] threads: [4, 1, 1]"
        "  shared_memory: 0 bytes\n"
        "003: kCustomKernel [prev=002 (1) | next=004 (1)] hlofuse_flash_attention_gpu grid: [2, 4, 32] "
        "threads: [128, 1, 1]  shared_memory: 131072 bytes\n"
    )
    assert ct.gpu_resources(str(tmp_path), "hlofuse_flash_attention_gpu") == {
        "grid": (2, 4, 32), "threads": (128, 1, 1), "shared_memory_bytes": 131072,
    }


def test_compile_for_needs_no_pipeline_and_picks_the_chips_kernels():
    options = opt.parse_args(["in.mlir", "--compile-for=h200"])
    assert options.compile_for == "h200" and opt.pipeline_text(options) == "default"
    assert opt.kernel_target(options) == "gpu"
    with pytest.raises(opt.UsageError, match="invalid choice"):
        opt.parse_args(["in.mlir", "--compile-for=v4"])


def test_output_onto_a_fifo_writes_to_it(tmp_path):
    # -o onto something that is not a regular file (/dev/null, a FIFO) writes to it: renaming the temp
    # file over it once replaced /dev/null with a regular file.
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    with opt._output(str(fifo), binary=False) as out:
        out.write("module {}\n")
    reader.join(timeout=30)
    assert got == ["module {}\n"]
    assert fifo.is_fifo() and os.listdir(tmp_path) == ["out.fifo"]


def test_a_missing_compiler_is_one_error_line(monkeypatch, capsys):
    def unavailable(module, name):
        raise ct.CompilerUnavailable(f'{name} needs libtpu: pip install "hlofuse[tpu]" (or jax[tpu]==0.10.2)')

    monkeypatch.setattr(ct, "check_module", unavailable)
    options = opt.parse_args(["in.mlir", "--compile-for=tpu-v5e"])
    assert not opt._compile_for(lowered_for("tpu"), "in.mlir", options, sys.stderr)
    assert capsys.readouterr().err.splitlines() == [
        'hlofuse-opt: error: --compile-for=tpu-v5e: tpu-v5e needs libtpu: pip install "hlofuse[tpu]" '
        "(or jax[tpu]==0.10.2)"
    ]


def test_tpu_blocks_table_reads_the_shipped_bundles():
    text = ct.tpu_blocks_table()
    lines = text.splitlines()
    assert lines[0] == "| tile (block_q x block_k / slice) | tpu-v5e | tpu-v5p | tpu-v6e |"
    assert len(lines) == 2 + len(ct.TUNE_TPU_CANDIDATES) + 2
    assert lines[-1].startswith("| **picked**, causal T = S = 32768 |")
    heads = [f"| {q} x {k}" + (f" / {w}" if w else "") + " | " for q, k, w in ct.TUNE_TPU_CANDIDATES]
    assert all(any(line.startswith(head) for line in lines) for head in heads)
    assert "refused" not in text  # some measured tile is spill-free for every chip


def test_inner_loop_bundles_count_bundles_below_the_grid_loop():
    dump = ("     0   :  { %1 = smov 0 }\n  0x13 LB: > { %2 = sadd.s32 1, %1 }\n  0x14   : > { %3 = vld }\n"
            "  0xb5 LB: >> { %4 = vld }\n  0xb6   : >> { %5 = vst }\n  0xb7 PF: > { %6 = smov 0 }\n")
    assert ct.inner_loop_bundles(dump) == 2
