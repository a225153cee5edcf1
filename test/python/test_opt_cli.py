"""hlofuse-opt end to end: exit codes, one-line errors without tracebacks, atomic -o, remarks and stats."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from jaxlib.mlir import ir

from hlofuse import pipeline
from hlofuse.tools import opt

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "hlofuse-opt"
INPUTS = REPO / "test" / "tools" / "inputs"

GOOD = """func.func @twice(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  %1 = stablehlo.add %a, %a : tensor<4xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<4xf32>
  return %2 : tensor<4xf32>
}
"""
BAD = GOOD.replace("stablehlo.multiply", "stablehlo.bogus")


@dataclass(frozen=True)
class RemarkOnAddPass(pipeline.ModulePass):
    """Test pass: a remark and a counter for every stablehlo.add."""

    name: ClassVar[str] = "hlofuse-test-remark"
    summary: ClassVar[str] = "remark on every add"
    reason: str = "seen"

    def run(self, module: ir.Operation, state: pipeline.PassState) -> None:
        def visit(op: ir.Operation) -> ir.WalkResult:
            if op.name == "stablehlo.add":
                state.remark(op, self.reason)
                state.count("add_seen")
            return ir.WalkResult.ADVANCE

        module.walk(visit)


@dataclass(frozen=True)
class FailingPass(pipeline.ModulePass):
    name: ClassVar[str] = "hlofuse-test-fail"
    summary: ClassVar[str] = "always raises"

    def run(self, module: ir.Operation, state: pipeline.PassState) -> None:
        raise ValueError("boom")


@dataclass(frozen=True)
class CheckedOptionPass(pipeline.ModulePass):
    name: ClassVar[str] = "hlofuse-test-checked"
    summary: ClassVar[str] = "rejects a bad target before anything runs"
    target: str = "cpu"

    def __post_init__(self) -> None:
        if self.target not in ("cpu", "tpu"):
            raise ValueError(f"unknown target '{self.target}'")

    def run(self, module: ir.Operation, state: pipeline.PassState) -> None:
        pass


@pytest.fixture
def test_passes(monkeypatch):
    monkeypatch.setitem(pipeline.PASS_CLASSES, CheckedOptionPass.name, f"{__name__}:CheckedOptionPass")
    monkeypatch.setitem(pipeline.PASS_CLASSES, RemarkOnAddPass.name, f"{__name__}:RemarkOnAddPass")
    monkeypatch.setitem(pipeline.PASS_CLASSES, FailingPass.name, f"{__name__}:FailingPass")
    monkeypatch.setitem(pipeline.PASS_CLASSES, "hlofuse-test-missing", "hlofuse.passes.no_such_module:X")


def run_tool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- through the wrapper script, as lit runs it -------------------------------------------------------


def test_wrapper_runs_a_pass_from_a_checkout(tmp_path):
    source = tmp_path / "in.mlir"
    source.write_text(GOOD)
    done = run_tool(str(source), "--cse")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("stablehlo.add") == 1
    assert done.stderr == ""


def test_parse_error_is_one_line_exit_1_no_partial_output(tmp_path):
    source = tmp_path / "bad.mlir"
    source.write_text(BAD)
    before = digest(source)
    out = tmp_path / "out.mlir"
    out.write_text("previous contents\n")
    done = run_tool(str(source), "--cse", "-o", str(out))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"{source}:4:8: error: custom op 'stablehlo.bogus' is unknown"]
    assert "Traceback" not in done.stderr
    assert out.read_text() == "previous contents\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.mlir", "out.mlir"]
    assert digest(source) == before


def test_failure_never_creates_the_output_or_touches_the_input(tmp_path):
    source = tmp_path / "bad.mlir"
    source.write_text(BAD)
    before = digest(source)
    out = tmp_path / "new.mlir"
    assert run_tool(str(source), "-o", str(out)).returncode == 1
    assert not out.exists()
    # -o naming the input itself: a failed run leaves the input as it was.
    assert run_tool(str(source), "-o", str(source)).returncode == 1
    assert digest(source) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.mlir"]


def test_debug_shows_the_traceback(tmp_path):
    done = run_tool(str(tmp_path / "missing.mlir"), "--debug")
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert (
        done.stderr.rstrip()
        .splitlines()[-1]
        .endswith("missing.mlir: error: cannot read input: No such file or directory")
    )


def test_stdin_and_output_file(tmp_path):
    out = tmp_path / "out.mlir"
    done = run_tool("-", "--canonicalize", "-o", str(out), stdin=GOOD.encode())
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "func.func @twice" in out.read_text()


# ---- in-process, with test passes registered ----------------------------------------------------------


def write(tmp_path: Path, text: str = GOOD, name: str = "in.mlir") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_remarks_and_stats(tmp_path, capsys, test_passes):
    source = write(tmp_path)
    assert (
        opt.main([str(source), "--hlofuse-test-remark=reason=near-miss", "--remarks", "--print-stats"]) == 0
    )
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert f"{source}:2:8: remark: [hlofuse-test-remark] stablehlo.add: near-miss" in lines
    assert f"{source}:3:8: remark: [hlofuse-test-remark] stablehlo.add: near-miss" in lines
    assert any(line.split() == ["2", "add_seen"] for line in lines)
    assert "func.func @twice" in captured.out


def test_shorthand_flags_run_in_order(tmp_path, capsys, test_passes):
    source = write(tmp_path)
    # cse first leaves one add to remark on; remarking first sees both.
    assert opt.main([str(source), "--cse", "--hlofuse-test-remark", "--remarks"]) == 0
    assert capsys.readouterr().err.count("remark:") == 1
    assert opt.main([str(source), "--hlofuse-test-remark", "--cse", "--remarks"]) == 0
    assert capsys.readouterr().err.count("remark:") == 2


def test_pass_pipeline_mixes_hlofuse_and_upstream(tmp_path, capsys, test_passes):
    source = write(tmp_path)
    pipeline_text = "builtin.module(cse,hlofuse-test-remark{reason=x})"
    assert opt.main([str(source), f"--pass-pipeline={pipeline_text}", "--remarks"]) == 0
    assert capsys.readouterr().err.count("remark: [hlofuse-test-remark] stablehlo.add: x") == 1


def test_pass_failure_is_one_line(tmp_path, capsys, test_passes):
    source = write(tmp_path)
    assert opt.main([str(source), "--hlofuse-test-fail"]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"{source}: error: pass 'hlofuse-test-fail' failed: ValueError: boom\n"
    assert captured.out == ""


def test_pass_failure_with_debug_has_traceback(tmp_path, capsys, test_passes):
    source = write(tmp_path)
    assert opt.main([str(source), "--hlofuse-test-fail", "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert err.rstrip().endswith("failed: ValueError: boom")


def test_unknown_option_names_the_known_ones(tmp_path, capsys, test_passes):
    source = write(tmp_path)
    assert opt.main([str(source), "--hlofuse-test-remark=colour=red"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "hlofuse-opt: error: invalid pipeline: unknown option 'colour' for pass 'hlofuse-test-remark' "
        "(options: reason)\n"
    )


def test_option_checked_in_post_init_is_a_pipeline_error(tmp_path, capsys, test_passes):
    source = write(tmp_path, GOOD + "// -----\n" + GOOD)
    assert opt.main([str(source), "--split-input-file", "--hlofuse-test-checked=target=mars"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "hlofuse-opt: error: invalid pipeline: unknown target 'mars'\n"
    assert captured.out == ""


def test_unavailable_pass_is_listed_and_rejected(tmp_path, capsys, test_passes):
    assert opt.main(["--list-passes"]) == 0
    out = capsys.readouterr().out
    assert "hlofuse-test-missing  (unavailable: No module named 'hlofuse.passes.no_such_module')" in out
    assert "hlofuse-test-remark  remark on every add" in out
    assert "reason: str = 'seen'" in out
    assert opt.main([str(write(tmp_path)), "--hlofuse-test-missing"]) == 1
    assert capsys.readouterr().err.startswith("hlofuse-opt: error: pass unavailable:")


def test_split_failure_keeps_other_chunks(tmp_path, capsys):
    source = write(tmp_path, GOOD + "// -----\n" + BAD + "// -----\n" + GOOD.replace("@twice", "@third"))
    assert opt.main([str(source), "--split-input-file"]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"{source}:11:8: error: custom op 'stablehlo.bogus' is unknown\n"
    assert "@twice" in captured.out and "@third" in captured.out
    assert captured.out.count("// -----") == 1


def test_split_failure_with_output_file_writes_nothing(tmp_path, capsys):
    source = write(tmp_path, GOOD + "// -----\n" + BAD)
    out = tmp_path / "out.mlir"
    assert opt.main([str(source), "--split-input-file", "-o", str(out)]) == 1
    assert not out.exists()


def test_split_chunks_keep_line_numbers():
    text = "a\n// -----\nb\nc\n  // -----  \nd\n"
    chunks = opt.split_chunks(text)
    assert [chunk.split("\n").index(letter) for chunk, letter in zip(chunks, "abd", strict=True)] == [0, 2, 5]


def test_split_empty_and_comment_chunks_are_empty_modules(tmp_path, capsys):
    source = write(tmp_path, "// just a note\n// -----\n" + GOOD + "// -----\n")
    assert opt.main([str(source), "--split-input-file"]) == 0
    assert capsys.readouterr().out.split("// -----\n") == ["module {\n}\n", ANY_TWICE, "module {\n}\n"]


class _ContainsTwice:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and "func.func @twice" in other


ANY_TWICE = _ContainsTwice()


def test_pass_element_forms():
    assert opt.pass_element("hlofuse-lower-kernels", "target=cpu") == "hlofuse-lower-kernels{target=cpu}"
    assert opt.pass_element("p", "{a=1 b=2}") == "p{a=1 b=2}"
    assert opt.pass_element("p", "a=1,b=2") == "p{a=1 b=2}"
    assert opt.pass_element("p", None) == "p"


def test_emit_bytecode_round_trips(tmp_path, capsys):
    source = write(tmp_path)
    out = tmp_path / "out.mlirbc"
    assert opt.main([str(source), "--emit-bytecode", "-o", str(out)]) == 0
    assert out.read_bytes().startswith(b"ML\xefR")
    assert opt.main([str(out)]) == 0
    assert "func.func @twice" in capsys.readouterr().out


def test_a_flag_never_eats_the_input(tmp_path, capsys):
    source = write(tmp_path)
    assert opt.main(["--cse", str(source)]) == 0
    assert capsys.readouterr().out.count("stablehlo.add") == 1


def test_starting_the_tool_puts_no_plugin_log_lines_on_stderr():
    """hlofuse's modules load jaxlib's C++ library (through jaxlib.mlir) before jax can set its quiet default, so
    hlofuse sets it: else each installed PJRT plugin (the CUDA compiler of the accelerators extra) logs INFO lines
    ("GetPjrtApi was found for cuda") on every run, with the first backend."""
    if importlib.util.find_spec("jax_plugins") is None:
        pytest.skip("no PJRT plugin is installed: none would log")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"} | {"JAX_PLATFORMS": "cpu"}
    program = "import hlofuse.tools.opt\nimport jax\njax.devices()\n"
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, env=env,
                         check=True)
    assert not re.findall(r"(?m)^I\d{4} \d\d:\d\d:\d\d", run.stderr), run.stderr
