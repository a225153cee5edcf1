"""The hlofuse-report command line: --help, exit codes, --json/--html/--compare outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from hlofuse.report.cli import main

REPO = Path(__file__).resolve().parents[2]


def _decode_text(kv_heads: int) -> str:
    def attention(q, k, v):
        k, v = jnp.repeat(k, 32 // kv_heads, axis=2), jnp.repeat(v, 32 // kv_heads, axis=2)
        s = jnp.einsum("btnh,bsnh->bnts", q, k) / 8.0
        return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s, axis=-1), v)

    q = jnp.ones((1, 1, 32, 64), jnp.float32)
    k = jnp.ones((1, 1024, kv_heads, 64), jnp.float32)
    return jax.jit(attention).lower(q, k, k).as_text()


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("report")
    a, b = folder / "gqa8.mlir", folder / "gqa2.mlir"
    a.write_text(_decode_text(8))
    b.write_text(_decode_text(2))
    return a, b


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: hlofuse-report" in out and "--compare" in out and "--measure" in out


def test_module_entry_point_help():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO / "python"))
    result = subprocess.run([sys.executable, "-m", "hlofuse.report", "--help"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0
    assert "hlofuse-report" in result.stdout


@pytest.mark.parametrize("argv, message", [
    (["/no/such/file.mlir", "--no-calibrate"], "cannot read input"),
    (["{program}", "--targets", "tpu-v9", "--no-calibrate"], "unknown target 'tpu-v9'"),
    (["{program}", "--no-such-flag"], "unrecognized arguments"),
    (["{program}", "--kv-fill", "2"], "--kv-fill"),
    ([], "the following arguments are required"),
])
def test_errors_are_one_line_and_exit_one(argv, message, programs, capsys):
    argv = [a.replace("{program}", str(programs[0])) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1


def test_help_describes_every_option_formats_targets_and_exit_status(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--targets", "--json", "--html", "--compare", "--measure", "--runs", "--no-fuse", "--kv-fill",
                 "--top", "--no-calibrate", "--recalibrate", "--quiet", "--debug"):
        assert flag in out, flag
    for words in ("input formats", "jax.export", "the next 2x", "tpu-v5e", "trn2", "HLOFUSE_CACHE_DIR",
                  "exit status", "measured B/A"):
        assert words in out, words


@pytest.mark.parametrize("text, message", [
    ("module {}", "nothing to model: the module has no public function"),
    ("func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}\n",
     "nothing to model: @main has no ops"),
])
def test_a_module_with_nothing_to_model_is_a_clear_error(text, message, tmp_path, capsys):
    path = tmp_path / "empty.mlir"
    path.write_text(text)
    assert main([str(path), "--targets", "host", "--no-calibrate"]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and str(path) in err and len(err.splitlines()) == 1


def test_unknown_target_suggests_the_closest(programs, capsys):
    assert main([str(programs[0]), "--targets", "host,h1000", "--no-calibrate"]) == 1
    assert "did you mean 'h100'?" in capsys.readouterr().err


def test_unwritable_output_fails_before_the_analysis(programs, capsys):
    assert main([str(programs[0]), "--targets", "host", "--no-calibrate", "--json", "/no/such/dir/r.json"]) == 1
    captured = capsys.readouterr()
    assert "--json /no/such/dir/r.json: no such directory" in captured.err and "== host" not in captured.out


def test_measure_shows_progress_on_a_long_run(programs, capsys, monkeypatch):
    """Progress lines go to stderr: one when it compiles, then one per round once a call takes a second or more
    (a slow clock here makes every call look long)."""
    import itertools

    from hlofuse.report import measure

    ticks = itertools.count(0.0, 2.0)
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(ticks))
    assert main([str(programs[1]), "--targets", "host", "--no-calibrate", "--measure", "--runs", "2"]) == 0
    err = capsys.readouterr().err
    assert "--measure: compiling for this CPU" in err
    assert "--measure: call 1/2" in err and "--measure: call 2/2" in err


def test_unparseable_input_exits_one(tmp_path, capsys):
    bad = tmp_path / "bad.mlir"
    bad.write_text("func.func @main() { stablehlo.bogus }")
    assert main([str(bad), "--targets", "host", "--no-calibrate"]) == 1
    assert "error" in capsys.readouterr().err


def test_report_json_html_and_compare(programs, tmp_path, capsys):
    a, b = programs
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    code = main([str(a), "--targets", "host,tpu-v6e,h200", "--no-calibrate", "--compare", str(b),
                 "--json", str(out_json), "--html", str(out_html)])
    assert code == 0
    text = capsys.readouterr().out
    assert "== tpu-v6e" in text and "--compare" in text
    data = json.loads(out_json.read_text())
    assert data["targets"]["h200"]["predicted_s"] > 0
    for name in ("tpu-v6e", "h200"):
        assert data["compare"]["targets"][name]["delta_s"] < 0  # 2 KV heads read less than 8
    page = out_html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "Compare" in page


def test_json_to_stdout(programs, capsys):
    assert main([str(programs[1]), "--targets", "trn2", "--no-calibrate", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["targets"]) == {"trn2"}
    assert data["targets"]["trn2"]["lowering"] != "ok"  # no Neuron SDK here: the kernel is modelled


def test_demo_programs_write_modules_the_report_reads(tmp_path, capsys):
    """python -m hlofuse.report.demo_programs (the README's example) writes the demo's two programs; the report
    fuses their attention and sampling sites, and more KV heads cost more in the decode step."""
    from hlofuse.report import demo_programs

    small = ["--layers", "1", "--d-model", "128", "--heads", "4", "--head-dim", "32", "--vocab", "512",
             "--prompt-len", "16", "--cache-len", "256"]
    assert demo_programs.main([str(tmp_path / "kv1"), *small, "--kv-heads", "1"]) == 0
    assert demo_programs.main([str(tmp_path / "kv4"), *small, "--kv-heads", "4"]) == 0
    assert demo_programs.main([str(tmp_path / "bad"), *small, "--kv-heads", "3"]) == 1
    capsys.readouterr()
    out_json = tmp_path / "r.json"
    assert main([str(tmp_path / "kv4" / "decode_step.mlir"), "--compare", str(tmp_path / "kv1" / "decode_step.mlir"),
                 "--targets", "tpu-v6e", "--no-calibrate", "--compare-only", "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("hlofuse-report --compare:") and "== tpu-v6e" in text
    data = json.loads(out_json.read_text())
    assert data["counters"].get("softmax_of_qk_to_attention") == 1 and data["sites"] == 2
    assert data["compare"]["targets"]["tpu-v6e"]["delta_s"] < 0
    assert main([str(tmp_path / "kv1" / "prefill.mlir"), "--targets", "host", "--no-calibrate", "--quiet"]) == 0
