"""tools/bench/attention_cpu.py's side-by-side mode: columns per HLOFUSE_CPU_ISA setting, interleaved with torch."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from hlofuse.kernels import cpu

if not cpu.is_available():
    pytest.skip("hlofuse CPU kernel library not built", allow_module_level=True)

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench" / "attention_cpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("attention_cpu_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_isa_columns_name_the_kernel_each_runs_and_restore_the_setting(bench, capsys, monkeypatch):
    monkeypatch.delenv(cpu.ISA_ENV, raising=False)
    bench.main(["--isa", "generic", "--isa", "avx2", "--repeats", "1", "--shapes", "T=12,S=40,N=4,K=2,H=32;T=1,S=64"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    header, _, *rows = lines
    avx2 = "avx2" if cpu.isa() in ("amx", "avx512bf16", "avx512", "avx2") else f"avx2 (runs {cpu.isa()})"
    assert header.startswith(f"| case | generic ms | {avx2} ms | torch SDPA ms |")
    assert [row.split("|")[1].strip() for row in rows] == [
        "B1 T12 S40 N4 K2 H32 f32 full",
        "B1 T1 S64 N8 K8 H128 f32 decode",
    ]
    for row in rows:
        generic_ms, avx2_ms = (float(cell) for cell in row.split("|")[2:4])
        assert generic_ms > 0 and avx2_ms > 0
    assert cpu.ISA_ENV not in os.environ  # each column's setting is undone after the case


def test_needs_two_columns(bench):
    with pytest.raises(SystemExit):
        bench.main(["--isa", "avx2"])


def test_extra_peak_rss_sees_a_block_that_is_freed_again(bench):
    bench.fix_malloc_thresholds()
    rss = bench.extra_peak_rss(lambda: np.ones(16 * 2**20 // 8).sum())  # 16 MiB, touched, then freed
    if rss is None:
        pytest.skip("no /proc/self/clear_refs here")
    assert 15 * 2**20 <= rss < 64 * 2**20
    assert bench.extra_peak_rss(lambda: None) < 2**20


def test_plain_mode_reports_the_gemm_peak_and_peak_rss(bench, capsys):
    bench.main(["--repeats", "1", "--shapes", "T=16,S=32,N=2,K=2,H=32"])
    out = capsys.readouterr().out
    assert re.search(r"f32 GEMM peak here: \d+\.\d GFLOP/s \(2048\^3 matmul: XLA \d+\.\d", out)
    header, _, row = [line for line in out.splitlines() if line.startswith("|")]
    assert header.endswith("| of f32 GEMM peak | XLA temp MiB | extra peak RSS MiB: hlofuse | XLA | torch |")
    cells = [cell.strip() for cell in row.split("|")[1:-1]]
    assert cells[0] == "B1 T16 S32 N2 K2 H32 f32 full" and cells[7].endswith("%")
    assert float(cells[1]) > 0 and float(cells[2]) > 0
