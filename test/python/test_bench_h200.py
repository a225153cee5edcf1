"""tools/bench/h200_kernels.py, the script for a lent H200: it imports, --help and --dry-run work on any host,
--cpu-smoke runs its whole path in interpret mode, and without a GPU it exits 2 with a message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "bench" / "h200_kernels.py"


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)  # fmt: skip


def test_help_and_dry_run_need_no_device():
    assert run("--help").returncode == 0
    plan = run("--dry-run")
    assert plan.returncode == 0, plan.stderr[-2000:]
    lines = plan.stdout.splitlines()
    # The compile grid's f32 H = 256 prefill takes 16 x 32 Triton tiles on the H200, and no Mosaic GPU kernel.
    assert "- B1 T8192 S8192 N32 K8 H256 f32 causal: Triton 16x32, 4 warps, 2 stages; Mosaic GPU no" in lines
    assert sum(line.startswith("- sample ") for line in lines) == 8


def test_without_a_gpu_it_exits_2_with_a_message():
    result = run("--quick")
    assert result.returncode == 2 and "needs a CUDA GPU" in result.stderr


def test_cpu_smoke_checks_every_kernel_and_prints_the_table():
    result = run("--cpu-smoke", "--repeats", "1")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| B") or line.startswith("| sample ")]
    assert len(rows) == 5 and "FAIL" not in result.stdout, result.stdout
    assert "numerics ok" in result.stdout
