"""One lit file per pass (STYLE.md, test-beside-code): passes/<stem>.py has test/passes/<stem>.mlir.

The reverse holds too: every lit file in test/passes/ belongs to a pass, by its stem or by `<stem>_<topic>`
(a sibling file for one family of a pass's options, e.g. lower_kernels_sharding.mlir), and its RUN lines run
that pass. The registry (hlofuse.pipeline.PASS_CLASSES) names each module after its pass: hlofuse-fuse-attention
lives in passes/fuse_attention.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PASSES = REPO / "passes"
LIT = REPO / "test" / "passes"

PASS_STEMS = sorted(p.stem for p in PASSES.glob("*.py") if p.stem != "__init__")
LIT_STEMS = sorted(p.stem for p in LIT.glob("*.mlir"))


def _flag(stem: str) -> str:
    return "hlofuse-" + stem.replace("_", "-")


def _owner(lit_stem: str) -> str | None:
    """The pass stem a lit file belongs to: its own stem, else the longest `<pass>_` prefix."""
    if lit_stem in PASS_STEMS:
        return lit_stem
    owners = [s for s in PASS_STEMS if lit_stem.startswith(s + "_")]
    return max(owners, key=len) if owners else None


def test_there_are_passes_and_lit_files():
    assert PASS_STEMS, f"no pass modules in {PASSES}"
    assert LIT_STEMS, f"no lit files in {LIT}"


@pytest.mark.parametrize("stem", PASS_STEMS)
def test_every_pass_has_a_lit_file(stem):
    lit = LIT / f"{stem}.mlir"
    assert lit.is_file(), f"passes/{stem}.py has no lit file: add test/passes/{stem}.mlir (STYLE.md)"


@pytest.mark.parametrize("lit_stem", LIT_STEMS)
def test_every_lit_file_belongs_to_a_pass(lit_stem):
    owner = _owner(lit_stem)
    assert owner is not None, (f"test/passes/{lit_stem}.mlir names no pass: rename it to <pass module stem>.mlir "
                               f"or <stem>_<topic>.mlir (pass modules: {', '.join(PASS_STEMS)})")
    runs = [line for line in (LIT / f"{lit_stem}.mlir").read_text().splitlines() if line.startswith("// RUN:")]
    assert runs, f"test/passes/{lit_stem}.mlir has no RUN line"
    flag = re.compile(re.escape(_flag(owner)) + r"(?![\w-])")
    assert any(flag.search(line) for line in runs), f"no RUN line of test/passes/{lit_stem}.mlir runs {_flag(owner)}"


def test_registry_names_each_module_after_its_pass():
    from hlofuse.pipeline import PASS_CLASSES

    registered = {}
    for name, target in PASS_CLASSES.items():
        module = target.split(":")[0]
        assert module.startswith("hlofuse.passes."), f"{name} is registered outside hlofuse.passes: {target}"
        stem = module.removeprefix("hlofuse.passes.")
        assert name == _flag(stem), f"pass {name} lives in passes/{stem}.py; its module should be named after it"
        registered[stem] = name
    assert sorted(registered) == PASS_STEMS, "passes/ and hlofuse.pipeline.PASS_CLASSES list different passes"
